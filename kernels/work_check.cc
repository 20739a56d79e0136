#include "kernels/work_check.h"

#include <climits>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/report/report.h"

namespace memest::kernels {

using validate::DevicePtr;
using validate::Work;
using validate::WorkKind;

namespace {

Status Positive(int64_t v, const char* field) {
  if (v > 0) return Status::Ok();
  return InvalidArgument(std::string(field) + ": must be positive, got " + std::to_string(v));
}

Status NonNegative(int64_t v, const char* field) {
  if (v >= 0) return Status::Ok();
  return InvalidArgument(std::string(field) + ": must be >= 0, got " + std::to_string(v));
}

// cuBLAS and cuDNN's legacy API count in int.
Status FitsInt(int64_t v, const char* field) {
  if (v <= INT_MAX) return Status::Ok();
  return FailedPrecondition(std::string(field) + ": " + std::to_string(v) +
                            " is more than the libraries' int dimensions hold (2^31 - 1)");
}

// Products of positive dimensions, in double so that absurd shapes cannot overflow int64
// (here or in BytesNeeded) before they are refused. BytesNeeded multiplies by the element size
// (up to 8, an elementwise int64/float64), so the bound is 2^56 elements (2^59 bytes at most):
// room to spare, and still far beyond any device.
Status ReasonableElements(std::initializer_list<int64_t> dims, const char* field) {
  double product = 1;
  for (int64_t d : dims) product *= static_cast<double>(d);
  if (product <= static_cast<double>(int64_t{1} << 56)) return Status::Ok();
  return InvalidArgument(std::string(field) + ": " + std::to_string(product) +
                         " elements, more than any device holds");
}

bool IsFloat(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

bool Overlap(DevicePtr a, int64_t an, DevicePtr b, int64_t bn) {
  return an > 0 && bn > 0 && a < b + static_cast<DevicePtr>(bn) &&
         b < a + static_cast<DevicePtr>(an);
}

Status CheckGemmShape(const validate::GemmShape& g) {
  MEMEST_RETURN_IF_ERROR(Positive(g.batch, "work.gemm.batch"));
  MEMEST_RETURN_IF_ERROR(Positive(g.m, "work.gemm.m"));
  MEMEST_RETURN_IF_ERROR(Positive(g.n, "work.gemm.n"));
  MEMEST_RETURN_IF_ERROR(Positive(g.k, "work.gemm.k"));
  MEMEST_RETURN_IF_ERROR(FitsInt(g.batch, "work.gemm.batch"));
  MEMEST_RETURN_IF_ERROR(FitsInt(g.m, "work.gemm.m"));
  MEMEST_RETURN_IF_ERROR(FitsInt(g.n, "work.gemm.n"));
  MEMEST_RETURN_IF_ERROR(FitsInt(g.k, "work.gemm.k"));
  MEMEST_RETURN_IF_ERROR(ReasonableElements({g.batch, g.m, g.k}, "work.gemm (A)"));
  MEMEST_RETURN_IF_ERROR(ReasonableElements({g.batch, g.k, g.n}, "work.gemm (B)"));
  return ReasonableElements({g.batch, g.m, g.n}, "work.gemm (C)");
}

Status CheckConvShape(const validate::ConvShape& c) {
  const std::pair<int64_t, const char*> positive[] = {
      {c.n, "work.conv.n"},          {c.c, "work.conv.c"},
      {c.h, "work.conv.h"},          {c.w, "work.conv.w"},
      {c.k, "work.conv.k"},          {c.r, "work.conv.r"},
      {c.s, "work.conv.s"},          {c.stride_h, "work.conv.stride_h"},
      {c.stride_w, "work.conv.stride_w"}, {c.dilation_h, "work.conv.dilation_h"},
      {c.dilation_w, "work.conv.dilation_w"}, {c.groups, "work.conv.groups"}};
  for (const auto& [v, field] : positive) {
    MEMEST_RETURN_IF_ERROR(Positive(v, field));
    MEMEST_RETURN_IF_ERROR(FitsInt(v, field));
  }
  MEMEST_RETURN_IF_ERROR(NonNegative(c.pad_h, "work.conv.pad_h"));
  MEMEST_RETURN_IF_ERROR(NonNegative(c.pad_w, "work.conv.pad_w"));
  MEMEST_RETURN_IF_ERROR(FitsInt(c.pad_h, "work.conv.pad_h"));
  MEMEST_RETURN_IF_ERROR(FitsInt(c.pad_w, "work.conv.pad_w"));
  if (c.c % c.groups != 0) {
    return InvalidArgument("work.conv.c: " + std::to_string(c.c) + " channels do not divide into " +
                           std::to_string(c.groups) + " groups");
  }
  if (c.k % c.groups != 0) {
    return InvalidArgument("work.conv.k: " + std::to_string(c.k) + " channels do not divide into " +
                           std::to_string(c.groups) + " groups");
  }
  // The extent itself, not only out_h()/out_w(): those divide with truncation toward zero, so
  // with stride > 1 a kernel up to stride - 1 rows larger than the padded input still gives 1
  // (h = 3, r = 4, stride 2: (3 - 3 - 1) / 2 + 1 = 1); PyTorch refuses such a shape.
  if (c.out_h() <= 0 || c.out_w() <= 0 || c.h + 2 * c.pad_h < c.dilation_h * (c.r - 1) + 1 ||
      c.w + 2 * c.pad_w < c.dilation_w * (c.s - 1) + 1) {
    return InvalidArgument("work.conv: the output would be empty (out_h " +
                           std::to_string(c.out_h()) + ", out_w " + std::to_string(c.out_w()) +
                           "): the dilated kernel is larger than the padded input");
  }
  MEMEST_RETURN_IF_ERROR(ReasonableElements({c.n, c.c, c.h, c.w}, "work.conv (x)"));
  MEMEST_RETURN_IF_ERROR(ReasonableElements({c.k, c.c, c.r, c.s}, "work.conv (w)"));
  return ReasonableElements({c.n, c.k, c.out_h(), c.out_w()}, "work.conv (y)");
}

// The operand count of each kind, as device.h's Work names them.
struct Arity {
  size_t min, max;
  const char* names;
};
Arity ArityOf(WorkKind kind) {
  switch (kind) {
    case WorkKind::kGemm: return {2, 2, "A, B"};
    case WorkKind::kConvForward: return {2, 2, "x, w"};
    case WorkKind::kConvBackwardData: return {2, 2, "dy, w"};
    case WorkKind::kConvBackwardFilter: return {2, 2, "x, dy"};
    case WorkKind::kElementwise: return {1, 3, "1 to 3 inputs"};
    default: return {1, 1, "the input"};
  }
}

bool MayRunInPlace(WorkKind kind) {
  return kind == WorkKind::kElementwise || kind == WorkKind::kSoftmax ||
         kind == WorkKind::kLayerNorm;
}

}  // namespace

std::string HexAddress(DevicePtr ptr) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(ptr));
  return buf;
}

Status CheckShape(const Work& work) {
  const char* kind = validate::WorkKindName(work.kind);
  if (work.kind != WorkKind::kElementwise && !IsFloat(work.dtype)) {
    return InvalidArgument(std::string("work.dtype: ") + kind +
                           " runs float32, float16 or bfloat16, got " +
                           std::string(DTypeName(work.dtype)));
  }
  switch (work.kind) {
    case WorkKind::kGemm:
      return CheckGemmShape(work.gemm);
    case WorkKind::kConvForward:
    case WorkKind::kConvBackwardData:
    case WorkKind::kConvBackwardFilter:
      return CheckConvShape(work.conv);
    case WorkKind::kElementwise:
      MEMEST_RETURN_IF_ERROR(Positive(work.elements, "work.elements"));
      return ReasonableElements({work.elements}, "work.elements");
    case WorkKind::kSoftmax:
    case WorkKind::kLayerNorm:
    case WorkKind::kReduce:
      MEMEST_RETURN_IF_ERROR(Positive(work.rows, "work.rows"));
      MEMEST_RETURN_IF_ERROR(Positive(work.cols, "work.cols"));
      return ReasonableElements({work.rows, work.cols}, "work.rows * work.cols");
  }
  return InvalidArgument("work.kind: unknown (" + std::to_string(static_cast<int>(work.kind)) +
                         ")");
}

Status CheckInsideAllocation(DevicePtr ptr, int64_t bytes, const AllocationMap& allocations,
                             const std::string& field) {
  if (ptr == 0) return InvalidArgument(field + ": null");
  auto it = allocations.upper_bound(ptr);  // the first allocation starting after ptr
  if (it != allocations.begin()) {
    --it;
    const DevicePtr end = it->first + static_cast<DevicePtr>(it->second);
    if (ptr + static_cast<DevicePtr>(bytes) <= end) return Status::Ok();
  }
  return InvalidArgument(field + ": " + FormatBytes(bytes) + " at " + HexAddress(ptr) +
                         " is not inside one live allocation of this device");
}

Status CheckOperands(const Work& work, const AllocationMap& allocations) {
  const Arity arity = ArityOf(work.kind);
  const char* kind = validate::WorkKindName(work.kind);
  if (work.inputs.size() < arity.min || work.inputs.size() > arity.max) {
    return InvalidArgument("work.inputs: " + std::string(kind) + " takes " + arity.names +
                           ", got " + std::to_string(work.inputs.size()) + " operand(s)");
  }
  const validate::WorkBytes need = validate::BytesNeeded(work);
  std::vector<std::string> names;
  for (size_t i = 0; i < work.inputs.size(); ++i) {
    names.push_back("work.inputs[" + std::to_string(i) + "]");
    MEMEST_RETURN_IF_ERROR(
        CheckInsideAllocation(work.inputs[i], need.inputs[i], allocations, names.back()));
  }
  MEMEST_RETURN_IF_ERROR(
      CheckInsideAllocation(work.output, need.output, allocations, "work.output"));
  // Float operands are read and written as T* (our kernels, cuBLAS, cuDNN); an address that is
  // not a multiple of the element size would fault (misaligned address), which kills the
  // context. Non-float elementwise runs as bytes and takes any address.
  if (IsFloat(work.dtype)) {
    const auto size = static_cast<DevicePtr>(DTypeSize(work.dtype));
    for (size_t i = 0; i <= work.inputs.size(); ++i) {
      const bool out = i == work.inputs.size();
      const DevicePtr p = out ? work.output : work.inputs[i];
      if (p % size != 0) {
        return InvalidArgument((out ? std::string("work.output") : names[i]) + ": " +
                               HexAddress(p) + " is not aligned to its " +
                               std::to_string(size) + "-byte " +
                               std::string(DTypeName(work.dtype)) + " elements");
      }
    }
  }
  MEMEST_RETURN_IF_ERROR(NonNegative(work.workspace_bytes, "work.workspace_bytes"));
  if (work.workspace_bytes > 0) {
    MEMEST_RETURN_IF_ERROR(CheckInsideAllocation(work.workspace, work.workspace_bytes, allocations,
                                                 "work.workspace"));
    if (work.kind == WorkKind::kGemm && work.workspace % 256 != 0) {
      return InvalidArgument("work.workspace: cuBLAS needs a 256-byte aligned workspace, got " +
                             HexAddress(work.workspace));
    }
  }

  for (size_t i = 0; i < work.inputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (work.inputs[i] != work.inputs[j] &&
          Overlap(work.inputs[i], need.inputs[i], work.inputs[j], need.inputs[j])) {
        return InvalidArgument(names[i] + ": overlaps " + names[j] +
                               " (inputs may share an address, not part of a range)");
      }
    }
    if (!Overlap(work.output, need.output, work.inputs[i], need.inputs[i])) continue;
    const bool in_place = MayRunInPlace(work.kind) && work.output == work.inputs[i] &&
                          need.output == need.inputs[i];
    if (!in_place) {
      return InvalidArgument("work.output: overlaps " + names[i] + "; " + kind +
                             (MayRunInPlace(work.kind)
                                  ? " runs in place only when the output is exactly the input"
                                  : " cannot run in place"));
    }
  }
  if (work.workspace_bytes > 0) {
    for (size_t i = 0; i < work.inputs.size(); ++i) {
      if (Overlap(work.workspace, work.workspace_bytes, work.inputs[i], need.inputs[i])) {
        return InvalidArgument("work.workspace: overlaps " + names[i]);
      }
    }
    if (Overlap(work.workspace, work.workspace_bytes, work.output, need.output)) {
      return InvalidArgument("work.workspace: overlaps work.output");
    }
  }
  return Status::Ok();
}

}  // namespace memest::kernels
