#include "services/common/http_exposer.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace tessera::services {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kHeaderLimit = 8 << 10;

std::chrono::steady_clock::duration Deadline() {
  return absl::ToChronoNanoseconds(HttpExposer::kRequestDeadline);
}

// One connection: read one request within the deadline, answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const HttpExposer::Render* render, std::atomic<int>* open)
      : stream_(std::move(socket)), render_(render), open_(open) {}
  ~Session() { open_->fetch_sub(1); }

  void Run() {
    parser_.header_limit(kHeaderLimit);
    stream_.expires_after(Deadline());
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }

 private:
  void Answer() {
    const http::request<http::empty_body>& req = parser_.get();
    res_.version(req.version());
    res_.keep_alive(false);
    beast::string_view target = req.target();
    target = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get) {
      res_.result(http::status::method_not_allowed);
      res_.set(http::field::allow, "GET");
      res_.body() = "only GET is served here\n";
    } else if (target != "/metrics") {
      res_.result(http::status::not_found);
      res_.body() = "not found: metrics are served at /metrics\n";
    } else {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res_.body() = (*render_)();
    }
    res_.prepare_payload();
    stream_.expires_after(Deadline());
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> res_;
  const HttpExposer::Render* render_;
  std::atomic<int>* open_;
};

}  // namespace

struct HttpExposer::Impl {
  // Declared before io: sessions still queued in io when it is destroyed
  // use them.
  Render render;
  std::atomic<int> open{0};
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::thread thread;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors, say: try again shortly instead of spinning.
        retry.expires_after(std::chrono::milliseconds(50));
        retry.async_wait([this](beast::error_code) { Accept(); });
        return;
      }
      if (open.load() < kMaxConnections) {
        open.fetch_add(1);
        std::make_shared<Session>(std::move(socket), &render, &open)->Run();
      }  // else: the socket closes as it goes out of scope
      Accept();
    });
  }
};

HttpExposer::HttpExposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpExposer::~HttpExposer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpExposer::port() const {
  beast::error_code ec;
  tcp::endpoint ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Start(const std::string& address,
                                                                Render render) {
  auto fail = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return fail("expected host:port");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  beast::error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) return fail(absl::StrCat("cannot resolve it: ", ec.message()));
  const tcp::endpoint endpoint = *endpoints.begin();
  tcp::acceptor& acceptor = impl->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail(ec.message());
  impl->Accept();
  impl->thread = std::thread([io = &impl->io] { io->run(); });
  return std::unique_ptr<HttpExposer>(new HttpExposer(std::move(impl)));
}

}  // namespace tessera::services
