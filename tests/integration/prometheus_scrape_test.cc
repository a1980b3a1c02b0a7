// A real Prometheus server (Debian's `prometheus`), started on loopback with
// a generated scrape config, scrapes the three services; the test reads
// `up == 1` for each from Prometheus's HTTP API.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

constexpr const char* kPrometheus = "/usr/bin/prometheus";

TEST(PrometheusScrapeTest, PrometheusSeesEveryServiceUp) {
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << kPrometheus << " is missing: run scripts/install-deps.sh (package 'prometheus')";
  const std::map<std::string, std::string> binaries = {
      {"worker", "services/worker/tessera-worker"},
      {"router", "services/router/tessera-router"},
      {"drafter", "services/drafter/tessera-drafter"},
  };
  std::string dir = MakeTempDir();
  std::map<std::string, std::unique_ptr<TestProcess>> services;
  std::map<std::string, int> metrics_ports;
  for (const auto& [job, binary] : binaries) {
    auto p = std::make_unique<TestProcess>();
    std::string port_file = absl::StrCat(dir, "/", job, ".ports");
    std::vector<std::string> args = {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                     "--port_file=" + port_file};
    if (job == "router") args.push_back("--workers=127.0.0.1:1");
    if (job == "worker") {
      const char* src = std::getenv("TESSERA_SOURCE_DIR");
      args.push_back(
          absl::StrCat("--model=", src ? src : ".", "/tests/fixtures/models/qwen3_tiny"));
    }
    ASSERT_TRUE(p->Start(BinaryPath(binary), args, absl::StrCat(dir, "/", job, ".log")).ok());
    auto ports = p->WaitForPortFile(port_file, absl::Seconds(20));
    ASSERT_TRUE(ports.ok()) << ports.status();
    metrics_ports[job] = (*ports)["metrics_port"];
    services[job] = std::move(p);
  }

  std::string config = absl::StrCat(dir, "/prometheus.yml");
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n";
    for (const auto& [job, port] : metrics_ports) {
      out << "  - job_name: " << job
          << "\n    static_configs:\n      - targets: ['127.0.0.1:" << port << "']\n";
    }
  }
  int web_port = PickFreePort();
  TestProcess prometheus;
  ASSERT_TRUE(
      prometheus
          .Start(kPrometheus,
                 {"--config.file=" + config, "--storage.tsdb.path=" + dir + "/tsdb",
                  absl::StrCat("--web.listen-address=127.0.0.1:", web_port), "--log.level=warn"},
                 dir + "/prometheus.log")
          .ok());

  std::map<std::string, std::string> up;
  absl::Time until = absl::Now() + absl::Seconds(60);
  while (absl::Now() < until && up.size() < binaries.size()) {
    absl::SleepFor(absl::Milliseconds(500));
    auto body = HttpGet(web_port, "/api/v1/query?query=up");
    if (!body.ok()) continue;
    auto json = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || json.value("status", "") != "success") continue;
    up.clear();
    for (const auto& sample : json["data"]["result"]) {
      std::string value = sample["value"][1].get<std::string>();
      if (value == "1") up[sample["metric"]["job"].get<std::string>()] = value;
    }
  }
  for (const auto& [job, binary] : binaries) {
    EXPECT_EQ(up[job], "1") << "Prometheus does not see job " << job << " up; prometheus log:\n"
                            << prometheus.ReadLog();
  }
  // The services' own metrics arrived too, not just the synthetic `up`.
  auto body = HttpGet(web_port, "/api/v1/query?query=tessera_build_info");
  ASSERT_TRUE(body.ok()) << body.status();
  auto json = nlohmann::json::parse(*body, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["data"]["result"].size(), binaries.size()) << *body;

  prometheus.Signal(SIGTERM);
  prometheus.Wait(absl::Seconds(20));
  for (auto& [job, p] : services) {
    p->Signal(SIGTERM);
    auto exit = p->Wait(absl::Seconds(20));
    ASSERT_TRUE(exit.has_value()) << job;
    EXPECT_EQ(exit->code, 0) << job << ": " << p->ReadLog();
  }
}

}  // namespace
}  // namespace tessera::testing
