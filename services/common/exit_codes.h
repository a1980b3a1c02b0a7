// Process exit codes the Tessera services share, for supervisors (systemd's
// Restart=on-failure, the kubelet, `tessera up`) and scripts.
#pragma once

namespace tessera::services {

// A clean drain (SIGTERM, SIGINT or the Drain RPC).
inline constexpr int kExitClean = 0;
// A start-up error: bad flags, an unreadable model, a kernel preflight that
// failed (StartupError).
inline constexpr int kExitStartupError = 1;
// The service failed for good while serving (a worker whose model runner can
// run no more steps) and exited so that it is started afresh
// (ServiceHost::RequestFailureExit).
inline constexpr int kExitServiceFailed = 3;

}  // namespace tessera::services
