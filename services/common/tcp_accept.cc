#include "services/common/tcp_accept.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/strand.hpp"

namespace tessera::services {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

absl::Status Listen(const std::string& address, absl::string_view what, tcp::acceptor* acceptor) {
  auto fail = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", what, " on ", address, ": ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return fail("expected host:port");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  boost::system::error_code ec;
  tcp::resolver resolver(acceptor->get_executor());
  auto endpoints = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) return fail(absl::StrCat("cannot resolve it: ", ec.message()));
  const tcp::endpoint endpoint = *endpoints.begin();
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail(ec.message());
  return absl::OkStatus();
}

int BoundPort(const tcp::acceptor& acceptor) {
  boost::system::error_code ec;
  const tcp::endpoint endpoint = acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

void AcceptForever(tcp::acceptor* acceptor, asio::steady_timer* retry,
                   std::function<void(tcp::socket)> on_socket) {
  acceptor->async_accept(asio::make_strand(acceptor->get_executor()),
                         [acceptor, retry, on_socket = std::move(on_socket)](
                             boost::system::error_code ec, tcp::socket socket) mutable {
                           if (ec == asio::error::operation_aborted) return;
                           if (ec) {
                             retry->expires_after(std::chrono::milliseconds(50));
                             retry->async_wait([acceptor, retry, on_socket = std::move(on_socket)](
                                                   boost::system::error_code) {
                               AcceptForever(acceptor, retry, on_socket);
                             });
                             return;
                           }
                           on_socket(std::move(socket));
                           AcceptForever(acceptor, retry, std::move(on_socket));
                         });
}

}  // namespace tessera::services
