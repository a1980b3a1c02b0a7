// Asynchronous clients for http_chat_bench: many concurrent streaming chats
// over the router's HTTP API (Boost.Beast on Asio, a few event-loop threads)
// or its gRPC Chat RPC (gRPC's callback API), without a thread per stream.
//
// Why asynchronous: with a blocking thread per stream, 1,000 client threads
// on a 2-core machine were scheduled in turn with the router and workers, and
// their wake-up delays, not the router, shaped the measured latencies.
//
// Each stream records when it started (the request write for HTTP, the call
// for gRPC, both on an already open connection) and the arrival time of every
// content chunk. Thread-safety: each Run* call blocks until all its streams
// end; concurrent calls are independent.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tessera/v1/inference.grpc.pb.h"

namespace tessera::bench {

struct StreamTimes {
  bool ok = false;
  std::string error;  // why it failed, for the report's first error
  absl::Time start;
  std::vector<absl::Time> chunks;  // arrival of each content chunk
};

// `n` POST /v1/chat/completions requests with `body` (stream: true), each on
// a connection of its own opened before any request starts, then all sent at
// once; served by `threads` event-loop threads. Results in stream order.
std::vector<StreamTimes> RunHttpStreams(int port, const std::string& body, int n, int threads);

// `n` Chat calls of `request` on `stub`'s channel, started at once.
std::vector<StreamTimes> RunGrpcStreams(tessera::v1::Inference::Stub* stub,
                                        const tessera::v1::ChatRequest& request, int n);

}  // namespace tessera::bench
