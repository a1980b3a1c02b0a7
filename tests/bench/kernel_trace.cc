#include "tests/bench/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tessera::bench {
namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex mu;
std::vector<KernelRecord>* records = new std::vector<KernelRecord>();  // guarded by mu
bool enabled = false;                                                  // guarded by mu

absl::Status Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return absl::OkStatus();
  const char* text = "unknown";
  cuptiGetResultString(r, &text);
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelRecord> got;
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && a->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
    got.push_back({ShortKernelName(k->name), k->deviceId, k->start, k->end});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(mu);
  records->insert(records->end(), got.begin(), got.end());
}

// Index of the first '(' outside template brackets, or npos.
size_t ParameterListStart(const std::string& s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) return i;
  }
  return std::string::npos;
}

}  // namespace

std::string ShortKernelName(const char* name) {
  if (name == nullptr) return "?";
  std::string s = name;
  if (s.rfind("_Z", 0) == 0) {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) s = d;
    std::free(d);
  }
  s = absl::StrReplaceAll(s, {{"(anonymous namespace)::", ""}});
  if (const size_t p = ParameterListStart(s); p != std::string::npos) s.resize(p);
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // Drop the namespaces: the last "::" before the template arguments.
  const size_t lt = s.find('<');
  const size_t colons = s.rfind("::", lt == std::string::npos ? s.size() : lt);
  if (colons != std::string::npos) s.erase(0, colons + 2);
  if (s.size() > 96) s.resize(96);
  return s;
}

absl::Status KernelTrace::Enable() {
  std::lock_guard<std::mutex> lock(mu);
  if (enabled) return absl::OkStatus();
  if (auto s = Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
                     "cuptiActivityRegisterCallbacks");
      !s.ok())
    return s;
  if (auto s = Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
                     "cuptiActivityEnable(CONCURRENT_KERNEL)");
      !s.ok())
    return s;
  enabled = true;
  return absl::OkStatus();
}

uint64_t KernelTrace::Now() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Collect(uint64_t begin, uint64_t end) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!enabled) return absl::FailedPreconditionError("KernelTrace::Enable was not called");
  }
  if (auto s =
          Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      !s.ok())
    return s;
  std::vector<KernelRecord> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    all.swap(*records);
  }
  std::vector<KernelRecord> out;
  for (KernelRecord& r : all) {
    if (r.start_ns >= begin && r.start_ns < end) out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return a.device != b.device ? a.device < b.device : a.start_ns < b.start_ns;
  });
  return out;
}

nlohmann::json SummarizeKernels(const std::vector<KernelRecord>& records, int steps, int top,
                                double long_gap_us) {
  nlohmann::json devices = nlohmann::json::array();
  const double per = 1e-3 / std::max(steps, 1);  // ns in the window -> us per step
  size_t i = 0;
  while (i < records.size()) {
    const uint32_t device = records[i].device;
    size_t j = i;
    uint64_t busy = 0, short_gaps = 0, long_gaps = 0, reach = records[i].start_ns;
    std::map<std::string, std::pair<int64_t, uint64_t>> by_name;  // calls, ns
    std::map<std::string, uint64_t> gap_after;                    // short gaps after the kernel, ns
    for (; j < records.size() && records[j].device == device; ++j) {
      const KernelRecord& r = records[j];
      if (r.start_ns > reach) {
        const uint64_t gap = r.start_ns - reach;
        const bool is_long = gap > long_gap_us * 1e3;
        (is_long ? long_gaps : short_gaps) += gap;
        if (!is_long && j > i) gap_after[records[j - 1].name] += gap;
      }
      // Union of the intervals (kernels of other streams may overlap).
      const uint64_t from = std::max(r.start_ns, reach);
      if (r.end_ns > from) busy += r.end_ns - from;
      reach = std::max(reach, r.end_ns);
      auto& [calls, ns] = by_name[r.name];
      ++calls;
      ns += r.end_ns - r.start_ns;
    }
    std::vector<std::pair<std::string, std::pair<int64_t, uint64_t>>> sorted(by_name.begin(),
                                                                             by_name.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
      return a.second.second > b.second.second;
    });
    nlohmann::json kernels = nlohmann::json::array();
    int64_t rest_calls = 0;
    uint64_t rest_ns = 0;
    for (size_t k = 0; k < sorted.size(); ++k) {
      const auto& [name, cn] = sorted[k];
      if (static_cast<int>(k) < top) {
        kernels.push_back({{"name", name},
                           {"calls_per_step", static_cast<double>(cn.first) / std::max(steps, 1)},
                           {"us_per_step", cn.second * per},
                           {"us_per_call", 1e-3 * cn.second / cn.first},
                           {"gap_after_us_per_step", gap_after[name] * per}});
      } else {
        rest_calls += cn.first;
        rest_ns += cn.second;
      }
    }
    if (rest_calls > 0) {
      kernels.push_back({{"name", "(others)"},
                         {"calls_per_step", static_cast<double>(rest_calls) / std::max(steps, 1)},
                         {"us_per_step", rest_ns * per}});
    }
    devices.push_back({{"device", device},
                       {"kernels_per_step", static_cast<double>(j - i) / std::max(steps, 1)},
                       {"span_us_per_step", (reach - records[i].start_ns) * per},
                       {"busy_us_per_step", busy * per},
                       {"short_gap_us_per_step", short_gaps * per},
                       {"long_gap_us_per_step", long_gaps * per},
                       {"kernels", kernels}});
    i = j;
  }
  return devices;
}

}  // namespace tessera::bench
