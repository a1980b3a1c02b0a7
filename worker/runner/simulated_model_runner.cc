#include "worker/runner/simulated_model_runner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tessera::runner {
namespace {

// SplitMix64's finalizer: a fixed, well-mixed 64-bit permutation.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// What a slot holds before anything was written to it.
constexpr uint64_t kUnwrittenState = 0xBAD0BAD0BAD0BAD0ULL;

absl::Status CheckCost(double us, const char* name) {
  if (!std::isfinite(us) || us < 0 || us > 1e9) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a number of microseconds in [0, 1e9], got ", us));
  }
  return absl::OkStatus();
}

}  // namespace

SimulatedModelRunner::SimulatedModelRunner(SimulatedRunnerOptions options)
    : options_(std::move(options)),
      config_(SyntheticConfig(options_.vocab_size, options_.max_position_embeddings)) {}

absl::StatusOr<std::unique_ptr<SimulatedModelRunner>> SimulatedModelRunner::Create(
    SimulatedRunnerOptions options) {
  if (options.vocab_size < kMinVocabSize || options.vocab_size > kMaxVocabSize) {
    return absl::InvalidArgumentError(absl::StrCat("simulated vocab_size must be in [",
                                                   kMinVocabSize, ", ", kMaxVocabSize, "], got ",
                                                   options.vocab_size));
  }
  if (options.max_position_embeddings < 1 ||
      options.max_position_embeddings > model::kMaxPositionEmbeddings) {
    return absl::InvalidArgumentError(absl::StrCat("simulated context must be in [1, ",
                                                   model::kMaxPositionEmbeddings, "], got ",
                                                   options.max_position_embeddings));
  }
  if (options.block_size < 1 || options.num_kv_blocks < 1) {
    return absl::InvalidArgumentError("block_size and num_kv_blocks must be >= 1");
  }
  if (auto s = CheckCost(options.prefill_us_per_token, "prefill_us_per_token"); !s.ok()) return s;
  if (auto s = CheckCost(options.decode_step_us, "decode_step_us"); !s.ok()) return s;
  if (auto s = CheckCost(options.decode_us_per_seq, "decode_us_per_seq"); !s.ok()) return s;
  for (const auto& reply : options.script) {
    for (int32_t t : reply) {
      if (t < 0 || t >= options.vocab_size) {
        return absl::InvalidArgumentError("script token ids must be in [0, vocab_size)");
      }
    }
  }
  if (options.fail_after_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fail_after_steps must be >= 0, got ", options.fail_after_steps));
  }
  return std::unique_ptr<SimulatedModelRunner>(new SimulatedModelRunner(std::move(options)));
}

model::ModelConfig SimulatedModelRunner::SyntheticConfig(int64_t vocab_size,
                                                         int64_t max_position_embeddings) {
  model::ModelConfig c;
  c.architecture = model::ModelArchitecture::kLlama;
  c.model_type = "simulated";
  c.vocab_size = vocab_size;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.head_dim = 64;
  c.max_position_embeddings = max_position_embeddings;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

uint64_t SimulatedModelRunner::PrefixState(uint64_t previous, int32_t token, int32_t position) {
  const uint64_t key =
      (uint64_t{static_cast<uint32_t>(token)} << 32) | uint64_t{static_cast<uint32_t>(position)};
  return Mix(previous ^ Mix(key));
}

int32_t SimulatedModelRunner::TokenAfter(uint64_t state, int64_t vocab_size) {
  const uint64_t range = static_cast<uint64_t>(vocab_size - kFirstGeneratedId);
  return static_cast<int32_t>(Mix(state) % range) + kFirstGeneratedId;
}

uint64_t SimulatedModelRunner::ScriptState(uint64_t previous, int32_t token) const {
  uint64_t count = previous >> 32;
  uint64_t k = previous & 0xFFFFFFFFu;
  for (int32_t s : options_.script_switch_tokens) {
    if (token == s) return (count + 1) << 32;
  }
  const auto& reply = options_.script[std::min<uint64_t>(count, options_.script.size() - 1)];
  if (k < reply.size() && reply[k] == token) {
    ++k;
  } else {
    k = !reply.empty() && reply[0] == token ? 1 : 0;
  }
  return (count << 32) | k;
}

int32_t SimulatedModelRunner::ScriptTokenAfter(uint64_t state) const {
  const uint64_t count = state >> 32;
  const uint64_t k = state & 0xFFFFFFFFu;
  const auto& reply = options_.script[std::min<uint64_t>(count, options_.script.size() - 1)];
  return k < reply.size() ? reply[k] : config_.eos_token_ids[0];
}

std::vector<int32_t> SimulatedModelRunner::Continuation(const std::vector<int32_t>& prompt, int n,
                                                        int64_t vocab_size) {
  uint64_t state = kSeedState;
  int32_t pos = 0;
  for (int32_t t : prompt) state = PrefixState(state, t, pos++);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(TokenAfter(state, vocab_size));
    state = PrefixState(state, out.back(), pos++);
  }
  return out;
}

absl::Duration SimulatedModelRunner::StepCost(const ForwardBatch& batch,
                                              const SimulatedRunnerOptions& options) {
  int64_t prefill_tokens = 0;
  int64_t decode_seqs = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int64_t q_len = batch.query_start_loc[s + 1] - batch.query_start_loc[s];
    if (q_len > 1) {
      prefill_tokens += q_len;
    } else if (q_len == 1) {
      ++decode_seqs;
    }
  }
  double us = options.prefill_us_per_token * static_cast<double>(prefill_tokens);
  if (decode_seqs > 0) {
    us += options.decode_step_us + options.decode_us_per_seq * static_cast<double>(decode_seqs);
  }
  return absl::Nanoseconds(std::llround(us * 1e3));
}

absl::Status SimulatedModelRunner::ValidateBatch(const ForwardBatch& b) const {
  return ValidateForwardBatch(b, {config_.vocab_size, config_.max_position_embeddings,
                                  options_.block_size, options_.num_kv_blocks});
}

bool SimulatedModelRunner::Broken() const {
  return options_.fail_after_steps > 0 && steps_.load() >= options_.fail_after_steps;
}

absl::Status SimulatedModelRunner::Health() const {
  if (!Broken()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the simulated device broke after ", options_.fail_after_steps, " steps (fail_after_steps)"));
}

absl::Status SimulatedModelRunner::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const absl::Time start = absl::Now();
  if (Broken()) return absl::InternalError("simulated device failure");
  if (auto s = ValidateBatch(batch); !s.ok()) return s;
  steps_.fetch_add(1);
  // The "KV cache": each token's prefix state goes to its slot, from the
  // state at the slot of the position before it (through the block table).
  const int bs = options_.block_size;
  const bool scripted = !options_.script.empty();
  for (int s = 0; s < batch.num_seqs(); ++s) {
    for (int t = batch.query_start_loc[s]; t < batch.query_start_loc[s + 1]; ++t) {
      const int32_t pos = batch.positions[t];
      uint64_t previous = scripted ? 0 : kSeedState;
      if (pos > 0) {
        const int32_t block =
            batch.block_tables[static_cast<size_t>(s) * batch.block_table_stride + (pos - 1) / bs];
        auto it = states_.find(int64_t{block} * bs + (pos - 1) % bs);
        previous = it == states_.end() ? kUnwrittenState : it->second;
      }
      states_[batch.slot_mapping[t]] = scripted ? ScriptState(previous, batch.token_ids[t])
                                                : PrefixState(previous, batch.token_ids[t], pos);
    }
  }
  const int64_t vocab = config_.vocab_size;
  const size_t rows = batch.logits_indices.size();
  logits->assign(rows * static_cast<size_t>(vocab), 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const int32_t t = batch.logits_indices[r];
    const uint64_t state = states_[batch.slot_mapping[t]];
    const int32_t next = scripted ? ScriptTokenAfter(state) : TokenAfter(state, vocab);
    (*logits)[r * vocab + next] = kWinningLogit;
  }
  const absl::Duration remaining = start + StepCost(batch, options_) - absl::Now();
  if (remaining > absl::ZeroDuration()) absl::SleepFor(remaining);
  return absl::OkStatus();
}

}  // namespace tessera::runner
