// Engine: one worker's inference loop. A dedicated thread repeats
//
//   schedule → run the model → sample → emit tokens → free finished requests
//
// With a runner that takes steps asynchronously (ModelRunner::
// SupportsAsyncSampling) and a step that samples on the device, the loop is
// pipelined one step deep: step N+1 is scheduled, built and submitted while
// step N still runs, its decodes feeding on N's tokens on the device
// (kPendingToken placeholders, runner::PreviousStepToken); then N's tokens
// are collected, resolved, emitted and the load published while N+1 runs.
// README.md has the design and its invariants.
//
// fed by a thread-safe inbox (new requests, cancellations) from the gRPC
// threads. Each request gets a RequestStream its caller reads tokens from.
// Batching, KV blocks and preemption are the Scheduler's business
// (scheduler.h); the forward pass is the ModelRunner's (worker/runner);
// drafts and their bookkeeping are Speculation's (speculation.h), the
// verification rules spec's (worker/spec/verifier.h).
//
// Observability: load snapshots and prefix-cache events for the router
// (Load(), the event log), and an EngineObserver the service layer turns
// into metrics — the engine itself knows nothing of Prometheus or gRPC.
//
// Thread-safety: Submit, Cancel, Load, EventsSince and Stop are thread-safe;
// everything else runs on the engine thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/speculation.h"
#include "worker/runner/model_runner.h"
#include "worker/sampling/sampler.h"
#include "worker/spec/adaptive.h"
#include "worker/spec/draft_provider.h"
#include "worker/spec/verifier.h"

namespace tessera::engine {

// A request as the engine takes it: token ids in.
struct EngineRequest {
  std::string request_id;  // for logs
  std::vector<TokenId> prompt;
  // Tokens generated elsewhere (migration); generation continues after them.
  std::vector<TokenId> generated;
  sampling::SamplingParams sampling;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<TokenId> stop_token_ids;
  int priority = 0;
  bool logprobs = false;  // report each token's log-probability
};

// One token's report.
struct TokenReport {
  TokenId token = 0;
  float logprob = 0;                                 // when requested
  std::vector<sampling::TokenLogprob> top_logprobs;  // when requested
};

// What a request's stream carries: tokens as they are sampled, then one
// final event.
struct StreamEvent {
  std::vector<TokenReport> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<TokenId> stop_token;  // the id that stopped it, for kStop
  int prompt_tokens = 0;
  int output_tokens = 0;  // including resumed ones
  int cached_tokens = 0;
  int draft_tokens = 0;     // speculative tokens verified for this request
  int accepted_tokens = 0;  // of those, accepted
  absl::Duration queue_time, prefill_time, decode_time;
  absl::Status error;  // non-OK when the request failed after acceptance
};

// A single-consumer channel from the engine thread to one request's reader.
class RequestStream {
 public:
  explicit RequestStream(SequenceId id) : id_(id) {}
  SequenceId id() const { return id_; }
  // Waits up to `timeout` for the next event; false on timeout. After the
  // final event (finished == true) no more arrive.
  bool Next(StreamEvent* event, absl::Duration timeout);
  void Push(StreamEvent event);

 private:
  const SequenceId id_;
  absl::Mutex mu_;
  std::deque<StreamEvent> events_ ABSL_GUARDED_BY(mu_);
};

// The numbers the router routes by.
struct LoadSnapshot {
  int running = 0;
  int waiting = 0;  // includes requests still in the inbox
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  double prefix_cache_hit_rate = 0;  // lifetime, in blocks
  int64_t waiting_prefill_tokens = 0;
  int64_t preemptions = 0;
};

// Prefix-cache events numbered in order; a subscriber remembers the number
// after the last one it saw.
struct NumberedKvEvent {
  uint64_t number = 0;
  KvCacheEvent event;
};

// Hooks for metrics, called on the engine thread. Default: nothing.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnStep(const ScheduledBatch& batch, absl::Duration model_time) {}
  virtual void OnFirstToken(absl::Duration ttft) {}
  virtual void OnTokens(int count, absl::Duration since_previous) {}
  // Every request's last event once: a finish (stop, length), an abort
  // (cancelled) or an error.
  virtual void OnFinished(const StreamEvent& final_event, absl::Duration e2e) {}
  // Cumulative scheduler counters after each step (preemptions, prefix-cache
  // queries and hits, ...); observers turn them into deltas.
  virtual void OnSchedulerStats(const SchedulerStats& stats) {}
  // One draft verified: `proposed` tokens (a tree's nodes), `accepted` of
  // them accepted.
  virtual void OnDraftVerified(int proposed, int accepted) {}
};

// The runner's view of a scheduled step.
runner::ForwardBatch ToForwardBatch(const ScheduledBatch& batch);

struct EngineOptions {
  SchedulerOptions scheduler;  // block_size/num_blocks are taken from the runner
  int max_waiting = 1024;      // Submit refuses (RESOURCE_EXHAUSTED) beyond this
  std::vector<TokenId> eos_token_ids;
  size_t max_logged_kv_events = 100000;  // older events are dropped (subscribers resync)
  // Speculative decoding: on when a provider is set and
  // speculation.num_speculative_tokens > 0 (see worker/spec/README.md).
  spec::SpeculationOptions speculation;
  std::shared_ptr<spec::DraftProvider> draft_provider;
  // Sample on the runner's device when it can (runner::ModelRunner::
  // ForwardSample) and no sequence of the step needs the host: no drafts to
  // verify, no logprobs, no penalties. Same tokens as host sampling.
  bool device_sampling = true;
  // Pipeline steps (schedule and submit step N+1 before collecting step N)
  // when the runner has asynchronous steps and a step samples on the device
  // without speculation. Same tokens either way.
  bool pipeline_steps = true;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<runner::ModelRunner> runner,
                                                        EngineOptions options,
                                                        EngineObserver* observer = nullptr);
  ~Engine();  // stops the loop; open streams get a final CANCELLED event
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Called once, on the loop thread, when a step fails and the runner then
  // reports itself unable to run any more (ModelRunner::Health): the worker
  // takes itself out of service. Every request in the engine, and every
  // later one, then fails with UNAVAILABLE naming the runner's reason (the
  // request is sound: a router may run it elsewhere). Set before Start().
  void OnRunnerFailed(std::function<void(const absl::Status&)> fn) {
    on_runner_failed_ = std::move(fn);
  }
  // Starts the loop thread.
  void Start();
  // Stops the loop; in-flight requests end with an error event.
  void Stop();

  // Validates and queues a request. INVALID_ARGUMENT for a malformed one
  // (the message names the field), RESOURCE_EXHAUSTED when the waiting
  // queue is full, UNAVAILABLE once stopped.
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request);
  // Aborts a request; its blocks are freed at once (or at the end of the
  // step in flight). Unknown or finished ids are ignored.
  void Cancel(SequenceId id);

  LoadSnapshot Load() const;
  // Events numbered >= `from` (oldest first) and the next number to ask
  // for. `gap` is set when some were dropped from the log.
  std::vector<NumberedKvEvent> EventsSince(uint64_t from, uint64_t* next, bool* gap) const;
  // Every block now in the prefix cache, as stored-events (a snapshot).
  std::vector<KvCacheEvent> CachedBlocks() const;

  const runner::ModelRunner& runner() const { return *runner_; }
  const EngineOptions& options() const { return options_; }

  // Runs one iteration of the loop on the calling thread (takes the new
  // requests and cancellations, then one step), for tests that drive the
  // engine without its thread. Returns false when there was nothing to do.
  bool StepForTest() {
    DrainInbox();
    return Step();
  }

 private:
  struct Request;
  // What the model returned for a step: logits rows, or the tokens the
  // runner drew on its device.
  struct ModelOutput {
    bool on_device = false;
    std::vector<float> logits;
    std::vector<int32_t> device_tokens;
  };
  // A step submitted to the runner whose tokens are not collected yet.
  struct PendingStep {
    ScheduledBatch batch;
    // The scheduler's outputs for it, with kPendingToken for drawn tokens.
    std::vector<SequenceOutput> outputs;
    absl::flat_hash_map<SequenceId, int32_t> row_of;  // drawn-token row per sequence
    absl::Time submitted;
  };
  Engine(std::unique_ptr<runner::ModelRunner> runner, EngineOptions options,
         EngineObserver* observer);
  void Loop();
  bool Step();
  // The synchronous step: run, sample / verify, complete, emit.
  void RunStep(const ScheduledBatch& batch);

  // Pipelined steps. Whether `batch` can be submitted before the pending
  // step is collected (fills the device rows when so).
  bool CanPipeline(const ScheduledBatch& batch, std::vector<runner::DeviceSamplingRow>* rows) const;
  // Submits `batch`, collects the pending step (if any), completes `batch`
  // with pending tokens and keeps it as the pending step.
  void PipelineStep(const ScheduledBatch& batch, absl::Span<const runner::DeviceSamplingRow> rows);
  // The forward batch of `batch`, placeholders from the pending step's rows.
  absl::StatusOr<runner::ForwardBatch> PipelinedForwardBatch(
      const ScheduledBatch& batch, std::vector<runner::PreviousStepToken>* from_previous) const;
  // Collects the pending step: resolves its tokens, publishes and emits.
  // False when there was none.
  bool FinishPending();
  // The pending step's drawn tokens taken into its outputs and the scheduler.
  std::vector<SequenceOutput> ResolvePending(PendingStep& step, absl::Span<const int32_t> drawn);
  // A pending step whose collection failed.
  void OnPendingFailed(const PendingStep& step, const absl::Status& error);
  // Placeholders in a batch scheduled while a step was pending, replaced by
  // the ids now known (after FinishPending), for a synchronous step.
  void FillResolvedTokens(ScheduledBatch* batch) const;
  // The runner can run no more: the worker leaves service, every request fails.
  void OnRunnerBroken(const absl::Status& health);
  void DrainInbox();
  SamplingOptions SamplingOptionsOf(const EngineRequest& request) const;
  Request* Find(SequenceId id);

  // The forward pass for a step (sampling on the device when every sequence
  // allows it).
  absl::Status RunModel(const ScheduledBatch& batch, ModelOutput* out);
  // Device sampling (EngineOptions::device_sampling) for this step, when
  // every sequence allows it; fills one row per sequence that samples.
  bool DeviceSamplingRows(const ScheduledBatch& batch,
                          std::vector<runner::DeviceSamplingRow>* rows) const;
  // A failed forward pass: the batch's requests fail, or every request when
  // the runner can run no more.
  void OnModelFailed(const ScheduledBatch& batch, const absl::Status& error);

  // Sampling: each sequence that needed logits gets its next token, or its
  // verified drafts, from its rows of the model's output. A sequence that
  // cannot be sampled fails alone.
  std::vector<SampledTokens> Sample(const ScheduledBatch& batch, const ModelOutput& model);
  absl::StatusOr<SampledTokens> SampleOnHost(const ScheduledSequence& s, Request& req,
                                             absl::Span<const float> rows);
  // Rows [first, end) of the tokens the device drew (DeviceSamplingRows).
  absl::StatusOr<SampledTokens> TakeDeviceTokens(const ScheduledSequence& s, Request& req,
                                                 absl::Span<const int32_t> tokens, size_t first,
                                                 size_t end);
  // One token from one row (no drafts), on the host.
  absl::StatusOr<SampledTokens> SampleToken(const ScheduledSequence& s, Request& req,
                                            absl::Span<const float> row);
  // The step's draft for `s` verified against its k + 1 rows.
  absl::StatusOr<SampledTokens> VerifyOnHost(const ScheduledSequence& s, Request& req,
                                             absl::Span<const float> rows);
  // The drafts' verification (spec/verifier.h) taken into the step: a
  // tree's accepted K/V moved next to the decode token, the counts of the
  // draft recorded, the tokens reported. `rows` (empty after device
  // sampling) give the logprobs.
  absl::StatusOr<SampledTokens> TakeVerified(const ScheduledSequence& s, Request& req,
                                             spec::VerifyResult verified,
                                             absl::Span<const float> rows);
  // A tree's accepted nodes' K/V moved to contiguous slots
  // (kv_compaction.h, runner::ModelRunner::CopyKvSlots).
  absl::Status KeepAcceptedKv(const ScheduledSequence& s, absl::Span<const int32_t> path);
  // A token's report, with its logprobs from `row` when the request asks.
  TokenReport ReportOf(const Request& req, TokenId token, absl::Span<const float> row) const;
  // The position of the token a sequence samples next.
  int64_t NextPosition(const ScheduledSequence& s) const;

  void Emit(const std::vector<SequenceOutput>& outputs);
  // The final event's counts and times for a finished sequence.
  void FillFinish(const SequenceOutput& out, const Request& req, absl::Time now,
                  StreamEvent* e) const;
  // Ends a request whose logits could not be sampled.
  void FailSampling(SequenceId id, absl::Status status);
  // A failed model step: its requests fail with `status`, the others go on.
  void FailStep(const ScheduledBatch& batch, const absl::Status& status);
  void FailAll(const absl::Status& status);
  // Ends an active request with an error event and forgets it.
  void FailActive(SequenceId id, const absl::Status& status);
  // Ends a request's stream with its last event (an error, an abort or a
  // finish reason): every request ends here once, and the observer counts it.
  void End(Request& req, StreamEvent e);
  // After FailAll for a step that produced no usable tokens: the scheduler
  // drops the step (its sequences freed) and takes new work.
  void EndFailedStep();
  void PublishLoad();
  void ApplyToSnapshot(const KvCacheEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<runner::ModelRunner> runner_;
  EngineOptions options_;
  EngineObserver* observer_;
  std::function<void(const absl::Status&)> on_runner_failed_;
  bool runner_failed_ = false;            // loop thread
  std::unique_ptr<Scheduler> scheduler_;  // engine thread only

  mutable absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Request>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<SequenceId> cancels_ ABSL_GUARDED_BY(mu_);
  LoadSnapshot load_ ABSL_GUARDED_BY(mu_);
  std::deque<NumberedKvEvent> kv_log_ ABSL_GUARDED_BY(mu_);
  uint64_t next_kv_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks now in the prefix cache: hash -> (parent hash, token ids).
  struct CachedBlock {
    std::optional<uint64_t> parent;
    std::vector<TokenId> tokens;
  };
  absl::flat_hash_map<uint64_t, CachedBlock> cached_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_id_{1};

  // Engine thread only.
  absl::flat_hash_map<SequenceId, std::unique_ptr<Request>> active_;
  Speculation speculation_;
  std::optional<PendingStep> pending_;
  std::thread thread_;
};

}  // namespace tessera::engine
