// The CUDA toolkit libraries Tessera loads on first use (cuBLASLt, NCCL;
// see cuda_libraries.cc for why they are not linked at start-up).
//
// Thread-safety: safe from any thread.
#pragma once

#include <string>

namespace tessera::kernels::cuda {

// Why the last library or symbol failed to load ("" when none did).
std::string LastCudaLibraryError();

}  // namespace tessera::kernels::cuda
