// Checks a Work before anything touches the GPU. A bad shape or pointer that reached a kernel
// would at best fail there and at worst fault, and a fault kills the CUDA context for the rest
// of the process; here it is an INVALID_ARGUMENT naming the field ("work.gemm.m: must be
// positive, got 0").
#ifndef MEMEST_KERNELS_WORK_CHECK_H_
#define MEMEST_KERNELS_WORK_CHECK_H_

#include <cstdint>
#include <map>
#include <string>

#include "engine/ir/status.h"
#include "validate/device.h"

namespace memest::kernels {

// Live allocations of a device: base address -> bytes.
using AllocationMap = std::map<validate::DevicePtr, int64_t>;

// The kind's shape and dtype: every dimension positive (pads >= 0), channels divisible by
// groups, a positive convolution output, sizes within what the libraries take (cuBLAS's int
// dimensions), dtype float32/float16/bfloat16 for every kind but elementwise (which runs any
// dtype, the others as bytes). Enough for WorkspaceBytes, which needs no operands.
Status CheckShape(const validate::Work& work);

// The operands: as many as the kind takes (gemm and convolutions 2, elementwise 1 to 3, the
// row kinds 1), each non-null, aligned to its element size (float dtypes), and, with the bytes
// BytesNeeded says, inside one live allocation; the workspace likewise when workspace_bytes > 0,
// and 256-byte aligned for cuBLAS. Inputs may share an address with each other (x * x); the
// output may be exactly an input only for elementwise, softmax and layer norm (in place); any
// other overlap, and any overlap with the workspace, is refused.
Status CheckOperands(const validate::Work& work, const AllocationMap& allocations);

// "0x7f3a00000000", for messages.
std::string HexAddress(validate::DevicePtr ptr);

// OK when [ptr, ptr + bytes) lies inside one live allocation; `field` names it in the error.
Status CheckInsideAllocation(validate::DevicePtr ptr, int64_t bytes,
                             const AllocationMap& allocations, const std::string& field);

}  // namespace memest::kernels

#endif  // MEMEST_KERNELS_WORK_CHECK_H_
