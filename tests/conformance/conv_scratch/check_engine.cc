// Replays measured convolution allocation sequences through memest's own CPU convolution rule
// (engine/rules/cpu_conv.h) and reports how many it predicts exactly.
//
//   to_lines.py MEASURED.jsonl | build/bin/cpu_conv_check [--show N]
//
// Each input line: isa n ci co groups h w kh kw oh ow sh sw ph pw dh dw bias xg cl ; fwd ; bwd
// (cl: the input is channels-last; the measured backward then ends with AccumulateGrad's copy
// of a channels-last weight gradient, which the rule leaves to the engine: it is added here).
// (isa "avx512" or "avx2"; fwd and bwd are the signed allocation events, space-separated).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/rules/cpu_conv.h"

namespace {

std::vector<int64_t> ReadEvents(std::istringstream* in) {
  std::vector<int64_t> v;
  std::string tok;
  while (*in >> tok && tok != ";") v.push_back(std::stoll(tok));
  return v;
}

std::string Join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t e : v) s += (s.empty() ? "" : " ") + std::to_string(e);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int show = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--show") show = std::atoi(argv[i + 1]);
  }
  std::string line;
  int total = 0, exact = 0, peaks = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string isa_name, semi;
    memest::CpuConvProblem p;
    int bias = 0, xg = 0, cl = 0;
    in >> isa_name >> p.n >> p.ci >> p.co >> p.groups >> p.h >> p.w >> p.kh >> p.kw >> p.oh >> p.ow >>
        p.stride_h >> p.stride_w >> p.pad_h >> p.pad_w >> p.dil_h >> p.dil_w >> bias >> xg >> cl >> semi;
    if (!in || semi != ";") {
      std::cerr << "bad line: " << line << "\n";
      return 2;
    }
    p.bias = bias != 0;
    p.input_grad = xg != 0;
    p.channels_last = cl != 0;
    p.weight_grad = true;
    const memest::CpuIsa isa = isa_name == "avx2" ? memest::CpuIsa::kAvx2 : memest::CpuIsa::kAvx512;
    const std::vector<int64_t> fwd = ReadEvents(&in), bwd = ReadEvents(&in);
    memest::CpuConvTrace t = memest::CpuConvAllocations(p, isa);
    if (t.weight_grad_channels_last) {  // AccumulateGrad's copy into the weight's layout
      const int64_t w = p.co * (p.ci / p.groups) * p.kh * p.kw * p.element_bytes;
      t.backward.insert(t.backward.end(), {w, -w});
    }
    ++total;
    const bool same = t.forward == fwd && t.backward == bwd;
    auto pk = [](const std::vector<int64_t>& v) {
      const memest::EventPeak e = memest::PeakOfEvents(v);
      return std::make_pair(e.peak, e.net);
    };
    const bool same_peak = pk(t.forward) == pk(fwd) && pk(t.backward) == pk(bwd);
    exact += same;
    peaks += same_peak;
    if (!same && show-- > 0) {
      std::cout << line.substr(0, line.find(';')) << "(" << t.forward_kernel << ")\n";
      if (t.forward != fwd) std::cout << "  fwd measured  " << Join(fwd) << "\n      predicted " << Join(t.forward) << "\n";
      if (t.backward != bwd) std::cout << "  bwd measured  " << Join(bwd) << "\n      predicted " << Join(t.backward) << "\n";
    }
  }
  std::printf("exact sequence: %d/%d (%.2f%%); peak and net: %d/%d (%.2f%%)\n", exact, total,
              total ? 100.0 * exact / total : 0.0, peaks, total, total ? 100.0 * peaks / total : 0.0);
  return 0;
}
