#include "services/cli/bench_lib.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "tessera/v1/inference.grpc.pb.h"

namespace tessera::cli::bench {
namespace {

// SplitMix64: seeds per request and per tenant from (seed, index).
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Common English words; with a leading space each is one token in the
// usual BPE vocabularies, so N words make a prompt of about N tokens.
constexpr const char* kWords[] = {
    "the",   "of",     "and",    "to",     "in",      "is",     "you",     "that",   "it",
    "he",    "was",    "for",    "on",     "are",     "as",     "with",    "his",    "they",
    "at",    "be",     "this",   "have",   "from",    "or",     "one",     "had",    "by",
    "word",  "but",    "not",    "what",   "all",     "were",   "we",      "when",   "your",
    "can",   "said",   "there",  "use",    "an",      "each",   "which",   "she",    "do",
    "how",   "their",  "if",     "will",   "up",      "other",  "about",   "out",    "many",
    "then",  "them",   "these",  "so",     "some",    "her",    "would",   "make",   "like",
    "him",   "into",   "time",   "has",    "look",    "two",    "more",    "write",  "go",
    "see",   "number", "no",     "way",    "could",   "people", "my",      "than",   "first",
    "water", "been",   "call",   "who",    "its",     "now",    "find",    "long",   "down",
    "day",   "did",    "get",    "come",   "made",    "may",    "part",    "over",   "new",
    "sound", "take",   "only",   "little", "work",    "know",   "place",   "year",   "live",
    "me",    "back",   "give",   "most",   "very",    "after",  "thing",   "our",    "just",
    "name",  "good",   "man",    "think",  "say",     "great",  "where",   "help",   "through",
    "much",  "before", "line",   "right",  "too",     "mean",   "old",     "any",    "same",
    "tell",  "boy",    "follow", "came",   "want",    "show",   "also",    "around", "form",
    "three", "small",  "set",    "put",    "end",     "does",   "another", "well",   "large",
    "must",  "big",    "even",   "such",   "because", "turn",   "here",    "why",    "ask",
    "went",  "men",    "read",   "need",   "land",    "house",  "picture", "again",  "animal",
    "point", "mother", "world",  "near",   "build",   "self",   "earth",   "father", "head",
    "stand", "own",    "page",   "should", "country", "found",  "answer",  "school", "grow",
    "study", "still",  "learn",  "plant",  "cover",   "food",   "sun",     "four",   "between",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

void AppendRandomPrompt(PromptKind kind, int vocab, int n, std::mt19937_64& rng,
                        std::vector<int32_t>* ids, std::string* text) {
  if (kind == PromptKind::kTokenIds) {
    std::uniform_int_distribution<int32_t> id(0, vocab - 1);
    for (int i = 0; i < n; ++i) ids->push_back(id(rng));
  } else {
    std::uniform_int_distribution<int> word(0, kNumWords - 1);
    for (int i = 0; i < n; ++i) {
      if (!text->empty()) text->push_back(' ');
      text->append(kWords[word(rng)]);
    }
  }
}

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

// "FINISH_ERROR" for FINISH_REASON_ERROR, ...
std::string FinishKey(tessera::v1::FinishReason reason) {
  std::string name = tessera::v1::FinishReason_Name(reason);
  const std::string prefix = "FINISH_REASON_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  if (name.empty()) name = absl::StrCat(static_cast<int>(reason));
  return "FINISH_" + name;
}

tessera::v1::GenerateRequest ToProto(const PlannedRequest& p, const BenchOptions& o) {
  tessera::v1::GenerateRequest req;
  req.set_request_id(absl::StrCat("bench-", p.index));
  req.set_model(o.model);
  if (o.prompt_kind == PromptKind::kTokenIds) {
    auto* ids = req.mutable_token_ids()->mutable_ids();
    ids->Reserve(static_cast<int>(p.token_ids.size()));
    for (int32_t t : p.token_ids) ids->Add(t);
  } else {
    req.set_text(p.text);
  }
  tessera::v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(0);
  s->set_ignore_eos(true);
  s->set_max_tokens(p.max_tokens);
  req.set_routing_key(p.routing_key);
  return req;
}

// Sends one request and reads its stream; latencies count from `arrival`.
RequestRecord Execute(tessera::v1::Inference::Stub& stub, const BenchOptions& o,
                      const PlannedRequest& p, absl::Time arrival) {
  RequestRecord r;
  r.index = p.index;
  r.tenant = p.tenant;
  r.max_tokens = p.max_tokens;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.request_timeout));
  if (!o.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o.api_key);
  const tessera::v1::GenerateRequest req = ToProto(p, o);
  std::unique_ptr<grpc::ClientReader<tessera::v1::GenerateResponse>> reader =
      stub.Generate(&ctx, req);
  tessera::v1::GenerateResponse resp;
  std::optional<absl::Time> last_tokens;
  std::optional<tessera::v1::Complete> complete;
  while (reader->Read(&resp)) {
    const absl::Time now = absl::Now();
    if (resp.has_chunk()) {
      const int n = resp.chunk().token_ids_size();
      if (n == 0) continue;
      if (!last_tokens) {
        r.ttft_ms = absl::ToDoubleMilliseconds(now - arrival);
      } else {
        const double gap = absl::ToDoubleMilliseconds(now - *last_tokens) / n;
        r.itl_ms.insert(r.itl_ms.end(), n, gap);
      }
      last_tokens = now;
      r.output_tokens += n;
    } else if (resp.has_complete()) {
      complete = resp.complete();
    }
  }
  const grpc::Status status = reader->Finish();
  r.e2e_ms = absl::ToDoubleMilliseconds(absl::Now() - arrival);
  r.status_code = static_cast<int>(status.error_code());
  if (!status.ok()) {
    r.error = CodeName(status.error_code());
    r.error_message = status.error_message();
    return r;
  }
  if (!complete) {
    r.error = "NO_COMPLETE";
    r.error_message = "the stream ended without a complete message";
    return r;
  }
  r.prompt_tokens = complete->usage().prompt_tokens();
  r.cached_tokens = complete->usage().cached_tokens();
  const auto reason = complete->finish_reason();
  if (reason != tessera::v1::FINISH_REASON_LENGTH && reason != tessera::v1::FINISH_REASON_STOP) {
    r.error = FinishKey(reason);
    r.error_message = complete->error_message();
    return r;
  }
  r.succeeded = true;
  return r;
}

// Threads that run submitted tasks, started on demand up to `max_threads`:
// a task waits only while that many are busy. Join() waits for every task.
class GrowingPool {
 public:
  explicit GrowingPool(int max_threads) : max_threads_(max_threads) {}
  ~GrowingPool() { Join(); }

  void Submit(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    if (idle_ < static_cast<int>(tasks_.size()) &&
        static_cast<int>(threads_.size()) < max_threads_) {
      ++idle_;
      threads_.emplace_back([this] { Work(); });
    }
  }

  void Join() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Work() {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty() || closing_; };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // closing, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      --idle_;
      mu_.Unlock();
      task();
      mu_.Lock();
      ++idle_;
    }
  }

  const int max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads started and not running a task
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // Submit/Join callers only
};

nlohmann::json SummaryJson(const LatencySummary& s) {
  nlohmann::json j;
  j["count"] = s.count;
  for (const auto& [key, value] : {std::pair<const char*, double>{"mean", s.mean},
                                   {"p50", s.p50},
                                   {"p90", s.p90},
                                   {"p99", s.p99},
                                   {"min", s.min},
                                   {"max", s.max}}) {
    if (s.count > 0) {
      j[key] = value;
    } else {
      j[key] = nullptr;
    }
  }
  return j;
}

}  // namespace

// ---- LengthDistribution ----

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(std::string_view spec_in) {
  const std::string spec(spec_in);
  auto bad = [&spec](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("length '", spec, "': ", std::string(why),
                     " (use N, a:b for uniform, or mean~sd for normal)"));
  };
  auto number = [](const std::string& text, double* out) {
    return absl::SimpleAtod(text, out) && std::isfinite(*out);
  };
  LengthDistribution d;
  size_t sep = spec.find_first_of(":~");
  if (sep == std::string::npos) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(spec, &n)) return bad("not an integer");
    if (n < 1 || n > (int64_t{1} << 24)) return bad("must be in [1, 16777216]");
    d.kind = Kind::kFixed;
    d.a = static_cast<double>(n);
    return d;
  }
  if (!number(spec.substr(0, sep), &d.a) || !number(spec.substr(sep + 1), &d.b)) {
    return bad("not two numbers");
  }
  if (spec[sep] == ':') {
    d.kind = Kind::kUniform;
    if (d.a != std::floor(d.a) || d.b != std::floor(d.b)) return bad("bounds must be integers");
    if (d.a < 1 || d.b < d.a || d.b > (1 << 24)) return bad("need 1 <= a <= b <= 16777216");
  } else {
    d.kind = Kind::kNormal;
    if (d.a < 1 || d.a > (1 << 24) || d.b < 0) return bad("need mean >= 1 and sd >= 0");
  }
  return d;
}

int LengthDistribution::Sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<int>(a);
    case Kind::kUniform:
      return std::uniform_int_distribution<int>(static_cast<int>(a), static_cast<int>(b))(rng);
    case Kind::kNormal: {
      const double v = std::normal_distribution<double>(a, b)(rng);
      return static_cast<int>(std::clamp(std::round(v), 1.0, double{1 << 24}));
    }
  }
  return 1;
}

std::string LengthDistribution::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat(static_cast<int64_t>(a));
    case Kind::kUniform:
      return absl::StrCat(static_cast<int64_t>(a), ":", static_cast<int64_t>(b));
    case Kind::kNormal:
      return absl::StrCat(a, "~", b);
  }
  return "";
}

// ---- Options ----

absl::Status ValidateBenchOptions(const BenchOptions& o) {
  auto bad = [](std::string_view why) { return absl::InvalidArgumentError(std::string(why)); };
  if (o.target.empty()) return bad("--target is required (host:port)");
  if ((o.concurrency > 0) == (o.rate > 0)) {
    return bad("give exactly one of --concurrency (closed loop) and --rate (open loop)");
  }
  if (o.concurrency < 0 || o.concurrency > 4096) return bad("--concurrency must be in [1, 4096]");
  if (o.rate < 0 || !std::isfinite(o.rate)) return bad("--rate must be a positive number");
  if (o.requests < 0) return bad("--requests must be >= 0");
  if (o.duration < absl::ZeroDuration()) return bad("--duration must be >= 0");
  if (o.requests == 0 && o.duration == absl::ZeroDuration()) {
    return bad("give --requests or --duration (or both)");
  }
  if (o.prompt_kind == PromptKind::kTokenIds && o.vocab < 1) return bad("--vocab must be >= 1");
  if (o.tenants < 0 || o.tenants > 1000000) return bad("--tenants must be in [0, 1000000]");
  if (o.tenants > 0 && o.system_prompt_tokens < 1) {
    return bad("--tenants needs --system_prompt_tokens >= 1");
  }
  if (o.tenants == 0 && o.system_prompt_tokens != 0) {
    return bad("--system_prompt_tokens applies only with --tenants");
  }
  if (o.system_prompt_tokens < 0 ||
      int64_t{o.tenants} * o.system_prompt_tokens > (int64_t{1} << 27)) {
    return bad("--tenants x --system_prompt_tokens must be at most 2^27 tokens");
  }
  if (o.use_routing_key && o.tenants == 0) return bad("--use_routing_key needs --tenants");
  if (o.tenant_distribution == TenantDistribution::kZipf &&
      (!(o.zipf_exponent > 0) || !std::isfinite(o.zipf_exponent))) {
    return bad("--zipf_exponent must be > 0");
  }
  if (o.channels < 1 || o.channels > 256) return bad("--channels must be in [1, 256]");
  if (o.max_in_flight < 1 || o.max_in_flight > 16384) {
    return bad("--max_in_flight must be in [1, 16384]");
  }
  if (o.request_timeout <= absl::ZeroDuration()) return bad("--timeout must be > 0");
  return absl::OkStatus();
}

// ---- Workload ----

Workload::Workload(const BenchOptions& options) : options_(options) {
  system_ids_.resize(options_.tenants);
  system_text_.resize(options_.tenants);
  for (int t = 0; t < options_.tenants; ++t) {
    std::mt19937_64 rng(Mix(options_.seed ^ Mix(0x7E4A47ULL + static_cast<uint64_t>(t))));
    AppendRandomPrompt(options_.prompt_kind, options_.vocab, options_.system_prompt_tokens, rng,
                       &system_ids_[t], &system_text_[t]);
  }
  if (options_.tenant_distribution == TenantDistribution::kZipf) {
    double total = 0;
    for (int t = 0; t < options_.tenants; ++t) {
      total += 1.0 / std::pow(static_cast<double>(t + 1), options_.zipf_exponent);
      tenant_cdf_.push_back(total);
    }
  }
}

int Workload::PickTenant(std::mt19937_64& rng) const {
  if (options_.tenants <= 0) return -1;
  if (tenant_cdf_.empty()) return std::uniform_int_distribution<int>(0, options_.tenants - 1)(rng);
  const double u = std::uniform_real_distribution<double>(0, tenant_cdf_.back())(rng);
  auto it = std::upper_bound(tenant_cdf_.begin(), tenant_cdf_.end(), u);
  return static_cast<int>(std::min<ptrdiff_t>(it - tenant_cdf_.begin(), options_.tenants - 1));
}

PlannedRequest Workload::Make(int64_t index) const {
  std::mt19937_64 rng(Mix(options_.seed ^ Mix(static_cast<uint64_t>(index))));
  PlannedRequest p;
  p.index = index;
  p.tenant = PickTenant(rng);
  const int user_len = options_.prompt_len.Sample(rng);
  p.max_tokens = options_.output_len.Sample(rng);
  if (p.tenant >= 0) {
    p.token_ids = system_ids_[p.tenant];
    p.text = system_text_[p.tenant];
    if (options_.use_routing_key) p.routing_key = absl::StrCat("tenant-", p.tenant);
  }
  AppendRandomPrompt(options_.prompt_kind, options_.vocab, user_len, rng, &p.token_ids, &p.text);
  p.prompt_len = (p.tenant >= 0 ? options_.system_prompt_tokens : 0) + user_len;
  return p;
}

// ---- Arrivals and statistics ----

ArrivalSchedule::ArrivalSchedule(double rate, uint64_t seed)
    : rng_(Mix(seed ^ 0xA77E1ULL)), gap_(rate) {}

absl::Duration ArrivalSchedule::Next() {
  const absl::Duration at = absl::Seconds(t_);
  t_ += gap_(rng_);
  return at;
}

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

LatencySummary Summarize(std::vector<double> values) {
  LatencySummary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

// ---- Running ----

absl::StatusOr<BenchResult> RunLoad(const BenchOptions& o) {
  if (auto s = ValidateBenchOptions(o); !s.ok()) return s;
  const Workload workload(o);
  std::vector<std::unique_ptr<tessera::v1::Inference::Stub>> stubs;
  for (int i = 0; i < o.channels; ++i) {
    grpc::ChannelArguments args;
    // Distinct arguments keep channels from sharing one connection.
    args.SetInt("tessera.bench.channel", i);
    args.SetMaxReceiveMessageSize(64 << 20);
    stubs.push_back(tessera::v1::Inference::NewStub(
        grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args)));
  }

  absl::Mutex mu;
  std::vector<RequestRecord> records;
  auto run_one = [&](int64_t index, absl::Time arrival) {
    const PlannedRequest p = workload.Make(index);
    RequestRecord r = Execute(*stubs[index % stubs.size()], o, p, arrival);
    absl::MutexLock lock(&mu);
    records.push_back(std::move(r));
  };

  const absl::Time start = absl::Now();
  const bool bounded_time = o.duration > absl::ZeroDuration();
  const absl::Time end = start + o.duration;
  if (o.concurrency > 0) {
    std::atomic<int64_t> next{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < o.concurrency; ++c) {
      clients.emplace_back([&] {
        while (true) {
          const int64_t index = next.fetch_add(1);
          if (o.requests > 0 && index >= o.requests) return;
          const absl::Time now = absl::Now();
          if (bounded_time && now >= end) return;
          run_one(index, now);
        }
      });
    }
    for (std::thread& t : clients) t.join();
  } else {
    GrowingPool pool(o.max_in_flight);
    ArrivalSchedule arrivals(o.rate, o.seed);
    for (int64_t index = 0; o.requests == 0 || index < o.requests; ++index) {
      const absl::Duration offset = arrivals.Next();
      if (bounded_time && offset >= o.duration) break;
      const absl::Time at = start + offset;
      const absl::Duration wait = at - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
      pool.Submit([&run_one, index, at] { run_one(index, at); });
    }
    pool.Join();
  }

  BenchResult result;
  result.duration = absl::Now() - start;
  std::sort(records.begin(), records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  std::vector<double> ttft, itl, e2e;
  for (const RequestRecord& r : records) {
    ++result.sent;
    if (!r.succeeded) {
      result.error_examples.emplace(r.error, r.error_message);
      if (r.status_code == static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED)) {
        ++result.resource_exhausted;
      } else {
        ++result.failed;
        ++result.errors[r.error];
      }
      continue;
    }
    ++result.succeeded;
    result.output_tokens += r.output_tokens;
    result.prompt_tokens += r.prompt_tokens;
    result.cached_tokens += r.cached_tokens;
    if (r.output_tokens != r.max_tokens) ++result.length_mismatches;
    if (r.ttft_ms) ttft.push_back(*r.ttft_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    e2e.push_back(r.e2e_ms);
  }
  result.ttft_ms = Summarize(std::move(ttft));
  result.itl_ms = Summarize(std::move(itl));
  result.e2e_ms = Summarize(std::move(e2e));
  result.records = std::move(records);
  return result;
}

nlohmann::json ReportJson(const BenchOptions& o, const BenchResult& r) {
  nlohmann::json config;
  config["target"] = o.target;
  config["model"] = o.model;
  config["mode"] = o.concurrency > 0 ? "closed" : "open";
  if (o.concurrency > 0) {
    config["concurrency"] = o.concurrency;
  } else {
    config["rate"] = o.rate;
    config["max_in_flight"] = o.max_in_flight;
  }
  config["requests"] = o.requests;
  config["duration_s"] = absl::ToDoubleSeconds(o.duration);
  config["prompt_len"] = o.prompt_len.ToString();
  config["output_len"] = o.output_len.ToString();
  config["prompt_kind"] = o.prompt_kind == PromptKind::kTokenIds ? "token_ids" : "text";
  if (o.prompt_kind == PromptKind::kTokenIds) config["vocab"] = o.vocab;
  config["seed"] = o.seed;
  config["tenants"] = o.tenants;
  if (o.tenants > 0) {
    config["system_prompt_tokens"] = o.system_prompt_tokens;
    config["tenant_distribution"] =
        o.tenant_distribution == TenantDistribution::kZipf ? "zipf" : "uniform";
    if (o.tenant_distribution == TenantDistribution::kZipf) {
      config["zipf_exponent"] = o.zipf_exponent;
    }
    config["use_routing_key"] = o.use_routing_key;
  }
  config["channels"] = o.channels;
  config["api_key"] = !o.api_key.empty();  // whether one was sent, never the key

  nlohmann::json j;
  j["config"] = config;
  const double seconds = absl::ToDoubleSeconds(r.duration);
  j["duration_s"] = seconds;
  j["requests"] = {{"sent", r.sent},
                   {"succeeded", r.succeeded},
                   {"resource_exhausted", r.resource_exhausted},
                   {"failed", r.failed}};
  j["errors"] = nlohmann::json::object();
  for (const auto& [key, count] : r.errors) j["errors"][key] = count;
  j["error_examples"] = nlohmann::json::object();
  for (const auto& [key, message] : r.error_examples) j["error_examples"][key] = message;
  j["request_throughput"] = seconds > 0 ? static_cast<double>(r.succeeded) / seconds : 0.0;
  j["output_token_throughput"] = seconds > 0 ? static_cast<double>(r.output_tokens) / seconds : 0.0;
  j["tokens"] = {{"prompt", r.prompt_tokens},
                 {"cached", r.cached_tokens},
                 {"output", r.output_tokens},
                 {"cached_fraction", r.prompt_tokens > 0 ? static_cast<double>(r.cached_tokens) /
                                                               static_cast<double>(r.prompt_tokens)
                                                         : 0.0}};
  j["length_mismatches"] = r.length_mismatches;
  j["ttft_ms"] = SummaryJson(r.ttft_ms);
  j["itl_ms"] = SummaryJson(r.itl_ms);
  j["e2e_ms"] = SummaryJson(r.e2e_ms);
  return j;
}

}  // namespace tessera::cli::bench
