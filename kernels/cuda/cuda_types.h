// Plain C++ names for CUDA types, so that headers of the CUDA kernels can be
// included by code that is compiled without the CUDA toolkit.
//
// Thread-safety: type aliases only.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace tessera::kernels::cuda {

// A cudaStream_t (nullptr = the legacy default stream).
using CudaStream = CUstream_st*;

// Device bf16 storage: the raw 16-bit pattern (the top half of an fp32).
using Bf16 = uint16_t;

}  // namespace tessera::kernels::cuda
