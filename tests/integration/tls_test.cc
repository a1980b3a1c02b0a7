// TLS and mutual TLS on a real service binary, with certificates made by
// openssl for the test: a client with the CA and a client certificate gets
// SERVING; a client without a certificate, or speaking plaintext, is refused.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/test_process.h"

namespace tessera::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Makes ca.pem, server.{pem,key} (for 127.0.0.1 / localhost) and
// client.{pem,key} signed by the CA.
void MakeCertificates(const std::string& dir) {
  std::string script = absl::StrCat(
      "set -e; cd ", dir, "; exec >openssl.log 2>&1; ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=tessera-test-ca "
      "-keyout ca.key -out ca.pem; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out "
      "server.csr; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile san.ext -out server.pem; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=tessera-client -keyout client.key "
      "-out client.csr; ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.pem");
  ASSERT_EQ(std::system(absl::StrCat("bash -c '", script, "'").c_str()), 0)
      << ReadAll(dir + "/openssl.log");
}

grpc::Status CheckHealth(std::shared_ptr<grpc::ChannelCredentials> creds, int port) {
  grpc::ChannelArguments args;
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), std::move(creds), args);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (s.ok() && resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "not SERVING");
  }
  return s;
}

TEST(TlsTest, MutualTlsAdmitsOnlyClientsWithCertificates) {
  std::string dir = MakeTempDir();
  // The certificates' file names contain no quote, so the script's quoting holds.
  MakeCertificates(dir);
  TestProcess worker;
  ASSERT_TRUE(worker
                  .Start(BinaryPath("services/worker/tessera-worker"),
                         {"--model=" + std::string(std::getenv("TESSERA_SOURCE_DIR")) +
                              "/tests/fixtures/models/qwen3_tiny",
                          "--listen=127.0.0.1:0", "--metrics_listen=",
                          "--port_file=" + dir + "/ports", "--tls_cert=" + dir + "/server.pem",
                          "--tls_key=" + dir + "/server.key", "--tls_client_ca=" + dir + "/ca.pem"},
                         dir + "/worker.log")
                  .ok());
  auto ports = worker.WaitForPortFile(dir + "/ports", absl::Seconds(20));
  ASSERT_TRUE(ports.ok()) << ports.status();
  int port = (*ports)["grpc_port"];

  grpc::SslCredentialsOptions with_cert;
  with_cert.pem_root_certs = ReadAll(dir + "/ca.pem");
  with_cert.pem_cert_chain = ReadAll(dir + "/client.pem");
  with_cert.pem_private_key = ReadAll(dir + "/client.key");
  grpc::Status ok = CheckHealth(grpc::SslCredentials(with_cert), port);
  EXPECT_TRUE(ok.ok()) << ok.error_message() << "\n" << worker.ReadLog();

  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ReadAll(dir + "/ca.pem");
  EXPECT_FALSE(CheckHealth(grpc::SslCredentials(no_cert), port).ok());
  EXPECT_FALSE(CheckHealth(grpc::InsecureChannelCredentials(), port).ok());

  worker.Signal(SIGTERM);
  auto exit = worker.Wait(absl::Seconds(20));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 0);
}

}  // namespace
}  // namespace tessera::testing
