#include "engine/passes/pipeline.h"

#include <algorithm>
#include <string>
#include <utility>

namespace memest {
namespace {

Status Refuse(const std::string& why) {
  return InvalidArgument("config.parallelism.pipeline: " + why);
}

// Each block's op range [first, last], checked to run one block after another.
StatusOr<std::vector<std::pair<int, int>>> BlockRanges(const Graph& g) {
  std::vector<std::pair<int, int>> ranges(g.blocks.size(), {-1, -1});
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (size_t b = 0; b < g.blocks.size(); ++b) {
      if (!ScopeWithin(g.ops[i].scope, g.blocks[b])) continue;
      if (ranges[b].first < 0) ranges[b].first = static_cast<int>(i);
      ranges[b].second = static_cast<int>(i);
      break;
    }
  }
  for (size_t b = 0; b < ranges.size(); ++b) {
    if (ranges[b].first < 0) return Refuse("block " + g.blocks[b] + " runs no op");
    if (b > 0 && ranges[b].first <= ranges[b - 1].second) {
      return Refuse("blocks " + g.blocks[b - 1] + " and " + g.blocks[b] +
                    " do not run one after the other, so they cannot be split into stages");
    }
  }
  return ranges;
}

// Whether a parameter is read both before op `first` (the first block's first) and after op
// `last` (the last block's last): an embedding tied to the head, which the first and the last
// stage each hold.
bool TiedAcrossEnds(const Graph& g, int first, int last) {
  std::vector<char> before(g.tensors.size(), 0);
  for (int i = 0; i < first; ++i) {
    for (int t : g.ops[i].inputs) before[t] = g.tensors[t].role == TensorRole::kParameter;
  }
  for (size_t i = static_cast<size_t>(last) + 1; i < g.ops.size(); ++i) {
    for (int t : g.ops[i].inputs) {
      if (before[t]) return true;
    }
  }
  return false;
}

// The slice of `g` made of ops [lo, hi] (see PlanPipelineStage).
StatusOr<Graph> Slice(const Graph& g, int lo, int hi, bool last) {
  Graph s;
  std::vector<int> id(g.tensors.size(), -1);
  int received = -1;
  auto take = [&](int t) -> StatusOr<int> {
    if (id[t] >= 0) return id[t];
    Tensor copy = g.tensors[t];
    if (copy.role == TensorRole::kActivation) {  // made by an earlier stage: received
      if (copy.requires_grad) {
        if (received >= 0) {
          return Refuse("a stage would receive two activations that need gradients (" +
                        g.tensors[received].name + ", " + copy.name +
                        "); memest splits models whose stages pass one");
        }
        received = t;
      }
      copy.role = TensorRole::kInput;
      copy.producer = copy.alias_of = -1;
    }
    id[t] = static_cast<int>(s.tensors.size());
    s.tensors.push_back(std::move(copy));
    return id[t];
  };
  for (int i = lo; i <= hi; ++i) {
    Op op = g.ops[i];
    for (int& t : op.inputs) {
      MEMEST_ASSIGN_OR_RETURN(t, take(t));
    }
    for (int& t : op.outputs) {
      Tensor copy = g.tensors[t];
      copy.producer = static_cast<int>(s.ops.size());
      if (copy.alias_of >= 0) {
        MEMEST_ASSIGN_OR_RETURN(copy.alias_of, take(copy.alias_of));
      }
      id[t] = static_cast<int>(s.tensors.size());
      t = id[t];
      s.tensors.push_back(std::move(copy));
    }
    s.ops.push_back(std::move(op));
  }
  if (last) {
    s.loss = g.loss >= 0 ? id[g.loss] : -1;
    s.loss_begin = g.loss_begin >= lo ? g.loss_begin - lo : -1;
    for (int t : g.outputs) {
      if (id[t] >= 0) s.outputs.push_back(id[t]);
    }
  } else {  // the activation sent on: made here, read later, needing a gradient
    for (size_t i = hi + 1; i < g.ops.size(); ++i) {
      for (int t : g.ops[i].inputs) {
        const int p = g.tensors[t].producer;
        if (p < lo || p > hi || !g.tensors[t].requires_grad || s.loss == id[t]) continue;
        if (s.loss >= 0) {
          return Refuse("a stage would send two activations that need gradients (" +
                        s.tensors[s.loss].name + ", " + g.tensors[t].name +
                        "); memest splits models whose stages pass one");
        }
        s.loss = id[t];
      }
    }
    if (s.loss < 0) {
      return Refuse("a stage sends no activation that needs a gradient (its blocks and every "
                    "block before them train nothing: frozen, or LoRA adapters only later)");
    }
  }
  for (size_t k = 0; k < g.checkpoints.size(); ++k) {
    const auto [first, end] = g.checkpoints[k];
    if (first >= lo && end <= hi) {
      s.checkpoints.push_back({first - lo, end - lo});
      s.checkpoint_non_reentrant.push_back(g.checkpoint_non_reentrant[k]);
    }
  }
  for (const HeldTensor& h : g.held) {
    if (id[h.tensor] >= 0 && h.until_op >= lo && h.until_op <= hi) {
      s.held.push_back({id[h.tensor], h.until_op - lo});
    }
  }
  s.autocast = g.autocast;
  s.runtime = g.runtime;
  return s;
}

// Appends slice `part` to `into`, renumbering its tensors and ops, and returns its chunk.
StageChunk Append(Graph& into, const Graph& part) {
  const int t0 = static_cast<int>(into.tensors.size());
  const int o0 = static_cast<int>(into.ops.size());
  for (Tensor t : part.tensors) {
    if (t.producer >= 0) t.producer += o0;
    if (t.alias_of >= 0) t.alias_of += t0;
    into.tensors.push_back(std::move(t));
  }
  for (Op op : part.ops) {
    for (int& t : op.inputs) t += t0;
    for (int& t : op.outputs) t += t0;
    into.ops.push_back(std::move(op));
  }
  for (size_t k = 0; k < part.checkpoints.size(); ++k) {
    into.checkpoints.push_back({part.checkpoints[k].first + o0, part.checkpoints[k].second + o0});
    into.checkpoint_non_reentrant.push_back(part.checkpoint_non_reentrant[k]);
  }
  for (const HeldTensor& h : part.held) into.held.push_back({h.tensor + t0, h.until_op + o0});
  for (int t : part.outputs) into.outputs.push_back(t + t0);
  into.blocks.insert(into.blocks.end(), part.blocks.begin(), part.blocks.end());
  if (part.loss_begin >= 0) into.loss_begin = part.loss_begin + o0;
  into.loss = part.loss >= 0 ? part.loss + t0 : -1;
  into.autocast = part.autocast;
  into.runtime = part.runtime;
  StageChunk c;
  c.first_op = o0;
  c.last_op = static_cast<int>(into.ops.size()) - 1;
  c.sent = into.loss;
  return c;
}

}  // namespace

std::vector<PipelineAction> InterleavedActions(int64_t stage, int64_t stages, int64_t v,
                                               int64_t m) {
  const int64_t total = m * v;
  const int64_t warmup = std::min((stages - stage - 1) * 2 + (v - 1) * stages, total);
  auto at = [&](int64_t k, bool forward) {
    const int64_t group = k / (stages * v), in_group = k % (stages * v);
    const int64_t chunk = in_group / stages;
    return PipelineAction{forward, group * stages + in_group % stages,
                          static_cast<int>(forward ? chunk : v - 1 - chunk)};
  };
  std::vector<PipelineAction> out;
  int64_t fwd = 0, bwd = 0;
  for (; fwd < warmup; ++fwd) out.push_back(at(fwd, true));
  while (fwd < total) {
    out.push_back(at(fwd++, true));
    out.push_back(at(bwd++, false));
  }
  while (bwd < total) out.push_back(at(bwd++, false));
  return out;
}

std::vector<PipelineAction> PipelineActions(PipelineSchedule schedule, int64_t stage,
                                            int64_t stages, int64_t m) {
  const int64_t warmup =
      schedule == PipelineSchedule::kGPipe ? m : std::min(stages - stage - 1, m);
  std::vector<PipelineAction> out;
  int64_t fwd = 0, bwd = 0;
  for (; fwd < warmup; ++fwd) out.push_back({true, fwd});
  while (fwd < m) {
    out.push_back({true, fwd++});
    out.push_back({false, bwd++});
  }
  while (bwd < m) out.push_back({false, bwd++});
  return out;
}

namespace {

std::vector<PipelineAction> ActionsOf(PipelineSchedule schedule, int64_t stage, int64_t stages,
                                      int64_t v, int64_t m) {
  return v > 1 ? InterleavedActions(stage, stages, v, m)
               : PipelineActions(schedule, stage, stages, m);
}

// Whether `full` is `short_list` with `copies` copies of its period [end - period, end)
// inserted after `end`, each `stride` micro-batches on, and what follows moved on by all of them.
bool ExpandsTo(const std::vector<PipelineAction>& short_list, int64_t end, int64_t period,
               int64_t stride, int64_t copies, const std::vector<PipelineAction>& full) {
  if (full.size() != short_list.size() + static_cast<size_t>(copies * period)) return false;
  auto same = [](const PipelineAction& a, const PipelineAction& b, int64_t shift) {
    return a.forward == b.forward && a.chunk == b.chunk && a.micro_batch + shift == b.micro_batch;
  };
  size_t at = 0;
  for (int64_t k = 0; k < end; ++k) {
    if (!same(short_list[k], full[at++], 0)) return false;
  }
  for (int64_t c = 1; c <= copies; ++c) {
    for (int64_t k = end - period; k < end; ++k) {
      if (!same(short_list[k], full[at++], c * stride)) return false;
    }
  }
  for (size_t k = static_cast<size_t>(end); k < short_list.size(); ++k) {
    if (!same(short_list[k], full[at++], copies * stride)) return false;
  }
  return true;
}

size_t FirstBackward(const std::vector<PipelineAction>& actions) {
  size_t k = 0;
  while (k < actions.size() && actions[k].forward) ++k;
  return k;
}

}  // namespace

std::optional<PipelineFold> FoldPipelineActions(PipelineSchedule schedule, int64_t stage,
                                                int64_t stages, int64_t v, int64_t m) {
  if (v == 1 && schedule == PipelineSchedule::kGPipe) return std::nullopt;
  const int64_t stride = v > 1 ? stages : 1;  // micro-batches a period moves on
  const int64_t half = stride * v;            // forwards (and backwards) a period
  const int64_t period = 2 * half;
  const std::vector<PipelineAction> full = ActionsOf(schedule, stage, stages, v, m);
  const int64_t warmup = static_cast<int64_t>(FirstBackward(full));
  // A forward's tensors live until its backward, warmup forwards later: about warmup / half
  // periods, one more for what a backward hands to the next. The zone starts that far into the
  // steady state, and the two periods compared (engine/step/fold.cc) that far into the zone.
  const int64_t lag = (warmup + half - 1) / half + 1;
  for (int64_t n = stride; n < m; n += stride) {
    std::vector<PipelineAction> actions = ActionsOf(schedule, stage, stages, v, n);
    const int64_t warm = static_cast<int64_t>(FirstBackward(actions));
    if (warm < warmup) continue;
    const int64_t periods = (n * v - warm) / half;
    if (periods < 2 * lag + 2) continue;
    PipelineFold f;
    f.micro_batches = n;
    f.period = period;
    f.stride = stride;
    f.end = warm + periods * period;
    f.zone = warm + lag * period;
    f.copies = (m - n) / stride;
    if (!ExpandsTo(actions, f.end, period, stride, f.copies, full)) return std::nullopt;
    f.actions = std::move(actions);
    return f;
  }
  return std::nullopt;
}

int64_t SimulatedMicroBatches(const RunConfig& c, int64_t stage) {
  const ParallelismConfig& p = c.parallelism;
  const auto fold = FoldPipelineActions(p.pipeline_schedule, stage, p.pipeline,
                                        p.pipeline_virtual_stages, c.grad_accum_steps);
  return fold ? fold->micro_batches : c.grad_accum_steps;
}

StatusOr<PipelineStage> PlanPipelineStage(const Graph& g, const RunConfig& c, int64_t stage) {
  const ParallelismConfig& p = c.parallelism;
  const int64_t v = p.pipeline_virtual_stages;
  const int64_t blocks = static_cast<int64_t>(g.blocks.size());
  if (blocks == 0) return Refuse("the model has no repeated blocks to split into stages");
  if (blocks % (p.pipeline * v) != 0) {
    return Refuse(std::to_string(blocks) + " blocks do not split evenly into " +
                  std::to_string(p.pipeline) + " stages" +
                  (v > 1 ? " of " + std::to_string(v) + " model chunks" : std::string()));
  }
  MEMEST_ASSIGN_OR_RETURN(auto ranges, BlockRanges(g));
  PipelineStage out;
  out.stage = stage;
  out.holds_tied_embedding = (stage == 0 || stage == p.pipeline - 1) &&
                             TiedAcrossEnds(g, ranges.front().first, ranges.back().second);
  out.stages = p.pipeline;
  const int64_t per = blocks / (p.pipeline * v);
  // Chunk k of the stage is virtual stage k x pipeline + stage; the first virtual stage also runs
  // what precedes the blocks, the last what follows them.
  for (int64_t k = 0; k < v; ++k) {
    const int64_t vs = k * p.pipeline + stage;
    const int64_t first = vs * per, last_block = first + per - 1;
    const bool last = vs == p.pipeline * v - 1;
    const int lo = vs == 0 ? 0 : ranges[first].first;
    const int hi = last ? static_cast<int>(g.ops.size()) - 1 : ranges[last_block].second;
    MEMEST_ASSIGN_OR_RETURN(Graph slice, Slice(g, lo, hi, last));
    for (int64_t b = first; b <= last_block; ++b) slice.blocks.push_back(g.blocks[b]);
    if (v == 1) {
      out.graph = std::move(slice);
      out.chunks.push_back({0, static_cast<int>(out.graph.ops.size()) - 1, out.graph.loss, first,
                            last_block});
    } else {
      StageChunk chunk = Append(out.graph, slice);
      chunk.first_block = first;
      chunk.last_block = last_block;
      out.chunks.push_back(chunk);
    }
  }
  out.first_block = out.chunks.front().first_block;
  out.last_block = out.chunks.back().last_block;
  out.actions = ActionsOf(p.pipeline_schedule, stage, p.pipeline, v, c.grad_accum_steps);
  out.fold = FoldPipelineActions(p.pipeline_schedule, stage, p.pipeline, v, c.grad_accum_steps);
  out.keep_outputs = p.pipeline_keep_outputs;
  return out;
}

}  // namespace memest
