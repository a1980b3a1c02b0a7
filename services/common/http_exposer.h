// HttpExposer: the HTTP/1.1 endpoint that serves `/metrics`, on one
// event-driven thread (Boost.Beast on Asio), so that no peer can hold it.
//
// Why not prometheus-cpp's civetweb exposer: civetweb serves one connection
// per thread and its request timeout applies to each read, so one idle
// socket (or one sending a byte every 2 s) held a thread for 30 s or more,
// and with the one thread it had, every scrape waited. Here a connection
// costs no thread: each gets kRequestDeadline in total to send its request
// headers and to take the response, then it is closed; at most
// kMaxConnections are open at once (a connection beyond that is closed at
// once). A scrape is answered in the time it takes to render the page.
//
// Each request is answered and the connection closed (Connection: close);
// GET and HEAD of `/metrics` give the page, other paths 404, other methods
// 405, a malformed or oversized request is dropped.
//
// Thread-safety: Start and the destructor from one thread; `render` runs on
// the exposer's thread and must be thread-safe with respect to the caller.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::services {

class HttpExposer {
 public:
  // Renders the body of GET /metrics (Prometheus text format).
  using Render = std::function<std::string()>;

  static constexpr absl::Duration kRequestDeadline = absl::Seconds(2);
  static constexpr int kMaxConnections = 512;

  // Listens on `address` ("host:port", "[v6]:port"; port 0 picks a free
  // one). UNAVAILABLE names the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Start(const std::string& address,
                                                            Render render);
  ~HttpExposer();  // stops serving; open connections are closed
  HttpExposer(const HttpExposer&) = delete;
  HttpExposer& operator=(const HttpExposer&) = delete;

  int port() const;

 private:
  struct Impl;
  explicit HttpExposer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::services
