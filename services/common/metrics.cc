#include "services/common/metrics.h"

#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "services/common/version.h"

namespace tessera::services {

prometheus::Counter& AddCounter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram& AddHistogram(prometheus::Registry& r, const char* name, const char* help,
                                    prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

prometheus::Family<prometheus::Gauge>& AddGaugeFamily(prometheus::Registry& r, const char* name,
                                                      const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

MetricsServer::MetricsServer(std::string service_name)
    : service_(std::move(service_name)), registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::BuildGauge()
      .Name("tessera_build_info")
      .Help("Build information; the value is always 1")
      .Register(*registry_)
      .Add({{"service", service_},
            {"version", kTesseraVersion},
            {"cuda", kTesseraCudaBuilt ? "1" : "0"}})
      .Set(1);
  ready_ = &prometheus::BuildGauge()
                .Name("tessera_service_ready")
                .Help("1 when the service reports SERVING for readiness, else 0")
                .Register(*registry_)
                .Add({{"service", service_}});
  draining_ = &prometheus::BuildGauge()
                   .Name("tessera_service_draining")
                   .Help("1 while the service drains before shutting down")
                   .Register(*registry_)
                   .Add({{"service", service_}});
}

MetricsServer::~MetricsServer() { Stop(); }

absl::Status MetricsServer::Start(const std::string& address) {
  auto exposer = HttpExposer::Start(address, [this] { return Render(); });
  if (!exposer.ok()) return exposer.status();
  exposer_ = std::move(*exposer);
  port_ = exposer_->port();
  return absl::OkStatus();
}

std::string MetricsServer::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<std::shared_ptr<prometheus::Collectable>> extra;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) extra.push_back(std::move(c));
    }
  }
  for (const auto& c : extra) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void MetricsServer::Stop() {
  exposer_.reset();
  port_ = 0;
}

void MetricsServer::AddCollectable(std::weak_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

void MetricsServer::SetReady(bool ready) { ready_->Set(ready ? 1 : 0); }
void MetricsServer::SetDraining(bool draining) { draining_->Set(draining ? 1 : 0); }

}  // namespace tessera::services
