// Speculation: the engine's side of speculative decoding (worker/spec/
// README.md). Per step it picks the decoding sequences that ask for drafts
// and how many (spec::AdaptiveDraftLength), fetches and checks the drafts
// (spec::DraftProvider), keeps them as the step's drafts, and lays a token
// tree out in the forward batch. After verification it records how many
// drafts were accepted, and after each step it tells the provider what the
// sequence now holds (Open after its first token, Commit per step, Close at
// the end).
//
// Thread-safety: not thread-safe; the engine loop owns it.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "worker/engine/scheduler.h"
#include "worker/runner/model_runner.h"
#include "worker/sampling/sampling_params.h"
#include "worker/spec/adaptive.h"
#include "worker/spec/draft_provider.h"

namespace tessera::engine {

class Speculation {
 public:
  // Drafts verified for one sequence so far.
  struct Counts {
    int proposed = 0;
    int accepted = 0;
  };

  // `provider` may be null (speculation off).
  Speculation(const spec::SpeculationOptions& options,
              std::shared_ptr<spec::DraftProvider> provider);

  // A provider is set and options allow draft tokens.
  bool enabled() const { return provider_ != nullptr && options_.num_speculative_tokens > 0; }

  // A sequence enters the engine / leaves it (the provider closes it).
  void Add(SequenceId id);
  void Remove(SequenceId id);

  // Drafts for the scheduler's decoding sequences: asked of the provider,
  // trimmed to each sequence's draft length, checked against the
  // vocabulary; a runner without tree attention gets a tree's first-child
  // chain. They become the step's drafts (StepDraft), replacing the last
  // step's.
  DraftTokens CollectDrafts(const Scheduler& scheduler, int64_t vocab, bool tree_attention);
  // The step's draft for `id`. REQUIRES: `id` got one from CollectDrafts.
  const spec::Draft& StepDraft(SequenceId id) const { return step_drafts_.at(id); }
  // Whether the step's draft for `id` is a tree (not a chain).
  bool IsTree(SequenceId id) const;
  // Token trees among the step's drafts: sets the forward batch's
  // tree_parents and the nodes' positions (their depths).
  void LayOutTrees(const ScheduledBatch& batch, runner::ForwardBatch* forward) const;

  // One verification of `id`: `proposed` draft tokens, `accepted` of them
  // accepted (feeds the adaptive draft length).
  void Record(SequenceId id, int proposed, int accepted);
  Counts CountsOf(SequenceId id) const;

  // After a step added `new_tokens` to `seq` (the sequence `id` as it is
  // now): opens the sequence at the provider, or commits the new tokens.
  void Commit(SequenceId id, const Sequence& seq, absl::Span<const TokenId> new_tokens,
              const sampling::SamplingParams& params);

 private:
  struct State {
    explicit State(const spec::SpeculationOptions& o) : length(o) {}
    bool open = false;  // the provider has the sequence
    Counts counts;
    spec::AdaptiveDraftLength length;
  };

  const spec::SpeculationOptions options_;
  const std::shared_ptr<spec::DraftProvider> provider_;
  absl::flat_hash_map<SequenceId, State> states_;
  // Drafts attached to the step in flight, by sequence.
  absl::flat_hash_map<SequenceId, spec::Draft> step_drafts_;
};

}  // namespace tessera::engine
