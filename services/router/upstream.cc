#include "services/router/upstream.h"

#include <algorithm>

#include "base/log.h"

namespace tessera::services {

WorkerUpstream::WorkerUpstream(std::string address, std::shared_ptr<grpc::Channel> channel,
                               UpstreamSink* sink, int load_interval_ms)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      worker_(tessera::v1::Worker::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      sink_(sink),
      load_interval_ms_(load_interval_ms) {}

WorkerUpstream::~WorkerUpstream() { Stop(); }

void WorkerUpstream::Start() {
  health_thread_ = std::thread([this] { HealthLoop(); });
  load_thread_ = std::thread([this] { LoadLoop(); });
}

void WorkerUpstream::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !health_thread_.joinable()) return;
    stopping_ = true;
    if (health_ctx_) health_ctx_->TryCancel();
    if (load_ctx_) load_ctx_->TryCancel();
  }
  if (health_thread_.joinable()) health_thread_.join();
  if (load_thread_.joinable()) load_thread_.join();
}

bool WorkerUpstream::Backoff(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

void WorkerUpstream::HealthLoop() {
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      health_ctx_ = &ctx;
    }
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("tessera.v1.Worker");
    auto stream = health_->Watch(&ctx, req);
    grpc::health::v1::HealthCheckResponse resp;
    bool got_any = false;
    while (stream->Read(&resp)) {
      got_any = true;
      backoff = absl::Milliseconds(50);
      sink_->OnHealth(address_, resp.status() == grpc::health::v1::HealthCheckResponse::SERVING);
    }
    grpc::Status s = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      health_ctx_ = nullptr;
    }
    sink_->OnHealth(address_, false);
    if (!got_any) backoff = std::min(backoff * 2, absl::Seconds(2));
    if (!Backoff(backoff)) return;
  }
}

void WorkerUpstream::LoadLoop() {
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    // GetInfo on every (re)connection: the worker may have restarted.
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      tessera::v1::WorkerInfo info;
      if (worker_->GetInfo(&ctx, {}, &info).ok()) sink_->OnInfo(address_, info);
    }
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      load_ctx_ = &ctx;
    }
    tessera::v1::WatchLoadRequest req;
    req.set_interval_ms(load_interval_ms_);
    req.set_include_snapshot(true);
    auto stream = worker_->WatchLoad(&ctx, req);
    tessera::v1::LoadReport report;
    bool got_any = false;
    while (stream->Read(&report)) {
      got_any = true;
      backoff = absl::Milliseconds(50);
      sink_->OnLoad(address_, report);
    }
    stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      load_ctx_ = nullptr;
    }
    if (!got_any) backoff = std::min(backoff * 2, absl::Seconds(2));
    if (!Backoff(backoff)) return;
  }
}

}  // namespace tessera::services
