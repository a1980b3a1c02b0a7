#include "worker/engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "worker/engine/kv_compaction.h"
#include "worker/spec/verifier.h"

namespace tessera::engine {

// A request the engine owns: its stream, sampling state and timing.
// (Its speculation state is in Speculation.)
struct Engine::Request {
  SequenceId id = 0;
  EngineRequest request;
  std::shared_ptr<RequestStream> stream;
  sampling::TokenCounts counts;
  absl::Time arrival;
  std::optional<absl::Time> last_token_time;
  // Tokens sampled in the step in flight, with their logprobs, until Emit.
  std::vector<TokenReport> reports;
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

namespace {

// The tokens the device sampler drew for one sequence. The GPU sampler's -1:
// a NaN or +inf logit, no finite logit, or its group of CTAs for the row
// could not all run (kernels/cuda/sampling.h). Any other id outside the
// vocabulary fails the request alone too, rather than the whole step in
// Scheduler::OnStepDone.
absl::Status CheckDrawnTokens(absl::Span<const int32_t> drawn, int64_t vocab) {
  const auto bad =
      std::find_if(drawn.begin(), drawn.end(), [vocab](int32_t t) { return t < 0 || t >= vocab; });
  if (bad == drawn.end()) return absl::OkStatus();
  if (*bad < 0) {
    return absl::InvalidArgumentError(
        "no token drawn on the GPU: the logits row is not finite, or the sampler's CTAs for the "
        "row could not all run");
  }
  return absl::InternalError(absl::StrCat("the device sampler returned token id ", *bad,
                                          ", outside the vocabulary of ", vocab));
}

}  // namespace

// ---- Engine ----

Engine::Engine(std::unique_ptr<runner::ModelRunner> runner, EngineOptions options,
               EngineObserver* observer)
    : runner_(std::move(runner)),
      options_(std::move(options)),
      observer_(observer),
      speculation_(options_.speculation, options_.draft_provider) {
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
  if (auto s = scheduler_->CheckAdmissible(request.prompt, request.generated,
                                           SamplingOptionsOf(request));
      !s.ok()) {
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

SamplingOptions Engine::SamplingOptionsOf(const EngineRequest& request) const {
  SamplingOptions so;
  so.max_tokens = request.max_tokens;
  so.eos_token_ids = options_.eos_token_ids;
  so.ignore_eos = request.ignore_eos;
  so.stop_token_ids = request.stop_token_ids;
  so.priority = request.priority;
  return so;
}

Engine::Request* Engine::Find(SequenceId id) {
  auto it = active_.find(id);
  return it == active_.end() ? nullptr : it->second.get();
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
    absl::Status s = scheduler_->AddSequence(r->id, r->request.prompt,
                                             SamplingOptionsOf(r->request), r->request.generated);
    if (!s.ok()) {
      StreamEvent e;
      e.error = s;
      End(*r, std::move(e));
      continue;
    }
    speculation_.Add(r->id);
    active_[r->id] = std::move(r);
  }
  std::vector<std::unique_ptr<Request>> aborted;
  for (SequenceId id : cancels) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    // Abort frees the blocks now, or when the step in flight completes.
    scheduler_->Abort(id).IgnoreError();
    speculation_.Remove(id);
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

// One engine step: (drafts →) schedule → run → sample / verify → emit → free;
// pipelined: schedule → submit → collect the step before → emit it.
bool Engine::Step() {
  const DraftTokens drafts = speculation_.CollectDrafts(*scheduler_, runner_->config().vocab_size,
                                                        runner_->SupportsTreeAttention());
  absl::StatusOr<ScheduledBatch> batch = scheduler_->Schedule(drafts.empty() ? nullptr : &drafts);
  if (!batch.ok()) {
    FailAll(batch.status());
    return false;
  }
  if (batch->empty()) return FinishPending();
  std::vector<runner::DeviceSamplingRow> rows;
  if (CanPipeline(*batch, &rows)) {
    PipelineStep(*batch, rows);
    return true;
  }
  if (FinishPending()) FillResolvedTokens(&*batch);
  RunStep(*batch);
  return true;
}

void Engine::RunStep(const ScheduledBatch& batch) {
  ModelOutput model;
  if (absl::Status run = RunModel(batch, &model); !run.ok()) {
    OnModelFailed(batch, run);
    return;
  }
  const std::vector<SampledTokens> sampled = Sample(batch, model);
  absl::StatusOr<std::vector<SequenceOutput>> outputs = scheduler_->OnStepDone(sampled);
  if (!outputs.ok()) {
    FailAll(outputs.status());
    EndFailedStep();
    return;
  }
  // Load first: a reader that sees a request finish then sees its blocks freed.
  PublishLoad();
  Emit(*outputs);
}

// ---- Pipelined steps ----

bool Engine::CanPipeline(const ScheduledBatch& batch,
                         std::vector<runner::DeviceSamplingRow>* rows) const {
  if (!options_.pipeline_steps || !runner_->SupportsAsyncSampling() || speculation_.enabled()) {
    return false;
  }
  for (const ScheduledSequence& s : batch.sequences) {
    if (s.num_draft_tokens > 0) return false;
  }
  return DeviceSamplingRows(batch, rows);
}

void Engine::PipelineStep(const ScheduledBatch& batch,
                          absl::Span<const runner::DeviceSamplingRow> rows) {
  std::vector<runner::PreviousStepToken> from_previous;
  absl::StatusOr<runner::ForwardBatch> forward = PipelinedForwardBatch(batch, &from_previous);
  const absl::Time start = absl::Now();
  absl::Status submitted = forward.status();
  if (submitted.ok()) submitted = runner_->SubmitSample(*forward, rows, from_previous);
  // Step N's tokens, while N + 1 runs. (A failed submission queued nothing.)
  FinishPending();
  if (!submitted.ok()) {
    OnModelFailed(batch, submitted);
    return;
  }
  PendingStep step;
  step.submitted = start;
  std::vector<SampledTokens> placeholders;
  int32_t row = 0;
  for (const ScheduledSequence& s : batch.sequences) {
    if (!s.needs_logits) continue;
    step.row_of[s.id] = row++;
    // Finished or aborted meanwhile: nothing to hand in.
    if (Find(s.id) != nullptr && scheduler_->FindSequence(s.id) != nullptr) {
      placeholders.push_back({s.id, {kPendingToken}, {}});
    }
  }
  absl::StatusOr<std::vector<SequenceOutput>> outputs = scheduler_->OnStepDone(placeholders);
  if (!outputs.ok()) {  // unreachable: placeholders match the batch
    std::vector<int32_t> ignored;
    runner_->CollectSample(&ignored).IgnoreError();
    FailAll(outputs.status());
    EndFailedStep();
    return;
  }
  step.batch = batch;
  step.outputs = *std::move(outputs);
  pending_ = std::move(step);
  PublishLoad();
}

absl::StatusOr<runner::ForwardBatch> Engine::PipelinedForwardBatch(
    const ScheduledBatch& batch, std::vector<runner::PreviousStepToken>* from_previous) const {
  runner::ForwardBatch forward = ToForwardBatch(batch);
  for (int32_t i = 0; i < forward.num_tokens(); ++i) {
    if (forward.token_ids[i] != kPendingToken) continue;
    // The placeholder of a sequence the pending step samples: the runner
    // takes the id that step draws for its row.
    const auto seq =
        std::upper_bound(forward.query_start_loc.begin() + 1, forward.query_start_loc.end(), i) -
        (forward.query_start_loc.begin() + 1);
    const SequenceId id = batch.sequences[seq].id;
    if (!pending_ || !pending_->row_of.contains(id)) {
      return absl::InternalError(
          absl::StrCat("sequence ", id, " has a pending token but no pending step draws it"));
    }
    from_previous->push_back({i, pending_->row_of.at(id)});
    forward.token_ids[i] = 0;  // any id: the runner replaces it
  }
  return forward;
}

bool Engine::FinishPending() {
  if (!pending_) return false;
  PendingStep step = std::move(*pending_);
  pending_.reset();
  std::vector<int32_t> drawn;
  const absl::Status collected = runner_->CollectSample(&drawn);
  observer_->OnStep(step.batch, absl::Now() - step.submitted);
  if (!collected.ok()) {
    OnPendingFailed(step, collected);
    return true;
  }
  const std::vector<SequenceOutput> outputs = ResolvePending(step, drawn);
  PublishLoad();
  Emit(outputs);
  return true;
}

std::vector<SequenceOutput> Engine::ResolvePending(PendingStep& step,
                                                   absl::Span<const int32_t> drawn) {
  const int64_t vocab = runner_->config().vocab_size;
  std::vector<SequenceOutput> outputs;
  outputs.reserve(step.outputs.size());
  for (SequenceOutput& out : step.outputs) {
    Request* req = Find(out.id);
    const bool pending = !out.new_token_ids.empty() && out.new_token_ids.back() == kPendingToken;
    if (!pending) {
      outputs.push_back(std::move(out));
      continue;
    }
    const size_t row = static_cast<size_t>(step.row_of.at(out.id));
    absl::Status checked =
        row < drawn.size() ? CheckDrawnTokens(drawn.subspan(row, 1), vocab)
                           : absl::InternalError(absl::StrCat("the runner drew ", drawn.size(),
                                                              " tokens for ", row + 1, " rows"));
    absl::StatusOr<std::optional<SequenceOutput>> resolved =
        checked.ok() ? scheduler_->ResolvePendingToken(out.id, drawn[row]) : checked;
    if (req == nullptr) continue;  // aborted meanwhile
    if (!resolved.ok()) {
      FailSampling(out.id, resolved.status());
      continue;
    }
    const TokenId token = drawn[row];
    if (resolved->has_value()) out = **std::move(resolved);
    out.new_token_ids.back() = token;
    req->counts.AddOutput(token);
    req->reports.push_back(ReportOf(*req, token, {}));
    outputs.push_back(std::move(out));
  }
  return outputs;
}

void Engine::OnPendingFailed(const PendingStep& step, const absl::Status& error) {
  const absl::Status health = runner_->Health();
  LogError(health.ok() ? "pipelined model step failed; failing its requests"
                       : "pipelined model step failed and the runner can run no more; failing "
                         "every request",
           {{"error", std::string(error.message())}});
  if (!health.ok()) {
    OnRunnerBroken(health);
    return;
  }
  // Their KV is unknown: they end here (a step in flight that includes one
  // frees it when it completes).
  for (const ScheduledSequence& s : step.batch.sequences) {
    if (Find(s.id) == nullptr) continue;
    FailActive(s.id, error);
    scheduler_->Abort(s.id).IgnoreError();
  }
  PublishLoad();
}

void Engine::FillResolvedTokens(ScheduledBatch* batch) const {
  for (ScheduledSequence& s : batch->sequences) {
    const Sequence* seq = scheduler_->FindSequence(s.id);
    for (int i = 0; i < s.num_tokens; ++i) {
      if (s.token_ids[i] != kPendingToken) continue;
      // Finished or aborted meanwhile: any id (its result is dropped).
      s.token_ids[i] = seq != nullptr ? seq->token_ids()[s.start_position + i] : 0;
    }
  }
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

absl::Status Engine::RunModel(const ScheduledBatch& batch, ModelOutput* out) {
  runner::ForwardBatch forward = ToForwardBatch(batch);
  speculation_.LayOutTrees(batch, &forward);
  std::vector<runner::DeviceSamplingRow> device_rows;
  out->on_device = DeviceSamplingRows(batch, &device_rows);
  const absl::Time start = absl::Now();
  absl::Status run = out->on_device
                         ? runner_->ForwardSample(forward, device_rows, &out->device_tokens)
                         : runner_->Forward(forward, &out->logits);
  observer_->OnStep(batch, absl::Now() - start);
  return run;
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
      if (!p.greedy() || speculation_.IsTree(s.id)) return false;
      for (int i = 0; i <= s.num_draft_tokens; ++i) {
        runner::DeviceSamplingRow row;
        row.temperature = 0.0f;
        rows->push_back(row);
      }
      continue;
    }
    runner::DeviceSamplingRow row;
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    row.seed = p.seed;
    row.position = NextPosition(s);
    rows->push_back(row);
  }
  return true;
}

void Engine::OnModelFailed(const ScheduledBatch& batch, const absl::Status& error) {
  const absl::Status health = runner_->Health();
  LogError(health.ok() ? "model step failed; failing the batch's requests"
                       : "model step failed and the runner can run no more; failing every "
                         "request",
           {{"error", std::string(error.message())}});
  if (health.ok()) {
    FailStep(batch, error);
    return;
  }
  OnRunnerBroken(health);
  EndFailedStep();
}

void Engine::OnRunnerBroken(const absl::Status& health) {
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
}

std::vector<SampledTokens> Engine::Sample(const ScheduledBatch& batch, const ModelOutput& model) {
  const int64_t vocab = runner_->config().vocab_size;
  const absl::Span<const float> logits = model.logits;
  std::vector<SampledTokens> sampled;
  size_t end = 0;  // rows taken so far
  for (const ScheduledSequence& s : batch.sequences) {
    if (!s.needs_logits) continue;
    const size_t first = end;
    end += 1 + s.num_draft_tokens;
    Request* req = Find(s.id);
    if (req == nullptr) continue;  // aborted during the step
    absl::StatusOr<SampledTokens> taken =
        model.on_device
            ? TakeDeviceTokens(s, *req, model.device_tokens, first, end)
            : SampleOnHost(s, *req, logits.subspan(first * vocab, (end - first) * vocab));
    if (!taken.ok()) {
      FailSampling(s.id, taken.status());  // e.g. non-finite logits: this request only
      continue;
    }
    sampled.push_back(*std::move(taken));
  }
  return sampled;
}

absl::StatusOr<SampledTokens> Engine::SampleOnHost(const ScheduledSequence& s, Request& req,
                                                   absl::Span<const float> rows) {
  return s.num_draft_tokens == 0 ? SampleToken(s, req, rows) : VerifyOnHost(s, req, rows);
}

absl::StatusOr<SampledTokens> Engine::TakeDeviceTokens(const ScheduledSequence& s, Request& req,
                                                       absl::Span<const int32_t> tokens,
                                                       size_t first, size_t end) {
  if (end > tokens.size()) {
    return absl::InternalError(
        absl::StrCat("the runner drew ", tokens.size(), " tokens for at least ", end, " rows"));
  }
  const absl::Span<const int32_t> drawn = tokens.subspan(first, end - first);
  if (absl::Status checked = CheckDrawnTokens(drawn, runner_->config().vocab_size); !checked.ok()) {
    return checked;
  }
  if (s.num_draft_tokens > 0) {
    const absl::Span<const TokenId> draft =
        absl::MakeConstSpan(speculation_.StepDraft(s.id).tokens).first(s.num_draft_tokens);
    return TakeVerified(s, req, spec::VerifyChainArgmax(draft, drawn, &req.counts), {});
  }
  req.counts.AddOutput(drawn[0]);
  req.reports.push_back(ReportOf(req, drawn[0], {}));
  return SampledTokens{s.id, {drawn[0]}, {}};
}

absl::StatusOr<SampledTokens> Engine::SampleToken(const ScheduledSequence& s, Request& req,
                                                  absl::Span<const float> row) {
  absl::StatusOr<sampling::SampleResult> result =
      sampling::Sample(row, req.request.sampling, req.counts, NextPosition(s));
  if (!result.ok()) return result.status();
  req.counts.AddOutput(result->token);
  // Logprobs travel with the token; kept until Emit.
  TokenReport report;
  report.token = result->token;
  if (req.request.logprobs) {
    report.logprob = result->logprob;
    report.top_logprobs = std::move(result->top_logprobs);
  }
  req.reports.push_back(std::move(report));
  return SampledTokens{s.id, {result->token}, {}};
}

absl::StatusOr<SampledTokens> Engine::VerifyOnHost(const ScheduledSequence& s, Request& req,
                                                   absl::Span<const float> rows) {
  absl::StatusOr<spec::VerifyResult> verified =
      spec::VerifyDraft(rows, runner_->config().vocab_size, speculation_.StepDraft(s.id),
                        s.num_draft_tokens, req.request.sampling, &req.counts, NextPosition(s));
  if (!verified.ok()) return verified.status();
  return TakeVerified(s, req, *std::move(verified), rows);
}

absl::StatusOr<SampledTokens> Engine::TakeVerified(const ScheduledSequence& s, Request& req,
                                                   spec::VerifyResult verified,
                                                   absl::Span<const float> rows) {
  if (absl::Status kept = KeepAcceptedKv(s, verified.path); !kept.ok()) return kept;
  speculation_.Record(s.id, s.num_draft_tokens, verified.num_accepted);
  observer_->OnDraftVerified(s.num_draft_tokens, verified.num_accepted);
  const int64_t vocab = runner_->config().vocab_size;
  for (size_t m = 0; m < verified.tokens.size(); ++m) {
    const absl::Span<const float> row =
        rows.empty() ? rows : rows.subspan(spec::LogitsRowOf(verified, m) * vocab, vocab);
    req.reports.push_back(ReportOf(req, verified.tokens[m], row));
  }
  return SampledTokens{s.id, std::move(verified.tokens), std::move(verified.path)};
}

absl::Status Engine::KeepAcceptedKv(const ScheduledSequence& s, absl::Span<const int32_t> path) {
  const absl::Span<const int64_t> node_slots =
      absl::MakeConstSpan(s.slot_mapping).subspan(s.num_tokens - s.num_draft_tokens);
  const KvSlotCopies copies = AcceptedPathCopies(node_slots, path);
  return copies.empty() ? absl::OkStatus() : runner_->CopyKvSlots(copies.from, copies.to);
}

TokenReport Engine::ReportOf(const Request& req, TokenId token, absl::Span<const float> row) const {
  TokenReport report;
  report.token = token;
  if (req.request.logprobs && !row.empty()) {
    spec::RawLogprobs(row, token, req.request.sampling.top_logprobs, &report.logprob,
                      &report.top_logprobs);
  }
  return report;
}

int64_t Engine::NextPosition(const ScheduledSequence& s) const {
  const Sequence* seq = scheduler_->FindSequence(s.id);
  return seq ? seq->num_tokens() : s.context_len();
}

void Engine::Emit(const std::vector<SequenceOutput>& outputs) {
  absl::Time now = absl::Now();
  for (const SequenceOutput& out : outputs) {
    auto it = active_.find(out.id);
    if (it == active_.end()) continue;
    Request& req = *it->second;
    StreamEvent e;
    // The scheduler may keep fewer tokens than were sampled (a stop).
    const size_t kept = std::min(out.new_token_ids.size(), req.reports.size());
    e.tokens.assign(std::make_move_iterator(req.reports.begin()),
                    std::make_move_iterator(req.reports.begin() + kept));
    req.reports.clear();
    if (!out.new_token_ids.empty()) {
      if (!req.last_token_time) {
        observer_->OnFirstToken(now - req.arrival);
        observer_->OnTokens(static_cast<int>(out.new_token_ids.size()) - 1, absl::ZeroDuration());
      } else {
        observer_->OnTokens(static_cast<int>(out.new_token_ids.size()), now - *req.last_token_time);
      }
      req.last_token_time = now;
    }
    if (out.finished) {
      FillFinish(out, req, now, &e);
      speculation_.Remove(out.id);
      End(req, std::move(e));
      active_.erase(it);
      continue;
    }
    if (const Sequence* seq = scheduler_->FindSequence(out.id); seq != nullptr) {
      speculation_.Commit(out.id, *seq, out.new_token_ids, req.request.sampling);
    }
    if (!e.tokens.empty()) req.stream->Push(std::move(e));
  }
}

void Engine::FillFinish(const SequenceOutput& out, const Request& req, absl::Time now,
                        StreamEvent* e) const {
  e->finish_reason = out.finish_reason;
  if (out.finish_reason == FinishReason::kStop && !out.new_token_ids.empty()) {
    e->stop_token = out.new_token_ids.back();
  }
  e->prompt_tokens = out.num_prompt_tokens;
  e->output_tokens = out.num_output_tokens;
  e->cached_tokens = out.num_cached_tokens;
  const Speculation::Counts drafts = speculation_.CountsOf(req.id);
  e->draft_tokens = drafts.proposed;
  e->accepted_tokens = drafts.accepted;
  const SequenceTimes& t = out.times;
  absl::Time scheduled = t.first_scheduled.value_or(now);
  absl::Time first = t.first_token.value_or(now);
  e->queue_time = scheduled - t.arrival;
  e->prefill_time = first - scheduled;
  e->decode_time = t.finished.value_or(now) - first;
}

void Engine::FailSampling(SequenceId id, absl::Status status) {
  if (!active_.contains(id)) return;
  FailActive(id, absl::InternalError(absl::StrCat("sampling failed: ", status.message())));
  scheduler_->Abort(id).IgnoreError();
}

void Engine::FailStep(const ScheduledBatch& batch, const absl::Status& status) {
  for (const ScheduledSequence& seq : batch.sequences) FailActive(seq.id, status);
  EndFailedStep();  // aborts and frees the step's sequences
}

void Engine::FailActive(SequenceId id, const absl::Status& status) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  StreamEvent e;
  e.error = status;
  End(*it->second, std::move(e));
  speculation_.Remove(id);
  active_.erase(it);
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
  if (pending_) {  // its tokens have no reader any more
    std::vector<int32_t> ignored;
    runner_->CollectSample(&ignored).IgnoreError();
    pending_.reset();
  }
  for (auto& [id, req] : active_) {
    scheduler_->Abort(id).IgnoreError();
    speculation_.Remove(id);
    StreamEvent e;
    e.error = status;
    End(*req, std::move(e));
  }
  active_.clear();
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
