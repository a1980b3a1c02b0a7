#include "worker/spec/model_source.h"

#include "kernels/cuda_devices.h"
#if TESSERA_HAVE_CUDA
#include "worker/runner/cuda/cuda_model_runner.h"
#endif

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/sampling/philox.h"
#include "worker/sampling/sampler.h"
#include "worker/spec/draft_kv_cache.h"

namespace tessera::spec {
namespace {

class ModelSource final : public DraftSource {
 public:
  ModelSource(std::unique_ptr<runner::ModelRunner> runner, std::unique_ptr<DraftKvCache> kv,
              ModelSourceOptions o, std::unique_ptr<model::LoadedModel> model)
      : model_(std::move(model)), runner_(std::move(runner)), kv_(std::move(kv)), o_(o) {
    o_.max_model_len = std::min<int>(o_.max_model_len,
                                     static_cast<int>(runner_->config().max_position_embeddings));
  }
  ~ModelSource() override { runner_.reset(); }

  std::string name() const override { return "model"; }
  bool runs_ahead() const override { return true; }

  absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens,
                    const sampling::SamplingParams& params) override {
    if (tokens.empty()) return absl::InvalidArgumentError("a draft sequence needs tokens");
    if (seqs_.contains(seq)) {
      return absl::AlreadyExistsError(absl::StrCat("draft sequence ", seq, " is already open"));
    }
    const int vocab = static_cast<int>(runner_->config().vocab_size);
    for (TokenId t : tokens) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " is outside the draft model's vocabulary of ", vocab));
      }
    }
    State& s = seqs_[seq];
    s.tokens.assign(tokens.begin(), tokens.end());
    s.params = params;
    s.params.repetition_penalty = 1;
    s.params.presence_penalty = 0;
    s.params.frequency_penalty = 0;
    s.params.top_logprobs = 0;
    if (!s.params.greedy() && (s.params.top_k <= 0 || s.params.top_k > o_.max_q_support)) {
      s.params.top_k = o_.max_q_support;
    }
    return absl::OkStatus();
  }

  absl::Status Update(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no draft sequence ", seq));
    State& s = it->second;
    if (base_len < 0 || base_len > static_cast<int64_t>(s.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat("base_len ", base_len, " for sequence ", seq,
                                                     " outside [0, ", s.tokens.size(), "]"));
    }
    const int vocab = static_cast<int>(runner_->config().vocab_size);
    for (TokenId t : tokens) {
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " is outside the draft model's vocabulary of ", vocab));
      }
    }
    // Common prefix of the old tokens (with run-ahead drafts) and the new.
    size_t keep = base_len;
    for (size_t i = 0; i < tokens.size() && keep < s.tokens.size(); ++i, ++keep) {
      if (s.tokens[keep] != tokens[i]) break;
    }
    s.tokens.resize(base_len);
    s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
    RollBack(seq, s, static_cast<int>(std::min<size_t>(keep, s.computed)));
    return absl::OkStatus();
  }

  void Close(SeqKey seq) override {
    kv_->Free(seq);
    seqs_.erase(seq);
  }

  int64_t Length(SeqKey seq) const override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? -1 : static_cast<int64_t>(it->second.tokens.size());
  }

  std::vector<Draft> Propose(absl::Span<const DraftQuery> queries) override {
    std::vector<Draft> out(queries.size());
    std::vector<Plan> plans(queries.size());
    std::vector<int> active;  // query indices still drafting
    for (size_t i = 0; i < queries.size(); ++i) {
      auto it = seqs_.find(queries[i].seq);
      if (it == seqs_.end()) continue;
      out[i].base_len = static_cast<int64_t>(it->second.tokens.size());
      plans[i] = PlanOf(queries[i]);
      if (queries[i].max_tokens > 0) active.push_back(static_cast<int>(i));
    }
    // Each round is one batched forward pass and adds a token to each draft.
    while (!active.empty()) active = DraftRound(queries, active, plans, out);
    for (size_t i = 0; i < queries.size(); ++i) AttachSiblings(plans[i], &out[i]);
    return out;
  }

 private:
  // A greedy row for ForwardSample (temperature 0).
  const runner::DeviceSamplingRow greedy_row_{0.0f, 0, 1.0f, 0.0f, 0, 0};

  struct State {
    std::vector<TokenId> tokens;
    int computed = 0;  // tokens whose KV is in the cache
    sampling::SamplingParams params;
  };
  // A sibling leaf found while drafting a tree: its depth, token and q.
  struct Sibling {
    int depth;
    TokenId token;
    DraftDistribution q;
  };
  // One query's shape: the chain's length, and (trees) the sibling leaves
  // found so far with the room left for more.
  struct Plan {
    int chain_len = 0;
    int sibling_room = 0;
    std::vector<Sibling> siblings;
  };

  Plan PlanOf(const DraftQuery& query) const {
    Plan p;
    p.chain_len = query.max_tokens;
    if (o_.tree.enabled() && p.chain_len > 1) {
      // A leaf sibling is accepted less often than a chain node a few
      // positions deep: siblings take at most a third of the nodes.
      p.sibling_room = std::min((o_.tree.max_branching - 1) * std::max(0, o_.tree.branch_depth),
                                p.chain_len / 3);
      p.chain_len -= p.sibling_room;
    }
    return p;
  }

  // One forward pass over the queries in `active` (indices into queries):
  // the first catches a sequence's KV up with its new tokens, later ones add
  // the last draft token. Returns the queries that want more tokens (none
  // when the step failed: every sequence in it then starts its KV again).
  std::vector<int> DraftRound(absl::Span<const DraftQuery> queries, const std::vector<int>& active,
                              std::vector<Plan>& plans, std::vector<Draft>& out) {
    runner::ForwardBatch batch;
    std::vector<int> in_batch;
    size_t stride = 0;
    // Reserve slots first (the stride must be known before AddSequence).
    for (int qi : active) {
      State& s = seqs_[queries[qi].seq];
      if (static_cast<int>(s.tokens.size()) >= o_.max_model_len) continue;
      if (s.computed >= static_cast<int>(s.tokens.size()))
        RollBack(queries[qi].seq, s, s.tokens.size() - 1);
      const int n = static_cast<int>(s.tokens.size()) - s.computed;
      if (!Reserve(queries[qi].seq, s, n)) continue;
      in_batch.push_back(qi);
      stride = std::max(stride, kv_->BlockTable(queries[qi].seq).size());
    }
    if (in_batch.empty()) return {};
    batch.block_table_stride = static_cast<int64_t>(stride);
    for (int qi : in_batch) {
      State& s = seqs_[queries[qi].seq];
      const absl::Span<const int32_t> table = kv_->BlockTable(queries[qi].seq);
      std::vector<int32_t> tbl(table.begin(), table.end());
      std::vector<int32_t> toks(s.tokens.begin() + s.computed, s.tokens.end());
      batch.AddSequence(toks, s.computed, tbl, runner_->block_size(), /*want_logits=*/true);
    }
    // Greedy drafts on a runner that samples on its device: only the
    // argmax of each row comes back (the same token as the host's greedy
    // draw: ties go to the lowest id in both).
    bool on_device = runner_->SupportsDeviceSampling();
    for (int qi : in_batch) on_device &= seqs_[queries[qi].seq].params.greedy();
    std::vector<int32_t> device_tokens;
    const absl::Status st =
        on_device ? runner_->ForwardSample(
                        batch, std::vector<runner::DeviceSamplingRow>(in_batch.size(), greedy_row_),
                        &device_tokens)
                  : runner_->Forward(batch, &logits_);
    if (!st.ok()) {
      LogWarning("draft model step failed", {{"error", std::string(st.message())}});
      for (int qi : in_batch) RollBack(queries[qi].seq, seqs_[queries[qi].seq], 0);
      return {};
    }
    const int64_t vocab = runner_->config().vocab_size;
    std::vector<int> next;
    for (size_t r = 0; r < in_batch.size(); ++r) {
      const int qi = in_batch[r];
      State& s = seqs_[queries[qi].seq];
      s.computed = static_cast<int>(s.tokens.size());
      const bool drafted = on_device
                               ? TakeToken(device_tokens[r], s, &out[qi])
                               : DrawToken(absl::MakeConstSpan(logits_).subspan(r * vocab, vocab),
                                           s, &plans[qi], &out[qi]);
      if (drafted && static_cast<int>(out[qi].tokens.size()) < plans[qi].chain_len) {
        next.push_back(qi);
      }
    }
    return next;
  }

  // The device's greedy token for `s` (-1: a non-finite row, no draft).
  static bool TakeToken(int32_t token, State& s, Draft* d) {
    if (token < 0) return false;
    d->tokens.push_back(token);
    s.tokens.push_back(token);  // run ahead: as if accepted
    return true;
  }

  // Draws the next draft token of `s` from its logits row (greedy: the
  // argmax), with its q, and notes sibling leaves while there is room.
  bool DrawToken(absl::Span<const float> row, State& s, Plan* plan, Draft* d) {
    auto dist = sampling::ComputeSamplingDistribution(row, s.params, empty_counts_);
    if (!dist.ok()) return false;
    const int64_t position = static_cast<int64_t>(s.tokens.size());
    size_t chosen = dist->tokens.size() - 1;
    if (dist->tokens.size() > 1) {
      const double u =
          sampling::UniformFromSeed(s.params.seed ^ kDraftSeedMix, static_cast<uint64_t>(position),
                                    sampling::RandomStream::kSample);
      double c = 0;
      for (size_t j = 0; j < dist->tokens.size(); ++j) {
        c += dist->probs[j];
        if (u < c) {
          chosen = j;
          break;
        }
      }
    }
    const TokenId token = dist->tokens[chosen];
    DraftDistribution q;
    if (!s.params.greedy()) {
      q.tokens = dist->tokens;
      q.probs.assign(dist->probs.begin(), dist->probs.end());
    }
    const int depth = static_cast<int>(d->tokens.size()) + 1;
    if (plan->sibling_room > 0 && depth <= o_.tree.branch_depth) {
      const int n = std::min(o_.tree.max_branching - 1, plan->sibling_room);
      for (TokenId alt : RunnersUp(row, *dist, token, n, s.params.greedy())) {
        plan->siblings.push_back({depth, alt, q});
        --plan->sibling_room;
      }
    }
    d->tokens.push_back(token);
    if (!s.params.greedy()) d->q.push_back(std::move(q));
    s.tokens.push_back(token);  // run ahead: as if accepted
    return true;
  }

  // Sibling leaves after the chain: one at depth d hangs off chain node
  // d - 2 (the last committed token for d = 1).
  static void AttachSiblings(Plan& plan, Draft* d) {
    if (plan.siblings.empty()) return;
    const int chain = static_cast<int>(d->tokens.size());
    for (int j = 0; j < chain; ++j) d->parents.push_back(j - 1);
    for (Sibling& x : plan.siblings) {
      if (x.depth > chain) continue;
      d->tokens.push_back(x.token);
      d->parents.push_back(x.depth - 2);
      if (!d->q.empty()) d->q.push_back(std::move(x.q));
    }
  }

  // Up to n tokens other than `chosen`, most likely first: by raw logit for
  // a greedy draft (ties to the lower id), else by probability in `dist`.
  static std::vector<TokenId> RunnersUp(absl::Span<const float> row,
                                        const sampling::SamplingDistribution& dist, TokenId chosen,
                                        int n, bool greedy) {
    std::vector<std::pair<float, TokenId>> c;
    if (greedy) {
      for (size_t t = 0; t < row.size(); ++t) {
        if (static_cast<TokenId>(t) != chosen && std::isfinite(row[t])) {
          c.push_back({row[t], static_cast<TokenId>(t)});
        }
      }
    } else {
      for (size_t j = 0; j < dist.tokens.size(); ++j) {
        if (dist.tokens[j] != chosen && dist.probs[j] > 0)
          c.push_back({dist.probs[j], dist.tokens[j]});
      }
    }
    const size_t m = std::min<size_t>(std::max(0, n), c.size());
    std::partial_sort(c.begin(), c.begin() + m, c.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    std::vector<TokenId> out;
    for (size_t j = 0; j < m; ++j) out.push_back(c[j].second);
    return out;
  }

  // Keeps the KV of the first `keep` tokens.
  void RollBack(SeqKey seq, State& s, size_t keep) {
    kv_->Truncate(seq, static_cast<int>(keep));
    s.computed = std::min<int>(s.computed, static_cast<int>(keep));
  }

  // Adds n slots for `seq`, freeing its KV first when the pool is short.
  bool Reserve(SeqKey seq, State& s, int n) {
    if (kv_->Append(seq, n)) return true;
    if (!kv_->Contains(seq)) return false;
    kv_->Free(seq);
    s.computed = 0;
    return kv_->Append(seq, static_cast<int>(s.tokens.size()));
  }

  std::unique_ptr<model::LoadedModel> model_;  // when loaded here; outlives runner_
  std::unique_ptr<runner::ModelRunner> runner_;
  std::unique_ptr<DraftKvCache> kv_;
  ModelSourceOptions o_;
  absl::flat_hash_map<SeqKey, State> seqs_;
  sampling::TokenCounts empty_counts_;
  std::vector<float> logits_;  // the last round's, reused
};

absl::StatusOr<std::unique_ptr<DraftSource>> Make(std::unique_ptr<runner::ModelRunner> runner,
                                                  ModelSourceOptions options,
                                                  std::unique_ptr<model::LoadedModel> model) {
  if (runner == nullptr) return absl::InvalidArgumentError("the draft model source needs a runner");
  auto kv = DraftKvCache::Create(runner->block_size(), runner->num_kv_blocks());
  if (!kv.ok()) return kv.status();
  return std::unique_ptr<DraftSource>(
      new ModelSource(std::move(runner), std::move(*kv), options, std::move(model)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftSource>> MakeModelSource(
    std::unique_ptr<runner::ModelRunner> runner, ModelSourceOptions options) {
  return Make(std::move(runner), options, nullptr);
}

absl::StatusOr<std::unique_ptr<DraftSource>> MakeModelSourceFromDir(
    const std::string& dir, ModelSourceFromDirOptions options) {
  auto model = model::LoadModel(dir);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("draft model: ", model.status().message()));
  }
  if (options.device != "cpu") {
#if TESSERA_HAVE_CUDA
    auto device = kernels::ResolveDevice(options.device);
    if (!device.ok()) return device.status();
    runner::CudaRunnerOptions co;
    co.block_size = options.block_size;
    co.num_kv_blocks = options.num_kv_blocks;
    co.max_num_tokens = 8192;
    co.max_num_seqs = 256;
    auto r = runner::CudaModelRunner::Create(model->get(), *device, co);
    if (!r.ok()) return r.status();
    return Make(std::move(*r), options.source, std::move(*model));
#else
    return absl::FailedPreconditionError("draft model on " + options.device +
                                         ": this binary was built without the CUDA backend");
#endif
  }
  runner::CpuRunnerOptions ro;
  ro.block_size = options.block_size;
  ro.num_kv_blocks = options.num_kv_blocks;
  ro.num_threads = options.num_threads;
  auto r = runner::CpuModelRunner::Create(model->get(), ro);
  if (!r.ok()) return r.status();
  return Make(std::move(*r), options.source, std::move(*model));
}

}  // namespace tessera::spec
