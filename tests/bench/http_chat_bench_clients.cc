#include "tests/bench/http_chat_bench_clients.h"

#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "grpcpp/grpcpp.h"

namespace tessera::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// SSE text is scanned where it arrives; what is scanned is dropped past this.
constexpr size_t kKeepScanned = 64 << 10;

// One streaming chat over HTTP/1.1: Connect, then (once every stream is
// connected) Send; the SSE events are read as the chunked body arrives.
// Each content event (finish_reason null) is one chunk; [DONE] ends it.
class HttpChatStream : public std::enable_shared_from_this<HttpChatStream> {
 public:
  HttpChatStream(asio::io_context& io, const http::request<http::string_body>* request,
                 StreamTimes* out, absl::BlockingCounter* connected, absl::BlockingCounter* done)
      : socket_(io), request_(request), out_(out), connected_(connected), done_(done) {
    parser_.body_limit(boost::none);
    on_body_ = [this](uint64_t, beast::string_view body, beast::error_code&) {
      pending_.append(body.data(), body.size());
      return body.size();
    };
    parser_.on_chunk_body(on_body_);
  }

  void Connect(const tcp::endpoint& endpoint) {
    socket_.async_connect(endpoint, [self = shared_from_this()](beast::error_code ec) {
      if (ec) self->Fail(absl::StrCat("connect: ", ec.message()));
      self->connected_->DecrementCount();
    });
  }

  void Send() {
    if (finished_) return;  // the connect failed
    out_->start = absl::Now();
    http::async_write(socket_, *request_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Fail(absl::StrCat("write: ", ec.message()));
                        self->Read();
                      });
  }

 private:
  void Read() {
    http::async_read_some(
        socket_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    Scan(absl::Now());
    if (!error_.empty()) return Fail(error_);
    if (ec) return Fail(absl::StrCat("read: ", ec.message()));
    if (parser_.is_header_done() && parser_.get().result_int() != 200) {
      return Fail(absl::StrCat("HTTP ", parser_.get().result_int()));
    }
    if (!parser_.is_done()) return Read();
    if (!saw_done_) return Fail("the stream ended without [DONE]");
    out_->ok = !out_->chunks.empty();
    if (!out_->ok) out_->error = "no content chunk";
    Finish();
  }

  // Takes the complete events out of what arrived; `now` is their arrival.
  void Scan(absl::Time now) {
    size_t end;
    while ((end = pending_.find("\n\n", scanned_)) != std::string::npos) {
      absl::string_view event(pending_.data() + scanned_, end - scanned_);
      scanned_ = end + 2;
      if (!absl::ConsumePrefix(&event, "data: ")) continue;
      if (event == "[DONE]") {
        saw_done_ = true;
      } else if (absl::StrContains(event, "\"error\"")) {
        error_ = std::string(event.substr(0, 200));
      } else if (absl::StrContains(event, "\"finish_reason\":null")) {
        out_->chunks.push_back(now);
      }
    }
    if (scanned_ > kKeepScanned) {
      pending_.erase(0, scanned_);
      scanned_ = 0;
    }
  }

  void Fail(const std::string& why) {
    if (out_->error.empty()) out_->error = why;
    Finish();
  }

  void Finish() {
    if (finished_) return;
    finished_ = true;
    beast::error_code ignored;
    socket_.close(ignored);
    done_->DecrementCount();
  }

  tcp::socket socket_;
  const http::request<http::string_body>* request_;
  StreamTimes* out_;
  absl::BlockingCounter* connected_;
  absl::BlockingCounter* done_;
  beast::flat_buffer buffer_;
  http::response_parser<http::empty_body> parser_;
  std::function<uint64_t(uint64_t, beast::string_view, beast::error_code&)> on_body_;
  std::string pending_;
  size_t scanned_ = 0;
  bool saw_done_ = false;
  bool finished_ = false;
  std::string error_;
};

// One Chat call on gRPC's callback API; its callbacks run on gRPC's threads.
class GrpcChatStream : public grpc::ClientReadReactor<tessera::v1::GenerateResponse> {
 public:
  GrpcChatStream(StreamTimes* out, absl::BlockingCounter* done) : out_(out), done_(done) {}

  void Start(tessera::v1::Inference::Stub* stub, const tessera::v1::ChatRequest& request) {
    out_->start = absl::Now();
    stub->async()->Chat(&context_, &request, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (response_.has_chunk() &&
        (!response_.chunk().text().empty() || !response_.chunk().reasoning().empty())) {
      out_->chunks.push_back(absl::Now());
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    out_->ok = status.ok() && !out_->chunks.empty();
    if (!status.ok()) out_->error = absl::StrCat("gRPC ", status.error_message());
    if (status.ok() && out_->chunks.empty()) out_->error = "no content chunk";
    done_->DecrementCount();
  }

 private:
  StreamTimes* out_;
  absl::BlockingCounter* done_;
  grpc::ClientContext context_;
  tessera::v1::GenerateResponse response_;
};

}  // namespace

std::vector<StreamTimes> RunHttpStreams(int port, const std::string& body, int n, int threads) {
  std::vector<StreamTimes> out(n);
  http::request<http::string_body> request{http::verb::post, "/v1/chat/completions", 11};
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::vector<std::thread> loop;
  for (int i = 0; i < threads; ++i) loop.emplace_back([&io] { io.run(); });
  absl::BlockingCounter connected(n), done(n);
  std::vector<std::shared_ptr<HttpChatStream>> streams;
  const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port));
  for (int i = 0; i < n; ++i) {
    streams.push_back(std::make_shared<HttpChatStream>(io, &request, &out[i], &connected, &done));
    asio::post(io, [s = streams.back(), endpoint] { s->Connect(endpoint); });
  }
  connected.Wait();
  for (auto& s : streams) asio::post(io, [s] { s->Send(); });
  done.Wait();
  work.reset();
  io.stop();
  for (std::thread& t : loop) t.join();
  return out;
}

std::vector<StreamTimes> RunGrpcStreams(tessera::v1::Inference::Stub* stub,
                                        const tessera::v1::ChatRequest& request, int n) {
  std::vector<StreamTimes> out(n);
  absl::BlockingCounter done(n);
  std::vector<std::unique_ptr<GrpcChatStream>> streams;
  for (int i = 0; i < n; ++i) streams.push_back(std::make_unique<GrpcChatStream>(&out[i], &done));
  for (auto& s : streams) s->Start(stub, request);
  done.Wait();
  return out;
}

}  // namespace tessera::bench
