// The golden corpus (issue 14): the run configurations whose full answers are recorded in
// tests/data/golden/estimates.tsv, so that a change that makes the engine faster can be shown to
// change no answer. Each configuration is a line of `memest estimate` flags, read by the CLI's
// own flag parser: every preset, Hugging Face config and example model file, under precisions,
// optimizers, checkpointing, batch sizes and devices, with advice, in inference and generation,
// on the CPU runtime, and with the parallel, LoRA, quantization and serving features.
#ifndef MEMEST_TESTS_GOLDEN_CORPUS_H_
#define MEMEST_TESTS_GOLDEN_CORPUS_H_

#include <string>
#include <vector>

namespace memest::golden {

// The configurations, in a fixed order, each a line of flags; its files are named relative to
// the source directory, which must be the working directory.
std::vector<std::string> Configurations();

}  // namespace memest::golden

#endif  // MEMEST_TESTS_GOLDEN_CORPUS_H_
