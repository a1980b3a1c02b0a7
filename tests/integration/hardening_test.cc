// What an adversarial client found, each as a regression test against the
// real binaries on loopback: slow peers on the metrics port, huge text
// prompts, cancels taken for worker failures, uncounted aborts, Tokenize's
// model check, the sampling contracts, the drafter's half-closed stream, the
// worker-health gauge of a hung worker, and streams cut by the router's
// drain deadline.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/drafter.grpc.pb.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

using tessera::v1::GenerateRequest;
using ::testing::HasSubstr;

// A TCP connection to 127.0.0.1:port, or -1.
int Connect(int port) {
  absl::StatusOr<int> fd = ConnectLoopback(port);
  return fd.ok() ? *fd : -1;
}

// True once the server closed `fd` (a read returns 0 or an error).
bool ClosedByServer(int fd, absl::Duration within) {
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(within)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  return read(fd, &c, 1) <= 0;
}

// 1. An idle connection and one that trickles a byte every 2 s, both open,
// must not hold up scrapes (the exposer once served one connection at a
// time and gave each 30 s); and the server cuts the trickler within its
// request deadline (2 s in total, not per byte).
TEST(HardeningTest, IdleAndTricklingPeersDoNotStarveScrapes) {
  Cluster c = StartCluster(1, {kSlowSim});
  for (const int port : {c.router.metrics_port, c.workers[0].metrics_port}) {
    SCOPED_TRACE(absl::StrCat("metrics port ", port));
    const int idle = Connect(port);
    const int trickle = Connect(port);
    ASSERT_GE(idle, 0);
    ASSERT_GE(trickle, 0);
    std::atomic<bool> stop{false};
    std::atomic<int> sent{0};
    std::thread trickler([&] {
      const char request[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
      for (size_t i = 0; i < sizeof(request) - 1 && !stop.load(); ++i) {
        if (send(trickle, request + i, 1, MSG_NOSIGNAL) != 1) return;
        sent.fetch_add(1);
        for (int t = 0; t < 40 && !stop.load(); ++t) absl::SleepFor(absl::Milliseconds(50));
      }
    });
    absl::SleepFor(absl::Milliseconds(100));  // both peers are in the server's hands
    for (int i = 0; i < 20; ++i) {
      const absl::Time start = absl::Now();
      auto body = HttpGet(port, "/metrics");
      const absl::Duration took = absl::Now() - start;
      EXPECT_TRUE(body.ok()) << "scrape " << i << ": " << body.status();
      if (!body.ok()) break;
      EXPECT_THAT(*body, HasSubstr("tessera_build_info"));
      EXPECT_LT(took, absl::Milliseconds(1000)) << "scrape " << i;
    }
    const absl::Time waited = absl::Now();
    EXPECT_TRUE(ClosedByServer(trickle, absl::Seconds(10)));
    EXPECT_LT(absl::Now() - waited, absl::Seconds(3)) << "the trickling peer was kept too long";
    EXPECT_TRUE(ClosedByServer(idle, absl::Seconds(10)));
    stop = true;
    trickler.join();
    close(idle);
    close(trickle);
  }
}

// 2. Text prompts larger than the context can hold are refused before they
// are tokenized: fast, without delaying other requests, and without leaving
// the router's memory grown. The byte tokenizer has one byte per token, so
// a simulated context of 8192 tokens holds at most 8192 bytes.
TEST(HardeningTest, HugePromptsAreRefusedBeforeTokenizingAndDoNotDelayOthers) {
  const std::string dir = MakeTempDir();
  WriteByteTokenizer(dir);
  Cluster c =
      StartCluster(1,
                   {"--simulate=vocab=256,context=8192,prefill_us_per_token=0,decode_step_us=2000",
                    "--kv_cache_blocks=1024"},
                   {"--tokenizer=" + dir});
  const pid_t router = c.router.process->pid();
  const long baseline_kib = ResidentKiB(router);
  ASSERT_GT(baseline_kib, 0);

  std::atomic<int> huge_done{0};
  std::vector<Result> huge(2);
  std::vector<absl::Duration> huge_took(2);
  std::vector<std::thread> senders;
  for (int i = 0; i < 2; ++i) {
    senders.emplace_back([&, i] {
      GenerateRequest req = Greedy({}, 4);
      req.set_text(std::string(50 << 20, static_cast<char>('a' + i)));
      const absl::Time start = absl::Now();
      huge[i] = RunStream(c.stub.get(), req);
      huge_took[i] = absl::Now() - start;
      huge_done.fetch_add(1);
    });
  }
  // Small requests meanwhile: each normally takes a few tens of ms.
  absl::Duration slowest;
  int small = 0;
  while (huge_done.load() < 2 || small < 10) {
    GenerateRequest req = Greedy({}, 4);
    req.set_text("hello");
    const absl::Time start = absl::Now();
    Result r = RunStream(c.stub.get(), req);
    slowest = std::max(slowest, absl::Now() - start);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ++small;
  }
  for (auto& t : senders) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(huge[i].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(huge[i].status.error_message(), HasSubstr("52428800 bytes"));
    EXPECT_LT(huge_took[i], absl::Seconds(5));
  }
  EXPECT_LT(slowest, absl::Seconds(2)) << "small requests waited behind the huge prompts";
  // A long prompt that fits is tokenized (off the request threads) and served.
  GenerateRequest fits = Greedy({}, 2);
  fits.set_text(std::string(8000, 'z'));
  Result ok = RunStream(c.stub.get(), fits);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.complete.usage().prompt_tokens(), 8000);
  // The 100 MB received are given back (gRPC's buffers and the strings).
  const long after_kib = ResidentKiB(router);
  EXPECT_LT(after_kib, baseline_kib + 16 * 1024)
      << "router RSS " << baseline_kib << " KiB before, " << after_kib << " KiB after";
  RecordProperty("router_rss_kib_before", static_cast<int>(baseline_kib));
  RecordProperty("router_rss_kib_after", static_cast<int>(after_kib));
  RecordProperty("slowest_small_request_ms", static_cast<int>(absl::ToInt64Milliseconds(slowest)));
}

// The bound the context implies, a long text within it that takes the
// tokenize pool (over 64 KiB), and --max_prompt_bytes below the bound.
TEST(HardeningTest, TheContextBoundsTextPromptsAndLongOnesAreTokenized) {
  const std::string dir = MakeTempDir();
  WriteByteTokenizer(dir);
  Cluster c = StartCluster(
      1,
      {"--simulate=vocab=256,context=131072,prefill_us_per_token=0,decode_step_us=2000",
       "--kv_cache_blocks=10000"},
      {"--tokenizer=" + dir});
  Service capped = StartService("services/router/tessera-router",
                                {"--tokenizer=" + dir, "--max_prompt_bytes=1000",
                                 absl::StrCat("--workers=127.0.0.1:", c.workers[0].grpc_port)});
  auto capped_stub = tessera::v1::Inference::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", capped.grpc_port), grpc::InsecureChannelCredentials()));
  GenerateRequest over_cap = Greedy({}, 2);
  over_cap.set_text(std::string(1001, 'c'));
  Result capped_refused = RunStream(capped_stub.get(), over_cap);
  EXPECT_EQ(capped_refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(capped_refused.status.error_message(), HasSubstr("1001 bytes"));
  GenerateRequest over = Greedy({}, 2);
  over.set_text(std::string(131073, 'q'));
  Result refused = RunStream(c.stub.get(), over);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("context of 131072 tokens"));
  GenerateRequest fits = Greedy({}, 2);
  fits.set_text(std::string(100000, 'q'));
  Result ok = RunStream(c.stub.get(), fits);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.complete.usage().prompt_tokens(), 100000);
  // Tokenize answers the same bound.
  grpc::ClientContext ctx;
  tessera::v1::TokenizeRequest treq;
  treq.set_text(over.text());
  tessera::v1::TokenizeResponse tresp;
  EXPECT_EQ(c.stub->Tokenize(&ctx, treq, &tresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// 3 and 4. Streams cancelled by their clients are neither retried nor
// migrated nor counted unavailable, and each worker counts them as aborts.
TEST(HardeningTest, ClientCancelsAreNeverMigrationsAndWorkersCountAborts) {
  Cluster c = StartCluster(2, {"--simulate=vocab=1024,context=8192,prefill_us_per_token=1,"
                               "decode_step_us=5000",
                               "--max_num_seqs=256"});
  // Three rounds of 200 streams, every second one cancelled after 8 tokens:
  // the old race (the worker call's CANCELLED seen before the client's)
  // showed in about one round of three.
  const int kStreams = 200, kRounds = 3;
  int ok = 0, cancelled = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> threads;
    std::vector<Result> results(kStreams);
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    for (int i = 0; i < kStreams; ++i) contexts.push_back(std::make_unique<grpc::ClientContext>());
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back([&, i] {
        grpc::ClientContext* ctx = contexts[i].get();
        const bool cancel = i % 2 == 1;
        bool done = false;
        results[i] = RunStream(
            c.stub.get(), Greedy({3, 4, 5, 6 + i % 500}, 40),
            [&](int n) {
              if (cancel && n >= 8 && !done) {
                done = true;
                ctx->TryCancel();
              }
            },
            ctx);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kStreams; ++i) {
      if (i % 2 == 0) {
        EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
        ok += results[i].status.ok();
      } else {
        EXPECT_EQ(results[i].status.error_code(), grpc::StatusCode::CANCELLED) << i;
        cancelled += results[i].status.error_code() == grpc::StatusCode::CANCELLED;
      }
    }
  }
  const int port = c.router.metrics_port;
  // The router counts every cancel once it has seen the stream end.
  const std::string cancelled_metric = "tessera_router_requests_total{outcome=\"cancelled\"}";
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (MetricValue(port, cancelled_metric) < cancelled && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(MetricValue(port, cancelled_metric), cancelled);
  EXPECT_EQ(MetricValue(port, "tessera_router_requests_total{outcome=\"ok\"}"), ok);
  EXPECT_LE(MetricValue(port, "tessera_router_requests_total{outcome=\"unavailable\"}"), 0);
  EXPECT_EQ(MetricValue(port, "tessera_router_migrations_total"), 0);
  EXPECT_EQ(MetricValue(port, "tessera_router_retries_total"), 0);
  EXPECT_THAT(c.router.process->ReadLog(), ::testing::Not(HasSubstr("migrating")));
  // Each stream ended once on the worker that ran it: a cancelled one as
  // an abort, unless the worker had already written its last token when
  // the cancel reached it (a race the client cannot see; then it counts as
  // a length finish); every other one as a length finish, plus each
  // worker's warm-up request.
  auto finished = [&](const char* reason) {
    double sum = 0;
    for (const Service& w : c.workers) {
      sum += std::max(0.0, MetricValue(w.metrics_port,
                                       absl::StrCat("tessera_worker_requests_finished_total{reason=\"",
                                                    reason, "\"}")));
    }
    return sum;
  };
  const double all = ok + cancelled + /*warm-up requests*/ 2;
  until = absl::Now() + absl::Seconds(10);
  while (finished("abort") + finished("length") < all && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double aborts = finished("abort"), lengths = finished("length");
  EXPECT_EQ(aborts + lengths, all);
  EXPECT_GE(lengths, ok + 2);
  EXPECT_LE(aborts, cancelled);
  // Cancels after 8 of 40 tokens overtake the end almost always (297 of
  // 300 on a loaded 2-core machine); most must reach the worker as aborts.
  EXPECT_GE(aborts, 0.5 * cancelled);
}

// 5 and 6 (names). Tokenize checks the model name as Generate does, and a
// long name is echoed only in part.
TEST(HardeningTest, TokenizeChecksTheModelAndLongNamesAreNotEchoedWhole) {
  const std::string dir = MakeTempDir();
  WriteByteTokenizer(dir);
  Cluster c = StartCluster(1, {kSlowSim}, {"--tokenizer=" + dir});
  for (const std::string& model : {std::string("nope"), std::string(20000, 'm')}) {
    SCOPED_TRACE(model.size());
    grpc::ClientContext ctx;
    tessera::v1::TokenizeRequest treq;
    treq.set_model(model);
    treq.set_text("hello");
    tessera::v1::TokenizeResponse tresp;
    grpc::Status s = c.stub->Tokenize(&ctx, treq, &tresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_EQ(tresp.token_ids_size(), 0);
    EXPECT_LT(s.error_message().size(), 400u);
    GenerateRequest g = Greedy({1, 2}, 2);
    g.set_model(model);
    Result r = RunStream(c.stub.get(), g);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND) << r.status.error_message();
    EXPECT_LT(r.status.error_message().size(), 400u);
  }
  grpc::ClientContext ctx;
  tessera::v1::TokenizeRequest treq;
  treq.set_model("default");
  treq.set_text("hi");
  tessera::v1::TokenizeResponse tresp;
  EXPECT_TRUE(c.stub->Tokenize(&ctx, treq, &tresp).ok());
  EXPECT_EQ(tresp.token_ids_size(), 2);
}

// 6. The sampling contracts, as common.proto states them.
TEST(HardeningTest, SamplingContractsHoldAsDocumented) {
  Cluster c = StartCluster(1, {"--simulate=vocab=1024,context=256,prefill_us_per_token=1,"
                               "decode_step_us=1000"});
  auto run = [&](GenerateRequest req) { return RunStream(c.stub.get(), req); };
  // top_k = -1 is "off", like 0.
  GenerateRequest k = Greedy({4, 5}, 3);
  k.mutable_sampling()->set_temperature(1);
  k.mutable_sampling()->set_seed(7);
  k.mutable_sampling()->set_top_k(-1);
  Result minus_one = run(k);
  EXPECT_TRUE(minus_one.status.ok()) << minus_one.status.error_message();
  k.mutable_sampling()->set_top_k(0);
  EXPECT_EQ(run(k).tokens, minus_one.tokens);
  // Integers print as integers.
  k.mutable_sampling()->set_top_k(std::numeric_limits<int32_t>::min());
  Result bad_k = run(k);
  EXPECT_EQ(bad_k.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_k.status.error_message(), HasSubstr("got -2147483648"));
  // max_tokens beyond what the context leaves is refused, not capped.
  Result too_long = run(Greedy({4, 5}, 255));
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("room for 254 tokens"));
  EXPECT_TRUE(run(Greedy({4, 5}, 254)).status.ok());
  // Field 15 (min_tokens, removed) is refused by name, not ignored.
  GenerateRequest min_tokens = Greedy({4, 5}, 3);
  min_tokens.mutable_sampling()
      ->GetReflection()
      ->MutableUnknownFields(min_tokens.mutable_sampling())
      ->AddVarint(15, 2);
  Result refused = run(min_tokens);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("min_tokens"));
}

// 6 (stop strings). The rule: token_ids and usage.completion_tokens hold
// every generated token up to and including the one that completed the stop
// string; the text ends before the stop string.
TEST(HardeningTest, StopStringsKeepIdsTextAndUsageConsistent) {
  const std::string dir = MakeTempDir();
  WriteByteTokenizer(dir);
  // The simulated model emits ids 3..255: each decodes to one byte.
  Cluster c = StartCluster(
      1, {"--simulate=vocab=256,context=4096,prefill_us_per_token=1,decode_step_us=1000"},
      {"--tokenizer=" + dir});
  auto run = [&](int max_tokens, const std::string& stop) {
    GenerateRequest req = Greedy({}, max_tokens);
    req.set_text("hello");
    if (!stop.empty()) req.mutable_sampling()->add_stop(stop);
    Result r = RunStream(c.stub.get(), req);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return r;
  };
  Result full = run(60, "");
  // Three ASCII characters from the middle of the text.
  size_t at = 10;
  while (at + 3 < full.text.size() &&
         !std::all_of(full.text.begin() + at, full.text.begin() + at + 3,
                      [](char ch) { return ch > ' ' && ch < 0x7f; })) {
    ++at;
  }
  ASSERT_LT(at + 3, full.text.size()) << full.text;
  const std::string stop = full.text.substr(at, 3);
  Result cut = run(60, stop);
  EXPECT_EQ(cut.complete.finish_reason(), tessera::v1::FINISH_REASON_STOP);
  EXPECT_EQ(cut.complete.matched_stop(), stop);
  const int n = static_cast<int>(cut.tokens.size());
  EXPECT_EQ(n, cut.complete.usage().completion_tokens());
  ASSERT_GT(n, 0);
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + n));
  // Its last token completed the stop string: n tokens hold it, n - 1 not.
  EXPECT_THAT(run(n, "").text, HasSubstr(stop));
  EXPECT_THAT(run(n - 1, "").text, ::testing::Not(HasSubstr(stop)));
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
}

// 6 (drafter). A worker that half-closes its Speculate stream gets OK.
TEST(HardeningTest, DrafterEndsAHalfClosedStreamWithOk) {
  Service d = StartService("services/drafter/tessera-drafter", {"--draft_source=ngram"});
  auto stub = tessera::v1::Drafter::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", d.grpc_port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Speculate(&ctx);
  tessera::v1::DraftControl open;
  open.mutable_open()->set_seq(1);
  for (int32_t t : {1, 2, 3, 1, 2, 3, 1, 2}) open.mutable_open()->add_prompt_ids(t);
  open.mutable_open()->set_max_draft_tokens(3);
  ASSERT_TRUE(stream->Write(open));
  tessera::v1::DraftProposal p;
  ASSERT_TRUE(stream->Read(&p));  // the stream is up and drafting
  EXPECT_EQ(p.seq(), 1u);
  ASSERT_TRUE(stream->WritesDone());
  while (stream->Read(&p)) {
  }
  grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
}

// 6 (health gauge). A worker that stops answering (SIGSTOP) reads 0 in
// tessera_router_worker_healthy once routing avoids it, and 1 again after.
TEST(HardeningTest, WorkerHealthyGaugeFollowsRoutingForAHungWorker) {
  Cluster c = StartCluster(2, {kSlowSim}, {"--load_staleness=1s", "--load_interval_ms=50"});
  const std::string hung = absl::StrCat(
      "tessera_router_worker_healthy{worker=\"127.0.0.1:", c.workers[0].grpc_port, "\"}");
  const std::string other = absl::StrCat(
      "tessera_router_worker_healthy{worker=\"127.0.0.1:", c.workers[1].grpc_port, "\"}");
  EXPECT_EQ(MetricValue(c.router.metrics_port, hung), 1);
  c.workers[0].process->Signal(SIGSTOP);
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (MetricValue(c.router.metrics_port, hung) != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(MetricValue(c.router.metrics_port, hung), 0);
  EXPECT_EQ(MetricValue(c.router.metrics_port, other), 1);
  c.workers[0].process->Signal(SIGCONT);
  until = absl::Now() + absl::Seconds(10);
  while (MetricValue(c.router.metrics_port, hung) != 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(MetricValue(c.router.metrics_port, hung), 1);
}

// 6 (drain). Streams still open at the router's drain deadline end with a
// final message (finish reason CANCELLED, the usage so far) and status OK.
TEST(HardeningTest, DrainDeadlineEndsOpenStreamsWithAFinalMessage) {
  Cluster c = StartCluster(1, {kSlowSim}, {"--drain_deadline=1s"});
  // Two streams of about 10 s each (500 tokens at 20 ms).
  OpenStreams streams(c.stub.get(), {Greedy({4, 5, 6}, 500), Greedy({4, 5, 7}, 500)});
  ASSERT_TRUE(streams.WaitAllStarted(absl::Seconds(30)));
  c.router.process->Signal(SIGTERM);
  for (const Result& r : streams.Join()) {
    EXPECT_TRUE(r.status.ok()) << r.status.error_code() << ": " << r.status.error_message();
    ASSERT_TRUE(r.has_complete);
    EXPECT_EQ(r.complete.finish_reason(), tessera::v1::FINISH_REASON_CANCELLED);
    EXPECT_EQ(r.complete.usage().completion_tokens(), static_cast<int>(r.tokens.size()));
    EXPECT_GT(r.tokens.size(), 0u);
    EXPECT_LT(r.tokens.size(), 500u);
  }
  auto exit = c.router.process->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0) << c.router.process->ReadLog();
  EXPECT_THAT(c.router.process->ReadLog(), HasSubstr("ending in-flight streams"));
}

}  // namespace
}  // namespace tessera::testing
