#include "services/common/http_exposer.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "services/common/tcp_accept.h"

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
    AcceptForever(&acceptor, &retry, [this](tcp::socket socket) {
      if (open.load() >= kMaxConnections) return;  // the socket closes here
      open.fetch_add(1);
      std::make_shared<Session>(std::move(socket), &render, &open)->Run();
    });
  }
};

HttpExposer::HttpExposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpExposer::~HttpExposer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpExposer::port() const { return BoundPort(impl_->acceptor); }

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Start(const std::string& address,
                                                                Render render) {
  auto impl = std::make_unique<Impl>();
  RETURN_IF_ERROR(Listen(address, "metrics", &impl->acceptor));
  impl->render = std::move(render);
  impl->Accept();
  impl->thread = std::thread([io = &impl->io] { io->run(); });
  return std::unique_ptr<HttpExposer>(new HttpExposer(std::move(impl)));
}

}  // namespace tessera::services
