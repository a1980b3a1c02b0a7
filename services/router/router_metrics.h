// RouterMetrics: the tessera_router_* Prometheus families.
//
// Thread-safety: prometheus-cpp metrics are thread-safe.
#pragma once

#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "router/admission.h"
#include "router/router.h"

namespace tessera::services {

class RouterMetrics {
 public:
  explicit RouterMetrics(prometheus::Registry& registry);

  // outcome: ok, invalid, unauthenticated, rejected (admission), unavailable,
  // cancelled (by the client), drain_cut (ended by the router's drain
  // deadline with a final message), error.
  void Request(const std::string& outcome) { requests_.Add({{"outcome", outcome}}).Increment(); }
  prometheus::Counter& retries;
  prometheus::Counter& migrations;
  prometheus::Counter& prefix_hit_tokens;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Histogram& route_decision;
  prometheus::Histogram& ttft;
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& e2e;
  prometheus::Gauge& in_flight;
  prometheus::Family<prometheus::Gauge>& worker_running;
  prometheus::Family<prometheus::Gauge>& worker_waiting;
  prometheus::Family<prometheus::Gauge>& worker_kv_usage;

 private:
  prometheus::Family<prometheus::Counter>& requests_;
};

// The families read from the router's state at each scrape:
//   tessera_router_worker_healthy{worker}: 1 while the router would route to
//     the worker (it reports SERVING, was heard from within --load_staleness
//     and is not ejected), else 0; a worker that stops answering turns 0 as
//     routing stops using it.
//   tessera_router_requests_queued{priority}: requests waiting for an
//     admission slot.
class RouterStateCollector final : public prometheus::Collectable {
 public:
  // REQUIRES: `router` and `admission` outlive the collector.
  RouterStateCollector(const router::Router* router, const router::AdmissionController* admission)
      : router_(router), admission_(admission) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const router::Router* router_;
  const router::AdmissionController* admission_;
};

}  // namespace tessera::services
