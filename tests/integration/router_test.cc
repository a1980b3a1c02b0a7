// The router on loopback in front of real tessera-worker processes (tiny
// fixture models, or simulated models whose cost is time): routing and
// streaming, migration when a worker is killed mid-stream or its model
// runner fails for good, routing around a hung (SIGSTOP'd) worker,
// cancellation reaching the worker, admission control and API keys.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/exit_codes.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "tessera/v1/worker.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

using tessera::v1::GenerateRequest;
using tessera::v1::GenerateResponse;
using tessera::v1::Inference;
using ::testing::HasSubstr;

TEST(RouterTest, StreamsTransformersContinuationsThroughTheRouter) {
  Cluster c = StartCluster(2, {"--model=" + Fixture("qwen3_tiny")});
  std::ifstream in(Fixture("qwen3_tiny") + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json expected = nlohmann::json::parse(ss.str());
  for (int i = 0; i < 3; ++i) {
    Result r =
        RunStream(c.stub.get(), Greedy(expected["prompts"][i].get<std::vector<int32_t>>(), 32));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, expected["greedy_continuations"][i].get<std::vector<int32_t>>());
    EXPECT_EQ(r.complete.finish_reason(), tessera::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.complete.usage().completion_tokens(), 32);
    EXPECT_EQ(r.complete.usage().prompt_tokens(), expected["prompts"][i].size());
  }
  // A malformed request is the client's error, not retried.
  Result bad = RunStream(c.stub.get(), Greedy({1, 999}, 4));
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("prompt_ids[1] is 999"));
  Result text = [&] {
    GenerateRequest r = Greedy({}, 4);
    r.set_text("hello");
    return RunStream(c.stub.get(), r);
  }();
  EXPECT_EQ(text.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(RouterTest, KillNineMidStreamMigratesWithoutLosingOrRepeatingTokens) {
  Cluster c = StartCluster(3, {kSlowSim});
  const int kStreams = 64, kTokens = 40;
  auto prompt = [](int i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 8 + i % 5; ++j) p.push_back(3 + (i * 31 + j * 7) % 1000);
    return p;
  };
  auto run_all = [&](bool kill) {
    std::vector<Result> results(kStreams);
    std::atomic<int> with_tokens{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back([&, i] {
        bool counted = false;
        results[i] = RunStream(c.stub.get(), Greedy(prompt(i), kTokens), [&](int n) {
          if (!counted && n >= 3) {
            counted = true;
            with_tokens.fetch_add(1);
          }
        });
      });
    }
    if (kill) {
      absl::Time until = absl::Now() + absl::Seconds(60);
      while (with_tokens.load() < kStreams && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(2));
      }
      c.workers[0].process->Signal(SIGKILL);
    }
    for (auto& t : threads) t.join();
    return results;
  };
  std::vector<Result> reference = run_all(false);
  std::vector<Result> killed = run_all(true);
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(absl::StrCat("stream ", i));
    ASSERT_TRUE(reference[i].status.ok()) << reference[i].status.error_message();
    ASSERT_TRUE(killed[i].status.ok()) << killed[i].status.error_message();
    EXPECT_EQ(killed[i].tokens.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(killed[i].tokens, reference[i].tokens);
    EXPECT_EQ(killed[i].complete.usage().completion_tokens(), kTokens);
  }
  EXPECT_GT(MetricValue(c.router.metrics_port, "tessera_router_migrations_total"), 0);
}

// A worker whose model runner fails for good (as a tensor-parallel group
// whose ranks fell out of step) ends its streams with UNAVAILABLE: the
// router resumes them on the other worker, so every client stream completes
// with the tokens a healthy cluster gives, and the failed worker exits with
// code 3 for its supervisor to restart it.
TEST(RouterTest, StreamsOfAWorkerWhoseRunnerFailsForGoodMoveOnAndTheWorkerExits) {
  // Worker 0 breaks at its 31st step (the warm-up is its first), some 0.6 s
  // into the streams; round robin gives it half of them.
  Cluster c = StartCluster({{std::string(kSlowSim) + ",fail_after_steps=30"}, {kSlowSim}},
                           {"--policy=round_robin"});
  const int kStreams = 8, kTokens = 40;
  auto prompt = [](int i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 6 + i; ++j) p.push_back(3 + (i * 17 + j * 11) % 1000);
    return p;
  };
  auto run_all = [&] {
    std::vector<Result> results(kStreams);
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back(
          [&, i] { results[i] = RunStream(c.stub.get(), Greedy(prompt(i), kTokens)); });
    }
    for (auto& t : threads) t.join();
    return results;
  };
  std::vector<Result> failed_over = run_all();
  auto exit = c.workers[0].process->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.has_value()) << "worker 0 still runs:\n" << c.workers[0].process->ReadLog();
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, services::kExitServiceFailed) << c.workers[0].process->ReadLog();
  EXPECT_THAT(c.workers[0].process->ReadLog(),
              HasSubstr("the simulated device broke after 30 steps"));
  EXPECT_GT(MetricValue(c.router.metrics_port, "tessera_router_migrations_total"), 0);
  // The same streams again, all on worker 1 now.
  std::vector<Result> reference = run_all();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(absl::StrCat("stream ", i));
    ASSERT_TRUE(failed_over[i].status.ok()) << failed_over[i].status.error_message();
    ASSERT_TRUE(reference[i].status.ok()) << reference[i].status.error_message();
    EXPECT_EQ(failed_over[i].tokens.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(failed_over[i].tokens, reference[i].tokens);
    EXPECT_EQ(failed_over[i].complete.usage().completion_tokens(), kTokens);
  }
}

TEST(RouterTest, HungWorkerIsRoutedAroundWithinTheStalenessBound) {
  // Bound: a worker that stops answering gets no new requests once
  // --load_staleness (1 s) has passed since its last load report.
  Cluster c = StartCluster(2, {kSlowSim}, {"--load_staleness=1s", "--load_interval_ms=50"});
  c.workers[0].process->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(1200));
  for (int i = 0; i < 8; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    Result r = RunStream(c.stub.get(), Greedy({5, 6, 7, i + 8}, 3), nullptr, &ctx);
    EXPECT_TRUE(r.status.ok()) << "request " << i << ": " << r.status.error_message();
  }
  c.workers[0].process->Signal(SIGCONT);
}

TEST(RouterTest, ClientCancellationFreesTheWorkersBlocks) {
  Cluster c = StartCluster(1, {kSlowSim});
  auto worker = tessera::v1::Worker::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", c.workers[0].grpc_port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext load_ctx;
  tessera::v1::WatchLoadRequest lr;
  lr.set_interval_ms(10);
  auto load = worker->WatchLoad(&load_ctx, lr);
  absl::Mutex mu;
  tessera::v1::LoadReport latest;
  std::thread watcher([&] {
    tessera::v1::LoadReport r;
    while (load->Read(&r)) {
      absl::MutexLock lock(&mu);
      latest = r;
    }
  });
  grpc::ClientContext ctx;
  std::atomic<bool> cancelled{false};
  std::vector<int32_t> prompt(100, 9);
  std::thread client([&] {
    RunStream(
        c.stub.get(), Greedy(prompt, 2000),
        [&](int n) {
          if (n >= 5 && !cancelled.exchange(true)) ctx.TryCancel();
        },
        &ctx);
  });
  auto used = [&] {
    absl::MutexLock lock(&mu);
    return latest.kv_blocks_used();
  };
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (used() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GT(used(), 0);
  client.join();
  until = absl::Now() + absl::Seconds(5);
  while (used() != 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(used(), 0) << "the worker still holds the cancelled request's blocks";
  load_ctx.TryCancel();
  watcher.join();
}

TEST(RouterTest, OverloadAnswersResourceExhaustedWithARetryHint) {
  Cluster c = StartCluster(1, {kSlowSim}, {"--max_in_flight=4", "--max_queue_per_priority=2"});
  const int kStreams = 16;
  std::vector<Result> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = RunStream(c.stub.get(), Greedy({4, 5, i + 6}, 20));
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, exhausted = 0;
  for (const Result& r : results) {
    ok += r.status.ok();
    if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_TRUE(r.trailers.count("retry-after-ms"));
    }
  }
  EXPECT_GE(ok, 6);  // 4 running + 2 queued
  EXPECT_GT(exhausted, 0);
  EXPECT_EQ(ok + exhausted, kStreams);
  EXPECT_TRUE(RunStream(c.stub.get(), Greedy({1, 2}, 2)).status.ok())
      << "the router must stay healthy";
}

TEST(RouterTest, WorkersFileIsReReadWhenItChanges) {
  Service worker = StartService("services/worker/tessera-worker", {kSlowSim});
  std::string dir = MakeTempDir();
  const std::string file = dir + "/workers";
  {
    std::ofstream out(file);
    out << "# nothing listens here yet\n127.0.0.1:1\n";
  }
  Service router = StartService("services/router/tessera-router", {"--workers_file=" + file});
  auto stub = Inference::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", router.grpc_port),
                                                     grpc::InsecureChannelCredentials()));
  auto healthy = [&] {
    grpc::ClientContext ctx;
    tessera::v1::ListModelsResponse resp;
    return stub->ListModels(&ctx, {}, &resp).ok() ? resp.models(0).healthy_workers() : -1;
  };
  EXPECT_EQ(healthy(), 0);
  EXPECT_EQ(RunStream(stub.get(), Greedy({1, 2}, 2)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  {
    std::ofstream out(file + ".tmp");
    out << "127.0.0.1:" << worker.grpc_port << "\n";
  }
  ASSERT_EQ(std::rename((file + ".tmp").c_str(), file.c_str()), 0);
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (healthy() != 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(healthy(), 1);
  EXPECT_TRUE(RunStream(stub.get(), Greedy({1, 2}, 2)).status.ok());
}

TEST(RouterTest, StopStringsEndTheTextStreamAndCancelTheWorker) {
  std::string dir = MakeTempDir();
  WriteByteTokenizer(dir);
  // The simulated model emits ids 3..255: each decodes to one byte.
  Cluster c = StartCluster(
      1, {"--simulate=vocab=256,context=4096,prefill_us_per_token=1,decode_step_us=1000"},
      {"--tokenizer=" + dir});
  auto text_of = [&](GenerateRequest req, tessera::v1::Complete* complete) {
    grpc::ClientContext ctx;
    auto reader = c.stub->Generate(&ctx, req);
    GenerateResponse resp;
    std::string text;
    while (reader->Read(&resp)) {
      text += resp.chunk().text();
      if (resp.has_complete()) *complete = resp.complete();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return text;
  };
  GenerateRequest req = Greedy({}, 60);
  req.set_text("hello");
  tessera::v1::Complete full_done;
  std::string full = text_of(req, &full_done);
  ASSERT_GT(full.size(), 20u) << "the byte tokens should decode to text";
  EXPECT_EQ(full_done.finish_reason(), tessera::v1::FINISH_REASON_LENGTH);
  // Stop at a piece from the middle of the text.
  const std::string stop = full.substr(10, 3);
  req.mutable_sampling()->add_stop(stop);
  tessera::v1::Complete stopped;
  std::string cut = text_of(req, &stopped);
  EXPECT_EQ(cut, full.substr(0, full.find(stop)));
  EXPECT_EQ(stopped.finish_reason(), tessera::v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.matched_stop(), stop);
  EXPECT_LT(stopped.usage().completion_tokens(), 60);
}

TEST(RouterTest, ApiKeysAreRequiredWhenConfigured) {
  std::string dir = MakeTempDir();
  {
    std::ofstream keys(dir + "/keys");
    keys << "# clients\nsecret-one\nsecret-two\n";
  }
  Cluster c = StartCluster(1, {"--model=" + Fixture("qwen3_tiny")},
                           {"--api_keys_file=" + dir + "/keys"}, "secret-one");
  auto with_key = [&](const std::string& key) {
    grpc::ClientContext ctx;
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    return RunStream(c.stub.get(), Greedy({1, 2, 3}, 2), nullptr, &ctx).status;
  };
  EXPECT_EQ(with_key("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(with_key("secret-three").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(with_key("secret-two").ok());
}

// The router's threads (Threads: in /proc/<pid>/status), or -1.
// True once the router's in-flight gauge reads 0 (within 5 s).
bool InFlightDrops(int metrics_port) {
  absl::Time until = absl::Now() + absl::Seconds(5);
  while (MetricValue(metrics_port, "tessera_router_requests_in_flight") != 0) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(RouterTest, HundredsOfConcurrentStreamsRunOnAFewRouterThreads) {
  // 50 ms decode steps: 320 streams of 40 tokens stay in flight together for
  // about two seconds, so that all of them overlap on a loaded machine too.
  Cluster c = StartCluster(
      2, {"--simulate=vocab=1024,context=8192,prefill_us_per_token=1,decode_step_us=50000,"
          "decode_us_per_seq=0",
          "--max_num_seqs=256", "--kv_cache_blocks=4096"});
  const pid_t router_pid = c.router.process->pid();
  const int idle_threads = ThreadCount(router_pid);
  ASSERT_GT(idle_threads, 0);
  const int kStreams = 320, kTokens = 40;
  std::vector<Result> results(kStreams);
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = RunStream(c.stub.get(), Greedy({7, 8, 9, 10 + i % 900}, kTokens));
      finished.fetch_add(1);
    });
  }
  // Sample while the streams are in flight.
  int peak_in_flight = 0, peak_threads = 0;
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until && finished.load() < kStreams) {
    const int in_flight =
        static_cast<int>(MetricValue(c.router.metrics_port, "tessera_router_requests_in_flight"));
    peak_in_flight = std::max(peak_in_flight, in_flight);
    peak_threads = std::max(peak_threads, ThreadCount(router_pid));
    if (peak_in_flight >= 300) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (int i = 0; i < 5; ++i) {  // a few more samples with everything in flight
    peak_threads = std::max(peak_threads, ThreadCount(router_pid));
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& t : threads) t.join();
  int ok = 0;
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(absl::StrCat("stream ", i));
    EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    ok += results[i].status.ok();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(results[i].complete.usage().completion_tokens(), kTokens);
  }
  EXPECT_EQ(ok, kStreams);
  EXPECT_GE(peak_in_flight, 300) << "the streams were meant to overlap";
  // One thread per stream would be 300 more; the router's own threads (gRPC
  // pollers and callback threads, two watchers per worker, metrics) stay
  // a small, fixed set.
  EXPECT_LT(peak_threads, idle_threads + 48)
      << "idle " << idle_threads << " threads, " << peak_threads << " with " << peak_in_flight
      << " streams in flight";
  RecordProperty("router_threads_idle", idle_threads);
  RecordProperty("router_threads_peak", peak_threads);
  RecordProperty("peak_in_flight", peak_in_flight);
  EXPECT_TRUE(InFlightDrops(c.router.metrics_port));
}

TEST(RouterTest, LeavingTheAdmissionQueueFreesTheQueuePlace) {
  // One slot and one queue place per class.
  Cluster c = StartCluster(1, {kSlowSim}, {"--max_in_flight=1", "--max_queue_per_priority=1"});
  const std::string rejected = "tessera_router_requests_total{outcome=\"rejected\"}";
  // A holds the slot for about 2 s (100 tokens at 20 ms).
  std::atomic<bool> a_started{false};
  Result a;
  std::thread a_thread([&] {
    a = RunStream(c.stub.get(), Greedy({4, 5, 6}, 100), [&](int) { a_started = true; });
  });
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (!a_started.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(a_started.load());

  // B waits in the queue and is cancelled by its client.
  grpc::ClientContext b_ctx;
  Result b;
  std::thread b_thread([&] { b = RunStream(c.stub.get(), Greedy({7, 8}, 5), nullptr, &b_ctx); });
  const std::string queued = "tessera_router_requests_queued{priority=\"normal\"}";
  until = absl::Now() + absl::Seconds(30);
  while (MetricValue(c.router.metrics_port, queued) != 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(MetricValue(c.router.metrics_port, queued), 1) << "B never reached the queue";
  const absl::Time cancel_at = absl::Now();
  b_ctx.TryCancel();
  b_thread.join();
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::CANCELLED);
  // The router notices at once (no polling interval): B counts as rejected.
  double r = 0;
  while ((r = MetricValue(c.router.metrics_port, rejected)) < 1 &&
         absl::Now() < cancel_at + absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(r, 1) << "the cancelled wait was not ended";

  // C's client deadline passes while it waits: it leaves the queue too.
  grpc::ClientContext c_ctx;
  c_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  Result waited = RunStream(c.stub.get(), Greedy({9, 10}, 5), nullptr, &c_ctx);
  EXPECT_EQ(waited.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  until = absl::Now() + absl::Seconds(10);
  while ((r = MetricValue(c.router.metrics_port, rejected)) < 2 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(r, 2);

  // The queue place is free again: D waits (not RESOURCE_EXHAUSTED) and gets
  // the slot when A ends; neither cancelled waiter took it.
  Result d = RunStream(c.stub.get(), Greedy({11, 12}, 5));
  a_thread.join();
  EXPECT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens.size(), 100u);
  EXPECT_TRUE(d.status.ok()) << d.status.error_message();
  EXPECT_EQ(d.tokens.size(), 5u);
  EXPECT_TRUE(InFlightDrops(c.router.metrics_port));
}

TEST(RouterTest, SigtermLetsOpenStreamsFinishRefusesNewOnesAndExitsZero) {
  Cluster c = StartCluster(1, {kSlowSim}, {"--drain_deadline=20s"});
  // Two streams of about 1 s each (50 tokens at 20 ms).
  OpenStreams streams(c.stub.get(), {Greedy({4, 5, 6}, 50), Greedy({4, 5, 7}, 50)});
  ASSERT_TRUE(streams.WaitAllStarted(absl::Seconds(30)));
  c.router.process->Signal(SIGTERM);
  // After the 100 ms grace new work is refused; until then it is served.
  Result refused;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    refused = RunStream(c.stub.get(), Greedy({1, 2}, 2));
  } while (refused.status.ok() && absl::Now() < until);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  for (const Result& r : streams.Join()) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 50u);
  }
  auto exit = c.router.process->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0) << c.router.process->ReadLog();
}

}  // namespace
}  // namespace tessera::testing
