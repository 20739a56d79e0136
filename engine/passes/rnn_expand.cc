#include "engine/passes/rnn_expand.h"

#include "engine/passes/passes.h"

namespace memest {
namespace {

Status CheckFlag(const Op& op, const char* name, int64_t fallback, const std::string& field,
                 bool* out) {
  MEMEST_ASSIGN_OR_RETURN(int64_t v, IntAttr(op.attrs, name, fallback, field));
  if (v != 0 && v != 1) {
    return InvalidArgument(field + ".attrs." + name + ": must be 0 or 1, got " + std::to_string(v));
  }
  *out = v == 1;
  return Status::Ok();
}

Status CheckShape(const Tensor& t, const Shape& want, DType dtype, const std::string& field,
                  const char* what) {
  if (t.shape != want || t.dtype != dtype) {
    return InvalidArgument(field + ": " + what + " must be " + std::string(DTypeName(dtype)) + " " +
                           ShapeToString(want) + ", got " + std::string(DTypeName(t.dtype)) +
                           " " + ShapeToString(t.shape));
  }
  return Status::Ok();
}

// Builds PyTorch 1.13's CPU ops for one lstm / gru op (RNN.cpp: FullLayer /
// FullBidirectionalLayer with pre-computed input projections; LSTMCell, GRUCell).
class CpuRecurrent {
 public:
  CpuRecurrent(GraphBuilder& b, const RecurrentShape& s) : b_(b), s_(s) {}

  // ins: the op's inputs (ids in b). Returns output, h_n[, c_n].
  std::vector<int> Build(const std::vector<int>& ins, const std::vector<std::string>& names) {
    const int64_t ld = s_.layers * s_.dirs;
    const Shape state{ld, s_.batch, s_.hidden};
    const DType dt = b_.tensor(ins[0]).dtype;
    int h0, c0 = -1;
    if (s_.has_state) {
      h0 = ins[ins.size() - (s_.lstm ? 2 : 1)];
      if (s_.lstm) c0 = ins.back();
    } else {  // nn.LSTM.forward: torch.zeros for each state
      const Attrs zeros{{"shape", std::vector<int64_t>(state)}, {"dtype", std::string(DTypeName(dt))}};
      h0 = b_.Add1("full", {}, zeros);
      if (s_.lstm) c0 = b_.Add1("full", {}, zeros);
    }
    int layer_in = s_.batch_first ? Transpose(ins[0]) : ins[0];
    std::vector<int> hs = Unbind(h0, ld), cs = s_.lstm ? Unbind(c0, ld) : std::vector<int>{};
    std::vector<int> final_h(ld), final_c(ld);
    for (int64_t l = 0; l < s_.layers; ++l) {
      // FullLayer / FullBidirectionalLayer::operator(): a direction's projected inputs (and
      // the views unbind made of them) live until the layer returns, except that the forward
      // direction's are let go once the reverse direction's are made (the same variables are
      // reassigned). A view read at that point stands for them and allocates nothing.
      std::vector<int> dir_outs, pres;
      for (int64_t d = 0; d < s_.dirs; ++d) {
        const int k = s_.Weight(l, d);
        const int64_t i = l * s_.dirs + d;
        int h = hs[i], c = s_.lstm ? cs[i] : -1;
        pres.push_back(Linear(layer_in, ins, k, k + 2));  // every step's input projection
        const std::vector<int> steps = Unbind(pres.back(), s_.seq);
        if (d == 1) KeepAlive(pres[0]);
        dir_outs.push_back(Steps(steps, ins, k, d == 1, &h, &c));
        final_h[i] = h;
        if (s_.lstm) final_c[i] = c;
      }
      const int layer_out =
          dir_outs.size() == 1 ? dir_outs[0] : b_.Add1("cat", dir_outs, {{"dim", int64_t{2}}});
      KeepAlive(pres.back());
      KeepAlive(layer_in);  // apply_layer_stack's layer_input, reassigned once the layer returns
      layer_in = layer_out;
      if (s_.dropout > 0 && l + 1 < s_.layers) {
        layer_in = b_.Add1("dropout", {layer_in}, {{"p", s_.dropout}});
      }
    }
    std::vector<int> outs(s_.lstm ? 3 : 2, -1);
    if (s_.lstm) outs[2] = Stack(final_c, Name(names, 2));
    outs[1] = Stack(final_h, Name(names, 1));
    outs[0] = s_.batch_first ? Transpose(layer_in, Name(names, 0)) : layer_in;
    // One call: its caller holds the input and the states (given, or nn.LSTM.forward's zeros)
    // until it returns.
    KeepAlive(ins[0]);
    KeepAlive(h0);
    if (s_.lstm) KeepAlive(c0);
    return outs;
  }

 private:
  static std::vector<std::string> Name(const std::vector<std::string>& names, size_t k) {
    return k < names.size() && !names[k].empty() ? std::vector<std::string>{names[k]}
                                                  : std::vector<std::string>{};
  }

  int Transpose(int x, std::vector<std::string> name = {}) {
    std::vector<int> out = b_.Add("transpose", {x}, {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}},
                                  std::move(name));
    return out.empty() ? -1 : out[0];
  }

  // unbind(0): views [rest...] of each slice.
  std::vector<int> Unbind(int x, int64_t n) {
    std::vector<int> parts = b_.Add("split", {x}, {{"dim", int64_t{0}},
                                                   {"sizes", std::vector<int64_t>(n, 1)}});
    for (int& p : parts) p = b_.Add1("squeeze", {p}, {{"dim", int64_t{0}}});
    return parts;
  }

  // at::stack(xs, 0): a new [n, ...] tensor whose backward hands each input a view.
  int Stack(const std::vector<int>& xs, std::vector<std::string> name = {}) {
    std::vector<int> views;
    for (int x : xs) views.push_back(b_.Add1("unsqueeze", {x}, {{"dim", int64_t{0}}}));
    std::vector<int> out = b_.Add("cat", views, {{"dim", int64_t{0}}}, std::move(name));
    return out.empty() ? -1 : out[0];
  }

  int Linear(int x, const std::vector<int>& ins, int w, int bias) {
    std::vector<int> in{x, ins[w]};
    if (s_.bias) in.push_back(ins[bias]);
    return b_.Add1("linear", in, {});
  }

  std::vector<int> Chunks(int x, int n) {
    return b_.Add("split", {x}, {{"dim", int64_t{1}},
                                 {"sizes", std::vector<int64_t>(n, s_.hidden)}});
  }

  int Inplace(const char* kind, int x) { return b_.Add1(kind, {x}, {{"inplace", int64_t{1}}}); }

  void KeepAlive(int t) { b_.Add1("view", {t}, {{"shape", std::vector<int64_t>(b_.shape(t))}}); }

  // One direction of one layer over the whole sequence, from its projected step inputs; *h and
  // *c carry the state in and out. Returns the stacked outputs [T, B, H], in time order.
  int Steps(const std::vector<int>& steps, const std::vector<int>& ins, int k, bool reverse,
            int* h, int* c) {
    std::vector<int> outs(s_.seq, -1);
    for (int64_t n = 0; n < s_.seq && b_.ok(); ++n) {
      const int64_t t = reverse ? s_.seq - 1 - n : n;
      outs[t] = s_.lstm ? LstmCell(steps[t], ins, k, h, c) : GruCell(steps[t], ins, k, h);
    }
    return Stack(outs);
  }

  // LSTMCell: gates = linear_hh(h).add_(x_t); i, f, g, o = unsafe_chunk(4, 1); sigmoid_ (i, f,
  // o) and tanh_ (g) in place; cy = f * c + i * g; hy = o * tanh(cy).
  int LstmCell(int x_t, const std::vector<int>& ins, int k, int* h, int* c) {
    int gates = Linear(*h, ins, k + 1, k + 3);
    gates = b_.Add1("add_", {gates, x_t});
    std::vector<int> g = Chunks(gates, 4);
    if (g.size() != 4) return -1;
    const int ig = Inplace("sigmoid", g[0]), fg = Inplace("sigmoid", g[1]);
    const int cg = Inplace("tanh", g[2]), og = Inplace("sigmoid", g[3]);
    int cy = b_.Add1("mul", {fg, *c});
    cy = b_.Add1("add_", {cy, b_.Add1("mul", {ig, cg})});
    const int hy = b_.Add1("mul", {og, b_.Add1("tanh", {cy})});
    *h = hy;
    *c = cy;
    return hy;
  }

  // GRUCell: r = sigmoid_(hg0.add_(ig0)), z = sigmoid_(hg1.add_(ig1)),
  // n = tanh_(ig2 + hg2.mul_(r)), hy = (h - n).mul_(z).add_(n).
  int GruCell(int x_t, const std::vector<int>& ins, int k, int* h) {
    const std::vector<int> ig = Chunks(x_t, 3);
    const std::vector<int> hg = Chunks(Linear(*h, ins, k + 1, k + 3), 3);
    if (ig.size() != 3 || hg.size() != 3) return -1;
    const int r = Inplace("sigmoid", b_.Add1("add_", {hg[0], ig[0]}));
    const int z = Inplace("sigmoid", b_.Add1("add_", {hg[1], ig[1]}));
    const int n = Inplace("tanh", b_.Add1("add", {ig[2], b_.Add1("mul_", {hg[2], r})}));
    const int hy = b_.Add1("add_", {b_.Add1("mul_", {b_.Add1("sub", {*h, n}), z}), n});
    *h = hy;
    return hy;
  }

  GraphBuilder& b_;
  const RecurrentShape& s_;
};

}  // namespace

StatusOr<RecurrentShape> ReadRecurrent(const Op& op, const TensorPtrs& in,
                                       const std::string& field) {
  RecurrentShape s;
  s.lstm = op.kind == "lstm";
  auto input = [&](size_t i) { return field + ".inputs[" + std::to_string(i) + "]"; };
  MEMEST_ASSIGN_OR_RETURN(s.layers, IntAttr(op.attrs, "num_layers", 1, field));
  if (s.layers < 1 || s.layers > 4096) {
    return InvalidArgument(field + ".attrs.num_layers: must be in [1, 4096], got " +
                           std::to_string(s.layers));
  }
  bool bidirectional = false;
  MEMEST_RETURN_IF_ERROR(CheckFlag(op, "bidirectional", 0, field, &bidirectional));
  s.dirs = bidirectional ? 2 : 1;
  MEMEST_RETURN_IF_ERROR(CheckFlag(op, "batch_first", 0, field, &s.batch_first));
  MEMEST_RETURN_IF_ERROR(CheckFlag(op, "bias", 1, field, &s.bias));
  MEMEST_ASSIGN_OR_RETURN(s.dropout, FloatAttr(op.attrs, "dropout", 0.0, field));
  if (s.dropout < 0 || s.dropout >= 1) {
    return InvalidArgument(field + ".attrs.dropout: must be in [0, 1), got " +
                           std::to_string(s.dropout));
  }
  const Tensor& x = *in[0];
  if (x.shape.size() != 3 || !IsFloating(x.dtype)) {
    return InvalidArgument(input(0) + ": " + op.kind + " takes a floating [T, B, I] input (" +
                           "[B, T, I] with batch_first), got " + std::string(DTypeName(x.dtype)) +
                           " " + ShapeToString(x.shape));
  }
  s.seq = x.shape[s.batch_first ? 1 : 0];
  s.batch = x.shape[s.batch_first ? 0 : 1];
  s.input = x.shape[2];
  const int64_t weights = s.layers * s.dirs * (s.bias ? 4 : 2);
  const int64_t states = s.lstm ? 2 : 1;
  const int64_t extra = static_cast<int64_t>(in.size()) - 1 - weights;
  if (extra != 0 && extra != states) {
    return InvalidArgument(field + ".inputs: " + op.kind + " with " + std::to_string(s.layers) +
                           " layers, " + std::to_string(s.dirs) + " direction(s) and " +
                           (s.bias ? "biases" : "no biases") + " takes the input, " +
                           std::to_string(weights) + " weights and optionally " +
                           (s.lstm ? "h0 and c0" : "h0") + "; got " + std::to_string(in.size()) +
                           " inputs");
  }
  s.has_state = extra == states;
  const Tensor& w_hh = *in[2];
  if (w_hh.shape.size() != 2 || w_hh.shape[1] <= 0) {
    return InvalidArgument(input(2) + ": w_hh must be [G, H], got " + ShapeToString(w_hh.shape));
  }
  s.hidden = w_hh.shape[1];
  const int64_t gates = (s.lstm ? 4 : 3) * s.hidden;
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int k = s.Weight(l, d);
      const int64_t width = l == 0 ? s.input : s.dirs * s.hidden;
      MEMEST_RETURN_IF_ERROR(CheckShape(*in[k], {gates, width}, x.dtype, input(k), "w_ih"));
      MEMEST_RETURN_IF_ERROR(CheckShape(*in[k + 1], {gates, s.hidden}, x.dtype, input(k + 1), "w_hh"));
      if (!s.bias) continue;
      MEMEST_RETURN_IF_ERROR(CheckShape(*in[k + 2], {gates}, x.dtype, input(k + 2), "b_ih"));
      MEMEST_RETURN_IF_ERROR(CheckShape(*in[k + 3], {gates}, x.dtype, input(k + 3), "b_hh"));
    }
  }
  for (int64_t j = 0; s.has_state && j < states; ++j) {
    const size_t i = in.size() - states + j;
    MEMEST_RETURN_IF_ERROR(CheckShape(*in[i], {s.layers * s.dirs, s.batch, s.hidden}, x.dtype,
                                      input(i), j == 0 ? "h0" : "c0"));
  }
  return s;
}

bool HasRecurrent(const Graph& g) {
  for (const Op& op : g.ops) {
    if (op.kind == "lstm" || op.kind == "gru") return true;
  }
  return false;
}

StatusOr<Graph> ExpandRecurrentForCpu(const Graph& g) {
  StatusOr<Graph> out = ReplayGraph(g, [&g](int i, GraphBuilder& b, std::vector<int>& map) {
    const Op& op = g.ops[i];
    if (op.kind != "lstm" && op.kind != "gru") return false;
    TensorPtrs in;
    std::vector<int> ins;
    for (int t : op.inputs) {
      in.push_back(&g.tensors[t]);
      ins.push_back(map[t]);
    }
    const std::string field = "model.ops[" + std::to_string(i) + "]";
    StatusOr<RecurrentShape> s = ReadRecurrent(op, in, field);
    if (!s.ok()) {
      b.Fail(s.status());
      return true;
    }
    // About 20 ops a step (a cell's ops, its unbind view, its output's unsqueeze), per layer
    // and direction; refused before any is built when that passes kMaxExpandedOps.
    const int64_t units = s->layers * s->dirs;
    if (s->seq > kMaxExpandedOps / 20 / units) {
      b.Fail(InvalidArgument(field + ": " + op.kind + " over " + std::to_string(s->seq) +
                             " steps and " + std::to_string(units) + " layer direction(s) is " +
                             "more than " + std::to_string(kMaxExpandedOps) +
                             " ops on the cpu-1.13 runtime, which runs every step as its own ops"));
      return true;
    }
    std::vector<std::string> names;
    for (int t : op.outputs) names.push_back(g.tensors[t].name);
    std::vector<int> outs = CpuRecurrent(b, *s).Build(ins, names);
    for (size_t k = 0; k < op.outputs.size() && k < outs.size(); ++k) map[op.outputs[k]] = outs[k];
    return true;
  });
  if (!out.ok()) return out.status().Prefixed("cpu-1.13 recurrent layers: ");
  return out;
}

}  // namespace memest
