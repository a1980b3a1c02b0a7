// Structured logging for every Tessera module: one line per event in logfmt
// (`ts=... level=info msg="..." key=value ...`) on stderr, so journald,
// kubectl logs and grep all read it.
//
// Thread-safety: every function is safe to call from any thread; each line
// is written with one write() so lines never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// One key=value field. Values are quoted when they contain spaces or quotes.
struct LogField {
  LogField(std::string_view k, std::string_view v) : key(k), value(v) {}
  LogField(std::string_view k, const char* v) : key(k), value(v) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  template <typename T>
  requires std::is_arithmetic_v<T> LogField(std::string_view k, T v)
      : key(k), value(absl::StrCat(v)) {}
  std::string_view key;
  std::string value;
};

// Sets the minimum level printed (default kInfo) and the `svc=` field added
// to every line (default empty = omitted).
void SetLogLevel(LogLevel level);
void SetLogService(std::string_view service);
// Parses "debug", "info", "warning", "error".
bool ParseLogLevel(std::string_view text, LogLevel* level);

void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields = {});

inline void LogDebug(std::string_view msg, std::initializer_list<LogField> f = {}) {
  Log(LogLevel::kDebug, msg, f);
}
inline void LogInfo(std::string_view msg, std::initializer_list<LogField> f = {}) {
  Log(LogLevel::kInfo, msg, f);
}
inline void LogWarning(std::string_view msg, std::initializer_list<LogField> f = {}) {
  Log(LogLevel::kWarning, msg, f);
}
inline void LogError(std::string_view msg, std::initializer_list<LogField> f = {}) {
  Log(LogLevel::kError, msg, f);
}

// Formats one line without printing it (used by tests).
std::string FormatLogLine(LogLevel level, std::string_view service, std::string_view msg,
                          std::initializer_list<LogField> fields);

}  // namespace tessera
