// The command-line flags every Tessera service binary shares (listen
// address, TLS, keepalive, metrics, drain, logging). They are defined in this
// library, which only the binaries' main() files link, and turned into a
// plain ServerOptions here; libraries never read flags.
#pragma once

#include <string>

#include "services/common/service_host.h"

namespace tessera::services {

// Parses argv (absl flags). Unknown flags and bad values print a one-line
// error and exit with status 2. Positional arguments are returned.
std::vector<char*> ParseServiceFlags(int argc, char** argv, const char* usage);

// Fills ServerOptions from the shared flags.
ServerOptions ServerOptionsFromFlags(const std::string& service_name);

// Logs `status` as a one-line start-up error and returns kExitStartupError
// (1, exit_codes.h).
int StartupError(const absl::Status& status);

}  // namespace tessera::services
