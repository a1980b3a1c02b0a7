#include "services/common/metrics.h"

#include <exception>

#include "CivetServer.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "prometheus/exposer.h"
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

namespace {
// The HTTP server's own reason when it fails to start (civetweb reports it
// through the log callback only).
thread_local std::string g_civetweb_error;
int RecordCivetwebMessage(const struct mg_connection*, const char* message) {
  if (message != nullptr) g_civetweb_error = message;
  return 1;
}
}  // namespace

absl::Status MetricsServer::Start(const std::string& address) {
  // prometheus-cpp reports bind failures by throwing from the Exposer
  // constructor; this is the one place the exception is turned into a status.
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();
    c->log_message = &RecordCivetwebMessage;
    return c;
  }();
  g_civetweb_error.clear();
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1, callbacks);
  } catch (const std::exception& e) {
    if (!g_civetweb_error.empty()) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", address, ": ", g_civetweb_error));
    }
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address,
                                               " (address in use or not local?): ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  auto ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? 0 : ports.front();
  return absl::OkStatus();
}

void MetricsServer::Stop() {
  exposer_.reset();
  port_ = 0;
}

void MetricsServer::SetReady(bool ready) { ready_->Set(ready ? 1 : 0); }
void MetricsServer::SetDraining(bool draining) { draining_->Set(draining ? 1 : 0); }

}  // namespace tessera::services
