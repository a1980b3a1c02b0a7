#include "tests/integration/test_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera::testing {

std::string BinaryPath(const std::string& relative) {
  const char* dir = std::getenv("TESSERA_BINARY_DIR");
  return absl::StrCat(dir ? dir : ".", "/", relative);
}

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(base ? base : "/tmp", "/tessera-test-XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  return dir ? std::string(dir) : std::string("/tmp");
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

TestProcess::~TestProcess() {
  if (pid_ > 0 && !exit_) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(5));
  }
}

absl::Status TestProcess::Start(const std::string& binary, const std::vector<std::string>& args,
                                const std::string& log_path) {
  log_path_ = log_path;
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    // The test runner may block signals; the child starts with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  pid_ = pid;
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, int>> TestProcess::WaitForPortFile(const std::string& path,
                                                                        absl::Duration timeout) {
  absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    std::ifstream in(path);
    if (in) {
      std::map<std::string, int> ports;
      std::string line;
      while (std::getline(in, line)) {
        std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
        int value = 0;
        if (kv.size() == 2 && absl::SimpleAtoi(kv[1], &value)) ports[kv[0]] = value;
      }
      if (!ports.empty()) return ports;
    }
    if (!running()) {
      return absl::FailedPreconditionError(absl::StrCat("process exited early; log:\n", ReadLog()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no port file ", path, "; log:\n", ReadLog()));
}

void TestProcess::Signal(int sig) {
  if (pid_ > 0 && !exit_) kill(pid_, sig);
}

std::optional<ExitInfo> TestProcess::Wait(absl::Duration timeout) {
  if (exit_) return exit_;
  absl::Time until = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      ExitInfo info;
      info.exited = WIFEXITED(status);
      info.code = info.exited ? WEXITSTATUS(status) : -1;
      info.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      exit_ = info;
      return exit_;
    }
    if (absl::Now() >= until) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

bool TestProcess::running() { return pid_ > 0 && !Wait(absl::ZeroDuration()).has_value(); }

std::string TestProcess::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<RunResult> RunToCompletion(const std::string& binary,
                                          const std::vector<std::string>& args,
                                          absl::Duration timeout) {
  std::string log = MakeTempDir() + "/run.log";
  TestProcess p;
  if (auto s = p.Start(binary, args, log); !s.ok()) return s;
  auto exit = p.Wait(timeout);
  if (!exit) return absl::DeadlineExceededError(absl::StrCat(binary, " did not exit in time"));
  return RunResult{*exit, p.ReadLog()};
}

absl::StatusOr<int> ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path_and_query) {
  absl::StatusOr<int> connected = ConnectLoopback(port);
  if (!connected.ok()) return connected.status();
  const int fd = *connected;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string req = absl::StrCat("GET ", path_and_query, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) return absl::UnavailableError("no HTTP response");
  std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("HTTP status: ", status_line));
  }
  return response.substr(header_end + 4);
}

}  // namespace tessera::testing
