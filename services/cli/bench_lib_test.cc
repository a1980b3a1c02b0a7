// The load generator: length distributions, percentile math, workload
// construction (tenant prefixes, Zipf, determinism), Poisson arrivals, and
// closed- and open-loop runs against an in-process fake Inference server
// (request counts, concurrency, latencies, error counting, the report).
#include "services/cli/bench_lib.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tessera/v1/inference.grpc.pb.h"

namespace tessera::cli::bench {
namespace {

using ::testing::HasSubstr;

// ---- A fake tessera.v1.Inference server ----

// Streams max_tokens tokens in chunks of `chunk_tokens`, after
// `first_token_delay` and then `chunk_delay` per chunk, and a final
// complete. `decide(call_number, request)` may refuse a call with a status
// before anything is streamed, or (returning OK with `finish_error`) end it
// with finish reason ERROR.
class FakeInference final : public tessera::v1::Inference::Service {
 public:
  struct Options {
    absl::Duration first_token_delay = absl::Milliseconds(5);
    absl::Duration chunk_delay = absl::Milliseconds(2);
    int chunk_tokens = 1;
    std::function<grpc::Status(int64_t call, const tessera::v1::GenerateRequest&)> decide;
    std::function<bool(int64_t call)> finish_error;
  };

  explicit FakeInference(Options options) : options_(std::move(options)) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const tessera::v1::GenerateRequest* req,
                        grpc::ServerWriter<tessera::v1::GenerateResponse>* writer) override {
    const int64_t call = calls_.fetch_add(1);
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*req);
      auto auth = ctx->client_metadata().find("authorization");
      authorization_.push_back(auth == ctx->client_metadata().end()
                                   ? ""
                                   : std::string(auth->second.data(), auth->second.size()));
    }
    if (options_.decide) {
      grpc::Status s = options_.decide(call, *req);
      if (!s.ok()) return s;
    }
    const int now = in_flight_.fetch_add(1) + 1;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    absl::SleepFor(options_.first_token_delay);
    const int total = req->sampling().max_tokens();
    for (int sent = 0; sent < total;) {
      if (sent > 0) absl::SleepFor(options_.chunk_delay);
      tessera::v1::GenerateResponse resp;
      for (int k = 0; k < options_.chunk_tokens && sent < total; ++k, ++sent) {
        resp.mutable_chunk()->add_token_ids(3 + sent);
      }
      writer->Write(resp);
    }
    tessera::v1::GenerateResponse done;
    tessera::v1::Complete* c = done.mutable_complete();
    const bool error = options_.finish_error && options_.finish_error(call);
    c->set_finish_reason(error ? tessera::v1::FINISH_REASON_ERROR
                               : tessera::v1::FINISH_REASON_LENGTH);
    c->mutable_usage()->set_prompt_tokens(req->token_ids().ids_size());
    c->mutable_usage()->set_completion_tokens(total);
    c->mutable_usage()->set_cached_tokens(req->token_ids().ids_size() / 2);
    writer->Write(done);
    in_flight_.fetch_sub(1);
    return grpc::Status::OK;
  }

  int64_t calls() const { return calls_.load(); }
  int max_in_flight() const { return max_in_flight_.load(); }
  std::vector<tessera::v1::GenerateRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::vector<std::string> authorization() {
    absl::MutexLock lock(&mu_);
    return authorization_;
  }

 private:
  Options options_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  absl::Mutex mu_;
  std::vector<tessera::v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorization_ ABSL_GUARDED_BY(mu_);
};

class FakeServer {
 public:
  explicit FakeServer(FakeInference::Options options) : service_(std::move(options)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeInference& service() { return service_; }

 private:
  FakeInference service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

LengthDistribution Fixed(int n) {
  LengthDistribution d;
  d.a = n;
  return d;
}

BenchOptions Closed(const std::string& target, int concurrency, int64_t requests) {
  BenchOptions o;
  o.target = target;
  o.concurrency = concurrency;
  o.requests = requests;
  o.prompt_len = Fixed(16);
  o.output_len = Fixed(8);
  o.seed = 7;
  return o;
}

// ---- Pure parts ----

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 50.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 90.1);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 99.01);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 100);
  EXPECT_DOUBLE_EQ(Percentile({4.0}, 99), 4);
  EXPECT_DOUBLE_EQ(Percentile({1.0, 3.0}, 25), 1.5);

  // Summarize sorts its input.
  std::vector<double> shuffled = {9, 1, 5, 3, 7};
  LatencySummary s = Summarize(shuffled);
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 5);
  EXPECT_DOUBLE_EQ(s.p50, 5);
  EXPECT_DOUBLE_EQ(s.p90, 8.2);
  EXPECT_DOUBLE_EQ(s.p99, 8.92);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 9);
  EXPECT_EQ(Summarize({}).count, 0);
}

TEST(LengthDistributionTest, ParsesAndSamplesEachKind) {
  std::mt19937_64 rng(1);
  auto fixed = LengthDistribution::Parse("128");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->Sample(rng), 128);
  EXPECT_EQ(fixed->ToString(), "128");

  auto uniform = LengthDistribution::Parse("10:20");
  ASSERT_TRUE(uniform.ok());
  std::set<int> seen;
  for (int i = 0; i < 2000; ++i) {
    const int n = uniform->Sample(rng);
    ASSERT_GE(n, 10);
    ASSERT_LE(n, 20);
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 11u);
  EXPECT_EQ(uniform->ToString(), "10:20");

  auto normal = LengthDistribution::Parse("200~20");
  ASSERT_TRUE(normal.ok());
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = normal->Sample(rng);
    sum += x;
    sq += x * x;
  }
  const double mean = sum / n;
  const double sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 200, 1.0);
  EXPECT_NEAR(sd, 20, 1.0);
  EXPECT_EQ(normal->ToString(), "200~20");
  // Clamped to >= 1.
  auto wide = LengthDistribution::Parse("2~50");
  ASSERT_TRUE(wide.ok());
  for (int i = 0; i < 1000; ++i) ASSERT_GE(wide->Sample(rng), 1);

  for (const char* bad : {"", "abc", "0", "-3", "5:3", "0:4", "1.5:3", "10~-1", "x~2", "3:"}) {
    auto d = LengthDistribution::Parse(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ValidateBenchOptionsTest, RejectsInconsistentOptions) {
  EXPECT_TRUE(ValidateBenchOptions(Closed("h:1", 4, 10)).ok());
  BenchOptions o = Closed("h:1", 4, 10);
  o.rate = 5;
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("exactly one of"));
  o = Closed("h:1", 0, 10);
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("exactly one of"));
  o = Closed("h:1", 4, 0);
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("--requests or"));
  o = Closed("h:1", 4, 10);
  o.tenants = 3;
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("system_prompt_tokens"));
  o = Closed("h:1", 4, 10);
  o.use_routing_key = true;
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("needs --tenants"));
  o = Closed("", 4, 10);
  EXPECT_THAT(std::string(ValidateBenchOptions(o).message()), HasSubstr("--target"));
}

TEST(WorkloadTest, TenantPromptsStartWithTheTenantsSystemPrompt) {
  BenchOptions o = Closed("h:1", 1, 1);
  o.tenants = 5;
  o.system_prompt_tokens = 40;
  o.prompt_len = *LengthDistribution::Parse("8:16");
  o.output_len = *LengthDistribution::Parse("4:6");
  o.vocab = 500;
  o.use_routing_key = true;
  const Workload w(o);
  std::set<std::vector<int32_t>> distinct;
  for (int t = 0; t < o.tenants; ++t) {
    ASSERT_EQ(w.SystemPromptIds(t).size(), 40u);
    distinct.insert(w.SystemPromptIds(t));
  }
  EXPECT_EQ(distinct.size(), 5u) << "tenants must have different system prompts";
  std::set<int> tenants_seen;
  for (int64_t i = 0; i < 300; ++i) {
    const PlannedRequest p = w.Make(i);
    ASSERT_GE(p.tenant, 0);
    ASSERT_LT(p.tenant, 5);
    tenants_seen.insert(p.tenant);
    const std::vector<int32_t>& sys = w.SystemPromptIds(p.tenant);
    ASSERT_GE(p.token_ids.size(), 48u);
    ASSERT_LE(p.token_ids.size(), 56u);
    EXPECT_TRUE(std::equal(sys.begin(), sys.end(), p.token_ids.begin())) << "request " << i;
    EXPECT_EQ(p.prompt_len, static_cast<int>(p.token_ids.size()));
    for (int32_t id : p.token_ids) ASSERT_TRUE(id >= 0 && id < 500);
    EXPECT_GE(p.max_tokens, 4);
    EXPECT_LE(p.max_tokens, 6);
    EXPECT_EQ(p.routing_key, "tenant-" + std::to_string(p.tenant));
    // A pure function of (options, index).
    const PlannedRequest again = w.Make(i);
    EXPECT_EQ(again.token_ids, p.token_ids);
    EXPECT_EQ(again.max_tokens, p.max_tokens);
  }
  EXPECT_EQ(tenants_seen.size(), 5u);
  // Requests differ in their suffixes; another seed gives other prompts.
  EXPECT_NE(w.Make(0).token_ids, w.Make(1).token_ids);
  BenchOptions other = o;
  other.seed = o.seed + 1;
  EXPECT_NE(Workload(other).SystemPromptIds(0), w.SystemPromptIds(0));

  // Without --use_routing_key no key is sent.
  o.use_routing_key = false;
  EXPECT_EQ(Workload(o).Make(3).routing_key, "");
}

TEST(WorkloadTest, TextPromptsShareTheSystemPromptText) {
  BenchOptions o = Closed("h:1", 1, 1);
  o.prompt_kind = PromptKind::kText;
  o.tenants = 2;
  o.system_prompt_tokens = 30;
  o.prompt_len = Fixed(10);
  const Workload w(o);
  const std::string& sys = w.SystemPromptText(0);
  EXPECT_EQ(std::count(sys.begin(), sys.end(), ' '), 29);
  for (int64_t i = 0; i < 50; ++i) {
    const PlannedRequest p = w.Make(i);
    EXPECT_TRUE(p.token_ids.empty());
    const std::string& prefix = w.SystemPromptText(p.tenant);
    ASSERT_EQ(p.text.compare(0, prefix.size(), prefix), 0) << p.text;
    EXPECT_EQ(std::count(p.text.begin(), p.text.end(), ' '), 39) << p.text;
  }
}

TEST(WorkloadTest, ZipfFavoursLowTenants) {
  BenchOptions o = Closed("h:1", 1, 1);
  o.tenants = 8;
  o.system_prompt_tokens = 4;
  o.tenant_distribution = TenantDistribution::kZipf;
  o.zipf_exponent = 1.0;
  const Workload w(o);
  std::mt19937_64 rng(3);
  std::vector<int> counts(8, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[w.PickTenant(rng)];
  // P(t) = (1 / (t + 1)) / H_8.
  double h = 0;
  for (int t = 1; t <= 8; ++t) h += 1.0 / t;
  for (int t = 0; t < 8; ++t) {
    const double expected = n / ((t + 1) * h);
    EXPECT_NEAR(counts[t], expected, 5 * std::sqrt(expected)) << "tenant " << t;
  }
  // Uniform for comparison.
  o.tenant_distribution = TenantDistribution::kUniform;
  const Workload u(o);
  std::vector<int> flat(8, 0);
  for (int i = 0; i < n; ++i) ++flat[u.PickTenant(rng)];
  for (int t = 0; t < 8; ++t) EXPECT_NEAR(flat[t], n / 8.0, 5 * std::sqrt(n / 8.0));
}

TEST(ArrivalScheduleTest, GapsAreExponentialWithTheRate) {
  ArrivalSchedule s(50.0, 11);
  EXPECT_EQ(s.Next(), absl::ZeroDuration());
  std::vector<double> gaps;
  double previous = 0;
  for (int i = 0; i < 20000; ++i) {
    const double t = absl::ToDoubleSeconds(s.Next());
    ASSERT_GT(t, previous);
    gaps.push_back(t - previous);
    previous = t;
  }
  double sum = 0, sq = 0;
  for (double g : gaps) {
    sum += g;
    sq += g * g;
  }
  const double mean = sum / gaps.size();
  const double sd = std::sqrt(sq / gaps.size() - mean * mean);
  EXPECT_NEAR(mean, 1.0 / 50, 0.03 / 50);  // 20000 samples: 1 sigma = 0.7 %
  EXPECT_NEAR(sd / mean, 1.0, 0.03);       // exponential: sd == mean
}

// ---- Against the fake server ----

TEST(RunLoadTest, ClosedLoopSendsExactlyTheRequestsAtTheConcurrency) {
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(20);
  fo.chunk_delay = absl::Milliseconds(4);
  fo.chunk_tokens = 2;
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 4, 20);
  o.api_key = "secret-key";
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sent, 20);
  EXPECT_EQ(r->succeeded, 20);
  EXPECT_EQ(r->failed + r->resource_exhausted, 0);
  EXPECT_EQ(server.service().calls(), 20);
  EXPECT_EQ(server.service().max_in_flight(), 4);
  EXPECT_EQ(r->output_tokens, 20 * 8);
  EXPECT_EQ(r->length_mismatches, 0);
  EXPECT_EQ(r->prompt_tokens, 20 * 16);
  EXPECT_EQ(r->cached_tokens, 20 * 8);

  // Every request's latencies are consistent and include the fake's delays.
  ASSERT_EQ(r->records.size(), 20u);
  for (size_t i = 0; i < r->records.size(); ++i) {
    const RequestRecord& rec = r->records[i];
    EXPECT_EQ(rec.index, static_cast<int64_t>(i));
    ASSERT_TRUE(rec.ttft_ms.has_value());
    EXPECT_GE(*rec.ttft_ms, 20.0);
    // The fake spends >= 20 ms + 3 x 4 ms on each request.
    EXPECT_GE(rec.e2e_ms, 32.0);
    EXPECT_GE(rec.e2e_ms, *rec.ttft_ms);
    // 8 tokens in chunks of 2: the first chunk's 2, then 3 chunks x 2 samples.
    EXPECT_EQ(rec.itl_ms.size(), 6u);
  }
  // Each chunk's gap (4 ms at the server, give or take delivery jitter) is
  // split over its 2 tokens.
  EXPECT_GE(r->itl_ms.mean, 2.0 * 0.75);
  EXPECT_EQ(r->ttft_ms.count, 20);
  EXPECT_EQ(r->itl_ms.count, 20 * 6);
  EXPECT_GE(r->ttft_ms.p50, 20.0);
  EXPECT_LE(r->ttft_ms.p50, r->ttft_ms.p99);
  EXPECT_LE(r->ttft_ms.p99, r->e2e_ms.max);
  // 5 rounds of >= 32 ms each.
  EXPECT_GE(r->duration, absl::Milliseconds(5 * 32));

  // What the server received: greedy, ignore_eos, exact max_tokens, the key.
  for (const auto& req : server.service().requests()) {
    EXPECT_TRUE(req.sampling().has_temperature());
    EXPECT_EQ(req.sampling().temperature(), 0.0f);
    EXPECT_TRUE(req.sampling().ignore_eos());
    EXPECT_EQ(req.sampling().max_tokens(), 8);
    EXPECT_EQ(req.token_ids().ids_size(), 16);
    EXPECT_EQ(req.routing_key(), "");
  }
  for (const std::string& auth : server.service().authorization()) {
    EXPECT_EQ(auth, "Bearer secret-key");
  }
}

TEST(RunLoadTest, ClosedLoopStopsAtTheDuration) {
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(10);
  fo.chunk_delay = absl::Milliseconds(1);
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 2, 0);
  o.duration = absl::Milliseconds(300);
  o.output_len = Fixed(4);
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  // Each request takes >= 13 ms, so 2 clients send at most 2 * 300 / 13 + 2.
  EXPECT_GE(r->sent, 4);
  EXPECT_LE(r->sent, 2 * 300 / 13 + 2);
  EXPECT_EQ(r->sent, server.service().calls());
  EXPECT_EQ(r->succeeded, r->sent);
  EXPECT_GE(r->duration, absl::Milliseconds(300));
}

TEST(RunLoadTest, OpenLoopSendsOnScheduleWithoutWaitingForResponses) {
  // Each request takes >= 150 ms while requests arrive at 100/s: an open
  // loop keeps several in flight.
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(150);
  fo.chunk_delay = absl::Milliseconds(1);
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 0, 30);
  o.rate = 100;
  o.output_len = Fixed(3);
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sent, 30);
  EXPECT_EQ(r->succeeded, 30);
  EXPECT_EQ(server.service().calls(), 30);
  EXPECT_GE(server.service().max_in_flight(), 5);
  EXPECT_GE(r->ttft_ms.min, 150.0);
  // The run lasts at least until the last scheduled arrival plus its latency.
  ArrivalSchedule schedule(o.rate, o.seed);
  absl::Duration last;
  for (int i = 0; i < 30; ++i) last = schedule.Next();
  EXPECT_GE(r->duration, last + absl::Milliseconds(150));
}

TEST(RunLoadTest, OpenLoopByDurationSendsTheScheduledArrivals) {
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(1);
  fo.chunk_delay = absl::Milliseconds(1);
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 0, 0);
  o.rate = 80;
  o.duration = absl::Milliseconds(500);
  o.output_len = Fixed(2);
  o.max_in_flight = 2;  // a cap delays requests but never drops them
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ArrivalSchedule schedule(o.rate, o.seed);
  int64_t expected = 0;
  while (schedule.Next() < o.duration) ++expected;
  EXPECT_EQ(r->sent, expected);
  EXPECT_EQ(server.service().calls(), expected);
  EXPECT_EQ(r->succeeded, expected);
  EXPECT_LE(server.service().max_in_flight(), 2);
}

TEST(RunLoadTest, CountsErrorsByCodeAndResourceExhaustedApart) {
  auto refuse = [](int64_t call) { return call % 3 == 0; };
  auto unavailable = [&](int64_t call) { return !refuse(call) && call % 5 == 1; };
  auto finish_error = [&](int64_t call) {
    return !refuse(call) && !unavailable(call) && call == 7;
  };
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(1);
  fo.chunk_delay = absl::Milliseconds(1);
  fo.decide = [&](int64_t call, const tessera::v1::GenerateRequest&) {
    if (refuse(call)) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full");
    if (unavailable(call)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no worker");
    return grpc::Status::OK;
  };
  fo.finish_error = finish_error;
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 3, 30);
  o.output_len = Fixed(4);
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t want_refused = 0, want_unavailable = 0, want_finish_error = 0;
  for (int64_t call = 0; call < 30; ++call) {
    want_refused += refuse(call);
    want_unavailable += unavailable(call);
    want_finish_error += finish_error(call);
  }
  ASSERT_GT(want_refused, 0);
  ASSERT_GT(want_unavailable, 0);
  ASSERT_EQ(want_finish_error, 1);
  EXPECT_EQ(r->sent, 30);
  EXPECT_EQ(r->resource_exhausted, want_refused);
  EXPECT_EQ(r->errors.count("RESOURCE_EXHAUSTED"), 0u);
  EXPECT_EQ(r->errors["UNAVAILABLE"], want_unavailable);
  EXPECT_EQ(r->errors["FINISH_ERROR"], want_finish_error);
  EXPECT_EQ(r->failed, want_unavailable + want_finish_error);
  EXPECT_EQ(r->succeeded, 30 - want_refused - want_unavailable - want_finish_error);
  EXPECT_EQ(r->output_tokens, r->succeeded * 4);
  EXPECT_EQ(r->e2e_ms.count, r->succeeded);

  // The report carries the same numbers.
  const nlohmann::json j = ReportJson(o, *r);
  EXPECT_EQ(j["requests"]["sent"], 30);
  EXPECT_EQ(j["requests"]["succeeded"], r->succeeded);
  EXPECT_EQ(j["requests"]["resource_exhausted"], want_refused);
  EXPECT_EQ(j["requests"]["failed"], r->failed);
  EXPECT_EQ(j["errors"]["UNAVAILABLE"], want_unavailable);
  EXPECT_FALSE(j["errors"].contains("RESOURCE_EXHAUSTED"));
  EXPECT_EQ(j["error_examples"]["RESOURCE_EXHAUSTED"], "queue full");
  EXPECT_EQ(j["error_examples"]["UNAVAILABLE"], "no worker");
  EXPECT_EQ(j["config"]["mode"], "closed");
  EXPECT_EQ(j["config"]["concurrency"], 3);
  EXPECT_EQ(j["config"]["output_len"], "4");
  EXPECT_NEAR(j["request_throughput"].get<double>(),
              r->succeeded / absl::ToDoubleSeconds(r->duration), 1e-9);
  EXPECT_NEAR(j["output_token_throughput"].get<double>(),
              r->output_tokens / absl::ToDoubleSeconds(r->duration), 1e-9);
  for (const char* key : {"ttft_ms", "itl_ms", "e2e_ms"}) {
    for (const char* stat : {"count", "mean", "p50", "p90", "p99", "min", "max"}) {
      EXPECT_TRUE(j[key].contains(stat)) << key << "." << stat;
    }
  }
  EXPECT_DOUBLE_EQ(j["e2e_ms"]["p90"].get<double>(), r->e2e_ms.p90);
}

TEST(RunLoadTest, TenantModeSendsPrefixesAndRoutingKeys) {
  FakeInference::Options fo;
  fo.first_token_delay = absl::Milliseconds(1);
  fo.chunk_delay = absl::Milliseconds(1);
  FakeServer server(fo);
  BenchOptions o = Closed(server.target(), 2, 24);
  o.tenants = 3;
  o.system_prompt_tokens = 64;
  o.prompt_len = *LengthDistribution::Parse("4:12");
  o.output_len = Fixed(2);
  o.use_routing_key = true;
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->succeeded, 24);
  const Workload w(o);
  const auto requests = server.service().requests();
  ASSERT_EQ(requests.size(), 24u);
  for (const auto& req : requests) {
    ASSERT_EQ(req.routing_key().rfind("tenant-", 0), 0u) << req.routing_key();
    const int tenant = std::stoi(req.routing_key().substr(7));
    const std::vector<int32_t>& sys = w.SystemPromptIds(tenant);
    ASSERT_GE(req.token_ids().ids_size(), 64 + 4);
    EXPECT_TRUE(std::equal(sys.begin(), sys.end(), req.token_ids().ids().begin()));
    // The request id names the index; the server got exactly that request.
    const int64_t index = std::stoll(req.request_id().substr(6));
    const PlannedRequest p = w.Make(index);
    EXPECT_EQ(std::vector<int32_t>(req.token_ids().ids().begin(), req.token_ids().ids().end()),
              p.token_ids);
  }
}

TEST(RunLoadTest, UnreachableServerCountsAsUnavailable) {
  // Bind a port and close it again: nothing listens there.
  int port = 0;
  {
    FakeServer gone(FakeInference::Options{});
    port = std::stoi(gone.target().substr(10));
  }
  BenchOptions o = Closed("127.0.0.1:" + std::to_string(port), 2, 4);
  o.request_timeout = absl::Seconds(5);
  auto r = RunLoad(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sent, 4);
  EXPECT_EQ(r->succeeded, 0);
  EXPECT_EQ(r->errors["UNAVAILABLE"], 4);
  const nlohmann::json j = ReportJson(o, *r);
  EXPECT_TRUE(j["ttft_ms"]["p50"].is_null());
  EXPECT_EQ(j["ttft_ms"]["count"], 0);
}

}  // namespace
}  // namespace tessera::cli::bench
