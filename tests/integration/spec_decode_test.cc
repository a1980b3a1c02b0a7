// Speculative decoding across real binaries: tessera-worker with
// --drafter pointing at tessera-drafter.
//  - Greedy outputs equal a plain worker's; kill -9 of the drafter in the
//    middle of a generation changes nothing and the generation goes on; the
//    worker reconnects when a drafter listens on the address again.
//  - A drafter slower than the per-step deadline (--inject_delay_ms) does not
//    slow the worker below plain decoding by more than the stated margin.
//  - The tessera_spec_decode_* metrics and the usage counts are reported.
#include <signal.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tessera/v1/worker.grpc.pb.h"
#include "tests/integration/test_process.h"
#include "worker/runner/test_model.h"

namespace tessera::testing {
namespace {

using tessera::v1::Worker;
using tessera::v1::WorkerGenerateRequest;
using tessera::v1::WorkerGenerateResponse;

// Tied embeddings make greedy output repetitive, so n-gram drafts get
// accepted; big enough that a decode step takes a few milliseconds.
std::string Model() {
  static std::string* dir = [] {
    auto* d = new std::string(MakeTempDir());
    runner::TestModelSpec spec = runner::SlowDecodeSpec();
    spec.tie_embeddings = true;
    spec.weight_scale = 0.08f;
    EXPECT_TRUE(runner::WriteTestModel(*d, spec).ok());
    return d;
  }();
  return *dir;
}

struct Service {
  std::unique_ptr<TestProcess> process;
  int grpc_port = 0;
  int metrics_port = 0;
};

Service Start(const std::string& binary, std::vector<std::string> args) {
  Service s;
  std::string dir = MakeTempDir();
  args.push_back("--port_file=" + dir + "/ports");
  args.push_back("--metrics_listen=127.0.0.1:0");
  args.push_back("--drain_grace=50ms");
  s.process = std::make_unique<TestProcess>();
  EXPECT_TRUE(s.process->Start(BinaryPath(binary), args, dir + "/log").ok());
  auto ports = s.process->WaitForPortFile(dir + "/ports", absl::Seconds(30));
  EXPECT_TRUE(ports.ok()) << ports.status();
  if (ports.ok()) {
    s.grpc_port = (*ports)["grpc_port"];
    s.metrics_port = (*ports)["metrics_port"];
  }
  return s;
}

Service StartDrafter(int port, int delay_ms = 0) {
  return Start("services/drafter/tessera-drafter",
               {absl::StrCat("--listen=127.0.0.1:", port), "--draft_source=ngram",
                absl::StrCat("--inject_delay_ms=", delay_ms)});
}

struct WorkerClient {
  Service service;
  std::unique_ptr<Worker::Stub> stub;
};

WorkerClient StartWorker(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model=" + Model(), "--listen=127.0.0.1:0", "--cpu_threads=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  WorkerClient w;
  w.service = Start("services/worker/tessera-worker", args);
  w.stub = Worker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", w.service.grpc_port),
                                               grpc::InsecureChannelCredentials()));
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until) {
    grpc::ClientContext ctx;
    tessera::v1::WorkerInfo info;
    if (w.stub->GetInfo(&ctx, {}, &info).ok() && info.ready()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return w;
}

WorkerGenerateRequest Greedy(int seed, int max_tokens) {
  WorkerGenerateRequest r;
  for (int i = 0; i < 24; ++i) r.add_prompt_ids(3 + (seed * 131 + i * 17) % 1000);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

struct Result {
  std::vector<int32_t> tokens;
  tessera::v1::WorkerComplete complete;
  grpc::Status status;
  absl::Duration elapsed;
};

// Runs a stream; `on_token(n)` is called after every chunk with the count
// so far.
Result RunStream(Worker::Stub* stub, const WorkerGenerateRequest& req,
                 const std::function<void(size_t)>& on_token = nullptr) {
  Result r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  absl::Time start = absl::Now();
  auto reader = stub->Generate(&ctx, req);
  WorkerGenerateResponse resp;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.chunk().token_ids()) r.tokens.push_back(t);
    if (resp.has_complete()) r.complete = resp.complete();
    if (on_token) on_token(r.tokens.size());
  }
  r.status = reader->Finish();
  r.elapsed = absl::Now() - start;
  return r;
}

double MetricValue(int port, const std::string& name) {
  auto body = HttpGet(port, "/metrics");
  if (!body.ok()) return -1;
  double total = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) {
      total += v;
      found = true;
    }
  }
  return found ? total : -1;
}

TEST(SpecDecodeTest, DrafterKilledMidGenerationChangesNothingAndTheWorkerReconnects) {
  constexpr int kTokens = 240;
  std::vector<std::vector<int32_t>> expected;
  {
    WorkerClient plain = StartWorker({});
    for (int i = 0; i < 3; ++i) {
      Result r = RunStream(plain.stub.get(), Greedy(i, kTokens));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      expected.push_back(r.tokens);
    }
  }
  const int port = PickFreePort();
  Service drafter = StartDrafter(port);
  WorkerClient w = StartWorker({absl::StrCat("--drafter=127.0.0.1:", port), "--spec_deadline_ms=50",
                                "--num_speculative_tokens=4"});
  // With the drafter: same output, drafts accepted.
  Result a = RunStream(w.stub.get(), Greedy(0, kTokens));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens, expected[0]);
  std::cout << "with the drafter: " << a.complete.usage().accepted_tokens() << " of "
            << a.complete.usage().draft_tokens() << " draft tokens accepted\n";
  EXPECT_GT(a.complete.usage().draft_tokens(), 0);
  EXPECT_GT(a.complete.usage().accepted_tokens(), 0);
  EXPECT_LE(a.complete.usage().accepted_tokens(), a.complete.usage().draft_tokens());
  EXPECT_GT(MetricValue(w.service.metrics_port, "tessera_spec_decode_num_drafts_total"), 0);
  EXPECT_GT(MetricValue(w.service.metrics_port, "tessera_spec_decode_accepted_per_position_total"),
            0);
  EXPECT_GT(MetricValue(w.service.metrics_port, "tessera_spec_decode_drafter_rtt_seconds_count"),
            0);

  // kill -9 in the middle, while its drafts are in use: the stream
  // finishes with the same tokens.
  const char kDrafts[] = "tessera_spec_decode_num_drafts_total";
  const double drafts_before_b = MetricValue(w.service.metrics_port, kDrafts);
  double drafts_at_kill = 0;
  bool killed = false;
  Result b = RunStream(w.stub.get(), Greedy(1, kTokens), [&](size_t n) {
    if (!killed && n >= kTokens / 4) {
      drafts_at_kill = MetricValue(w.service.metrics_port, kDrafts);
      drafter.process->Signal(SIGKILL);
      killed = true;
    }
  });
  ASSERT_TRUE(killed);
  EXPECT_GT(drafts_at_kill, drafts_before_b) << "the drafter's drafts were not in use at the kill";
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.tokens, expected[1]);
  drafter.process->Wait(absl::Seconds(10));

  // Without a drafter the worker decodes plainly.
  const double drafts_before =
      MetricValue(w.service.metrics_port, "tessera_spec_decode_num_drafts_total");
  Result c = RunStream(w.stub.get(), Greedy(2, kTokens));
  ASSERT_TRUE(c.status.ok());
  EXPECT_EQ(c.tokens, expected[2]);
  EXPECT_EQ(c.complete.usage().draft_tokens(), 0);

  // A drafter on the same address again: the worker reconnects by itself.
  Service again = StartDrafter(port);
  bool reconnected = false;
  absl::Time until = absl::Now() + absl::Seconds(30);
  while (!reconnected && absl::Now() < until) {
    Result d = RunStream(w.stub.get(), Greedy(2, kTokens));
    ASSERT_TRUE(d.status.ok());
    EXPECT_EQ(d.tokens, expected[2]);
    reconnected = d.complete.usage().draft_tokens() > 0;
  }
  EXPECT_TRUE(reconnected);
  EXPECT_GT(MetricValue(w.service.metrics_port, "tessera_spec_decode_num_drafts_total"),
            drafts_before);
}

TEST(SpecDecodeTest, SlowDrafterDoesNotSlowTheWorker) {
  constexpr int kTokens = 300;
  constexpr int kRounds = 5;
  const int port = PickFreePort();
  Service slow = StartDrafter(port, /*delay_ms=*/100);
  WorkerClient plain = StartWorker({});
  WorkerClient w =
      StartWorker({absl::StrCat("--drafter=127.0.0.1:", port), "--spec_deadline_ms=5"});
  // The worker connects to the drafter after it is ready; on a busy machine
  // that can take longer than the timed rounds. Requests until a proposal
  // came back late show the connection is up.
  const char kLate[] = "tessera_spec_decode_late_proposals_total";
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       MetricValue(w.service.metrics_port, kLate) <= 0 && absl::Now() < until;) {
    ASSERT_TRUE(RunStream(w.stub.get(), Greedy(9, kTokens)).status.ok());
  }
  // (A late proposal comes only when the drafter's answer lands while its
  // stream still runs, so the timed rounds need not see another.)
  ASSERT_GT(MetricValue(w.service.metrics_port, kLate), 0)
      << "no proposal of the drafter reached the worker";
  // Interleaved, best of kRounds each, one request at a time (the machine
  // is shared; the best run is the least disturbed).
  absl::Duration plain_time = absl::InfiniteDuration(), spec_time = absl::InfiniteDuration();
  for (int i = 0; i < kRounds; ++i) {
    for (WorkerClient* c : {&plain, &w}) {
      Result r = RunStream(c->stub.get(), Greedy(10 + i, kTokens));
      ASSERT_TRUE(r.status.ok());
      ASSERT_EQ(r.tokens.size(), static_cast<size_t>(kTokens));
      absl::Duration& best = c == &plain ? plain_time : spec_time;
      best = std::min(best, r.elapsed);
    }
  }
  const double ratio = absl::FDivDuration(plain_time, spec_time);
  std::cout << "plain " << plain_time << ", with a drafter 100 ms late: " << spec_time
            << " (speed ratio " << ratio << ")\n";
  // A worker that waited for this drafter would be 20x slower (ratio about
  // 0.05). Not waiting, it still shares the CPU with the drafter's stream:
  // with the connection up for every timed round, 0.88-0.93 on a quiet
  // two-core machine and 0.58 once in CI (before the warm-up above, the
  // rounds sometimes ran before the connection, and 0.79-1.08 was seen).
  // The bound separates the two by a wide margin (4x above waiting, about
  // 3x below the slowest not-waiting run seen); the speed itself is
  // measured by spec_decode_bench, not here.
  EXPECT_GT(ratio, 0.20);
}

TEST(SpecDecodeTest, DraftModelDrafterGreedyAndSeededSampling) {
  constexpr int kTokens = 96;
  std::vector<int32_t> expected;
  {
    WorkerClient plain = StartWorker({});
    Result r = RunStream(plain.stub.get(), Greedy(5, kTokens));
    ASSERT_TRUE(r.status.ok());
    expected = r.tokens;
  }
  // The target drafting for itself: every greedy draft is accepted.
  Service drafter = Start(
      "services/drafter/tessera-drafter",
      {"--listen=127.0.0.1:0", "--draft_source=model", "--model=" + Model(), "--cpu_threads=1"});
  WorkerClient w = StartWorker(
      {absl::StrCat("--drafter=127.0.0.1:", drafter.grpc_port), "--spec_deadline_ms=200"});
  Result g = RunStream(w.stub.get(), Greedy(5, kTokens));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, expected);
  EXPECT_GT(g.complete.usage().draft_tokens(), 0);
  EXPECT_EQ(g.complete.usage().accepted_tokens(), g.complete.usage().draft_tokens());
  // Sampling with a seed: drafts carry their distribution; the result is
  // reproducible.
  WorkerGenerateRequest sampled = Greedy(6, kTokens);
  sampled.mutable_sampling()->set_temperature(0.8f);
  sampled.mutable_sampling()->set_seed(42);
  Result s1 = RunStream(w.stub.get(), sampled);
  Result s2 = RunStream(w.stub.get(), sampled);
  ASSERT_TRUE(s1.status.ok() && s2.status.ok());
  EXPECT_EQ(s1.tokens, s2.tokens);
  EXPECT_EQ(s1.tokens.size(), static_cast<size_t>(kTokens));
  EXPECT_GT(s1.complete.usage().accepted_tokens(), 0);
  // A bad --draft_source is a clear start-up error.
  auto bad = RunToCompletion(BinaryPath("services/drafter/tessera-drafter"),
                             {"--draft_source=magic"}, absl::Seconds(20));
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->exit.code, 0);
  EXPECT_THAT(bad->output, ::testing::HasSubstr("expected ngram, suffix or model"));
}

}  // namespace
}  // namespace tessera::testing
