#include "services/common/service_host.h"

#include <signal.h>
#include <string.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "systemd/sd-daemon.h"

namespace tessera::services {
namespace {

// The signal that started (or should cut short) the drain, set by the
// signal-waiting thread.
std::atomic<int> g_signals_received{0};

absl::Status CheckReadable(const std::string& flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  return ReadFileForFlag(flag, path).status();
}

}  // namespace

absl::StatusOr<std::string> ReadFileForFlag(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    std::string why = err ? strerror(err) : "cannot open";
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("--", flag, "=", path, ": ", why));
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat("--", flag, "=", path, ": ", why));
    }
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": ", why));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": read error"));
  }
  return buffer.str();
}

absl::Status ValidateServerOptions(const ServerOptions& o) {
  if (o.listen_address.empty()) return absl::InvalidArgumentError("--listen must not be empty");
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (!o.tls_client_ca_file.empty() && o.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca (mTLS) needs --tls_cert and --tls_key");
  }
  if (auto s = CheckReadable("tls_cert", o.tls_cert_file); !s.ok()) return s;
  if (auto s = CheckReadable("tls_key", o.tls_key_file); !s.ok()) return s;
  if (auto s = CheckReadable("tls_client_ca", o.tls_client_ca_file); !s.ok()) return s;
  if (o.keepalive_time_ms <= 0 || o.keepalive_timeout_ms <= 0) {
    return absl::InvalidArgumentError("--keepalive_time_ms and --keepalive_timeout_ms must be > 0");
  }
  if (o.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_message_bytes must be > 0");
  }
  if (o.drain_deadline < absl::ZeroDuration() || o.drain_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_deadline and --drain_grace must be >= 0");
  }
  return absl::OkStatus();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

ServiceHost::ServiceHost(ServerOptions options)
    : options_(std::move(options)), metrics_(options_.service_name) {}

ServiceHost::~ServiceHost() {
  drain_.Finish();
  if (watchdog_.joinable()) watchdog_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

void ServiceHost::AddService(grpc::Service* service, std::string full_name) {
  services_.emplace_back(service, std::move(full_name));
}

absl::Status ServiceHost::Start() {
  if (auto s = ValidateServerOptions(options_); !s.ok()) return s;

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options_.tls_cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    auto cert = ReadFileForFlag("tls_cert", options_.tls_cert_file);
    auto key = ReadFileForFlag("tls_key", options_.tls_key_file);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options_.tls_client_ca_file.empty()) {
      auto ca = ReadFileForFlag("tls_client_ca", options_.tls_client_ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen_address, creds, &grpc_port_);
  // gRPC enables SO_REUSEPORT by default, which would let two processes
  // share a port silently; a port in use must be a start-up error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options_.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options_.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             std::min(options_.keepalive_time_ms, 10'000));
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  for (auto& [service, name] : services_) builder.RegisterService(service);

  server_ = builder.BuildAndStart();
  if (!server_ || grpc_port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen_address,
                                               " (port in use or address not local?)"));
  }
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  for (auto& [service, name] : services_) health->SetServingStatus(name, false);

  if (!options_.metrics_address.empty()) {
    if (auto s = metrics_.Start(options_.metrics_address); !s.ok()) {
      server_->Shutdown();
      server_.reset();
      return s;
    }
  }
  if (auto s = WritePortFile(); !s.ok()) return s;
  for (const auto& [key, port] : extra_ports_) LogInfo("listening", {{key, port}});
  LogInfo("listening", {{"grpc_port", grpc_port_},
                        {"metrics_port", metrics_.port()},
                        {"tls", options_.tls_cert_file.empty() ? "off" : "on"},
                        {"mtls", options_.tls_client_ca_file.empty() ? "off" : "on"}});
  return absl::OkStatus();
}

absl::Status ServiceHost::WritePortFile() const {
  if (options_.port_file.empty()) return absl::OkStatus();
  std::string tmp = options_.port_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "grpc_port=" << grpc_port_ << "\nmetrics_port=" << metrics_.port() << "\n";
    for (const auto& [key, port] : extra_ports_) out << key << "=" << port << "\n";
    if (!out)
      return absl::InvalidArgumentError(absl::StrCat("--port_file=", tmp, ": cannot write"));
  }
  if (::rename(tmp.c_str(), options_.port_file.c_str()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port_file=", options_.port_file, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

void ServiceHost::SetReady(bool ready) {
  if (!server_ || drain_.draining()) return;
  for (auto& [service, name] : services_) {
    server_->GetHealthCheckService()->SetServingStatus(name, ready);
  }
  metrics_.SetReady(ready);
  // systemd (Type=notify): ready only once preflight, loading and warm-up
  // passed. A no-op outside systemd (no NOTIFY_SOCKET).
  if (ready && !notified_ready_.exchange(true)) {
    sd_notifyf(0, "READY=1\nSTATUS=serving on port %d", grpc_port_);
    StartWatchdog();
  }
}

void ServiceHost::StartWatchdog() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  // Ping at half the watchdog period while the process runs its main loop.
  watchdog_ = std::thread([this, period = absl::Microseconds(usec / 2)] {
    while (!drain_.WaitFinishedFor(period)) sd_notify(0, "WATCHDOG=1");
  });
}

void ServiceHost::RequestDrain(absl::Duration deadline, std::string reason) {
  drain_.Begin(deadline, std::move(reason));
}

void ServiceHost::RequestFailureExit(std::string reason) {
  int expected = kExitClean;
  if (!exit_code_.compare_exchange_strong(expected, kExitServiceFailed)) return;
  LogError("the service failed for good; exiting so that it is restarted",
           {{"reason", reason}, {"exit_code", kExitServiceFailed}});
  // Out of service at once, before the drain loop notices.
  if (server_) {
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    for (auto& [service, name] : services_) health->SetServingStatus(name, false);
    health->SetServingStatus("", false);
  }
  metrics_.SetReady(false);
  drain_.Begin(std::min(options_.drain_deadline, kFailureDrainDeadline), std::move(reason));
}

void ServiceHost::WaitForDrainRequest() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Signals are polled with a short timeout so a Drain RPC (which sets the
  // drain state directly) also ends the wait.
  while (!drain_.draining()) {
    timespec timeout{0, 100'000'000};
    int sig = sigtimedwait(&set, nullptr, &timeout);
    if (sig > 0) {
      g_signals_received.fetch_add(1);
      drain_.Begin(options_.drain_deadline, sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
  }
}

int ServiceHost::RunUntilShutdown() {
  WaitForDrainRequest();
  LogInfo("draining", {{"reason", drain_.reason()},
                       {"in_flight", drain_.in_flight()},
                       {"deadline_s", absl::ToDoubleSeconds(drain_.deadline() - absl::Now())}});
  sd_notifyf(0, "STOPPING=1\nSTATUS=draining (%s)", drain_.reason().c_str());
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  for (auto& [service, name] : services_) health->SetServingStatus(name, false);
  metrics_.SetReady(false);
  metrics_.SetDraining(true);

  // A further signal during the drain cuts the deadline short.
  std::atomic<bool> done{false};
  std::thread signal_thread([this, &done] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    while (!done.load()) {
      timespec timeout{0, 100'000'000};
      if (sigtimedwait(&set, nullptr, &timeout) > 0) {
        LogWarning("second termination signal: ending the drain now");
        drain_.Begin(absl::ZeroDuration(), "second signal");
      }
    }
  });

  absl::SleepFor(std::min(options_.drain_grace, drain_.deadline() - absl::Now()));
  bool idle = false;
  while (!idle && absl::Now() < drain_.deadline()) {
    // Re-read the deadline: a second signal may shorten it.
    idle = drain_.WaitIdleUntil(std::min(drain_.deadline(), absl::Now() + absl::Milliseconds(100)));
  }
  const bool cut = !idle && drain_deadline_hook_;
  if (cut) {
    LogWarning("drain deadline passed; ending in-flight streams",
               {{"in_flight", drain_.in_flight()}});
    drain_deadline_hook_();
    idle = drain_.WaitIdleUntil(absl::Now() + kDrainCutGrace);
  }
  if (!idle) {
    LogWarning("drain deadline passed; cancelling in-flight calls",
               {{"in_flight", drain_.in_flight()}});
  }
  drain_.Finish();
  if (watchdog_.joinable()) watchdog_.join();
  // Streams that outlive ordinary work (load reports) end on Finish(); give
  // them a moment to send their final message before the server cancels.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  done.store(true);
  signal_thread.join();
  metrics_.Stop();
  const int code = exit_code_.load();  // kExitClean unless RequestFailureExit
  LogInfo("stopped", {{"clean", idle && !cut ? "true" : "false"}, {"exit_code", code}});
  return code;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsOptions& o) {
  if (o.ca_file.empty()) {
    if (!o.cert_file.empty() || !o.key_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs a CA file for TLS");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  auto ca = ReadFileForFlag("upstream_tls_ca", o.ca_file);
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!o.cert_file.empty()) {
    auto cert = ReadFileForFlag("upstream_tls_cert", o.cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadFileForFlag("upstream_tls_key", o.key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace tessera::services
