// The real tessera-worker binary on loopback: many concurrent streams with
// outputs checked against transformers' fixtures, cancellation freeing KV
// blocks (seen through WatchLoad), SIGTERM draining in-flight streams,
// precise INVALID_ARGUMENT / RESOURCE_EXHAUSTED answers, and a worker whose
// model runner fails for good leaving service with exit code 3.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/exit_codes.h"
#include "tessera/v1/worker.grpc.pb.h"
#include "tests/integration/test_process.h"
#include "worker/runner/test_model.h"

namespace tessera::testing {
namespace {

using tessera::v1::Worker;
using tessera::v1::WorkerGenerateRequest;
using tessera::v1::WorkerGenerateResponse;
using ::testing::HasSubstr;

std::string SourcePath(const std::string& rel) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/", rel);
}

struct RunningWorker {
  std::unique_ptr<TestProcess> process;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Worker::Stub> stub;
};

RunningWorker StartWorker(const std::string& model, std::vector<std::string> extra = {}) {
  RunningWorker w;
  std::string dir = MakeTempDir();
  std::vector<std::string> args = {"--model=" + model, "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0", "--port_file=" + dir + "/ports",
                                   "--drain_grace=100ms"};
  args.insert(args.end(), extra.begin(), extra.end());
  w.process = std::make_unique<TestProcess>();
  EXPECT_TRUE(
      w.process->Start(BinaryPath("services/worker/tessera-worker"), args, dir + "/log").ok());
  auto ports = w.process->WaitForPortFile(dir + "/ports", absl::Seconds(30));
  EXPECT_TRUE(ports.ok()) << ports.status();
  if (!ports.ok()) return w;
  w.channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*ports)["grpc_port"]),
                                  grpc::InsecureChannelCredentials());
  w.stub = Worker::NewStub(w.channel);
  // Ready once GetInfo says so (model loaded, warm-up done).
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    tessera::v1::WorkerInfo info;
    if (w.stub->GetInfo(&ctx, {}, &info).ok() && info.ready()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return w;
}

WorkerGenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  WorkerGenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_ids(t);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

struct StreamResult {
  std::vector<int32_t> tokens;
  tessera::v1::WorkerComplete complete;
  grpc::Status status;
};

StreamResult RunStream(Worker::Stub* stub, const WorkerGenerateRequest& req) {
  StreamResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Generate(&ctx, req);
  WorkerGenerateResponse resp;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.chunk().token_ids()) r.tokens.push_back(t);
    if (resp.has_complete()) r.complete = resp.complete();
  }
  r.status = reader->Finish();
  return r;
}

// A random model big enough that decoding takes visible time on one thread.
std::string SlowModel() {
  static std::string* dir = [] {
    auto* d = new std::string(MakeTempDir());
    EXPECT_TRUE(runner::WriteTestModel(*d, runner::SlowDecodeSpec()).ok());
    return d;
  }();
  return *dir;
}

TEST(WorkerTest, ThirtyTwoConcurrentStreamsMatchTransformers) {
  const std::string model = SourcePath("tests/fixtures/models/qwen3_tiny");
  std::ifstream in(model + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json expected = nlohmann::json::parse(ss.str());
  RunningWorker w = StartWorker(model);
  ASSERT_TRUE(w.stub);
  const int kStreams = 32;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto prompt = expected["prompts"][i % 3].get<std::vector<int32_t>>();
      results[i] = RunStream(w.stub.get(), Greedy(prompt, 32));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(absl::StrCat("stream ", i));
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens,
              expected["greedy_continuations"][i % 3].get<std::vector<int32_t>>());
    EXPECT_EQ(results[i].complete.finish_reason(), tessera::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(results[i].complete.usage().completion_tokens(), 32);
  }
  // Later requests reuse the cached prompt blocks of earlier identical ones.
  int cached = 0;
  for (const auto& r : results) cached += r.complete.usage().cached_tokens();
  EXPECT_GT(cached, 0);
  w.process->Signal(SIGTERM);
  EXPECT_EQ(w.process->Wait(absl::Seconds(30))->code, 0);
}

TEST(WorkerTest, CancellingHalfTheStreamsFreesTheirBlocks) {
  RunningWorker w = StartWorker(SlowModel(), {"--cpu_threads=1", "--kv_cache_blocks=512"});
  ASSERT_TRUE(w.stub);
  // Load reports in the background.
  grpc::ClientContext load_ctx;
  tessera::v1::WatchLoadRequest load_req;
  load_req.set_interval_ms(10);
  auto load = w.stub->WatchLoad(&load_ctx, load_req);
  absl::Mutex mu;
  std::vector<tessera::v1::LoadReport> reports;
  std::thread watcher([&] {
    tessera::v1::LoadReport r;
    while (load->Read(&r)) {
      absl::MutexLock lock(&mu);
      reports.push_back(r);
    }
  });

  const int kStreams = 16;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kStreams);
  std::vector<std::thread> threads;
  std::vector<StreamResult> results(kStreams);
  std::atomic<int> started{0};
  for (int i = 0; i < kStreams; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    threads.emplace_back([&, i] {
      std::vector<int32_t> prompt(20 + i, 7 + i);
      // Even streams are cancelled after their first chunk; odd ones run
      // long enough to be still running then.
      auto reader = w.stub->Generate(contexts[i].get(), Greedy(prompt, i % 2 ? 300 : 2000));
      WorkerGenerateResponse resp;
      bool counted = false;
      while (reader->Read(&resp)) {
        if (!counted) {
          started.fetch_add(1);
          counted = true;
        }
        for (int32_t t : resp.chunk().token_ids()) results[i].tokens.push_back(t);
      }
      results[i].status = reader->Finish();
    });
  }
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (started.load() < kStreams && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(started.load(), kStreams);
  // The most blocks the surviving half can ever hold: 8 x ceil(327 / 16).
  const int64_t kSurvivorBlocks = 8 * 21;
  int64_t used_before = 0;
  until = absl::Now() + absl::Seconds(10);
  while (used_before <= kSurvivorBlocks && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
    absl::MutexLock lock(&mu);
    used_before = reports.back().kv_blocks_used();
  }
  ASSERT_GT(used_before, kSurvivorBlocks);
  for (int i = 0; i < kStreams; i += 2) contexts[i]->TryCancel();
  // Soon after, only the odd half holds blocks.
  bool seen = false;
  until = absl::Now() + absl::Seconds(30);
  while (!seen && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
    absl::MutexLock lock(&mu);
    const auto& r = reports.back();
    seen = r.running_requests() <= kStreams / 2 && r.kv_blocks_used() <= kSurvivorBlocks;
  }
  EXPECT_TRUE(seen) << "no load report showed the cancelled streams' blocks freed";
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    if (i % 2) {
      EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
      EXPECT_EQ(results[i].tokens.size(), 300u);
    } else {
      EXPECT_EQ(results[i].status.error_code(), grpc::StatusCode::CANCELLED);
    }
  }
  // Everything finished: no block is referenced any more.
  until = absl::Now() + absl::Seconds(10);
  bool idle = false;
  while (!idle && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
    absl::MutexLock lock(&mu);
    idle = reports.back().kv_blocks_used() == 0 && reports.back().running_requests() == 0;
  }
  EXPECT_TRUE(idle);
  load_ctx.TryCancel();
  watcher.join();
}

TEST(WorkerTest, SigtermDrainsInFlightStreamsToCompletion) {
  RunningWorker w = StartWorker(SlowModel(), {"--cpu_threads=1", "--drain_deadline=60s"});
  ASSERT_TRUE(w.stub);
  const int kStreams = 6;
  std::vector<StreamResult> results(kStreams);
  std::atomic<int> first_tokens{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      auto reader = w.stub->Generate(&ctx, Greedy(std::vector<int32_t>(10 + i, 3), 120));
      WorkerGenerateResponse resp;
      while (reader->Read(&resp)) {
        if (results[i].tokens.empty()) first_tokens.fetch_add(1);
        for (int32_t t : resp.chunk().token_ids()) results[i].tokens.push_back(t);
        if (resp.has_complete()) results[i].complete = resp.complete();
      }
      results[i].status = reader->Finish();
    });
  }
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (first_tokens.load() < kStreams && absl::Now() < until)
    absl::SleepFor(absl::Milliseconds(5));
  w.process->Signal(SIGTERM);
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), 120u);
    EXPECT_EQ(results[i].complete.finish_reason(), tessera::v1::FINISH_REASON_LENGTH);
  }
  auto exit = w.process->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << w.process->ReadLog();
}

TEST(WorkerTest, StreamsStillRunningAtTheDrainDeadlineEndWithAClearStatus) {
  RunningWorker w = StartWorker(SlowModel(), {"--cpu_threads=1", "--drain_deadline=1s"});
  ASSERT_TRUE(w.stub);
  grpc::ClientContext ctx;
  auto reader = w.stub->Generate(&ctx, Greedy(std::vector<int32_t>(10, 3), 3000));
  WorkerGenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // running
  w.process->Signal(SIGTERM);
  size_t tokens = 0;
  while (reader->Read(&resp)) tokens += resp.chunk().token_ids_size();
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("drain deadline passed"));
  EXPECT_LT(tokens, 3000u);
  auto exit = w.process->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0) << w.process->ReadLog();
}

TEST(WorkerTest, MalformedRequestsGetPreciseInvalidArgument) {
  RunningWorker w = StartWorker(SourcePath("tests/fixtures/models/qwen3_tiny"));
  ASSERT_TRUE(w.stub);
  struct Case {
    std::string name;
    WorkerGenerateRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"empty prompt", Greedy({}, 4), "prompt_ids must not be empty"});
  cases.push_back(
      {"id >= vocab", Greedy({1, 384}, 4), "prompt_ids[1] is 384: ids must be in [0, 384)"});
  cases.push_back({"negative id", Greedy({-1}, 4), "prompt_ids[0] is -1"});
  cases.push_back({"max_tokens 0", Greedy({1, 2}, 0), "max_tokens must be >= 1, got 0"});
  cases.push_back({"max_tokens huge", Greedy({1, 2}, 1 << 30), "the context leaves room for 254"});
  WorkerGenerateRequest hot = Greedy({1, 2}, 4);
  hot.mutable_sampling()->set_temperature(-0.5f);
  cases.push_back({"negative temperature", hot, "temperature"});
  WorkerGenerateRequest top_p = Greedy({1, 2}, 4);
  top_p.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"top_p > 1", top_p, "top_p must be in (0, 1], got 1.5"});
  WorkerGenerateRequest top_p0 = Greedy({1, 2}, 4);
  top_p0.mutable_sampling()->set_top_p(0.0f);
  cases.push_back({"top_p = 0", top_p0, "top_p must be in (0, 1]"});
  WorkerGenerateRequest stop = Greedy({1, 2}, 4);
  stop.mutable_sampling()->add_stop_token_ids(999);
  cases.push_back({"stop id", stop, "stop_token_ids has 999"});
  for (const Case& c : cases) {
    StreamResult r = RunStream(w.stub.get(), c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // The worker is unharmed.
  EXPECT_TRUE(RunStream(w.stub.get(), Greedy({1, 2, 3}, 4)).status.ok());
}

TEST(WorkerTest, FullQueueAnswersResourceExhausted) {
  RunningWorker w =
      StartWorker(SlowModel(), {"--cpu_threads=1", "--max_num_seqs=1", "--max_waiting=1"});
  ASSERT_TRUE(w.stub);
  const int kStreams = 8;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] { results[i] = RunStream(w.stub.get(), Greedy({5, 6, 7}, 60)); });
  }
  for (auto& t : threads) t.join();
  int ok = 0, exhausted = 0;
  for (const auto& r : results) {
    if (r.status.ok()) ++ok;
    if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_THAT(r.status.error_message(), HasSubstr("waiting queue is full"));
    }
  }
  EXPECT_GT(ok, 0) << results[0].status.error_message();
  EXPECT_GT(exhausted, 0);
  EXPECT_EQ(ok + exhausted, kStreams);
}

// The health status of `service` ("" = liveness); UNKNOWN when the call
// fails.
grpc::health::v1::HealthCheckResponse::ServingStatus HealthOf(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp).ok() ? resp.status()
                                            : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

// A model runner that breaks for good (as a tensor-parallel group whose
// ranks fell out of step): the stream in flight ends with UNAVAILABLE naming
// the cause after the tokens of the steps that ran, liveness and readiness
// turn NOT_SERVING, later requests are refused, and the process exits with
// code 3 for its supervisor to restart it.
TEST(WorkerTest, RunnerThatFailsForGoodEndsStreamsUnavailableAndExitsThree) {
  // Step 1 is the warm-up, 2 the request's prefill, 3..6 decode steps; step
  // 7 fails. The grace period keeps the process up for the checks below.
  RunningWorker w =
      StartWorker("", {"--simulate=vocab=512,context=4096,decode_step_us=2000,fail_after_steps=6",
                       "--drain_grace=3s"});
  ASSERT_TRUE(w.stub);
  const absl::Time start = absl::Now();
  StreamResult r = RunStream(w.stub.get(), Greedy({5, 6, 7}, 50));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("model runner failed for good: the simulated device broke after 6 steps"));
  EXPECT_EQ(r.tokens.size(), 5u);  // the prefill's token and four decode steps'
  using grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(HealthOf(w.channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(HealthOf(w.channel, "tessera.v1.Worker"), HealthCheckResponse::NOT_SERVING);
  StreamResult later = RunStream(w.stub.get(), Greedy({5, 6, 7}, 5));
  EXPECT_EQ(later.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(later.tokens.empty());
  auto exit = w.process->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, services::kExitServiceFailed) << w.process->ReadLog();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_THAT(w.process->ReadLog(), HasSubstr("the service failed for good"));
}

}  // namespace
}  // namespace tessera::testing
