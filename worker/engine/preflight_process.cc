#include "worker/engine/preflight_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/log.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda_devices.h"
#if TESSERA_HAVE_CUDA
#include "worker/runner/cuda/cuda_preflight.h"
#endif

extern char** environ;

namespace tessera::engine {
namespace {

constexpr absl::string_view kResultPrefix = "tessera-preflight: ";

// The child's preflight: the parent's devices and selection, made again.
absl::Status RunPreflight(absl::string_view selector, int tp,
                          const kernels::BackendOverrides& backends) {
  auto devices = kernels::ResolveDevices(std::string_view(selector.data(), selector.size()), tp);
  if (!devices.ok()) return devices.status();
  auto report = kernels::BuiltinRegistry().SelectAll(devices->front(), backends);
  if (!report.ok()) return report.status();
  return PreflightDevices(*devices, *report);
}

}  // namespace

absl::Status PreflightDevices(const std::vector<kernels::DeviceDescription>& devices,
                              const kernels::SelectionReport& report) {
  if (devices.empty()) return absl::InvalidArgumentError("preflight: no device");
  if (devices.front().kind == kernels::DeviceKind::kCuda) {
#if TESSERA_HAVE_CUDA
    for (const kernels::DeviceDescription& d : devices) {
      if (auto s = runner::PreflightCudaKernels(d, report); !s.ok()) return s;
    }
    return absl::OkStatus();
#else
    return absl::FailedPreconditionError("this binary was built without the CUDA backend");
#endif
  }
  auto cpu = kernels::CpuKernelsFor(report);
  if (!cpu.ok()) return cpu.status();
  return kernels::PreflightCpuKernels(*cpu, kernels::CpuContextFor(devices.front(), nullptr));
}

std::string PreflightResultLine(const absl::Status& s) {
  if (s.ok()) return absl::StrCat(kResultPrefix, "ok\n");
  return absl::StrCat(kResultPrefix, "error ", static_cast<int>(s.code()), " ",
                      absl::StrReplaceAll(s.message(), {{"\n", " "}, {"\r", " "}}), "\n");
}

absl::StatusOr<bool> ParsePreflightChildOutput(absl::string_view out) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::ConsumePrefix(&line, kResultPrefix)) continue;
    if (line == "ok") return true;
    if (!absl::ConsumePrefix(&line, "error ")) continue;
    const size_t space = line.find(' ');
    int code = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(line.substr(0, space), &code) ||
        code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      continue;
    }
    return absl::Status(static_cast<absl::StatusCode>(code), line.substr(space + 1));
  }
  return false;
}

int RunPreflightChildIfAsked(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], kPreflightChildArg) != 0) return -1;
  absl::Status s;
  int tp = 0;
  kernels::BackendOverrides backends;
  if (argc < 4 || !absl::SimpleAtoi(argv[3], &tp)) {
    s = absl::InvalidArgumentError(absl::StrCat("usage: ", argv[0], " ", kPreflightChildArg,
                                                " DEVICE TENSOR_PARALLEL_SIZE [FLAG=BACKEND ...]"));
  }
  for (int i = 4; s.ok() && i < argc; ++i) {
    std::vector<std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      s = absl::InvalidArgumentError(
          absl::StrCat("backend override '", argv[i], "' is not flag=backend"));
      break;
    }
    backends[kv[0]] = kv[1];
  }
  if (s.ok()) s = RunPreflight(argv[2], tp, backends);
  const std::string line = PreflightResultLine(s);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
  return s.ok() ? 0 : 1;
}

absl::StatusOr<bool> PreflightInChildProcess(absl::string_view device_selector,
                                             int tensor_parallel_size,
                                             const kernels::BackendOverrides& backends,
                                             const std::string& executable) {
  std::vector<std::string> args = {"tessera-preflight", kPreflightChildArg,
                                   std::string(device_selector),
                                   absl::StrCat(tensor_parallel_size)};
  for (const auto& [flag, value] : backends) args.push_back(absl::StrCat(flag, "=", value));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {  // no other child of this process inherits it
    LogWarning("preflight process: no pipe", {{"error", std::strerror(errno)}});
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, out[1]);
  // The child starts with no signal blocked (the worker blocks SIGTERM and
  // SIGINT to handle them on a thread of its own) and default handlers.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, executable.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    LogWarning("preflight process: could not start",
               {{"program", executable}, {"error", std::strerror(spawned)}});
    return false;
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  absl::StatusOr<bool> result = ParsePreflightChildOutput(text);
  if (result.ok() && !*result) {
    LogWarning("preflight process gave no result; preflighting in this process",
               {{"exit", WIFEXITED(status) ? WEXITSTATUS(status) : -1},
                {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0}});
  }
  return result;
}

}  // namespace tessera::engine
