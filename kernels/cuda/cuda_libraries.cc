// cuBLASLt and NCCL, loaded with dlopen on first use instead of at program
// start.
//
// Why: a shared library linked at start-up puts its thread-local storage in
// the static TLS block that every thread's stack must hold. libcublasLt.so.13
// has 94 KB of TLS, so threads created with a small explicit stack (the
// metrics HTTP server's, for one) failed to start in every binary that links
// the CUDA backend, GPU or not. Loaded with dlopen, the libraries' TLS is
// dynamic and allocated per thread on demand; binaries also start on
// machines without these libraries and only a CUDA device run needs them.
//
// Each function below has the signature the toolkit header declares and
// forwards to the library's own symbol; when the library cannot be loaded,
// the call returns CUBLAS_STATUS_NOT_INITIALIZED / ncclSystemError and
// LastCudaLibraryError() says why (the dlerror text).
//
// Thread-safety: each symbol is resolved once (function-local statics).
#include <cublasLt.h>
#include <dlfcn.h>
#include <nccl.h>

#include <mutex>
#include <string>

#include "kernels/cuda/cuda_libraries.h"

namespace tessera::kernels::cuda {
namespace {

std::mutex g_mu;
std::string g_error;

void* Library(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    const char* e = dlerror();
    g_error = std::string("cannot load ") + soname + ": " + (e ? e : "unknown error") +
              " (is the CUDA toolkit's lib64 on LD_LIBRARY_PATH?)";
  }
  return handle;
}

void* Symbol(void* library, const char* name) {
  if (library == nullptr) return nullptr;
  void* fn = dlsym(library, name);
  if (fn == nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_error = std::string("symbol ") + name + " missing: " + dlerror();
  }
  return fn;
}

void* Cublas() {
  static void* lib = Library("libcublasLt.so.13");
  return lib;
}
void* Nccl() {
  static void* lib = Library("libnccl.so.2");
  return lib;
}

}  // namespace

std::string LastCudaLibraryError() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_error;
}

}  // namespace tessera::kernels::cuda

using tessera::kernels::cuda::Cublas;
using tessera::kernels::cuda::Nccl;
using tessera::kernels::cuda::Symbol;

// FORWARD(library, failure value, return type, name, (params), (args))
#define TESSERA_FORWARD(lib, fail, ret, name, params, args)    \
  extern "C" ret name params {                                 \
    using Fn = ret(*) params;                                  \
    static Fn fn = reinterpret_cast<Fn>(Symbol(lib(), #name)); \
    if (fn == nullptr) return fail;                            \
    return fn args;                                            \
  }

#define CUBLAS_FWD(name, params, args) \
  TESSERA_FORWARD(Cublas, CUBLAS_STATUS_NOT_INITIALIZED, cublasStatus_t, name, params, args)
#define NCCL_FWD(name, params, args) \
  TESSERA_FORWARD(Nccl, ncclSystemError, ncclResult_t, name, params, args)

CUBLAS_FWD(cublasLtCreate, (cublasLtHandle_t * h), (h))
CUBLAS_FWD(cublasLtDestroy, (cublasLtHandle_t h), (h))
TESSERA_FORWARD(Cublas, "cuBLASLt not loaded", const char*, cublasLtGetStatusName,
                (cublasStatus_t s), (s))
TESSERA_FORWARD(Cublas, "cuBLASLt not loaded", const char*, cublasLtGetStatusString,
                (cublasStatus_t s), (s))
CUBLAS_FWD(cublasLtMatmul,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
            cublasLtMatrixLayout_t Ad, const void* B, cublasLtMatrixLayout_t Bd, const void* beta,
            const void* C, cublasLtMatrixLayout_t Cd, void* D, cublasLtMatrixLayout_t Dd,
            const cublasLtMatmulAlgo_t* algo, void* ws, size_t ws_bytes, cudaStream_t stream),
           (h, d, alpha, A, Ad, B, Bd, beta, C, Cd, D, Dd, algo, ws, ws_bytes, stream))
CUBLAS_FWD(cublasLtMatrixLayoutCreate,
           (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),
           (l, t, rows, cols, ld))
CUBLAS_FWD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
CUBLAS_FWD(cublasLtMatmulDescCreate,
           (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))
CUBLAS_FWD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
CUBLAS_FWD(cublasLtMatmulDescSetAttribute,
           (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n),
           (d, a, buf, n))
CUBLAS_FWD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
CUBLAS_FWD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
CUBLAS_FWD(cublasLtMatmulPreferenceSetAttribute,
           (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* buf,
            size_t n),
           (p, a, buf, n))
CUBLAS_FWD(cublasLtMatmulAlgoGetHeuristic,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
            cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
            cublasLtMatmulPreference_t p, int requested, cublasLtMatmulHeuristicResult_t results[],
            int* returned),
           (h, d, A, B, C, D, p, requested, results, returned))
CUBLAS_FWD(cublasLtMatmulAlgoCheck,
           (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
            cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
            const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),
           (h, d, A, B, C, D, algo, result))
CUBLAS_FWD(cublasLtMatmulAlgoGetIds,
           (cublasLtHandle_t h, cublasComputeType_t c, cudaDataType_t s, cudaDataType_t A,
            cudaDataType_t B, cudaDataType_t C, cudaDataType_t D, int requested, int ids[],
            int* returned),
           (h, c, s, A, B, C, D, requested, ids, returned))
CUBLAS_FWD(cublasLtMatmulAlgoInit,
           (cublasLtHandle_t h, cublasComputeType_t c, cudaDataType_t s, cudaDataType_t A,
            cudaDataType_t B, cudaDataType_t C, cudaDataType_t D, int id,
            cublasLtMatmulAlgo_t* algo),
           (h, c, s, A, B, C, D, id, algo))
CUBLAS_FWD(cublasLtMatmulAlgoCapGetAttribute,
           (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t a, void* buf,
            size_t n, size_t* written),
           (algo, a, buf, n, written))
CUBLAS_FWD(cublasLtMatmulAlgoConfigSetAttribute,
           (cublasLtMatmulAlgo_t * algo, cublasLtMatmulAlgoConfigAttributes_t a, const void* buf,
            size_t n),
           (algo, a, buf, n))
CUBLAS_FWD(cublasLtMatmulAlgoConfigGetAttribute,
           (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t a, void* buf,
            size_t n, size_t* written),
           (algo, a, buf, n, written))

NCCL_FWD(ncclGetVersion, (int* v), (v))
NCCL_FWD(ncclCommInitAll, (ncclComm_t * comms, int n, const int* devs), (comms, n, devs))
NCCL_FWD(ncclCommDestroy, (ncclComm_t c), (c))
NCCL_FWD(ncclAllReduce,
         (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
          ncclComm_t comm, cudaStream_t stream),
         (send, recv, count, type, op, comm, stream))
TESSERA_FORWARD(Nccl, "NCCL not loaded", const char*, ncclGetErrorString, (ncclResult_t r), (r))
TESSERA_FORWARD(Nccl, "NCCL not loaded", const char*, ncclGetLastError, (ncclComm_t c), (c))
