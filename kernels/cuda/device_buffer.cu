// Device memory, streams, events and graphs (see device_buffer.h).
#include "kernels/cuda/device_buffer.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_common.cuh"

namespace tessera::kernels::cuda {

int CudaDeviceCount(std::string* why_none) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none != nullptr) {
      *why_none = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
    }
    cudaGetLastError();
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "cudaGetDeviceCount returned 0 devices";
  return count;
}

absl::Status SetDevice(int ordinal) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return absl::OkStatus();
}

absl::StatusOr<int> DeviceOrdinalForPciBusId(std::string_view pci_bus_id) {
  const std::string id(pci_bus_id);
  int ordinal = -1;
  const cudaError_t err = cudaDeviceGetByPCIBusId(&ordinal, id.c_str());
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::NotFoundError(absl::StrCat("no visible CUDA device has PCI bus id '", id,
                                            "': ", cudaGetErrorString(err)));
  }
  return ordinal;
}

absl::Status CheckLastLaunch(std::string_view what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaError(err, absl::StrCat("launch of ", std::string(what)));
}

absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, CudaStream s) {
  if (bytes == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, AsCuda(s)));
  return absl::OkStatus();
}

absl::Status CopyToHost(void* dst, const void* src, size_t bytes, CudaStream s) {
  if (bytes == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, AsCuda(s)));
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, CudaStream s) {
  if (bytes == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, AsCuda(s)));
  return absl::OkStatus();
}

absl::Status CopyRowsBetweenDevices(void* dst, int dst_device, size_t dst_pitch, const void* src,
                                    int src_device, size_t src_pitch, size_t width, size_t height,
                                    CudaStream s) {
  if (width == 0 || height == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr || width > dst_pitch || width > src_pitch) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyRowsBetweenDevices: null pointer or rows of ", width,
                     " bytes wider than their pitch (", src_pitch, " -> ", dst_pitch, ")"));
  }
  cudaMemcpy3DPeerParms p{};
  p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), src_pitch, width, height);
  p.srcDevice = src_device;
  p.dstPtr = make_cudaPitchedPtr(dst, dst_pitch, width, height);
  p.dstDevice = dst_device;
  p.extent = make_cudaExtent(width, height, 1);
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemcpy3DPeerAsync(&p, AsCuda(s)));
  return absl::OkStatus();
}

absl::Status MemsetDevice(void* dst, int value, size_t bytes, CudaStream s) {
  if (bytes == 0) return absl::OkStatus();
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, AsCuda(s)));
  return absl::OkStatus();
}

absl::Status Synchronize(CudaStream s) {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsCuda(s)));
  return absl::OkStatus();
}

absl::Status SynchronizeDevice() {
  TESSERA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

// ---- DeviceBuffer ----

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t err = cudaMalloc(&b.data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    b.data_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc(", bytes, " bytes) failed: ", cudaGetErrorString(err)));
  }
  b.size_ = bytes;
  return b;
}

// ---- Stream ----

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(AsCuda(stream_));
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(AsCuda(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

absl::StatusOr<Stream> Stream::Create() {
  Stream s;
  cudaStream_t raw = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  s.stream_ = reinterpret_cast<CudaStream>(raw);
  return s;
}

// ---- Event ----

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event_));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

absl::StatusOr<Event> Event::Create(bool timing) {
  Event e;
  cudaEvent_t raw = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&raw, timing ? cudaEventDefault : cudaEventDisableTiming));
  e.event_ = reinterpret_cast<CUevent_st*>(raw);
  return e;
}

absl::Status Event::Record(CudaStream s) {
  if (event_ == nullptr) return absl::FailedPreconditionError("Event::Record on an empty event");
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventRecord(reinterpret_cast<cudaEvent_t>(event_), AsCuda(s)));
  return absl::OkStatus();
}

absl::Status Event::WaitOn(CudaStream s) const {
  if (event_ == nullptr) return absl::FailedPreconditionError("Event::WaitOn on an empty event");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(AsCuda(s), reinterpret_cast<cudaEvent_t>(event_), 0));
  return absl::OkStatus();
}

absl::Status Event::Synchronize() {
  if (event_ == nullptr)
    return absl::FailedPreconditionError("Event::Synchronize on an empty event");
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(event_)));
  return absl::OkStatus();
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  if (start.event_ == nullptr || end.event_ == nullptr) {
    return absl::FailedPreconditionError("Event::ElapsedMs on an empty event");
  }
  float ms = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(
      &ms, reinterpret_cast<cudaEvent_t>(start.event_), reinterpret_cast<cudaEvent_t>(end.event_)));
  return ms;
}

// ---- CudaGraph ----

void CudaGraph::Reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}

CudaGraph::~CudaGraph() { Reset(); }

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : capturing_(std::exchange(other.capturing_, nullptr)),
      graph_(std::exchange(other.graph_, nullptr)),
      exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    Reset();
    capturing_ = std::exchange(other.capturing_, nullptr);
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

absl::Status CudaGraph::BeginCapture(CudaStream stream) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError("CUDA graph capture needs a created stream, not the default");
  }
  if (capturing_ != nullptr) return absl::FailedPreconditionError("capture already in progress");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(AsCuda(stream), cudaStreamCaptureModeThreadLocal));
  capturing_ = stream;
  return absl::OkStatus();
}

absl::Status CudaGraph::EndCapture() {
  if (capturing_ == nullptr)
    return absl::FailedPreconditionError("EndCapture without BeginCapture");
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(AsCuda(capturing_), &graph);
  capturing_ = nullptr;
  if (err != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return CudaError(err, "cudaStreamEndCapture (a captured call failed or synchronized)");
  }
  Reset();
  graph_ = reinterpret_cast<CUgraph_st*>(graph);
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = reinterpret_cast<CUgraphExec_st*>(exec);
  return absl::OkStatus();
}

absl::Status CudaGraph::Launch(CudaStream stream) {
  if (exec_ == nullptr) return absl::FailedPreconditionError("CudaGraph::Launch before EndCapture");
  TESSERA_CUDA_RETURN_IF_ERROR(
      cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec_), AsCuda(stream)));
  return absl::OkStatus();
}

// ---- conversions ----

Bf16 FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<Bf16>((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<Bf16>(x >> 16);
}

float Bf16ToFloat(Bf16 b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

absl::Status ConvertToBf16(const float* host, size_t n, std::vector<Bf16>* out) {
  if (out == nullptr || (host == nullptr && n > 0)) {
    return absl::InvalidArgumentError("ConvertToBf16: null pointer");
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) (*out)[i] = FloatToBf16(host[i]);
  return absl::OkStatus();
}

absl::Status ConvertFromBf16(const Bf16* host, size_t n, std::vector<float>* out) {
  if (out == nullptr || (host == nullptr && n > 0)) {
    return absl::InvalidArgumentError("ConvertFromBf16: null pointer");
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) (*out)[i] = Bf16ToFloat(host[i]);
  return absl::OkStatus();
}

}  // namespace tessera::kernels::cuda
