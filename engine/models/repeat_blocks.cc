#include "engine/models/repeat_blocks.h"

#include <map>
#include <string>
#include <utility>

namespace memest {

int RepeatBlocks(GraphBuilder& b, const std::string& prefix, int64_t layers, int h,
                 const std::function<int(int64_t, int)>& block,
                 const std::function<int64_t(int64_t)>& variant) {
  const int loop_start = b.num_tensors();
  struct Built {
    int count = 0;                 // blocks of the variant so far
    GraphBuilder::BlockMark last;  // the last one built
  };
  std::map<int64_t, Built> built;  // per variant
  for (int64_t i = 0; i < layers && b.ok(); ++i) {
    ScopeGuard scope(b, prefix + std::to_string(i));
    b.MarkBlock();
    if (!variant || !b.stamping()) {
      h = block(i, h);
      continue;
    }
    Built& v = built[variant(i)];
    if (v.count >= 2) {
      if (v.count == 2) b.ReserveCopies(v.last, layers - i);  // the most copies to come
      const int out = b.StampBlock(v.last, h, loop_start);
      if (!b.ok()) return -1;
      if (out >= 0) {
        h = out;
        ++v.count;
        continue;
      }
    }
    GraphBuilder::BlockMark mark = b.BeginBlock(h);
    h = block(i, h);
    b.EndBlock(h, &mark);
    v.last = std::move(mark);
    ++v.count;
  }
  return h;
}

}  // namespace memest
