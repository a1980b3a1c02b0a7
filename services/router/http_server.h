// HttpServer: the router's HTTP/1.1 front door (the OpenAI-compatible API),
// event-driven on Boost.Beast over Asio: a few threads run every connection,
// none is held per connection or per stream, so thousands of concurrent SSE
// streams cost only their sockets and buffers.
//
// The server parses requests (header and body limits, a deadline to receive
// them) and hands each one, as an HttpExchange, to the handler. The handler
// answers it once (Respond), or opens a stream (StartStream, Write...,
// EndStream) whose body is sent with chunked transfer encoding. Connections
// are kept alive between requests unless the client asks otherwise.
//
// Client disconnects: while an exchange is open a read stays pending on the
// socket, so a client that closes its end (or resets it) is seen at once,
// not only at the next write; the exchange's close callback then runs once.
//
// Thread-safety: HttpServer: Start and the destructor from one thread.
// HttpExchange: every method may be called from any thread; each hops to the
// connection's strand. Callbacks (write done, close) run on the server's
// threads and must not block.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::services {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // the target without its query
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  // The value of a header (lower-case name), "" when absent.
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A complete response (Content-Length). Once per exchange, instead of a
  // stream.
  virtual void Respond(int status, const std::string& content_type, std::string body,
                       HttpHeaders headers = {}) = 0;
  // Starts a streamed response: the status line and headers go out now.
  virtual void StartStream(int status, const std::string& content_type,
                           HttpHeaders headers = {}) = 0;
  // Appends `data` to the stream; `done(ok)` runs once it was handed to the
  // socket (ok) or could not be (the client is gone). REQUIRES: StartStream.
  virtual void Write(std::string data, std::function<void(bool ok)> done) = 0;
  // Ends the stream (the last chunk). REQUIRES: StartStream.
  virtual void EndStream() = 0;
  // `on_close` runs once when the client disconnects before the exchange
  // ended (at once if it already did). Set it at most once.
  virtual void OnClientClose(std::function<void()> on_close) = 0;
};

struct HttpServerOptions {
  std::string listen;               // "host:port"; port 0 picks one
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  size_t max_header_bytes = 16 << 10;
  int threads = 2;                                      // threads running the event loop
  int max_connections = 16384;                          // beyond it, new connections are closed
  absl::Duration request_deadline = absl::Seconds(60);  // to receive one request
  absl::Duration idle_timeout = absl::Seconds(60);      // keep-alive between requests
  // The body of the server's own error responses (413, 400 for a malformed
  // request line): e.g. the OpenAI error JSON.
  std::function<std::string(int status, const std::string& message)> error_body;
};

class HttpServer {
 public:
  // Runs on a server thread for each request received; the exchange stays
  // valid as long as the handler holds it.
  using Handler = std::function<void(HttpRequest, std::shared_ptr<HttpExchange>)>;

  // UNAVAILABLE names the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           Handler handler);
  // Stops accepting and closes every connection; waits for the threads.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  int open_connections() const;

  struct Impl;  // the implementation's state (http_server.cc)

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "HTTP/1.1 <status> <reason>" reason phrases for the codes we send.
const char* HttpReason(int status);

}  // namespace tessera::services
