// `tessera up`: starts a local cluster on loopback — N workers, a drafter
// and a router pointed at the workers — waits until every service is ready,
// prints the endpoints, and runs until SIGINT/SIGTERM, then drains and stops
// them all. Options can come from one file with --flagfile=cluster.flags.
//
// A worker that exits with kExitServiceFailed (its model runner failed for
// good) or is killed by a signal (a crash, the OOM killer, kill -9) is
// started again on the same ports, as systemd (Restart=on-failure) or the
// kubelet would restart it, so the router finds it where it was; up to
// kMaxRestarts times in kRestartWindow per worker. Any other exit of a
// service stops the cluster.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "services/cli/commands.h"
#include "services/common/exit_codes.h"

ABSL_FLAG(int, workers, 1, "up: number of workers");
ABSL_FLAG(std::string, up_model, "", "up: model directory the workers serve");
ABSL_FLAG(std::string, up_simulate, "",
          "up: run simulated workers with this cost spec instead of a model (see tessera-worker "
          "--simulate)");
ABSL_FLAG(std::string, up_tokenizer, "", "up: tokenizer directory for the router; default: model");
ABSL_FLAG(int, router_port, 0, "up: router gRPC port on 127.0.0.1 (0 = any free port)");
ABSL_FLAG(std::string, bin_dir, "", "up: where the service binaries are; default: next to tessera");
ABSL_FLAG(std::string, run_dir, "", "up: where logs and port files go; default: a temp dir");
ABSL_FLAG(std::vector<std::string>, worker_args, {},
          "up: extra flags for every worker (comma-separated)");
ABSL_FLAG(std::vector<std::string>, router_args, {}, "up: extra flags for the router");
ABSL_FLAG(std::string, up_draft_source, "",
          "up: speculative decoding: the drafter's source (ngram, suffix or model) and the "
          "workers verify its proposals; empty = the drafter runs but no worker uses it");
ABSL_FLAG(std::string, up_draft_model, "",
          "up: the drafter's draft model (--up_draft_source=model)");
ABSL_FLAG(absl::Duration, ready_timeout, absl::Seconds(120), "up: how long to wait for readiness");

namespace tessera::cli {
namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

constexpr int kMaxRestarts = 3;
constexpr absl::Duration kRestartWindow = absl::Minutes(10);

struct Child {
  std::string name;
  pid_t pid = -1;
  int exit_status = -1;  // set once reaped
  std::string port_file;
  std::string log;
  std::map<std::string, int> ports;
  // What Spawn started, for a restart.
  std::string binary;
  std::vector<std::string> args;
  std::deque<absl::Time> restarts;  // within kRestartWindow
};

std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  return path.substr(0, path.rfind('/'));
}

// A binary next to tessera (installed layout) or in the build tree.
std::string FindBinary(const std::string& name, const std::string& service_dir) {
  std::string dir = absl::GetFlag(FLAGS_bin_dir).empty() ? SelfDir() : absl::GetFlag(FLAGS_bin_dir);
  for (const std::string& candidate :
       {absl::StrCat(dir, "/", name), absl::StrCat(dir, "/../", service_dir, "/", name)}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Starts `binary` with `args`, its output to c.log (appended to with
// `append`, e.g. after a restart).
bool Spawn(Child& c, const std::string& binary, std::vector<std::string> args,
           bool append = false) {
  c.binary = binary;
  c.args = args;
  c.exit_status = -1;
  args.insert(args.begin(), binary);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    FILE* log = std::fopen(c.log.c_str(), append ? "a" : "w");
    if (log) {
      dup2(fileno(log), STDOUT_FILENO);
      dup2(fileno(log), STDERR_FILENO);
    }
    setpgid(0, 0);  // a terminal's Ctrl-C reaches `tessera up`, which drains the rest
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  c.pid = pid;
  return true;
}

bool ReadPorts(Child& c) {
  std::ifstream in(c.port_file);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    int v;
    if (kv.size() == 2 && absl::SimpleAtoi(kv[1], &v)) c.ports[kv[0]] = v;
  }
  return c.ports.count("grpc_port") > 0;
}

// True while the child runs; reaps it (keeping its status) once it exited.
bool Alive(Child& c) {
  if (c.pid <= 0) return false;
  int status = 0;
  if (waitpid(c.pid, &status, WNOHANG) == 0) return true;
  c.exit_status = status;
  c.pid = -1;
  return false;
}

// Waits for readiness with `tessera health`.
bool WaitReady(const Child& c, const std::string& service, absl::Duration timeout) {
  std::string cmd = absl::StrCat(
      SelfDir(), "/tessera health --target=127.0.0.1:", c.ports.at("grpc_port"),
      " --service=", service, " --wait=", absl::ToInt64Seconds(timeout), "s > /dev/null 2>&1");
  return std::system(cmd.c_str()) == 0;
}

// Why a worker's exit calls for a restart ("" when it does not): it exited
// with kExitServiceFailed, or a signal killed it.
std::string RestartReason(const Child& c) {
  if (c.name.rfind("worker-", 0) != 0) return "";
  if (WIFEXITED(c.exit_status) && WEXITSTATUS(c.exit_status) == services::kExitServiceFailed) {
    return absl::StrCat("exited with code ", services::kExitServiceFailed,
                        " (its model runner failed for good)");
  }
  if (WIFSIGNALED(c.exit_status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(c.exit_status), " (",
                        strsignal(WTERMSIG(c.exit_status)), ")");
  }
  return "";
}

// A worker whose exit has a RestartReason: started again with the ports it
// had (the router knows it by its address), unless it was restarted
// kMaxRestarts times within kRestartWindow already. False when it is not
// restarted.
bool RestartFailedWorker(Child& c) {
  const std::string reason = RestartReason(c);
  if (reason.empty()) return false;
  const absl::Time now = absl::Now();
  while (!c.restarts.empty() && now - c.restarts.front() > kRestartWindow) c.restarts.pop_front();
  if (static_cast<int>(c.restarts.size()) >= kMaxRestarts) {
    std::fprintf(stderr, "error: %s failed again after %d restarts within %s; log %s\n",
                 c.name.c_str(), kMaxRestarts, absl::FormatDuration(kRestartWindow).c_str(),
                 c.log.c_str());
    return false;
  }
  std::vector<std::string> args = c.args;
  for (std::string& a : args) {
    if (a.rfind("--listen=", 0) == 0) {
      a = absl::StrCat("--listen=127.0.0.1:", c.ports["grpc_port"]);
    } else if (a.rfind("--metrics_listen=", 0) == 0 && c.ports.count("metrics_port") > 0) {
      a = absl::StrCat("--metrics_listen=127.0.0.1:", c.ports["metrics_port"]);
    }
  }
  c.restarts.push_back(now);
  std::fprintf(stderr,
               "%s %s; restarting it on port %d (restart %zu of at most %d within %s); log %s\n",
               c.name.c_str(), reason.c_str(), c.ports["grpc_port"], c.restarts.size(),
               kMaxRestarts, absl::FormatDuration(kRestartWindow).c_str(), c.log.c_str());
  std::fflush(stderr);
  return Spawn(c, c.binary, args, /*append=*/true);
}

int StopAll(std::vector<Child>& children) {
  // Router first (stop taking requests), then the rest.
  int failures = 0;
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    int status = it->exit_status;
    if (it->pid > 0) {
      kill(it->pid, SIGTERM);
      waitpid(it->pid, &status, 0);
    }
    if (status == -1) continue;  // never started
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "%s exited with status %d (log: %s)\n", it->name.c_str(), status,
                   it->log.c_str());
      ++failures;
    }
    it->pid = -1;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int RunUp(const std::vector<char*>&) {
  const int n = absl::GetFlag(FLAGS_workers);
  const std::string model = absl::GetFlag(FLAGS_up_model);
  const std::string simulate = absl::GetFlag(FLAGS_up_simulate);
  if (n < 1) return std::fprintf(stderr, "error: --workers must be >= 1\n"), 2;
  if (model.empty() == simulate.empty()) {
    return std::fprintf(stderr, "error: give exactly one of --up_model and --up_simulate\n"), 2;
  }
  std::string worker_bin = FindBinary("tessera-worker", "worker");
  std::string router_bin = FindBinary("tessera-router", "router");
  std::string drafter_bin = FindBinary("tessera-drafter", "drafter");
  if (worker_bin.empty() || router_bin.empty() || drafter_bin.empty()) {
    return std::fprintf(stderr, "error: service binaries not found; pass --bin_dir\n"), 2;
  }
  std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty()) {
    char tmpl[] = "/tmp/tessera-up-XXXXXX";
    run_dir = mkdtemp(tmpl);
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);

  std::vector<Child> children;
  auto common = [&](Child& c) {
    c.port_file = absl::StrCat(run_dir, "/", c.name, ".ports");
    c.log = absl::StrCat(run_dir, "/", c.name, ".log");
    return std::vector<std::string>{"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                    "--port_file=" + c.port_file};
  };
  // The drafter first: workers that speculate connect to it.
  const std::string draft_source = absl::GetFlag(FLAGS_up_draft_source);
  {
    Child c{"drafter"};
    std::vector<std::string> args = common(c);
    if (!draft_source.empty()) {
      args.push_back("--draft_source=" + draft_source);
      if (!absl::GetFlag(FLAGS_up_draft_model).empty()) {
        args.push_back("--model=" + absl::GetFlag(FLAGS_up_draft_model));
      }
    }
    if (!Spawn(c, drafter_bin, args)) return 1;
    children.push_back(c);
  }
  std::string drafter_addr;
  if (!draft_source.empty()) {
    Child& d = children.back();
    const absl::Time until = absl::Now() + absl::GetFlag(FLAGS_ready_timeout);
    while (!ReadPorts(d)) {
      if (!Alive(d) || absl::Now() > until || g_stop) {
        std::fprintf(stderr, "error: drafter did not start; log %s\n", d.log.c_str());
        return StopAll(children), 1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    drafter_addr = absl::StrCat("127.0.0.1:", d.ports["grpc_port"]);
  }
  for (int i = 0; i < n; ++i) {
    Child c{absl::StrCat("worker-", i)};
    std::vector<std::string> args = common(c);
    args.push_back(model.empty() ? "--simulate=" + simulate : "--model=" + model);
    if (!drafter_addr.empty()) args.push_back("--drafter=" + drafter_addr);
    for (const std::string& a : absl::GetFlag(FLAGS_worker_args)) args.push_back(a);
    if (!Spawn(c, worker_bin, args)) return std::fprintf(stderr, "error: fork failed\n"), 1;
    children.push_back(c);
  }
  // Wait for the workers' ports, then start the router pointed at them.
  absl::Time until = absl::Now() + absl::GetFlag(FLAGS_ready_timeout);
  for (Child& c : children) {
    while (!ReadPorts(c)) {
      if (!Alive(c) || absl::Now() > until || g_stop) {
        std::fprintf(stderr, "error: %s did not start; log %s\n", c.name.c_str(), c.log.c_str());
        return StopAll(children), 1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::vector<std::string> worker_addrs;
  for (int i = 0; i < n; ++i) {
    worker_addrs.push_back(
        absl::StrCat("127.0.0.1:", children[i + 1].ports["grpc_port"]));  // [0] = drafter
  }
  {
    Child c{"router"};
    std::vector<std::string> args = common(c);
    if (absl::GetFlag(FLAGS_router_port) > 0) {
      args[0] = absl::StrCat("--listen=127.0.0.1:", absl::GetFlag(FLAGS_router_port));
    }
    args.push_back("--workers=" + absl::StrJoin(worker_addrs, ","));
    std::string tok =
        absl::GetFlag(FLAGS_up_tokenizer).empty() ? model : absl::GetFlag(FLAGS_up_tokenizer);
    // The model directory's tokenizer when it has one (else token ids only).
    if (!tok.empty() && (!absl::GetFlag(FLAGS_up_tokenizer).empty() ||
                         access((tok + "/tokenizer.json").c_str(), R_OK) == 0)) {
      args.push_back("--tokenizer=" + tok);
    }
    for (const std::string& a : absl::GetFlag(FLAGS_router_args)) args.push_back(a);
    if (!Spawn(c, router_bin, args)) return StopAll(children), 1;
    children.push_back(c);
    while (!ReadPorts(children.back())) {
      if (!Alive(children.back()) || absl::Now() > until || g_stop) {
        std::fprintf(stderr, "error: router did not start; log %s\n", children.back().log.c_str());
        return StopAll(children), 1;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  for (Child& c : children) {
    std::string service = c.name == "router"    ? "tessera.v1.Inference"
                          : c.name == "drafter" ? "tessera.v1.Drafter"
                                                : "tessera.v1.Worker";
    if (!WaitReady(c, service, until - absl::Now())) {
      std::fprintf(stderr, "error: %s is not ready; log %s\n", c.name.c_str(), c.log.c_str());
      return StopAll(children), 1;
    }
  }
  std::printf("cluster ready (logs in %s)\n", run_dir.c_str());
  for (const Child& c : children) {
    std::printf("  %-10s grpc 127.0.0.1:%d  metrics http://127.0.0.1:%d/metrics\n", c.name.c_str(),
                c.ports.at("grpc_port"),
                c.ports.count("metrics_port") ? c.ports.at("metrics_port") : 0);
  }
  std::printf("router=127.0.0.1:%d\n", children.back().ports.at("grpc_port"));
  std::fflush(stdout);
  while (!g_stop) {
    for (Child& c : children) {
      if (!Alive(c) && !RestartFailedWorker(c)) {
        std::fprintf(stderr, "error: %s exited; log %s\n", c.name.c_str(), c.log.c_str());
        g_stop = 1;
      }
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("stopping\n");
  return StopAll(children);
}

}  // namespace tessera::cli
