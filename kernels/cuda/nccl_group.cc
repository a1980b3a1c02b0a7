#include "kernels/cuda/nccl_group.h"

#include <nccl.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_libraries.h"

namespace tessera::kernels::cuda {
namespace {

absl::Status NcclError(ncclResult_t r, std::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  if (const std::string load = LastCudaLibraryError(); !load.empty()) {
    return absl::InternalError(absl::StrCat(std::string(what), ": ", load));
  }
  return absl::InternalError(absl::StrCat(std::string(what), ": ", ncclGetErrorString(r), " (",
                                          ncclGetLastError(nullptr), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::vector<int>& ordinals) {
  if (ordinals.empty()) return absl::InvalidArgumentError("NcclGroup needs at least one device");
  // Multicast (NVLS) stays off unless the operator decided otherwise.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(ordinals.size());
  std::vector<int> devs(ordinals.begin(), ordinals.end());
  if (auto s = NcclError(ncclCommInitAll(comms.data(), static_cast<int>(devs.size()), devs.data()),
                         "ncclCommInitAll");
      !s.ok()) {
    return s;
  }
  std::unique_ptr<NcclGroup> g(new NcclGroup);
  for (ncclComm_t c : comms) g->comms_.push_back(c);
  return g;
}

NcclGroup::~NcclGroup() {
  for (void* c : comms_) ncclCommDestroy(static_cast<ncclComm_t>(c));
}

absl::Status NcclGroup::AllReduceSum(int rank, void* data, int64_t count, DType dtype,
                                     CudaStream stream) {
  if (rank < 0 || rank >= size()) return absl::InvalidArgumentError("NCCL rank out of range");
  if (count == 0) return absl::OkStatus();
  return NcclError(
      ncclAllReduce(data, data, static_cast<size_t>(count),
                    dtype == DType::kBf16 ? ncclBfloat16 : ncclFloat32, ncclSum,
                    static_cast<ncclComm_t>(comms_[rank]), reinterpret_cast<cudaStream_t>(stream)),
      "ncclAllReduce");
}

std::string NcclGroup::Version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace tessera::kernels::cuda
