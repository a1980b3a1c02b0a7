#include "services/router/router_metrics.h"

#include "services/common/metrics.h"

namespace tessera::services {

RouterMetrics::RouterMetrics(prometheus::Registry& r)
    : retries(AddCounter(r, "tessera_router_retries_total",
                         "Requests sent to another worker before their first token")),
      migrations(AddCounter(r, "tessera_router_migrations_total",
                            "Requests resumed on another worker after their first token")),
      prefix_hit_tokens(
          AddCounter(r, "tessera_router_prefix_hit_tokens_total",
                     "Prompt tokens routed to a worker expected to have them cached")),
      prompt_tokens(AddCounter(r, "tessera_router_prompt_tokens_total", "Prompt tokens routed")),
      generation_tokens(
          AddCounter(r, "tessera_router_generation_tokens_total", "Tokens streamed to clients")),
      route_decision(AddHistogram(r, "tessera_router_route_decision_seconds",
                                  "Time to choose a worker for a request",
                                  {5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.25e-4, 1.5e-4,
                                   2e-4, 3e-4, 5e-4, 1e-3, 5e-3, 1e-2})),
      ttft(AddHistogram(r, "tessera_router_time_to_first_token_seconds",
                        "Request arrival to the first token sent to the client",
                        {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      inter_token_latency(AddHistogram(
          r, "tessera_router_inter_token_latency_seconds", "Gap between tokens sent to the client",
          {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5})),
      e2e(AddHistogram(r, "tessera_router_e2e_request_latency_seconds",
                       "Request arrival to its final message",
                       {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120})),
      in_flight(prometheus::BuildGauge()
                    .Name("tessera_router_requests_in_flight")
                    .Help("Admitted requests not yet finished")
                    .Register(r)
                    .Add({})),
      worker_running(AddGaugeFamily(r, "tessera_router_worker_running_requests",
                                    "Running requests the worker last reported")),
      worker_waiting(AddGaugeFamily(r, "tessera_router_worker_waiting_requests",
                                    "Waiting requests the worker last reported")),
      worker_kv_usage(AddGaugeFamily(r, "tessera_router_worker_kv_cache_usage_ratio",
                                     "KV-cache use the worker last reported (0..1)")),
      requests_(prometheus::BuildCounter()
                    .Name("tessera_router_requests_total")
                    .Help("Requests by outcome: ok, invalid, unauthenticated, rejected, "
                          "unavailable, cancelled, drain_cut, error")
                    .Register(r)) {}

std::vector<prometheus::MetricFamily> RouterStateCollector::Collect() const {
  prometheus::MetricFamily healthy;
  healthy.name = "tessera_router_worker_healthy";
  healthy.help = "1 when the worker reports SERVING and is routable, else 0";
  healthy.type = prometheus::MetricType::Gauge;
  for (const router::WorkerReport& w : router_->Report()) {
    prometheus::ClientMetric m;
    m.label.push_back({"worker", w.status.id});
    m.gauge.value = w.status.unroutable == router::Unroutable::kNone ? 1 : 0;
    healthy.metric.push_back(std::move(m));
  }
  prometheus::MetricFamily queued;
  queued.name = "tessera_router_requests_queued";
  queued.help = "Requests waiting for an admission slot, by priority";
  queued.type = prometheus::MetricType::Gauge;
  const router::AdmissionStats stats = admission_->Stats();
  for (int p = 0; p < router::kNumPriorities; ++p) {
    prometheus::ClientMetric m;
    m.label.push_back(
        {"priority", std::string(router::PriorityName(static_cast<router::Priority>(p)))});
    m.gauge.value = stats.queued[p];
    queued.metric.push_back(std::move(m));
  }
  return {std::move(healthy), std::move(queued)};
}

}  // namespace tessera::services
