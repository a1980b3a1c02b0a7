// WorkerMetrics: the tessera_worker_* Prometheus families, fed by the
// engine's observer hooks (engine thread) and read by scrapes.
//
// Thread-safety: prometheus-cpp metrics are thread-safe; the delta state
// for cumulative counters is touched only on the engine thread.
#pragma once

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/worker/draft_client.h"
#include "worker/engine/engine.h"

namespace tessera::services {

class WorkerMetrics final : public engine::EngineObserver, public DraftClientObserver {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void OnStep(const engine::ScheduledBatch& batch, absl::Duration model_time) override;
  void OnFirstToken(absl::Duration ttft) override;
  void OnTokens(int count, absl::Duration since_previous) override;
  void OnFinished(const engine::StreamEvent& final_event, absl::Duration e2e) override;
  void OnSchedulerStats(const engine::SchedulerStats& stats) override;
  // Speculative decoding (tessera_spec_decode_*).
  void OnDraftVerified(int proposed, int accepted) override;
  void OnStaleProposal() override;
  void OnLateProposal() override;
  void OnProposalRoundTrip(absl::Duration rtt) override;

 private:
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& kv_usage_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& queue_time_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& step_time_;
  prometheus::Histogram& step_tokens_;
  prometheus::Counter& spec_drafts_;
  prometheus::Counter& spec_draft_tokens_;
  prometheus::Counter& spec_accepted_tokens_;
  prometheus::Family<prometheus::Counter>& spec_accepted_per_position_;
  prometheus::Counter& spec_stale_;
  prometheus::Counter& spec_late_;
  prometheus::Histogram& spec_rtt_;
  std::vector<prometheus::Counter*> spec_position_counters_;  // engine thread only
  engine::SchedulerStats last_;
};

}  // namespace tessera::services
