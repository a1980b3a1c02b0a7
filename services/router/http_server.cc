#include "services/router/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "services/common/tcp_accept.h"

namespace tessera::services {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

constexpr size_t kWatchBytes = 1024;      // read while a response is open
constexpr size_t kDrainBytes = 64 << 10;  // discarded after an early error
constexpr absl::Duration kDrainTime = absl::Seconds(2);

}  // namespace

const char* HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

struct HttpServer::Impl {
  HttpServerOptions options;
  Handler handler;
  std::atomic<int> open{0};
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::vector<std::thread> threads;

  explicit Impl(int threads) : io(threads) {}
  void Accept();
};

namespace {

class Connection;
using tcp_executor = beast::tcp_stream::executor_type;

// The handler's view of one request; forwards to the connection's strand,
// tagged with its request number so that a stale exchange does nothing.
class ExchangeImpl final : public HttpExchange {
 public:
  ExchangeImpl(std::shared_ptr<Connection> conn, uint64_t number)
      : conn_(std::move(conn)), number_(number) {}
  void Respond(int status, const std::string& content_type, std::string body,
               HttpHeaders headers) override;
  void StartStream(int status, const std::string& content_type, HttpHeaders headers) override;
  void Write(std::string data, std::function<void(bool ok)> done) override;
  void EndStream() override;
  void OnClientClose(std::function<void()> on_close) override;

 private:
  std::shared_ptr<Connection> conn_;
  const uint64_t number_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {}
  ~Connection() { server_->open.fetch_sub(1); }

  void Run() { ReadRequest(); }

  // --- called on the strand, through ExchangeImpl ---
  void DoRespond(uint64_t n, int status, const std::string& type, std::string body,
                 HttpHeaders headers) {
    if (n != number_ || responded_) return;
    responded_ = true;
    std::string head = Head(status, type, headers);
    absl::StrAppend(&head, "Content-Length: ", body.size(), "\r\n\r\n");
    Queue(std::move(head), nullptr);
    Queue(std::move(body), nullptr);
    ending_ = true;
    Flush();
  }
  void DoStartStream(uint64_t n, int status, const std::string& type, HttpHeaders headers) {
    if (n != number_ || responded_) return;
    responded_ = true;
    streaming_ = true;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends at close
    std::string head = Head(status, type, headers);
    if (chunked_) head += "Transfer-Encoding: chunked\r\n";
    head += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n\r\n";
    Queue(std::move(head), nullptr);
    Flush();
  }
  void DoWrite(uint64_t n, std::string data, std::function<void(bool)> done) {
    if (n != number_ || !streaming_ || ending_ || closed_) {
      if (done) done(false);
      return;
    }
    if (data.empty()) {  // an empty chunk would end the body
      if (done) done(true);
      return;
    }
    if (chunked_) {
      std::string framed = absl::StrCat(absl::Hex(data.size()), "\r\n");
      framed += data;
      framed += "\r\n";
      data = std::move(framed);
    }
    Queue(std::move(data), std::move(done));
    Flush();
  }
  void DoEndStream(uint64_t n) {
    if (n != number_ || !streaming_ || ending_) return;
    if (chunked_) Queue("0\r\n\r\n", nullptr);
    ending_ = true;
    Flush();
  }
  void DoOnClose(uint64_t n, std::function<void()> f) {
    if (n != number_) return;
    if (closed_) {
      f();
      return;
    }
    on_close_ = std::move(f);
  }
  tcp_executor executor() { return stream_.get_executor(); }

 private:
  struct Out {
    std::string bytes;
    std::function<void(bool)> done;
  };

  std::string Head(int status, const std::string& type, const HttpHeaders& headers) const {
    std::string head = absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status), "\r\n");
    if (!type.empty()) absl::StrAppend(&head, "Content-Type: ", type, "\r\n");
    for (const auto& [k, v] : headers) absl::StrAppend(&head, k, ": ", v, "\r\n");
    absl::StrAppend(&head, "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n");
    return head;
  }

  void ReadRequest() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_->options.max_header_bytes));
    stream_.expires_after(Chrono(server_->options.request_deadline));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    const auto& req = parser_->get();
    if (auto len = parser_->content_length(); len && *len > server_->options.max_body_bytes) {
      return EarlyError(413, absl::StrCat("the request body (", *len, " bytes) is over the ",
                                          server_->options.max_body_bytes, "-byte limit"));
    }
    auto expect = req.find(http::field::expect);
    if (expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->OnReadError(ec);
                       self->Dispatch();
                     });
  }

  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return EarlyError(413, absl::StrCat("the request body is over the ",
                                          server_->options.max_body_bytes, "-byte limit"));
    }
    if (ec == http::error::header_limit) {
      return EarlyError(431, "the request headers are too large");
    }
    if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return EarlyError(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    }
    Close();  // the peer went away or timed out
  }

  // An error answered before the request was read in full: respond, stop
  // sending, discard what the client still sends (so that it reads the
  // response instead of a reset), then close.
  void EarlyError(int status, const std::string& message) {
    keep_alive_ = false;
    ++number_;
    responded_ = false;
    streaming_ = false;
    ending_ = false;
    std::string body =
        server_->options.error_body ? server_->options.error_body(status, message) : message + "\n";
    DoRespond(number_, status, "application/json", std::move(body), {});
    draining_ = true;
  }

  void Dispatch() {
    stream_.expires_never();
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    chunked_ = req.version() >= 11;
    HttpRequest out;
    out.method = std::string(req.method_string());
    std::string target(req.target());
    out.path = target.substr(0, target.find('?'));
    for (const auto& field : req) {
      out.headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
          std::string(field.value());
    }
    out.body = std::move(req.body());
    ++number_;
    responded_ = false;
    streaming_ = false;
    ending_ = false;
    exchange_open_ = true;
    on_close_ = nullptr;
    Watch();
    server_->handler(std::move(out), std::make_shared<ExchangeImpl>(shared_from_this(), number_));
  }

  // A read kept pending while the response is open: it ends with an error
  // when the client disconnects; bytes it gets (a pipelined request) stay in
  // the buffer for the next read.
  void Watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(
        buffer_.prepare(kWatchBytes),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }
  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec) {
      if (exchange_open_) ClientGone();
      return Close();
    }
    buffer_.commit(n);
    if (!exchange_open_ && awaiting_next_) {
      awaiting_next_ = false;
      ReadRequest();
    }
    // While the exchange is open, more bytes wait in the buffer: no re-arm
    // (bounded), the next request is read when this one is answered.
  }

  void ClientGone() {
    if (closed_) return;
    closed_ = true;
    if (on_close_) {
      auto f = std::move(on_close_);
      on_close_ = nullptr;
      f();
    }
  }

  void Queue(std::string bytes, std::function<void(bool)> done) {
    out_.push_back({std::move(bytes), std::move(done)});
  }

  void Flush() {
    if (writing_) return;
    if (out_.empty()) {
      if (ending_) EndExchange();
      return;
    }
    if (closed_) {
      FailPending();
      return;
    }
    writing_ = true;
    inflight_.clear();
    while (!out_.empty() && inflight_.size() < 64) {
      inflight_.push_back(std::move(out_.front()));
      out_.pop_front();
    }
    buffers_.clear();
    for (const Out& o : inflight_) buffers_.push_back(asio::buffer(o.bytes));
    asio::async_write(stream_, buffers_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWritten(ec);
    });
  }
  void OnWritten(beast::error_code ec) {
    writing_ = false;
    std::vector<Out> done;
    done.swap(inflight_);
    if (ec) {
      for (Out& o : done) {
        if (o.done) o.done(false);
      }
      ClientGone();
      FailPending();
      return Close();
    }
    for (Out& o : done) {
      if (o.done) o.done(true);
    }
    Flush();
  }
  void FailPending() {
    std::deque<Out> pending;
    pending.swap(out_);
    for (Out& o : pending) {
      if (o.done) o.done(false);
    }
  }

  // The response is out.
  void EndExchange() {
    exchange_open_ = false;
    on_close_ = nullptr;
    if (draining_) return Drain();
    if (!keep_alive_ || closed_) return Close();
    stream_.expires_after(Chrono(server_->options.idle_timeout));
    if (watching_) {
      awaiting_next_ = true;  // OnWatch reads the next request
    } else {
      ReadRequest();  // bytes of it are already in the buffer
    }
  }

  void Drain() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(Chrono(kDrainTime));
    DrainSome(0);
  }
  void DrainSome(size_t total) {
    if (total > server_->options.max_body_bytes + kDrainBytes) return Close();
    stream_.async_read_some(asio::buffer(scratch_),
                            [self = shared_from_this(), total](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->DrainSome(total + n);
                            });
  }

  void Close() {
    if (socket_closed_) return;
    socket_closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> scratch_{};

  uint64_t number_ = 0;  // the current exchange
  bool keep_alive_ = true;
  bool chunked_ = true;
  bool exchange_open_ = false;
  bool responded_ = false;
  bool streaming_ = false;
  bool ending_ = false;  // the response's last bytes are queued
  bool draining_ = false;
  bool watching_ = false;
  bool awaiting_next_ = false;
  bool closed_ = false;  // the client is gone
  bool socket_closed_ = false;
  std::function<void()> on_close_;

  std::deque<Out> out_;
  std::vector<Out> inflight_;
  std::vector<asio::const_buffer> buffers_;
  bool writing_ = false;
};

void ExchangeImpl::Respond(int status, const std::string& content_type, std::string body,
                           HttpHeaders headers) {
  asio::dispatch(conn_->executor(),
                 [c = conn_, n = number_, status, content_type, body = std::move(body),
                  headers = std::move(headers)]() mutable {
                   c->DoRespond(n, status, content_type, std::move(body), std::move(headers));
                 });
}

void ExchangeImpl::StartStream(int status, const std::string& content_type, HttpHeaders headers) {
  asio::dispatch(conn_->executor(), [c = conn_, n = number_, status, content_type,
                                     headers = std::move(headers)]() mutable {
    c->DoStartStream(n, status, content_type, std::move(headers));
  });
}

void ExchangeImpl::Write(std::string data, std::function<void(bool ok)> done) {
  asio::dispatch(conn_->executor(), [c = conn_, n = number_, data = std::move(data),
                                     done = std::move(done)]() mutable {
    c->DoWrite(n, std::move(data), std::move(done));
  });
}

void ExchangeImpl::EndStream() {
  asio::dispatch(conn_->executor(), [c = conn_, n = number_] { c->DoEndStream(n); });
}

void ExchangeImpl::OnClientClose(std::function<void()> on_close) {
  asio::dispatch(conn_->executor(), [c = conn_, n = number_, f = std::move(on_close)]() mutable {
    c->DoOnClose(n, std::move(f));
  });
}

}  // namespace

void HttpServer::Impl::Accept() {
  AcceptForever(&acceptor, &retry, [this](tcp::socket socket) {
    if (open.load() >= options.max_connections) return;  // the socket closes here
    open.fetch_add(1);
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Connection>(std::move(socket), this)->Run();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  impl_->io.stop();
  for (std::thread& t : impl_->threads) t.join();
}

int HttpServer::port() const { return BoundPort(impl_->acceptor); }

int HttpServer::open_connections() const { return impl_->open.load(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              Handler handler) {
  const int threads = std::max(1, options.threads);
  auto impl = std::make_unique<Impl>(threads);
  RETURN_IF_ERROR(Listen(options.listen, "HTTP", &impl->acceptor));
  impl->options = std::move(options);
  impl->handler = std::move(handler);
  impl->Accept();
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([io = &impl->io] { io->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace tessera::services
