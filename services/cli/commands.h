// Subcommands of the `tessera` command-line tool. Each takes the arguments
// after its name (flags already parsed) and returns the process exit code.
#pragma once

#include <string_view>
#include <vector>

namespace tessera::cli {

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const std::vector<char*>& args);
};

// The command table, in the order `tessera help` lists it.
const std::vector<Command>& Commands();

int RunDoctor(const std::vector<char*>& args);
int RunHealth(const std::vector<char*>& args);
int RunGenerate(const std::vector<char*>& args);
int RunUp(const std::vector<char*>& args);
int RunBench(const std::vector<char*>& args);

}  // namespace tessera::cli
