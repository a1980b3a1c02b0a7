#include "tests/integration/cluster.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera::testing {

using tessera::v1::GenerateRequest;
using tessera::v1::GenerateResponse;
using tessera::v1::Inference;

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

Service StartService(const std::string& binary, std::vector<std::string> args) {
  Service s;
  s.dir = MakeTempDir();
  args.insert(args.end(), {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                           "--port_file=" + s.dir + "/ports", "--drain_grace=100ms"});
  s.process = std::make_unique<TestProcess>();
  EXPECT_TRUE(s.process->Start(BinaryPath(binary), args, s.dir + "/log").ok());
  auto ports = s.process->WaitForPortFile(s.dir + "/ports", absl::Seconds(30));
  EXPECT_TRUE(ports.ok()) << ports.status();
  if (ports.ok()) {
    s.grpc_port = (*ports)["grpc_port"];
    s.metrics_port = (*ports)["metrics_port"];
    if (ports->count("http_port")) s.http_port = (*ports)["http_port"];
  }
  return s;
}

Cluster StartCluster(const std::vector<std::vector<std::string>>& worker_args,
                     std::vector<std::string> router_args, const std::string& api_key) {
  Cluster c;
  std::vector<std::string> addrs;
  const int n = static_cast<int>(worker_args.size());
  for (const std::vector<std::string>& args : worker_args) {
    c.workers.push_back(StartService("services/worker/tessera-worker", args));
    addrs.push_back(absl::StrCat("127.0.0.1:", c.workers.back().grpc_port));
  }
  router_args.push_back("--workers=" + absl::StrJoin(addrs, ","));
  c.router = StartService("services/router/tessera-router", router_args);
  c.stub = Inference::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", c.router.grpc_port),
                                                  grpc::InsecureChannelCredentials()));
  absl::Time until = absl::Now() + absl::Seconds(30);
  bool ready = false;
  while (!ready && absl::Now() < until) {
    grpc::ClientContext ctx;
    if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
    tessera::v1::ListModelsResponse resp;
    ready = c.stub->ListModels(&ctx, {}, &resp).ok() && resp.models_size() == 1 &&
            resp.models(0).healthy_workers() == n;
    if (!ready) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(ready) << "router log:\n" << c.router.process->ReadLog();
  return c;
}

Cluster StartCluster(int n, const std::vector<std::string>& worker_args,
                     std::vector<std::string> router_args, const std::string& api_key) {
  return StartCluster(std::vector<std::vector<std::string>>(n, worker_args), std::move(router_args),
                      api_key);
}

GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
  GenerateRequest r;
  for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

Result RunStream(Inference::Stub* stub, const GenerateRequest& req,
                 std::function<void(int)> on_token, grpc::ClientContext* ctx_in) {
  Result r;
  grpc::ClientContext local;
  grpc::ClientContext* ctx = ctx_in ? ctx_in : &local;
  auto reader = stub->Generate(ctx, req);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.chunk().token_ids()) r.tokens.push_back(t);
    r.text += resp.chunk().text();
    if (on_token) on_token(static_cast<int>(r.tokens.size()));
    if (resp.has_complete()) {
      r.complete = resp.complete();
      r.has_complete = true;
    }
  }
  r.status = reader->Finish();
  for (const auto& [k, v] : ctx->GetServerTrailingMetadata()) {
    r.trailers[std::string(k.data(), k.size())] = std::string(v.data(), v.size());
  }
  return r;
}

OpenStreams::OpenStreams(Inference::Stub* stub, std::vector<GenerateRequest> requests)
    : results_(requests.size()) {
  for (size_t i = 0; i < requests.size(); ++i) {
    threads_.emplace_back([this, stub, i, req = std::move(requests[i])] {
      bool counted = false;
      results_[i] = RunStream(stub, req, [&](int) {
        if (!counted) {
          counted = true;
          started_.fetch_add(1);
        }
      });
    });
  }
}

OpenStreams::~OpenStreams() { Join(); }

bool OpenStreams::WaitAllStarted(absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (started_.load() < static_cast<int>(results_.size()) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return started_.load() == static_cast<int>(results_.size());
}

std::vector<Result> OpenStreams::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  return results_;
}

double MetricValue(int port, const std::string& name) {
  auto body = HttpGet(port, "/metrics");
  if (!body.ok()) return -1;
  std::istringstream in(*body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

void WriteByteTokenizer(const std::string& dir) {
  std::vector<int> bs, cs;
  for (int b = 0; b < 256; ++b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
      bs.push_back(b);
      cs.push_back(b);
    }
  }
  for (int b = 0, n = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < bs.size(); ++i) {
    std::string utf8;
    int c = cs[i];
    if (c < 0x80) {
      utf8 += static_cast<char>(c);
    } else {
      utf8 += static_cast<char>(0xC0 | (c >> 6));
      utf8 += static_cast<char>(0x80 | (c & 0x3F));
    }
    vocab[utf8] = bs[i];
  }
  nlohmann::json tj = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array()},
        {"byte_fallback", false}}},
  };
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
}

namespace {
long StatusField(pid_t pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
  }
  return -1;
}
}  // namespace

int ThreadCount(pid_t pid) { return static_cast<int>(StatusField(pid, "Threads:")); }
long ResidentKiB(pid_t pid) { return StatusField(pid, "VmRSS:"); }

}  // namespace tessera::testing
