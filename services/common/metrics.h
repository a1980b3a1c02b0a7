// MetricsServer: one prometheus-cpp registry per process and the HTTP
// `/metrics` exposer on its own port.
//
// Every service registers its families on registry() before or after
// Start(). A few process-wide families are created here:
//   tessera_build_info{service,version,cuda}     1
//   tessera_service_ready{service}               1 when ready, else 0
//   tessera_service_draining{service}            1 while draining
//
// The HTTP side is HttpExposer (event-driven: an idle or trickling peer
// holds no thread and is cut after a deadline, so it cannot starve scrapes).
//
// Thread-safety: registry() and the gauges are thread-safe (prometheus-cpp
// metrics are atomic); Start/Stop are called from the main thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/common/http_exposer.h"

namespace tessera::services {

// Shorthands for registering unlabelled metrics (and gauge families) on a
// registry; the services' metric classes build their families with them.
prometheus::Counter& AddCounter(prometheus::Registry& r, const char* name, const char* help);
prometheus::Histogram& AddHistogram(prometheus::Registry& r, const char* name, const char* help,
                                    prometheus::Histogram::BucketBoundaries buckets);
prometheus::Family<prometheus::Gauge>& AddGaugeFamily(prometheus::Registry& r, const char* name,
                                                      const char* help);

class MetricsServer {
 public:
  explicit MetricsServer(std::string service_name);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on `address` ("host:port"; port 0 picks a free one). Errors name
  // the address (e.g. port in use).
  absl::Status Start(const std::string& address);
  void Stop();
  // The bound port; 0 before Start.
  int port() const { return port_; }

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> shared_registry() { return registry_; }

  // Serves `collectable` on /metrics beside the registry (before or after
  // Start); it must stay alive while the server runs.
  void AddCollectable(std::weak_ptr<prometheus::Collectable> collectable);

  void SetReady(bool ready);
  void SetDraining(bool draining);

 private:
  std::string service_;
  std::shared_ptr<prometheus::Registry> registry_;
  // The /metrics page: the registry's families, then the collectables'.
  std::string Render() const;

  std::unique_ptr<HttpExposer> exposer_;
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* ready_ = nullptr;
  prometheus::Gauge* draining_ = nullptr;
  int port_ = 0;
};

}  // namespace tessera::services
