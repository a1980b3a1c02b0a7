// Helpers shared by the benchmark programs: the machine's memory-copy
// bandwidth (the roofline of bandwidth-bound decoding), a JSON writer that
// records the command line, and a random model written to a temp dir.
#pragma once

#include <string>

#include "nlohmann/json.hpp"
#include "worker/runner/test_model.h"

namespace tessera::bench {

// Best-of-N bandwidth of copying a buffer much larger than the caches, in
// bytes per second counting bytes read plus bytes written.
double MeasureCopyBandwidth(size_t bytes = size_t{512} << 20, int repeats = 5);

// Best-of-N bandwidth of reading a buffer much larger than the caches with
// `threads` threads (bytes read per second): the ceiling of weight-streaming
// decode, which reads and never writes its weights.
double MeasureReadBandwidth(int threads, size_t bytes = size_t{1} << 30, int repeats = 3);

// Writes `result` (plus "command" = argv joined) to `path` as pretty JSON.
void WriteResult(const std::string& path, int argc, char** argv, nlohmann::json result);

// A fresh temp dir holding a random model of `spec`.
std::string MakeRandomModel(const runner::TestModelSpec& spec);

// Parameters of a model of `spec` and their bytes (weights read per decode step).
int64_t ParameterCount(const runner::TestModelSpec& spec);

}  // namespace tessera::bench
