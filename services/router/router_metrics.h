// RouterMetrics: the tessera_router_* Prometheus families.
//
// Thread-safety: prometheus-cpp metrics are thread-safe.
#pragma once

#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tessera::services {

class RouterMetrics {
 public:
  explicit RouterMetrics(prometheus::Registry& registry);

  // outcome: ok, invalid, unauthenticated, rejected (admission), unavailable,
  // cancelled, error.
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
  prometheus::Family<prometheus::Gauge>& worker_healthy;
  prometheus::Family<prometheus::Gauge>& worker_running;
  prometheus::Family<prometheus::Gauge>& worker_waiting;
  prometheus::Family<prometheus::Gauge>& worker_kv_usage;

 private:
  prometheus::Family<prometheus::Counter>& requests_;
};

}  // namespace tessera::services
