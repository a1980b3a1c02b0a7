// tessera-router: the public tessera.v1.Inference service of a cluster.
#include "base/log.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/router/inference_service.h"

namespace ts = tessera::services;

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv,
                        "tessera-router: routes requests to workers (tessera.v1.Inference)");
  tessera::SetLogService("router");
  ts::ServiceHost host(ts::ServerOptionsFromFlags("router"));
  ts::InferenceService service(&host.drain());
  host.AddService(&service, "tessera.v1.Inference");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);
  host.SetReady(true);
  return host.RunUntilShutdown();
}
