// Every metric that the Prometheus rules (deploy/prometheus/tessera-rules.yml)
// and the Grafana dashboard (deploy/grafana/tessera-dashboard.json) use must
// exist in a live scrape of the real services. The test starts a worker (on a
// simulated model), a drafter and a router on loopback, sends one generation
// through the router (labelled series such as requests_total{outcome} only
// appear after traffic), scrapes the three /metrics endpoints and compares
// series names. Histogram series are compared with their _bucket, _sum and
// _count suffixes, as the expressions write them.
//
// A companion check, tests/deploy/check_metric_names.py, compares the same
// names with README.md's metrics tables; this one compares them with what the
// binaries really export.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tessera/v1/inference.grpc.pb.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

// Names the rules or the dashboard may use before the services export them.
// Each entry must say why; the test fails when a listed name does appear, so
// the list only ever shrinks. Empty: every used name is exported.
const std::set<std::string> kExpectedMissing = {};

std::string SourceDir() {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return src ? src : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::regex& MetricName() {
  static const std::regex* re = new std::regex(R"(\btessera_[a-z0-9_]*[a-z0-9])");
  return *re;
}

void AddNames(const std::string& text, std::set<std::string>* out) {
  for (std::sregex_iterator it(text.begin(), text.end(), MetricName()), end; it != end; ++it) {
    out->insert(it->str());
  }
}

// Metric names in the rules' expressions (annotations are prose and skipped).
std::set<std::string> RuleNames(const std::string& path) {
  std::set<std::string> names;
  static const std::regex prose(R"(^\s*(summary|description):)");
  for (absl::string_view piece : absl::StrSplit(ReadFile(path), '\n')) {
    std::string line(piece);
    if (std::regex_search(line, prose)) continue;
    AddNames(line, &names);
  }
  return names;
}

void PanelExprs(const nlohmann::json& panels, std::set<std::string>* names) {
  if (!panels.is_array()) return;
  for (const auto& p : panels) {
    for (const auto& t : p.value("targets", nlohmann::json::array())) {
      AddNames(t.value("expr", ""), names);
    }
    PanelExprs(p.value("panels", nlohmann::json::array()), names);  // collapsed rows
  }
}

// Metric names in the dashboard's panel expressions and variable queries.
std::set<std::string> DashboardNames(const std::string& path) {
  std::set<std::string> names;
  auto dash = nlohmann::json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  if (dash.is_discarded()) return names;
  PanelExprs(dash.value("panels", nlohmann::json::array()), &names);
  for (const auto& v : dash["templating"].value("list", nlohmann::json::array())) {
    const auto& q = v.value("query", nlohmann::json());
    AddNames(q.is_object()   ? q.value("query", "")
             : q.is_string() ? q.get<std::string>()
                             : "",
             &names);
  }
  return names;
}

// Series names of a Prometheus text exposition.
std::set<std::string> ScrapedNames(const std::string& body) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    size_t end = line.find_first_of("{ ");
    names.insert(std::string(line.substr(0, end)));
  }
  return names;
}

struct Service {
  std::unique_ptr<TestProcess> process;
  int grpc_port = 0;
  int metrics_port = 0;
};

Service Start(const std::string& binary, std::vector<std::string> args) {
  Service s;
  std::string dir = MakeTempDir();
  args.insert(args.end(), {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                           "--port_file=" + dir + "/ports", "--drain_grace=100ms"});
  s.process = std::make_unique<TestProcess>();
  auto started = s.process->Start(BinaryPath(binary), args, dir + "/log");
  EXPECT_TRUE(started.ok()) << started;
  auto ports = s.process->WaitForPortFile(dir + "/ports", absl::Seconds(30));
  EXPECT_TRUE(ports.ok()) << binary << ": " << ports.status() << "\n" << s.process->ReadLog();
  if (ports.ok()) {
    s.grpc_port = (*ports)["grpc_port"];
    s.metrics_port = (*ports)["metrics_port"];
  }
  return s;
}

TEST(DeployMetricsScrapeTest, EveryMetricUsedByRulesAndDashboardIsExported) {
  const std::string rules_path = SourceDir() + "/deploy/prometheus/tessera-rules.yml";
  const std::string dash_path = SourceDir() + "/deploy/grafana/tessera-dashboard.json";
  std::set<std::string> used = RuleNames(rules_path);
  const size_t from_rules = used.size();
  std::set<std::string> dash = DashboardNames(dash_path);
  ASSERT_GT(from_rules, 5u) << "no metric names found in " << rules_path;
  ASSERT_GT(dash.size(), 10u) << "no metric names found in " << dash_path;
  used.insert(dash.begin(), dash.end());

  Service worker = Start("services/worker/tessera-worker",
                         {"--simulate=vocab=1024,context=4096,prefill_us_per_token=1,"
                          "decode_step_us=1000",
                          "--kv_cache_blocks=256"});
  Service drafter = Start("services/drafter/tessera-drafter", {});
  ASSERT_GT(worker.grpc_port, 0);
  ASSERT_GT(drafter.grpc_port, 0);
  Service router = Start("services/router/tessera-router",
                         {absl::StrCat("--workers=127.0.0.1:", worker.grpc_port)});
  ASSERT_GT(router.grpc_port, 0);

  // Wait until the router counts the worker healthy, then generate once.
  auto stub = tessera::v1::Inference::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", router.grpc_port), grpc::InsecureChannelCredentials()));
  bool ready = false;
  for (absl::Time until = absl::Now() + absl::Seconds(30); !ready && absl::Now() < until;) {
    grpc::ClientContext ctx;
    tessera::v1::ListModelsResponse resp;
    ready = stub->ListModels(&ctx, {}, &resp).ok() && resp.models_size() == 1 &&
            resp.models(0).healthy_workers() == 1;
    if (!ready) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(ready) << "router log:\n" << router.process->ReadLog();
  tessera::v1::GenerateRequest req;
  for (int t : {11, 12, 13, 14, 15, 16, 17, 18}) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(8);
  req.mutable_sampling()->set_ignore_eos(true);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Generate(&ctx, req);
    tessera::v1::GenerateResponse resp;
    int tokens = 0;
    while (reader->Read(&resp)) tokens += resp.chunk().token_ids_size();
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message() << "\nrouter log:\n"
                             << router.process->ReadLog();
    EXPECT_EQ(tokens, 8);
  }

  std::set<std::string> exported;
  std::map<std::string, std::string> bodies;
  const std::vector<std::pair<std::string, Service*>> services = {
      {"router", &router}, {"worker", &worker}, {"drafter", &drafter}};
  for (const auto& [name, s] : services) {
    auto body = HttpGet(s->metrics_port, "/metrics");
    ASSERT_TRUE(body.ok()) << name << ": " << body.status();
    std::set<std::string> names = ScrapedNames(*body);
    EXPECT_TRUE(names.count("tessera_build_info")) << name << " exports no tessera_build_info";
    exported.insert(names.begin(), names.end());
    bodies[name] = *body;
  }

  std::vector<std::string> missing, unexpectedly_present;
  for (const std::string& name : used) {
    bool present = exported.count(name) > 0;
    if (kExpectedMissing.count(name)) {
      if (present) unexpectedly_present.push_back(name);
    } else if (!present) {
      missing.push_back(name);
    }
  }
  EXPECT_TRUE(missing.empty())
      << "used by deploy/prometheus or deploy/grafana but exported by no service: "
      << absl::StrJoin(missing, ", ") << "\nrouter:\n"
      << bodies["router"] << "\nworker:\n"
      << bodies["worker"] << "\ndrafter:\n"
      << bodies["drafter"];
  EXPECT_TRUE(unexpectedly_present.empty()) << "exported now; remove from kExpectedMissing: "
                                            << absl::StrJoin(unexpectedly_present, ", ");
  std::cout << "compared " << used.size() << " metric names (" << from_rules << " from rules, "
            << dash.size() << " from the dashboard) with " << exported.size()
            << " exported series names\n";

  for (Service* s : {&router, &worker, &drafter}) {
    s->process->Signal(SIGTERM);
    auto exit = s->process->Wait(absl::Seconds(20));
    ASSERT_TRUE(exit.has_value());
    EXPECT_TRUE(exit->exited && exit->code == 0) << s->process->ReadLog();
  }
}

}  // namespace
}  // namespace tessera::testing
