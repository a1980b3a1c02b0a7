// Listening and accepting on Asio, shared by the two Beast servers (the
// metrics exposer and the router's HTTP API): resolve "host:port", open the
// acceptor, and accept forever, each connection on a strand of its own.
//
// Thread-safety: Listen before the io_context runs; AcceptForever's
// handlers run on the acceptor's io_context threads.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"

namespace tessera::services {

// Binds and listens `acceptor` on `address` ("host:port", "[v6]:port",
// ":port" for every interface; port 0 picks a free one). Errors are
// UNAVAILABLE: "cannot serve <what> on <address>: <why>".
absl::Status Listen(const std::string& address, absl::string_view what,
                    boost::asio::ip::tcp::acceptor* acceptor);

// The port `acceptor` is bound to; 0 when it is not.
int BoundPort(const boost::asio::ip::tcp::acceptor& acceptor);

// Accepts until the acceptor is closed or its io_context stops, handing
// each socket to `on_socket`. After an accept error (out of descriptors,
// say) it waits 50 ms on `retry` instead of spinning. Both pointers must
// outlive the io_context's run.
void AcceptForever(boost::asio::ip::tcp::acceptor* acceptor, boost::asio::steady_timer* retry,
                   std::function<void(boost::asio::ip::tcp::socket)> on_socket);

}  // namespace tessera::services
