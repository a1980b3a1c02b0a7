// Retry and migration of one request across workers: which upstream errors
// may be retried elsewhere, which count against a worker's circuit breaker,
// and the bookkeeping that lets a request resume on another worker after
// tokens were already delivered.
//
// Before the first token a failed attempt is simply retried on another
// worker (the ones already tried are excluded). After tokens were delivered
// the request migrates: the next worker gets prompt_ids plus the tokens
// generated so far as generated_ids, and the original max_tokens (the
// generated tokens count towards it), so the client sees one continuous
// stream. Sampling continues identically because the worker's RNG is
// position-based: the request only has to carry the same seed, so the
// router fixes a seed before the first attempt when the client gave none.
//
// Classification (by absl::StatusCode, plus what only the adapter knows):
//
//   error                                   retry elsewhere   breaker failure
//   connect failure (no response headers)   yes               yes
//   worker draining (refused or ended)      yes               no
//   UNAVAILABLE                             yes               yes
//   RESOURCE_EXHAUSTED (worker queue full)  yes               no
//   ABORTED                                 yes               no
//   INTERNAL, UNKNOWN, DATA_LOSS            no                yes
//   INVALID_ARGUMENT, FAILED_PRECONDITION,
//   OUT_OF_RANGE, NOT_FOUND, CANCELLED,
//   DEADLINE_EXCEEDED, UNIMPLEMENTED, ...   no                no
//
// DEADLINE_EXCEEDED is not retried: the worker call carries the client's
// deadline, so when it passes there is no time left for another attempt (the
// adapter reports a separate per-attempt connect timeout as a connect
// failure).
//
// Thread-safety: the functions are pure; a RequestAttempts belongs to one
// request's handler and is not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "router/prefix_hash.h"

namespace tessera::router {

enum class UpstreamErrorKind {
  kStatus,          // classify by the status code alone
  kConnectFailure,  // the call never reached the worker
  kWorkerDraining,  // the worker refused or cut the call because it drains
};

struct UpstreamError {
  absl::Status status;
  UpstreamErrorKind kind = UpstreamErrorKind::kStatus;
};

bool IsRetryable(const UpstreamError& error);
bool CountsAsWorkerFailure(const UpstreamError& error);

struct RetryOptions {
  // Attempts per request, the first included (retries and migrations both
  // count). REQUIRES: >= 1.
  int max_attempts = 3;
  // Resume on another worker after tokens were delivered; false fails the
  // request instead.
  bool migrate = true;
};

enum class NextStep {
  kRetry,     // no token yet: send the same request to another worker
  kMigrate,   // tokens delivered: resume on another worker (see Resume*)
  kComplete,  // every token max_tokens allows was delivered: finish (LENGTH)
  kFail,      // give up with `status`
};

struct RetryVerdict {
  NextStep step = NextStep::kFail;
  // kFail: the error for the client.
  absl::Status status;
};

// The attempts of one request.
class RequestAttempts {
 public:
  // `seed`: the client's sampling seed, or nullopt to have one chosen now.
  // REQUIRES: max_tokens >= 1.
  RequestAttempts(RetryOptions options, absl::Span<const TokenId> prompt_ids, int32_t max_tokens,
                  std::optional<uint64_t> seed);

  // An attempt is about to be sent to `worker_id`.
  void OnAttemptStarted(const std::string& worker_id);
  // Tokens of the current attempt, as delivered to the client.
  void OnTokens(absl::Span<const TokenId> tokens);
  // The current attempt ended with `error`; what to do next.
  RetryVerdict OnAttemptFailed(const UpstreamError& error);

  // Workers tried so far: RouteRequest::exclude for the next attempt.
  absl::Span<const std::string> tried_workers() const { return tried_; }
  int attempts() const { return static_cast<int>(tried_.size()); }

  // What the next attempt sends: WorkerGenerateRequest.prompt_ids,
  // generated_ids, sampling.max_tokens (the original), sampling.seed.
  absl::Span<const TokenId> prompt_ids() const {
    return absl::MakeConstSpan(tokens_).first(prompt_size_);
  }
  absl::Span<const TokenId> generated_ids() const {
    return absl::MakeConstSpan(tokens_).subspan(prompt_size_);
  }
  int32_t max_tokens() const { return max_tokens_; }
  uint64_t seed() const { return seed_; }
  // Tokens the next worker prefills (prompt + generated): route by these.
  absl::Span<const TokenId> routing_tokens() const { return tokens_; }
  // Tokens still allowed.
  int32_t remaining_tokens() const;

 private:
  const RetryOptions options_;
  std::vector<TokenId> tokens_;  // prompt, then generated
  const size_t prompt_size_;
  const int32_t max_tokens_;
  const uint64_t seed_;
  std::vector<std::string> tried_;
};

}  // namespace tessera::router
