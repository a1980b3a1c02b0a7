// ServiceHost: the bootstrap every Tessera binary shares.
//
// It builds the gRPC server (listen address, TLS/mTLS from files, keepalive,
// message size limits), registers grpc.health.v1 (service "" = live, each
// full service name = ready) and server reflection, serves Prometheus
// metrics on their own port, and turns SIGTERM/SIGINT or a Drain request
// into a graceful drain:
//
//   readiness NOT_SERVING → grace period (load balancers notice; new work is
//   refused) → in-flight work finishes, up to the drain deadline → long-lived
//   streams end → server shutdown → RunUntilShutdown() returns 0.
//
// A second SIGTERM/SIGINT during the drain cuts the deadline to now.
//
// RequestFailureExit runs the same drain when the service has failed for
// good, with liveness NOT_SERVING too, and ends with exit code
// kExitServiceFailed (3, exit_codes.h) so that the supervisor restarts the
// process.
//
// Under systemd (Type=notify) it sends READY=1 when readiness first turns
// SERVING (after preflight, model load and warm-up), STOPPING=1 when the
// drain starts, and WATCHDOG=1 at half of WatchdogSec while running.
//
// Thread-safety: construct, AddService, Start and RunUntilShutdown on the
// main thread; SetReady, drain() and metrics() from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/common/drain.h"
#include "services/common/exit_codes.h"
#include "services/common/metrics.h"

namespace grpc {
class Service;
class ChannelCredentials;
}  // namespace grpc

namespace tessera::services {

struct ServerOptions {
  std::string service_name;                       // "worker", "router", "drafter".
  std::string listen_address = "127.0.0.1:0";     // host:port; port 0 = any free port.
  std::string metrics_address = "127.0.0.1:0";    // empty = no metrics endpoint.
  std::string tls_cert_file;                      // PEM; TLS when set (with key).
  std::string tls_key_file;                       // PEM private key.
  std::string tls_client_ca_file;                 // PEM; when set, clients need certs (mTLS).
  int keepalive_time_ms = 30'000;                 // HTTP/2 ping period.
  int keepalive_timeout_ms = 10'000;              // Ping ack deadline.
  int max_message_bytes = 64 << 20;               // Receive and send limit.
  absl::Duration drain_grace = absl::Seconds(1);  // NOT_SERVING before refusing.
  absl::Duration drain_deadline = absl::Seconds(30);
  std::string port_file;  // When set, "grpc_port=N\nmetrics_port=M\n" is written here.
};

// Validates options that can be checked before binding (files readable,
// sizes positive). Errors are one line naming the flag.
absl::Status ValidateServerOptions(const ServerOptions& options);

// Blocks SIGTERM and SIGINT in the calling thread so that every thread
// created afterwards inherits the mask and ServiceHost receives them
// synchronously. Call first thing in main().
void BlockTerminationSignals();

class ServiceHost {
 public:
  explicit ServiceHost(ServerOptions options);
  ~ServiceHost();
  ServiceHost(const ServiceHost&) = delete;
  ServiceHost& operator=(const ServiceHost&) = delete;

  // Registers a service; `full_name` (e.g. "tessera.v1.Worker") is its
  // readiness name in grpc.health.v1. REQUIRES: before Start().
  void AddService(grpc::Service* service, std::string full_name);

  // Binds the gRPC server and the metrics endpoint and writes the port file.
  // Readiness starts NOT_SERVING; liveness ("") is SERVING.
  absl::Status Start();

  // Adds "key=port" to the port file (and the "listening" log line), e.g. a
  // second listener the binary runs itself. REQUIRES: before Start().
  void AddPortFileEntry(std::string key, int port) {
    extra_ports_.emplace_back(std::move(key), port);
  }

  // Sets readiness of every registered service (ignored once draining).
  void SetReady(bool ready);

  // Blocks until a signal or a Drain request, drains, shuts down. Returns
  // the process exit code (0 after a clean drain, kExitServiceFailed after
  // RequestFailureExit).
  int RunUntilShutdown();

  // Called once when the drain deadline passes with calls still in flight,
  // before the server cancels them: it should end its open streams with a
  // final message. They get kDrainCutGrace to do so. REQUIRES: before
  // RunUntilShutdown.
  void SetDrainDeadlineHook(std::function<void()> cut) { drain_deadline_hook_ = std::move(cut); }
  static constexpr absl::Duration kDrainCutGrace = absl::Seconds(2);

  // Starts a drain from inside the process (the Drain RPC).
  void RequestDrain(absl::Duration deadline, std::string reason);

  // The service can no longer do its work (a worker whose model runner
  // failed for good): liveness and readiness turn NOT_SERVING, a drain of
  // at most kFailureDrainDeadline starts (the caller fails the work in
  // flight itself), and RunUntilShutdown returns kExitServiceFailed, so
  // that systemd (Restart=on-failure) or the kubelet starts the process
  // afresh. Any thread; later calls change nothing.
  void RequestFailureExit(std::string reason);
  static constexpr absl::Duration kFailureDrainDeadline = absl::Seconds(5);

  DrainState& drain() { return drain_; }
  MetricsServer& metrics() { return metrics_; }
  const ServerOptions& options() const { return options_; }
  int grpc_port() const { return grpc_port_; }

 private:
  absl::Status WritePortFile() const;
  void WaitForDrainRequest();
  void StartWatchdog();

  ServerOptions options_;
  DrainState drain_;
  MetricsServer metrics_;
  std::vector<std::pair<grpc::Service*, std::string>> services_;
  std::unique_ptr<grpc::Server> server_;
  int grpc_port_ = 0;
  std::atomic<bool> notified_ready_{false};
  std::atomic<int> exit_code_{kExitClean};
  std::thread watchdog_;  // systemd watchdog pings, when enabled
  std::function<void()> drain_deadline_hook_;
  std::vector<std::pair<std::string, int>> extra_ports_;
};

// Client-side credentials for connecting to another Tessera service: TLS
// when a CA file is given (plus a client certificate for mTLS), otherwise
// insecure. Errors name the unreadable file.
struct ClientTlsOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& options);

// Reads a whole file; NotFound/PermissionDenied name the path and the flag.
absl::StatusOr<std::string> ReadFileForFlag(const std::string& flag, const std::string& path);

}  // namespace tessera::services
