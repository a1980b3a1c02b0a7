#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <mutex>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
absl::Mutex g_service_mu;
std::string* g_service ABSL_GUARDED_BY(g_service_mu) = new std::string();

std::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void AppendValue(std::string* out, std::string_view v) {
  bool quote = v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      quote = true;
      break;
    }
  }
  if (!quote) {
    out->append(v);
    return;
  }
  out->push_back('"');
  for (char c : v) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

void SetLogService(std::string_view service) {
  absl::MutexLock lock(&g_service_mu);
  g_service->assign(service);
}

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (text == LevelName(l)) {
      *level = l;
      return true;
    }
  }
  return false;
}

std::string FormatLogLine(LogLevel level, std::string_view service, std::string_view msg,
                          std::initializer_list<LogField> fields) {
  std::string line;
  line.reserve(128);
  absl::StrAppend(
      &line, "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()));
  line.append(" level=");
  line.append(LevelName(level));
  if (!service.empty()) {
    line.append(" svc=");
    AppendValue(&line, service);
  }
  line.append(" msg=");
  AppendValue(&line, msg);
  for (const LogField& f : fields) {
    line.push_back(' ');
    line.append(f.key);
    line.push_back('=');
    AppendValue(&line, f.value);
  }
  line.push_back('\n');
  return line;
}

void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields) {
  if (static_cast<int>(level) < g_level.load(std::memory_order_relaxed)) return;
  std::string service;
  {
    absl::MutexLock lock(&g_service_mu);
    service = *g_service;
  }
  std::string line = FormatLogLine(level, service, msg, fields);
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
}

}  // namespace tessera
