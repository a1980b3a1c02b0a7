#include "tests/bench/bench_util.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

namespace tessera::bench {

double MeasureCopyBandwidth(size_t bytes, int repeats) {
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 2, bytes);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.get(), a.get(), bytes);
    auto t1 = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(t1 - t0).count();
    best = std::max(best, 2.0 * bytes / s);
    std::swap(a, b);
  }
  return best;
}

double MeasureReadBandwidth(int threads, size_t bytes, int repeats) {
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  double best = 0;
  std::vector<uint64_t> sinks(threads);
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t begin = n * t / threads, end = n * (t + 1) / threads;
        uint64_t a = 0, b = 0, c = 0, d = 0;
        size_t i = begin;
        for (; i + 4 <= end; i += 4) {
          a += buf[i];
          b += buf[i + 1];
          c += buf[i + 2];
          d += buf[i + 3];
        }
        for (; i < end; ++i) a += buf[i];
        sinks[t] = a + b + c + d;
      });
    }
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, bytes / s);
  }
  uint64_t total = 0;
  for (uint64_t v : sinks) total += v;
  if (total == 42) std::fprintf(stderr, " ");  // keeps the sums observable
  return best;
}

void WriteResult(const std::string& path, int argc, char** argv, nlohmann::json result) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  result["command"] = command;
  std::ofstream out(path);
  out << result.dump(2) << "\n";
}

std::string MakeRandomModel(const runner::TestModelSpec& spec) {
  std::string pattern = "/tmp/tessera-bench-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  auto s = runner::WriteTestModel(dir, spec);
  if (!s.ok()) {
    std::fprintf(stderr, "cannot write model: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  return dir;
}

int64_t ParameterCount(const runner::TestModelSpec& s) {
  int64_t q = int64_t{s.heads} * s.head_dim, kv = int64_t{s.kv_heads} * s.head_dim;
  int64_t layer = s.hidden * (q + 2 * kv) + q * s.hidden + 3 * int64_t{s.hidden} * s.intermediate +
                  2 * s.hidden;
  if (s.architecture == "Qwen3ForCausalLM") layer += 2 * s.head_dim;
  int64_t total = int64_t{s.vocab} * s.hidden + s.layers * layer + s.hidden;
  if (!s.tie_embeddings) total += int64_t{s.vocab} * s.hidden;
  return total;
}

}  // namespace tessera::bench
