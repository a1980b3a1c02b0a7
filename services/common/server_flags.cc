#include "services/common/server_flags.h"

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "base/log.h"
#include "services/common/exit_codes.h"
#include "services/common/version.h"
#include "systemd/sd-daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC listen address host:port (port 0 = any free)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address host:port; empty disables it");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate; enables TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA that client certificates must chain to (mTLS)");
ABSL_FLAG(int, keepalive_time_ms, 30000, "HTTP/2 keepalive ping period");
ABSL_FLAG(int, keepalive_timeout_ms, 10000, "HTTP/2 keepalive ping ack deadline");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Maximum gRPC message size, both directions");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(1),
          "On drain: time readiness is NOT_SERVING before in-flight work is awaited");
ABSL_FLAG(absl::Duration, drain_deadline, absl::Seconds(30),
          "On drain: maximum wait for in-flight requests before they are cancelled");
ABSL_FLAG(std::string, port_file, "",
          "Write 'grpc_port=N\\nmetrics_port=M' here once listening (for tests and tools)");
ABSL_FLAG(std::string, log_level, "info", "Minimum log level: debug, info, warning, error");

namespace tessera::services {

std::vector<char*> ParseServiceFlags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;
  config.version_string = [] { return std::string("tessera ") + kTesseraVersion + "\n"; };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::fprintf(stderr, "error: --log_level=%s: expected debug, info, warning or error\n",
                 absl::GetFlag(FLAGS_log_level).c_str());
    std::exit(2);
  }
  SetLogLevel(level);
  return rest;
}

ServerOptions ServerOptionsFromFlags(const std::string& service_name) {
  ServerOptions o;
  o.service_name = service_name;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.keepalive_time_ms = absl::GetFlag(FLAGS_keepalive_time_ms);
  o.keepalive_timeout_ms = absl::GetFlag(FLAGS_keepalive_timeout_ms);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.drain_grace = absl::GetFlag(FLAGS_drain_grace);
  o.drain_deadline = absl::GetFlag(FLAGS_drain_deadline);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  return o;
}

int StartupError(const absl::Status& status) {
  // Tells systemd why the unit failed (shown by systemctl status).
  sd_notifyf(0, "STATUS=start-up failed: %s", std::string(status.message()).c_str());
  LogError("start-up failed", {{"error", std::string(status.message())},
                               {"code", absl::StatusCodeToString(status.code())}});
  return kExitStartupError;
}

}  // namespace tessera::services
