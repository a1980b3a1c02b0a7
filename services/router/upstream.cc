#include "services/router/upstream.h"

#include <algorithm>

#include "base/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

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

namespace {

// Adds the override to the arguments of every channel made with it, then
// lets the wrapped credentials make the channel.
class TargetNameCredentials final : public grpc::ChannelCredentials {
 public:
  TargetNameCredentials(std::shared_ptr<grpc::ChannelCredentials> inner, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)) {}

  // Only CompositeChannelCredentials asks for it, which the router does
  // not use on these credentials.
  grpc::SecureChannelCredentials* AsSecureCredentials() override { return nullptr; }

 private:
  std::shared_ptr<grpc::Channel> CreateChannelImpl(const std::string& target,
                                                   const grpc::ChannelArguments& args) override {
    grpc::ChannelArguments with_name = args;
    with_name.SetSslTargetNameOverride(name_);
    return grpc::CreateCustomChannel(target, inner_, with_name);
  }
  std::shared_ptr<grpc::Channel> CreateChannelWithInterceptors(
      const std::string& target, const grpc::ChannelArguments& args,
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
          interceptor_creators) override {
    grpc::ChannelArguments with_name = args;
    with_name.SetSslTargetNameOverride(name_);
    return grpc::experimental::CreateCustomChannelWithInterceptors(target, inner_, with_name,
                                                                   std::move(interceptor_creators));
  }
  bool IsInsecure() const override { return false; }

  const std::shared_ptr<grpc::ChannelCredentials> inner_;
  const std::string name_;
};

}  // namespace

std::shared_ptr<grpc::ChannelCredentials> WithTargetNameOverride(
    std::shared_ptr<grpc::ChannelCredentials> inner, const std::string& target_name) {
  if (target_name.empty()) return inner;
  return std::make_shared<TargetNameCredentials>(std::move(inner), target_name);
}

}  // namespace tessera::services
