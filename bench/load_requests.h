// The requests memest-load (bench/load_test.cc) sends, by mix.
#ifndef MEMEST_BENCH_LOAD_REQUESTS_H_
#define MEMEST_BENCH_LOAD_REQUESTS_H_

#include <string>
#include <vector>

#include "memest/v1/memest.pb.h"

namespace memest {

// "cheap": gpt2-small (12 layers) with advice, about 30 ms of one core; "expensive": gpt2-small
// with 300 layers and advice, about 0.6 s; "mixed": seven cheap, two llama-7b, one expensive.
// Empty for an unknown mix.
std::vector<v1::EstimateRequest> LoadRequests(const std::string& mix);
std::string LoadMixes();  // "cheap, expensive or mixed"

}  // namespace memest

#endif  // MEMEST_BENCH_LOAD_REQUESTS_H_
