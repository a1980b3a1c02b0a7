// SimulatedModelRunner: a ModelRunner without weights, for benchmarks of the
// router with many workers on one small machine, and for cluster tests.
// Forward() validates the batch exactly as a real runner must, waits for the
// time a cost model says the step would take on real hardware, and returns
// logits whose argmax is a fixed function of the WHOLE sequence so far:
//
//   state(-1) = kSeedState
//   state(p)  = PrefixState(state(p - 1), token at p, p)
//   next token after position p = TokenAfter(state(p))
//
// The state plays the part of the KV cache: it is kept per KV slot (the
// slot mapping says where each token's goes) and read through the block
// table, as a real runner reads K and V. So the output depends on every
// earlier token, and a scheduler that resumed a sequence with garbled
// context, or a prefix-cache hit on the wrong blocks, changes it; a slot
// read before it was written gives a state no real prefix has.
//
// The winning row holds kWinningLogit at the chosen token and 0 elsewhere,
// so the chosen token has probability ~1 at any temperature. Greedy output
// is therefore a pure function of the token list (Continuation computes
// it): independent of batching, chunked prefill, prefix-cache hits,
// preemption, migration, or which worker computes it. TokenAfter never
// returns ids 0..2 (kept for the synthetic config's BOS = 1 and EOS = 2), so
// generation never stops on EOS.
//
// Cost of one step (the wait), with q_len = the new tokens of a sequence in
// the batch:
//
//   prefill_us_per_token * (sum of q_len over sequences with q_len > 1)
//   + decode_step_us     (once, if any sequence has q_len == 1)
//   + decode_us_per_seq  * (number of sequences with q_len == 1)
//
// A batch holds only the tokens the scheduler decided to compute, so
// prefix-cache hits cost nothing: that is what makes prefix-aware routing
// measurable. A one-token prefill (e.g. all but the last prompt token came
// from the cache) costs like a decode, as it does on real hardware. The wait
// runs from the start of Forward() with absl::SleepFor, so the validation
// time is part of it; the operating system's timer slack adds some tens of
// microseconds per step. The thread sleeps rather than spins, so many
// simulated workers can share a few cores.
//
// The block table and slot mapping are checked against the configured
// cache (block ids in range, each slot where the block table puts its
// position), so scheduler bugs surface here as they would with a real
// runner. The states take 8 bytes per written slot.
//
// Thread-safety: not thread-safe (one engine loop owns it), like every
// ModelRunner, except Health() (any thread). PrefixState, TokenAfter,
// Continuation and StepCost are pure.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/model/config.h"
#include "worker/runner/model_runner.h"

namespace tessera::runner {

struct SimulatedRunnerOptions {
  int64_t vocab_size = 1024;                // >= 4
  int64_t max_position_embeddings = 32768;  // the synthetic model's context
  int block_size = 16;
  int64_t num_kv_blocks = 4096;
  // The cost model, in microseconds; each >= 0.
  double prefill_us_per_token = 20;
  double decode_step_us = 2000;
  double decode_us_per_seq = 50;
  // For tests of a worker whose device fails: after this many steps the
  // runner breaks for good (every later step fails at once and Health()
  // says why), as a tensor-parallel group whose ranks fell out of step
  // does. 0 = never. >= 0.
  int64_t fail_after_steps = 0;
  // TEST ONLY, for clients that need given output (tool calls, reasoning):
  // when non-empty, the token after a prefix is the next token of a
  // scripted reply instead of a hash. Reply r = min(number of
  // script_switch_tokens ids in the prefix, size - 1); the runner tracks how
  // many of the prefix's last tokens match that reply's start (k) and emits
  // reply[k], or EOS (2) once the reply is through. A prompt that does not
  // end in the reply's first tokens thus gets the whole reply.
  std::vector<std::vector<int32_t>> script;
  std::vector<int32_t> script_switch_tokens;
};

class SimulatedModelRunner final : public ModelRunner {
 public:
  // The logit of the chosen token; every other logit is 0.
  static constexpr float kWinningLogit = 30.0f;
  // Ids below this are never generated (special tokens of the synthetic
  // config: 0 = padding, 1 = BOS, 2 = EOS).
  static constexpr int32_t kFirstGeneratedId = 3;
  // Limits on the synthetic vocabulary (logits are vocab floats per row).
  static constexpr int64_t kMinVocabSize = 4;
  static constexpr int64_t kMaxVocabSize = int64_t{1} << 20;

  // INVALID_ARGUMENT for options out of range.
  static absl::StatusOr<std::unique_ptr<SimulatedModelRunner>> Create(
      SimulatedRunnerOptions options);

  // The synthetic config: architecture Llama, model_type "simulated",
  // the given vocabulary and context, BOS 1, EOS 2, and small nominal layer
  // sizes (1 layer, 1 head of 64) that nothing computes with.
  static model::ModelConfig SyntheticConfig(int64_t vocab_size, int64_t max_position_embeddings);

  // The state of a sequence before its first token.
  static constexpr uint64_t kSeedState = 0x5EEDC0FFEE123457ULL;
  // The state after `token` at `position`, following `previous`.
  static uint64_t PrefixState(uint64_t previous, int32_t token, int32_t position);
  // The scripted mode's state after `token` (replies seen << 32 | matched).
  uint64_t ScriptState(uint64_t previous, int32_t token) const;
  int32_t ScriptTokenAfter(uint64_t state) const;
  // The token generated after a prefix with this state, in
  // [kFirstGeneratedId, vocab_size). REQUIRES: vocab_size >= kMinVocabSize.
  static int32_t TokenAfter(uint64_t state, int64_t vocab_size);
  // The `n` tokens greedy decoding generates after `prompt`.
  static std::vector<int32_t> Continuation(const std::vector<int32_t>& prompt, int n,
                                           int64_t vocab_size);

  // The simulated duration of a step over `batch` (REQUIRES: a valid batch).
  static absl::Duration StepCost(const ForwardBatch& batch, const SimulatedRunnerOptions& options);

  const model::ModelConfig& config() const override { return config_; }
  int block_size() const override { return options_.block_size; }
  int64_t num_kv_blocks() const override { return options_.num_kv_blocks; }
  const SimulatedRunnerOptions& options() const { return options_; }

  // Validates the batch (INVALID_ARGUMENT, without waiting, when malformed),
  // waits StepCost(batch), and returns one logits row per logits index.
  // Once broken (fail_after_steps), INTERNAL at once.
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  // FAILED_PRECONDITION once fail_after_steps steps have run.
  absl::Status Health() const override;
  // Chains only: the engine verifies a token tree's first-child chain.
  bool SupportsTreeAttention() const override { return false; }

 private:
  explicit SimulatedModelRunner(SimulatedRunnerOptions options);
  absl::Status ValidateBatch(const ForwardBatch& batch) const;

  bool Broken() const;

  SimulatedRunnerOptions options_;
  absl::flat_hash_map<int64_t, uint64_t> states_;  // KV slot -> prefix state
  model::ModelConfig config_;
  std::atomic<int64_t> steps_{0};  // steps run (Health() reads it from any thread)
};

}  // namespace tessera::runner
