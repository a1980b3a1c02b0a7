// Helpers for integration tests that start the real Tessera binaries:
// spawning a process with its output captured to a file, waiting for its
// port file, signalling it and collecting its exit status, plus a minimal
// HTTP GET for metrics and Prometheus's API.
//
// Thread-safety: a TestProcess is used from one test thread.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::testing {

// Path of a built binary, e.g. BinaryPath("services/worker/tessera-worker").
std::string BinaryPath(const std::string& relative);
// A fresh temporary directory for this test.
std::string MakeTempDir();
// A TCP port on 127.0.0.1 that was free a moment ago.
int PickFreePort();

struct ExitInfo {
  bool exited = false;  // Normal exit (not killed by a signal).
  int code = -1;        // Exit code when exited.
  int signal = 0;       // Terminating signal otherwise.
};

class TestProcess {
 public:
  TestProcess() = default;
  ~TestProcess();  // Kills the process (SIGKILL) if it still runs.
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;

  // Starts `binary` with `args`; stdout and stderr go to `log_path`.
  absl::Status Start(const std::string& binary, const std::vector<std::string>& args,
                     const std::string& log_path);
  // Waits for a "key=value" port file written by --port_file.
  absl::StatusOr<std::map<std::string, int>> WaitForPortFile(const std::string& path,
                                                             absl::Duration timeout);
  void Signal(int sig);
  // Waits for exit; nullopt on timeout.
  std::optional<ExitInfo> Wait(absl::Duration timeout);
  bool running();
  pid_t pid() const { return pid_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<ExitInfo> exit_;
};

// Runs a binary to completion (with a timeout) and returns its exit status
// and combined output.
struct RunResult {
  ExitInfo exit;
  std::string output;
};
absl::StatusOr<RunResult> RunToCompletion(const std::string& binary,
                                          const std::vector<std::string>& args,
                                          absl::Duration timeout);

// A TCP connection to 127.0.0.1:port (the caller closes the descriptor).
absl::StatusOr<int> ConnectLoopback(int port);

// HTTP/1.0 GET on 127.0.0.1:port; returns the body when the status is 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path_and_query);

}  // namespace tessera::testing
