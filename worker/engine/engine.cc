#include "worker/engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "worker/spec/verifier.h"

namespace tessera::engine {

// A request the engine owns: its stream, sampling state and timing.
struct Engine::Request {
  SequenceId id = 0;
  EngineRequest request;
  std::shared_ptr<RequestStream> stream;
  sampling::TokenCounts counts;
  absl::Time arrival;
  std::optional<absl::Time> last_token_time;
  bool admitted = false;
  // Speculation.
  bool draft_open = false;
  int draft_tokens = 0;
  int accepted_tokens = 0;
  std::optional<spec::AdaptiveDraftLength> draft_length;
};

// ---- RequestStream ----

bool RequestStream::Next(StreamEvent* event, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::Push(StreamEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

// ---- Engine ----

Engine::Engine(std::unique_ptr<runner::ModelRunner> runner, EngineOptions options,
               EngineObserver* observer)
    : runner_(std::move(runner)), options_(std::move(options)), observer_(observer) {
  static EngineObserver* const kNoObserver = new EngineObserver();
  if (observer_ == nullptr) observer_ = kNoObserver;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<runner::ModelRunner> runner,
                                                       EngineOptions options,
                                                       EngineObserver* observer) {
  if (runner == nullptr) return absl::InvalidArgumentError("engine needs a model runner");
  options.scheduler.block_size = runner->block_size();
  options.scheduler.num_blocks = static_cast<int>(runner->num_kv_blocks());
  options.scheduler.vocab_size = static_cast<int>(runner->config().vocab_size);
  options.scheduler.max_model_len = static_cast<int>(
      std::min<int64_t>(options.scheduler.max_model_len, runner->config().max_position_embeddings));
  if (options.max_waiting < 1) return absl::InvalidArgumentError("max_waiting must be >= 1");
  auto scheduler = Scheduler::Create(options.scheduler);
  if (!scheduler.ok()) return scheduler.status();
  std::unique_ptr<Engine> engine(new Engine(std::move(runner), std::move(options), observer));
  engine->scheduler_ = std::move(*scheduler);
  engine->PublishLoad();
  return engine;
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ && !thread_.joinable()) return;
    stopped_ = true;
  }
  if (thread_.joinable()) thread_.join();
  FailAll(absl::CancelledError("the engine stopped"));
}

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request) {
  const int vocab = static_cast<int>(runner_->config().vocab_size);
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt must not be empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", request.prompt[i],
                                                     ": ids must be in [0, ", vocab, ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", request.max_tokens));
  }
  if (auto s = sampling::ValidateSamplingParams(request.sampling, vocab); !s.ok()) return s;
  SamplingOptions so;
  so.max_tokens = request.max_tokens;
  so.eos_token_ids = options_.eos_token_ids;
  so.ignore_eos = request.ignore_eos;
  so.stop_token_ids = request.stop_token_ids;
  so.priority = request.priority;
  if (auto s = scheduler_->CheckAdmissible(request.prompt, request.generated, so); !s.ok()) {
    return s;
  }
  auto r = std::make_unique<Request>();
  r->id = next_id_.fetch_add(1);
  r->arrival = absl::Now();
  r->counts.AddPrompt(request.prompt);
  for (TokenId t : request.generated) r->counts.AddOutput(t);
  r->request = std::move(request);
  r->stream = std::make_shared<RequestStream>(r->id);
  std::shared_ptr<RequestStream> stream = r->stream;
  absl::MutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("the engine is stopped");
  if (load_.waiting + static_cast<int>(inbox_.size()) >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the worker's waiting queue is full (", options_.max_waiting,
                     " requests); retry later or on another worker"));
  }
  inbox_.push_back(std::move(r));
  return stream;
}

void Engine::Cancel(SequenceId id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(id);
}

LoadSnapshot Engine::Load() const {
  absl::MutexLock lock(&mu_);
  LoadSnapshot l = load_;
  l.waiting += static_cast<int>(inbox_.size());
  for (const auto& r : inbox_) l.waiting_prefill_tokens += r->request.prompt.size();
  return l;
}

std::vector<NumberedKvEvent> Engine::EventsSince(uint64_t from, uint64_t* next, bool* gap) const {
  absl::MutexLock lock(&mu_);
  std::vector<NumberedKvEvent> out;
  uint64_t oldest = kv_log_.empty() ? next_kv_number_ : kv_log_.front().number;
  *gap = from < oldest;
  for (const NumberedKvEvent& e : kv_log_) {
    if (e.number >= from) out.push_back(e);
  }
  *next = next_kv_number_;
  return out;
}

std::vector<KvCacheEvent> Engine::CachedBlocks() const {
  absl::MutexLock lock(&mu_);
  std::vector<KvCacheEvent> out;
  out.reserve(cached_.size());
  for (const auto& [hash, block] : cached_) {
    KvCacheEvent e;
    e.kind = KvCacheEvent::Kind::kStored;
    e.block_hashes.push_back(hash);
    e.parent_hash = block.parent;
    e.token_ids = block.tokens;
    out.push_back(std::move(e));
  }
  return out;
}

void Engine::ApplyToSnapshot(const KvCacheEvent& e) {
  if (e.kind == KvCacheEvent::Kind::kRemoved) {
    for (uint64_t h : e.block_hashes) cached_.erase(h);
    return;
  }
  const size_t bs = static_cast<size_t>(runner_->block_size());
  std::optional<uint64_t> parent = e.parent_hash;
  for (size_t i = 0; i < e.block_hashes.size(); ++i) {
    CachedBlock& b = cached_[e.block_hashes[i]];
    b.parent = parent;
    if (e.token_ids.size() >= (i + 1) * bs) {
      b.tokens.assign(e.token_ids.begin() + i * bs, e.token_ids.begin() + (i + 1) * bs);
    }
    parent = e.block_hashes[i];
  }
}

void Engine::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    DrainInbox();
    if (!Step()) {
      // Idle: wait for new work.
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || !inbox_.empty() || !cancels_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(50));
    }
  }
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<Request>> inbox;
  std::vector<SequenceId> cancels;
  {
    absl::MutexLock lock(&mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : inbox) {
    SamplingOptions so;
    so.max_tokens = r->request.max_tokens;
    so.eos_token_ids = options_.eos_token_ids;
    so.ignore_eos = r->request.ignore_eos;
    so.stop_token_ids = r->request.stop_token_ids;
    so.priority = r->request.priority;
    absl::Status s = scheduler_->AddSequence(r->id, r->request.prompt, so, r->request.generated);
    if (!s.ok()) {
      StreamEvent e;
      e.error = s;
      End(*r, std::move(e));
      continue;
    }
    SequenceId id = r->id;
    r->draft_length.emplace(options_.speculation);
    active_[id] = std::move(r);
  }
  std::vector<std::unique_ptr<Request>> aborted;
  for (SequenceId id : cancels) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    // Abort frees the blocks now, or when the step in flight completes.
    scheduler_->Abort(id).IgnoreError();
    CloseDrafts(*it->second);
    aborted.push_back(std::move(it->second));
    active_.erase(it);
  }
  PublishLoad();
  for (auto& r : aborted) {
    StreamEvent e;
    e.finish_reason = FinishReason::kAbort;
    End(*r, std::move(e));
  }
}

// One engine step: (drafts →) schedule → run → sample / verify → emit → free.
bool Engine::Step() {
  const DraftTokens drafts = CollectDrafts();
  absl::StatusOr<ScheduledBatch> batch = scheduler_->Schedule(drafts.empty() ? nullptr : &drafts);
  if (!batch.ok()) {
    FailAll(batch.status());
    return false;
  }
  if (batch->empty()) return false;

  runner::ForwardBatch forward = ToForwardBatch(*batch);
  ApplyDraftTrees(*batch, &forward);
  std::vector<float> logits;
  std::vector<runner::DeviceSamplingRow> device_rows;
  std::vector<int32_t> device_tokens;
  const bool on_device = DeviceSamplingRows(*batch, &device_rows);
  absl::Time start = absl::Now();
  absl::Status run = on_device ? runner_->ForwardSample(forward, device_rows, &device_tokens)
                               : runner_->Forward(forward, &logits);
  observer_->OnStep(*batch, absl::Now() - start);
  if (!run.ok()) {
    const absl::Status health = runner_->Health();
    LogError(health.ok() ? "model step failed; failing the batch's requests"
                         : "model step failed and the runner can run no more; failing every "
                           "request",
             {{"error", std::string(run.message())}});
    if (health.ok()) {
      FailStep(*batch, run);
    } else {
      // The worker leaves service first, so that a router does not send the
      // failed requests back to it.
      if (!runner_failed_) {
        runner_failed_ = true;
        if (on_runner_failed_) on_runner_failed_(health);
      }
      // UNAVAILABLE: the requests themselves are sound, so a router retries
      // them, or resumes them after the tokens already sent, elsewhere.
      FailAll(absl::UnavailableError(
          absl::StrCat("the worker's model runner failed for good: ", health.message())));
      EndFailedStep();
    }
    return true;
  }

  std::vector<SampledTokens> sampled;
  if (on_device) {
    TakeDeviceTokens(*batch, device_tokens, &sampled);
  } else {
    Sample(*batch, logits, &sampled);
  }
  absl::StatusOr<std::vector<SequenceOutput>> outputs = scheduler_->OnStepDone(sampled);
  if (!outputs.ok()) {
    FailAll(outputs.status());
    EndFailedStep();
    return true;
  }
  // Load first: a reader that sees a request finish then sees its blocks freed.
  PublishLoad();
  Emit(*outputs);
  return true;
}

runner::ForwardBatch ToForwardBatch(const ScheduledBatch& batch) {
  runner::ForwardBatch f;
  size_t stride = 0;
  for (const ScheduledSequence& s : batch.sequences)
    stride = std::max(stride, s.block_table.size());
  f.block_table_stride = static_cast<int64_t>(stride);
  f.query_start_loc.push_back(0);
  for (const ScheduledSequence& s : batch.sequences) {
    for (int i = 0; i < s.num_tokens; ++i) {
      f.token_ids.push_back(s.token_ids[i]);
      f.positions.push_back(s.start_position + i);
      f.slot_mapping.push_back(s.slot_mapping[i]);
    }
    f.query_start_loc.push_back(static_cast<int32_t>(f.token_ids.size()));
    f.seq_lens.push_back(s.context_len());
    for (size_t i = 0; i < stride; ++i) {
      f.block_tables.push_back(i < s.block_table.size() ? s.block_table[i] : -1);
    }
    if (s.needs_logits) {
      // The last token's row, preceded by one row per draft token it checks.
      const int32_t end = static_cast<int32_t>(f.token_ids.size());
      for (int32_t i = end - 1 - s.num_draft_tokens; i < end; ++i) f.logits_indices.push_back(i);
    }
  }
  return f;
}

bool Engine::IsTreeDraft(SequenceId id) const {
  auto it = step_drafts_.find(id);
  return it != step_drafts_.end() && !spec::IsChain(it->second);
}

void Engine::ApplyDraftTrees(const ScheduledBatch& batch, runner::ForwardBatch* f) const {
  bool any = false;
  for (const ScheduledSequence& s : batch.sequences) {
    any |= s.num_draft_tokens > 0 && IsTreeDraft(s.id);
  }
  if (!any) return;
  f->tree_parents.resize(f->token_ids.size());
  int begin = 0;
  for (const ScheduledSequence& s : batch.sequences) {
    for (int j = 0; j < s.num_tokens; ++j) f->tree_parents[begin + j] = j - 1;
    if (s.num_draft_tokens > 0 && IsTreeDraft(s.id)) {
      // The drafts follow the decode token: node i is chunk token first + i.
      const std::vector<int32_t>& parents = step_drafts_.at(s.id).parents;
      const int first = s.num_tokens - s.num_draft_tokens;
      std::vector<int32_t> depth(s.num_tokens);
      for (int j = 0; j < s.num_tokens; ++j) {
        if (j >= first) {
          const int32_t p = parents[j - first];
          f->tree_parents[begin + j] = p < 0 ? first - 1 : first + p;
        }
        const int32_t parent = f->tree_parents[begin + j];
        depth[j] = parent < 0 ? 0 : depth[parent] + 1;
        f->positions[begin + j] = s.start_position + depth[j];
      }
    }
    begin += s.num_tokens;
  }
}

DraftTokens Engine::CollectDrafts() {
  step_drafts_.clear();
  spec::DraftProvider* provider = options_.draft_provider.get();
  if (provider == nullptr || options_.speculation.num_speculative_tokens <= 0) return {};
  const std::vector<SequenceId> decoding = scheduler_->DecodingSequences();
  std::vector<spec::ProposalRequest> wanted;
  for (SequenceId id : decoding) {
    auto it = active_.find(id);
    const Sequence* seq = scheduler_->FindSequence(id);
    if (it == active_.end() || seq == nullptr || !it->second->draft_open) continue;
    const int k =
        it->second->draft_length->Next(options_.speculation, static_cast<int>(decoding.size()));
    if (k > 0) wanted.push_back({id, seq->num_tokens(), k});
  }
  if (wanted.empty()) return {};
  std::vector<std::optional<spec::Draft>> got = provider->GetDrafts(wanted);
  const int64_t vocab = runner_->config().vocab_size;
  DraftTokens drafts;
  for (size_t i = 0; i < wanted.size() && i < got.size(); ++i) {
    if (!got[i] || got[i]->base_len != wanted[i].num_tokens) continue;
    spec::Draft& d = *got[i];
    if (static_cast<int>(d.tokens.size()) > wanted[i].max_tokens) {
      d.tokens.resize(wanted[i].max_tokens);
      if (!d.q.empty()) d.q.resize(wanted[i].max_tokens);
      if (!d.parents.empty()) d.parents.resize(wanted[i].max_tokens);
    }
    if (d.tokens.empty()) continue;
    if (absl::Status s = spec::ValidateDraft(d, vocab); !s.ok()) {
      LogDebug("draft dropped", {{"seq", wanted[i].seq}, {"why", std::string(s.message())}});
      continue;
    }
    // A runner without tree attention verifies the first-child chain.
    if (!runner_->SupportsTreeAttention() && !spec::IsChain(d)) d = spec::FirstChildChain(d);
    drafts[wanted[i].seq] = d.tokens;
    step_drafts_[wanted[i].seq] = std::move(d);
  }
  return drafts;
}

void Engine::SyncDrafts(Request& req, const SequenceOutput& out) {
  spec::DraftProvider* provider = options_.draft_provider.get();
  if (provider == nullptr || options_.speculation.num_speculative_tokens <= 0) return;
  if (out.finished) {
    CloseDrafts(req);
    return;
  }
  if (out.new_token_ids.empty()) return;
  const Sequence* seq = scheduler_->FindSequence(req.id);
  if (seq == nullptr) return;
  const int max_k = options_.speculation.num_speculative_tokens;
  if (!req.draft_open) {
    provider->Open(req.id, seq->token_ids(), req.request.sampling, max_k);
    req.draft_open = true;
  } else {
    const int64_t base = seq->num_tokens() - static_cast<int64_t>(out.new_token_ids.size());
    provider->Commit(req.id, base, out.new_token_ids, max_k);
  }
}

void Engine::CloseDrafts(Request& req) {
  if (!req.draft_open || options_.draft_provider == nullptr) return;
  options_.draft_provider->Close(req.id);
  req.draft_open = false;
}

void Engine::Sample(const ScheduledBatch& batch, const std::vector<float>& logits,
                    std::vector<SampledTokens>* sampled) {
  const int64_t vocab = runner_->config().vocab_size;
  int row = 0;
  for (const ScheduledSequence& s : batch.sequences) {
    if (!s.needs_logits) continue;
    const int rows = 1 + s.num_draft_tokens;
    absl::Span<const float> r(logits.data() + row * vocab, rows * vocab);
    row += rows;
    auto it = active_.find(s.id);
    if (it == active_.end()) continue;  // aborted during the step
    SampledTokens st;
    st.id = s.id;
    if (absl::Status status = SampleEntry(s, *it->second, r, &st); !status.ok()) {
      FailSampling(s.id, status);  // non-finite logits: this request only
      continue;
    }
    sampled->push_back(std::move(st));
  }
}

void Engine::TakeGreedyVerification(const ScheduledSequence& s, Request& req,
                                    absl::Span<const int32_t> argmax,
                                    std::vector<SampledTokens>* sampled) {
  // Greedy verification (spec::VerifyChain at temperature 0): accept while
  // the draft equals the target's argmax, then the target's token; all
  // accepted: the bonus token.
  const spec::Draft& draft = step_drafts_.at(s.id);
  const int k = s.num_draft_tokens;
  SampledTokens st;
  st.id = s.id;
  int accepted = 0;
  for (int i = 0; i <= k; ++i) {
    st.token_ids.push_back(argmax[i]);
    if (i == k || draft.tokens[i] != argmax[i]) break;
    ++accepted;
  }
  req.draft_tokens += k;
  req.accepted_tokens += accepted;
  req.draft_length->Observe(options_.speculation, k, accepted);
  observer_->OnDraftVerified(k, accepted);
  std::vector<TokenReport>& reports = pending_reports_[s.id];
  for (TokenId t : st.token_ids) {
    req.counts.AddOutput(t);
    TokenReport report;
    report.token = t;
    reports.push_back(std::move(report));
  }
  sampled->push_back(std::move(st));
}

void Engine::FailSampling(SequenceId id, absl::Status status) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  StreamEvent e;
  e.error = absl::InternalError(absl::StrCat("sampling failed: ", status.message()));
  End(*it->second, std::move(e));
  scheduler_->Abort(id).IgnoreError();
  CloseDrafts(*it->second);
  pending_reports_.erase(id);
  active_.erase(it);
}

bool Engine::DeviceSamplingRows(const ScheduledBatch& batch,
                                std::vector<runner::DeviceSamplingRow>* rows) const {
  if (!options_.device_sampling || !runner_->SupportsDeviceSampling()) return false;
  for (const ScheduledSequence& s : batch.sequences) {
    if (!s.needs_logits) continue;
    auto it = active_.find(s.id);
    if (it == active_.end()) return false;
    const EngineRequest& req = it->second->request;
    const sampling::SamplingParams& p = req.sampling;
    if (req.logprobs || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
        p.frequency_penalty != 0.0f) {
      return false;
    }
    if (s.num_draft_tokens > 0) {
      // Verifying drafts on the device: greedy requests with chains only
      // (the argmax of each of the k + 1 rows decides; sampled verification
      // needs the target's probabilities on the host, a tree the host walk).
      if (!p.greedy() || IsTreeDraft(s.id)) return false;
      for (int i = 0; i <= s.num_draft_tokens; ++i) {
        runner::DeviceSamplingRow row;
        row.temperature = 0.0f;
        rows->push_back(row);
      }
      continue;
    }
    const Sequence* seq = scheduler_->FindSequence(s.id);
    runner::DeviceSamplingRow row;
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.seed = p.seed;
    row.position = seq ? seq->num_tokens() : s.context_len();  // as SampleEntry
    rows->push_back(row);
  }
  return true;
}

void Engine::TakeDeviceTokens(const ScheduledBatch& batch, const std::vector<int32_t>& tokens,
                              std::vector<SampledTokens>* sampled) {
  const int64_t vocab = runner_->config().vocab_size;
  size_t row = 0;
  for (const ScheduledSequence& s : batch.sequences) {
    if (!s.needs_logits) continue;
    const size_t first = row;
    row += 1 + s.num_draft_tokens;
    auto it = active_.find(s.id);
    if (it == active_.end()) continue;  // aborted during the step
    if (row > tokens.size()) {
      FailSampling(s.id, absl::InternalError(absl::StrCat("the runner drew ", tokens.size(),
                                                          " tokens for at least ", row, " rows")));
      continue;
    }
    const auto bad = std::find_if(tokens.begin() + first, tokens.begin() + row,
                                  [vocab](int32_t t) { return t < 0 || t >= vocab; });
    if (bad != tokens.begin() + row) {
      // The GPU sampler's -1: a NaN or +inf logit, no finite logit, or its
      // group of CTAs for the row could not all run (kernels/cuda/sampling.h).
      // Any other id outside the vocabulary fails this request alone too,
      // rather than the whole step in Scheduler::OnStepDone.
      FailSampling(
          s.id,
          *bad < 0
              ? absl::InvalidArgumentError("no token drawn on the GPU: the logits row is not "
                                           "finite, or the sampler's CTAs for the row could not "
                                           "all run")
              : absl::InternalError(absl::StrCat("the device sampler returned token id ", *bad,
                                                 ", outside the vocabulary of ", vocab)));
      continue;
    }
    if (s.num_draft_tokens > 0) {
      TakeGreedyVerification(s, *it->second,
                             absl::MakeConstSpan(tokens).subspan(first, row - first), sampled);
      continue;
    }
    const int32_t token = tokens[first];
    it->second->counts.AddOutput(token);
    SampledTokens st;
    st.id = s.id;
    st.token_ids.push_back(token);
    TokenReport report;
    report.token = token;
    pending_reports_[s.id].push_back(std::move(report));
    sampled->push_back(std::move(st));
  }
}

absl::Status Engine::SampleEntry(const ScheduledSequence& s, Request& req,
                                 absl::Span<const float> rows, SampledTokens* out) {
  const int64_t vocab = runner_->config().vocab_size;
  const Sequence* seq = scheduler_->FindSequence(s.id);
  const int64_t position = seq ? seq->num_tokens() : s.context_len();
  std::vector<TokenReport>& reports = pending_reports_[s.id];
  if (s.num_draft_tokens == 0) {
    absl::StatusOr<sampling::SampleResult> result =
        sampling::Sample(rows, req.request.sampling, req.counts, position);
    if (!result.ok()) return result.status();
    req.counts.AddOutput(result->token);
    out->token_ids.push_back(result->token);
    // Logprobs travel with the token; kept until Emit.
    TokenReport report;
    report.token = result->token;
    if (req.request.logprobs) {
      report.logprob = result->logprob;
      report.top_logprobs = std::move(result->top_logprobs);
    }
    reports.push_back(std::move(report));
    return absl::OkStatus();
  }
  // Speculative decode: verify the drafts against the k + 1 rows.
  const spec::Draft& draft = step_drafts_.at(s.id);
  const int k = s.num_draft_tokens;
  if (!spec::IsChain(draft)) return VerifyTreeEntry(s, req, rows, position, out);
  absl::Span<const TokenId> tokens = absl::MakeConstSpan(draft.tokens).first(k);
  absl::Span<const spec::DraftDistribution> q;
  if (!draft.q.empty()) q = absl::MakeConstSpan(draft.q).first(k);
  absl::StatusOr<spec::VerifyResult> v =
      spec::VerifyChain(rows, vocab, tokens, q, req.request.sampling, &req.counts, position);
  if (!v.ok()) return v.status();
  req.draft_tokens += k;
  req.accepted_tokens += v->num_accepted;
  req.draft_length->Observe(options_.speculation, k, v->num_accepted);
  observer_->OnDraftVerified(k, v->num_accepted);
  out->token_ids = v->tokens;
  for (size_t i = 0; i < v->tokens.size(); ++i) {
    TokenReport report;
    report.token = v->tokens[i];
    if (req.request.logprobs) {
      spec::RawLogprobs(rows.subspan(i * vocab, vocab), report.token,
                        req.request.sampling.top_logprobs, &report.logprob, &report.top_logprobs);
    }
    reports.push_back(std::move(report));
  }
  return absl::OkStatus();
}

absl::Status Engine::VerifyTreeEntry(const ScheduledSequence& s, Request& req,
                                     absl::Span<const float> rows, int64_t position,
                                     SampledTokens* out) {
  const int64_t vocab = runner_->config().vocab_size;
  const spec::Draft& draft = step_drafts_.at(s.id);
  const int k = s.num_draft_tokens;
  absl::StatusOr<spec::VerifyResult> v = spec::VerifyTree(
      rows, vocab, absl::MakeConstSpan(draft.tokens).first(k),
      absl::MakeConstSpan(draft.parents).first(k), req.request.sampling, &req.counts, position);
  if (!v.ok()) return v.status();
  // KV compaction: accepted node path[m] (chunk token first + path[m]) moves
  // to the slot after the decode token and the accepted nodes before it
  // (chunk token first + m), so the kept prefix is contiguous. path is
  // increasing with path[m] >= m: no copy overwrites a later source.
  const int first = s.num_tokens - k;
  std::vector<int64_t> from, to;
  for (size_t m = 0; m < v->path.size(); ++m) {
    if (v->path[m] == static_cast<int32_t>(m)) continue;
    from.push_back(s.slot_mapping[first + v->path[m]]);
    to.push_back(s.slot_mapping[first + m]);
  }
  if (!from.empty()) {
    if (absl::Status c = runner_->CopyKvSlots(from, to); !c.ok()) return c;
  }
  req.draft_tokens += k;
  req.accepted_tokens += v->num_accepted;
  req.draft_length->Observe(options_.speculation, k, v->num_accepted);
  observer_->OnDraftVerified(k, v->num_accepted);
  out->token_ids = v->tokens;
  out->draft_path = v->path;
  std::vector<TokenReport>& reports = pending_reports_[s.id];
  for (size_t m = 0; m < v->tokens.size(); ++m) {
    TokenReport report;
    report.token = v->tokens[m];
    if (req.request.logprobs) {
      // Token m comes from the row of the node before it (row 0: the context).
      const int64_t row = m == 0 ? 0 : 1 + v->path[m - 1];
      spec::RawLogprobs(rows.subspan(row * vocab, vocab), report.token,
                        req.request.sampling.top_logprobs, &report.logprob, &report.top_logprobs);
    }
    reports.push_back(std::move(report));
  }
  return absl::OkStatus();
}

void Engine::Emit(const std::vector<SequenceOutput>& outputs) {
  absl::Time now = absl::Now();
  for (const SequenceOutput& out : outputs) {
    auto it = active_.find(out.id);
    if (it == active_.end()) continue;
    Request& req = *it->second;
    StreamEvent e;
    auto pending = pending_reports_.find(out.id);
    if (pending != pending_reports_.end()) {
      // The scheduler may keep fewer tokens than were sampled (a stop).
      for (size_t i = 0; i < out.new_token_ids.size() && i < pending->second.size(); ++i) {
        e.tokens.push_back(std::move(pending->second[i]));
      }
      pending_reports_.erase(pending);
    }
    if (!out.new_token_ids.empty()) {
      if (!req.last_token_time) {
        observer_->OnFirstToken(now - req.arrival);
        observer_->OnTokens(static_cast<int>(out.new_token_ids.size()) - 1, absl::ZeroDuration());
      } else {
        observer_->OnTokens(static_cast<int>(out.new_token_ids.size()), now - *req.last_token_time);
      }
      req.last_token_time = now;
    }
    SyncDrafts(req, out);
    if (out.finished) {
      e.finish_reason = out.finish_reason;
      if (out.finish_reason == FinishReason::kStop && !out.new_token_ids.empty()) {
        e.stop_token = out.new_token_ids.back();
      }
      e.prompt_tokens = out.num_prompt_tokens;
      e.output_tokens = out.num_output_tokens;
      e.cached_tokens = out.num_cached_tokens;
      e.draft_tokens = req.draft_tokens;
      e.accepted_tokens = req.accepted_tokens;
      const SequenceTimes& t = out.times;
      absl::Time scheduled = t.first_scheduled.value_or(now);
      absl::Time first = t.first_token.value_or(now);
      e.queue_time = scheduled - t.arrival;
      e.prefill_time = first - scheduled;
      e.decode_time = t.finished.value_or(now) - first;
      End(req, std::move(e));
      active_.erase(it);
    } else if (!e.tokens.empty()) {
      req.stream->Push(std::move(e));
    }
  }
}

void Engine::FailStep(const ScheduledBatch& batch, const absl::Status& status) {
  for (const ScheduledSequence& seq : batch.sequences) {
    auto it = active_.find(seq.id);
    if (it == active_.end()) continue;
    StreamEvent e;
    e.error = status;
    End(*it->second, std::move(e));
    CloseDrafts(*it->second);
    pending_reports_.erase(seq.id);
    active_.erase(it);
  }
  EndFailedStep();  // aborts and frees the step's sequences
}

void Engine::EndFailedStep() {
  // Without this the scheduler would still hold the step in flight and
  // refuse every later one.
  if (absl::StatusOr<std::vector<SequenceId>> ended = scheduler_->OnStepFailed(); !ended.ok()) {
    LogError("ending a failed step", {{"error", std::string(ended.status().message())}});
  }
  PublishLoad();
}

void Engine::FailAll(const absl::Status& status) {
  for (auto& [id, req] : active_) {
    scheduler_->Abort(id).IgnoreError();
    CloseDrafts(*req);
    StreamEvent e;
    e.error = status;
    End(*req, std::move(e));
  }
  active_.clear();
  pending_reports_.clear();
  std::vector<std::unique_ptr<Request>> inbox;
  {
    absl::MutexLock lock(&mu_);
    inbox.swap(inbox_);
  }
  for (auto& r : inbox) {
    StreamEvent e;
    e.error = status;
    End(*r, std::move(e));
  }
}

void Engine::End(Request& req, StreamEvent e) {
  e.finished = true;
  observer_->OnFinished(e, absl::Now() - req.arrival);
  req.stream->Push(std::move(e));
}

void Engine::PublishLoad() {
  SchedulerStats stats = scheduler_->stats();
  std::vector<KvCacheEvent> events = scheduler_->TakeKvEvents();
  int64_t waiting_tokens = 0;
  for (const auto& [id, req] : active_) {
    const Sequence* seq = scheduler_->FindSequence(id);
    if (seq && seq->status() != SequenceStatus::kRunning) {
      waiting_tokens += seq->num_uncomputed_tokens();
    }
  }
  observer_->OnSchedulerStats(stats);
  absl::MutexLock lock(&mu_);
  load_.running = stats.num_running;
  load_.waiting = stats.num_waiting;
  load_.kv_blocks_used = stats.blocks.num_used_blocks;
  load_.kv_blocks_total = stats.blocks.num_total_blocks;
  load_.prefix_cache_hit_rate =
      stats.blocks.prefix_query_blocks == 0
          ? 0.0
          : static_cast<double>(stats.blocks.prefix_hit_blocks) / stats.blocks.prefix_query_blocks;
  load_.waiting_prefill_tokens = waiting_tokens;
  load_.preemptions = stats.num_preemptions;
  for (KvCacheEvent& e : events) {
    ApplyToSnapshot(e);
    kv_log_.push_back({next_kv_number_++, std::move(e)});
  }
  while (kv_log_.size() > options_.max_logged_kv_events) kv_log_.pop_front();
}

}  // namespace tessera::engine
