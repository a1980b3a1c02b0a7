// WorkerUpstream: the router's connection to one worker. It owns the gRPC
// channel and stubs and two background watchers that keep the router's view
// of the worker current:
//   - grpc.health.v1 Watch on "tessera.v1.Worker" (readiness),
//   - Worker.WatchLoad with a prefix-cache snapshot (load and block events),
// plus Worker.GetInfo on every (re)connection. Each watcher reconnects with
// exponential back-off (50 ms .. 2 s) when its stream ends or fails.
//
// Thread-safety: Start/Stop from one thread; the stubs are thread-safe; the
// sink is called from the watcher threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "tessera/v1/worker.grpc.pb.h"

namespace tessera::services {

// Receives what the watchers learn. Implementations must be thread-safe.
class UpstreamSink {
 public:
  virtual ~UpstreamSink() = default;
  virtual void OnInfo(const std::string& address, const tessera::v1::WorkerInfo& info) = 0;
  // serving: the readiness reported by grpc.health.v1; unreachable workers
  // are reported as not serving.
  virtual void OnHealth(const std::string& address, bool serving) = 0;
  virtual void OnLoad(const std::string& address, const tessera::v1::LoadReport& report) = 0;
};

class WorkerUpstream {
 public:
  WorkerUpstream(std::string address, std::shared_ptr<grpc::Channel> channel, UpstreamSink* sink,
                 int load_interval_ms);
  ~WorkerUpstream();  // stops the watchers
  WorkerUpstream(const WorkerUpstream&) = delete;
  WorkerUpstream& operator=(const WorkerUpstream&) = delete;

  void Start();
  void Stop();

  const std::string& address() const { return address_; }
  tessera::v1::Worker::Stub* stub() { return worker_.get(); }

 private:
  void HealthLoop();
  void LoadLoop();
  // Sleeps up to `d` unless stopping; returns false when stopping.
  bool Backoff(absl::Duration d);

  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tessera::v1::Worker::Stub> worker_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  UpstreamSink* sink_;
  const int load_interval_ms_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* health_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientContext* load_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread health_thread_, load_thread_;
};

// Credentials whose channels check the server's certificate for
// `target_name` instead of the host of the address they connect to (gRPC's
// ssl_target_name_override): for workers addressed by IP, as the DNS
// discovery of a headless Service finds them, whose certificate names the
// Service. Empty `target_name`: `inner` itself.
std::shared_ptr<grpc::ChannelCredentials> WithTargetNameOverride(
    std::shared_ptr<grpc::ChannelCredentials> inner, const std::string& target_name);

}  // namespace tessera::services
