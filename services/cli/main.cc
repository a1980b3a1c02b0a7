// tessera: the command-line tool (`tessera <command> [flags]`).
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "services/cli/commands.h"
#include "worker/engine/preflight_process.h"

namespace tessera::cli {
namespace {

void PrintHelp(FILE* out) {
  std::fprintf(out, "usage: tessera <command> [flags]\n\ncommands:\n");
  for (const Command& c : Commands()) {
    std::fprintf(out, "  %-10s %s\n", std::string(c.name).c_str(), std::string(c.summary).c_str());
  }
  std::fprintf(out, "\n`tessera <command> --help` lists a command's flags.\n");
}

}  // namespace

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"doctor", "print devices, versions, compiled kernels and the backend table", RunDoctor},
      {"generate", "run a model in-process and stream a completion", RunGenerate},
      {"up", "start a local cluster (router, workers, drafter) on loopback", RunUp},
      {"bench", "load-test a cluster and report latency percentiles as JSON", RunBench},
      {"health", "ask a service's grpc.health.v1 status (exit 0 when SERVING)", RunHealth},
  };
  return *commands;
}

}  // namespace tessera::cli

int main(int argc, char** argv) {
  using tessera::cli::Commands;
  // `tessera generate` builds a CUDA engine, whose preflight runs in a child:
  // this binary again (worker/engine/preflight_process.h).
  if (int rc = tessera::engine::RunPreflightChildIfAsked(argc, argv); rc >= 0) return rc;
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    tessera::cli::PrintHelp(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& command : Commands()) {
    if (command.name == argv[1]) {
      absl::SetProgramUsageMessage(std::string("tessera ") + argv[1] + ": " +
                                   std::string(command.summary));
      // Flags follow the command name: parse argv[1..] with the command as
      // the program name.
      std::vector<char*> rest = absl::ParseCommandLine(argc - 1, argv + 1);
      return command.run(rest);
    }
  }
  std::fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
  tessera::cli::PrintHelp(stderr);
  return 2;
}
