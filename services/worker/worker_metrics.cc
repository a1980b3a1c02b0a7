#include "services/worker/worker_metrics.h"

#include "absl/strings/string_view.h"
#include "services/common/metrics.h"

namespace tessera::services {
namespace {

// Latency buckets from 1 ms to 60 s (TTFT, queue, end-to-end).
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60};
}
// Per-token and per-step buckets from 0.5 ms to 2.5 s.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5};
}

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name, const char* help) {
  return AddGaugeFamily(r, name, help).Add({});
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : running_(Gauge(r, "tessera_worker_requests_running", "Requests holding KV blocks")),
      waiting_(Gauge(r, "tessera_worker_requests_waiting", "Requests queued for admission")),
      kv_usage_(Gauge(r, "tessera_worker_kv_cache_usage_ratio",
                      "Fraction of KV blocks referenced by requests (0..1)")),
      prefix_queries_(AddCounter(r, "tessera_worker_prefix_cache_queries_total",
                                 "Prompt blocks looked up in the prefix cache")),
      prefix_hits_(AddCounter(r, "tessera_worker_prefix_cache_hits_total",
                              "Prompt blocks found in the prefix cache")),
      preemptions_(AddCounter(r, "tessera_worker_preemptions_total",
                              "Requests preempted (recomputed later) for lack of KV blocks")),
      prompt_tokens_(AddCounter(r, "tessera_worker_prompt_tokens_total",
                                "Prompt tokens computed (prefill, excluding cache hits)")),
      generation_tokens_(
          AddCounter(r, "tessera_worker_generation_tokens_total", "Tokens generated")),
      finished_(prometheus::BuildCounter()
                    .Name("tessera_worker_requests_finished_total")
                    .Help("Finished requests by finish reason (stop, length, abort, error)")
                    .Register(r)),
      ttft_(AddHistogram(r, "tessera_worker_time_to_first_token_seconds",
                         "Arrival to first generated token", LatencyBuckets())),
      itl_(AddHistogram(r, "tessera_worker_inter_token_latency_seconds",
                        "Time between consecutive tokens of a request", StepBuckets())),
      queue_time_(AddHistogram(r, "tessera_worker_queue_time_seconds",
                               "Arrival to first scheduling", LatencyBuckets())),
      e2e_(AddHistogram(r, "tessera_worker_e2e_request_latency_seconds",
                        "Arrival to the final token", LatencyBuckets())),
      step_time_(AddHistogram(r, "tessera_worker_step_duration_seconds",
                              "Model forward time per engine step", StepBuckets())),
      step_tokens_(AddHistogram(r, "tessera_worker_step_tokens", "Tokens computed per engine step",
                                {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096})),
      spec_drafts_(AddCounter(r, "tessera_spec_decode_num_drafts_total",
                              "Drafts verified (speculative decoding)")),
      spec_draft_tokens_(
          AddCounter(r, "tessera_spec_decode_draft_tokens_total", "Draft tokens verified")),
      spec_accepted_tokens_(
          AddCounter(r, "tessera_spec_decode_accepted_tokens_total", "Draft tokens accepted")),
      spec_accepted_per_position_(
          prometheus::BuildCounter()
              .Name("tessera_spec_decode_accepted_per_position_total")
              .Help("Draft tokens accepted, by position in the draft (0 = first)")
              .Register(r)),
      spec_stale_(AddCounter(r, "tessera_spec_decode_stale_proposals_total",
                             "Proposals dropped: built on a length the sequence no longer has")),
      spec_late_(AddCounter(r, "tessera_spec_decode_late_proposals_total",
                            "Proposals that arrived after the step they were for")),
      spec_rtt_(AddHistogram(r, "tessera_spec_decode_drafter_rtt_seconds",
                             "Commit or open sent to the matching proposal received",
                             {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1})) {}

void WorkerMetrics::OnDraftVerified(int proposed, int accepted) {
  spec_drafts_.Increment();
  spec_draft_tokens_.Increment(proposed);
  spec_accepted_tokens_.Increment(accepted);
  for (int i = 0; i < accepted; ++i) {
    while (static_cast<int>(spec_position_counters_.size()) <= i) {
      spec_position_counters_.push_back(&spec_accepted_per_position_.Add(
          {{"position", std::to_string(spec_position_counters_.size())}}));
    }
    spec_position_counters_[i]->Increment();
  }
}

void WorkerMetrics::OnStaleProposal() { spec_stale_.Increment(); }
void WorkerMetrics::OnLateProposal() { spec_late_.Increment(); }
void WorkerMetrics::OnProposalRoundTrip(absl::Duration rtt) {
  spec_rtt_.Observe(absl::ToDoubleSeconds(rtt));
}

void WorkerMetrics::OnStep(const engine::ScheduledBatch& batch, absl::Duration model_time) {
  step_time_.Observe(absl::ToDoubleSeconds(model_time));
  step_tokens_.Observe(batch.num_batched_tokens);
}

void WorkerMetrics::OnFirstToken(absl::Duration ttft) {
  ttft_.Observe(absl::ToDoubleSeconds(ttft));
  generation_tokens_.Increment();
}

void WorkerMetrics::OnTokens(int count, absl::Duration since_previous) {
  if (count <= 0) return;
  generation_tokens_.Increment(count);
  if (since_previous > absl::ZeroDuration()) {
    // Several tokens at once (speculation) share the interval.
    for (int i = 0; i < count; ++i) itl_.Observe(absl::ToDoubleSeconds(since_previous) / count);
  }
}

void WorkerMetrics::OnFinished(const engine::StreamEvent& e, absl::Duration e2e) {
  std::string reason =
      e.error.ok() ? std::string(engine::FinishReasonName(e.finish_reason)) : std::string("error");
  finished_.Add({{"reason", reason}}).Increment();
  // The latency histograms describe completed generations only.
  if (!e.error.ok() || e.finish_reason == engine::FinishReason::kAbort) return;
  queue_time_.Observe(absl::ToDoubleSeconds(e.queue_time));
  e2e_.Observe(absl::ToDoubleSeconds(e2e));
}

void WorkerMetrics::OnSchedulerStats(const engine::SchedulerStats& s) {
  running_.Set(s.num_running);
  waiting_.Set(s.num_waiting);
  kv_usage_.Set(s.blocks.num_total_blocks == 0
                    ? 0.0
                    : static_cast<double>(s.blocks.num_used_blocks) / s.blocks.num_total_blocks);
  auto delta = [](int64_t now, int64_t before) { return now > before ? now - before : 0; };
  prefix_queries_.Increment(delta(s.blocks.prefix_query_blocks, last_.blocks.prefix_query_blocks));
  prefix_hits_.Increment(delta(s.blocks.prefix_hit_blocks, last_.blocks.prefix_hit_blocks));
  preemptions_.Increment(delta(s.num_preemptions, last_.num_preemptions));
  prompt_tokens_.Increment(delta(s.num_prefill_tokens, last_.num_prefill_tokens));
  last_ = s;
}

}  // namespace tessera::services
