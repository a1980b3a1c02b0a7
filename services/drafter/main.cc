// tessera-drafter: proposes speculative tokens to workers (tessera.v1.Drafter).
#include "base/log.h"
#include "services/common/server_flags.h"
#include "services/common/service_host.h"
#include "services/drafter/drafter_service.h"

namespace ts = tessera::services;

int main(int argc, char** argv) {
  ts::BlockTerminationSignals();
  ts::ParseServiceFlags(argc, argv,
                        "tessera-drafter: speculative token proposals (tessera.v1.Drafter)");
  tessera::SetLogService("drafter");
  ts::ServiceHost host(ts::ServerOptionsFromFlags("drafter"));
  ts::DrafterService service(&host.drain());
  host.AddService(&service, "tessera.v1.Drafter");
  if (auto s = host.Start(); !s.ok()) return ts::StartupError(s);
  host.SetReady(true);
  return host.RunUntilShutdown();
}
