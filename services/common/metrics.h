// MetricsServer: one prometheus-cpp registry per process and the HTTP
// `/metrics` exposer on its own port.
//
// Every service registers its families on registry() before or after
// Start(). A few process-wide families are created here:
//   tessera_build_info{service,version,cuda}     1
//   tessera_service_ready{service}               1 when ready, else 0
//   tessera_service_draining{service}            1 while draining
//
// Thread-safety: registry() and the gauges are thread-safe (prometheus-cpp
// metrics are atomic); Start/Stop are called from the main thread only.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

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

  void SetReady(bool ready);
  void SetDraining(bool draining);

 private:
  std::string service_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Gauge* ready_ = nullptr;
  prometheus::Gauge* draining_ = nullptr;
  int port_ = 0;
};

}  // namespace tessera::services
