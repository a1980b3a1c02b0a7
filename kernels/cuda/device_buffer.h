// Device memory, streams, events, CUDA graphs and error handling for the CUDA
// kernels, behind plain C++ types (no CUDA header needed to include this).
//
// Every function returns absl::Status naming the CUDA call and the runtime's
// error string; nothing aborts. The current device is per host thread
// (cudaSetDevice): call SetDevice on every thread that uses a device.
//
// Thread-safety: DeviceBuffer, Stream, Event and CudaGraph are move-only
// owners without internal locking (one owner at a time); the free functions
// are safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"

struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;

namespace tessera::kernels::cuda {

// Number of CUDA devices visible to this process; 0 (not an error) when there
// is no driver or no device. `why_none` (optional) then says why.
int CudaDeviceCount(std::string* why_none = nullptr);

absl::Status SetDevice(int ordinal);

// The CUDA ordinal of the device with PCI bus id `pci_bus_id`
// ("0000:18:00.0"); NOT_FOUND when no visible device has it.
absl::StatusOr<int> DeviceOrdinalForPciBusId(std::string_view pci_bus_id);

// OK, or INTERNAL naming `what` and the runtime's error string when the last
// kernel launch on this thread failed (cudaGetLastError; clears the error).
absl::Status CheckLastLaunch(std::string_view what);

// cudaMemcpyAsync on `s`; the host side should be pinned for true overlap
// (pageable memory makes the copy synchronous with respect to the host).
absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, CudaStream s = nullptr);
absl::Status CopyToHost(void* dst, const void* src, size_t bytes, CudaStream s = nullptr);
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, CudaStream s = nullptr);
absl::Status MemsetDevice(void* dst, int value, size_t bytes, CudaStream s = nullptr);
// Copies `height` rows of `width` bytes from `src` on device `src_device`
// (rows `src_pitch` bytes apart) to `dst` on device `dst_device` (rows
// `dst_pitch` apart), peer to peer where the devices differ
// (cudaMemcpy3DPeerAsync: over NVLink with peer access, else staged by the
// driver); ordered on `s`, a stream of dst_device.
absl::Status CopyRowsBetweenDevices(void* dst, int dst_device, size_t dst_pitch, const void* src,
                                    int src_device, size_t src_pitch, size_t width, size_t height,
                                    CudaStream s);

// Waits for all work queued on `s` (nullptr: the legacy default stream).
absl::Status Synchronize(CudaStream s);
// Waits for all work on the current device.
absl::Status SynchronizeDevice();

// Owning device allocation (cudaMalloc: 256-byte aligned). Empty when
// default-constructed or moved from.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // bytes == 0 gives an empty buffer (data() == nullptr).
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Owning non-blocking stream.
class Stream {
 public:
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  static absl::StatusOr<Stream> Create();
  CudaStream get() const { return stream_; }

 private:
  CudaStream stream_ = nullptr;
};

// Owning CUDA event: timing (benchmarks) or, made with timing = false, an
// ordering point another stream (on any device) can wait for.
class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  static absl::StatusOr<Event> Create(bool timing = true);
  absl::Status Record(CudaStream s);
  // Work queued on `s` after this call waits until the work before the
  // event's last Record has completed (the event may be another device's).
  absl::Status WaitOn(CudaStream s) const;
  absl::Status Synchronize();
  // Milliseconds between two recorded (and completed) events.
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  CUevent_st* event_ = nullptr;
};

// Stream capture into an instantiated CUDA graph:
//   graph.BeginCapture(s); ...launch kernels on s...; graph.EndCapture();
//   graph.Launch(s);  // replays the captured work, reading buffers anew
// Kernels captured must not synchronize or allocate; the buffers they use
// must stay allocated while the graph may be launched.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Starts capturing `stream` (which must not be the legacy default stream).
  absl::Status BeginCapture(CudaStream stream);
  // Ends the capture and instantiates the graph (replacing any earlier one).
  absl::Status EndCapture();
  absl::Status Launch(CudaStream stream);
  bool instantiated() const { return exec_ != nullptr; }

 private:
  void Reset();
  CudaStream capturing_ = nullptr;
  CUgraph_st* graph_ = nullptr;
  CUgraphExec_st* exec_ = nullptr;
};

// Host conversions for tests and weight loading: fp32 -> bf16 round to
// nearest even (NaN stays a quiet NaN), and bf16 -> fp32 (exact).
Bf16 FloatToBf16(float f);
float Bf16ToFloat(Bf16 b);
absl::Status ConvertToBf16(const float* host, size_t n, std::vector<Bf16>* out);
absl::Status ConvertFromBf16(const Bf16* host, size_t n, std::vector<float>* out);

}  // namespace tessera::kernels::cuda
