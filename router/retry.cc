#include "router/retry.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/policy.h"

namespace tessera::router {
namespace {

// A seed no other request of this process shares.
uint64_t FreshSeed() {
  static std::atomic<uint64_t> counter{0};
  SplitMix64 mix(static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
                 (counter.fetch_add(1, std::memory_order_relaxed) * 0x9E3779B97F4A7C15ULL));
  return mix.Next();
}

}  // namespace

bool IsRetryable(const UpstreamError& error) {
  switch (error.kind) {
    case UpstreamErrorKind::kConnectFailure:
    case UpstreamErrorKind::kWorkerDraining:
      return true;
    case UpstreamErrorKind::kStatus:
      break;
  }
  switch (error.status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

bool CountsAsWorkerFailure(const UpstreamError& error) {
  switch (error.kind) {
    case UpstreamErrorKind::kConnectFailure:
      return true;
    case UpstreamErrorKind::kWorkerDraining:
      return false;
    case UpstreamErrorKind::kStatus:
      break;
  }
  switch (error.status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

RequestAttempts::RequestAttempts(RetryOptions options, absl::Span<const TokenId> prompt_ids,
                                 int32_t max_tokens, std::optional<uint64_t> seed)
    : options_(options),
      tokens_(prompt_ids.begin(), prompt_ids.end()),
      prompt_size_(prompt_ids.size()),
      max_tokens_(max_tokens),
      seed_(seed.has_value() ? *seed : FreshSeed()) {}

void RequestAttempts::OnAttemptStarted(const std::string& worker_id) {
  tried_.push_back(worker_id);
}

void RequestAttempts::OnTokens(absl::Span<const TokenId> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

int32_t RequestAttempts::remaining_tokens() const {
  return std::max<int32_t>(0, max_tokens_ - static_cast<int32_t>(generated_ids().size()));
}

RetryVerdict RequestAttempts::OnAttemptFailed(const UpstreamError& error) {
  RetryVerdict verdict;
  const size_t generated = generated_ids().size();
  if (error.status.ok()) {
    verdict.status = absl::InternalError("an attempt was reported failed with an OK status");
    return verdict;
  }
  if (!IsRetryable(error)) {
    verdict.status = error.status;
    return verdict;
  }
  if (generated > 0 && remaining_tokens() == 0) {
    // The stream broke after the last allowed token, before its final
    // message: nothing is left to generate.
    verdict.step = NextStep::kComplete;
    return verdict;
  }
  if (generated > 0 && !options_.migrate) {
    verdict.status =
        absl::Status(error.status.code(),
                     absl::StrCat("the worker failed after ", generated,
                                  " tokens and migration is off: ", error.status.message()));
    return verdict;
  }
  if (attempts() >= std::max(1, options_.max_attempts)) {
    verdict.status = absl::Status(error.status.code(),
                                  absl::StrCat("gave up after ", attempts(),
                                               " attempts; last error: ", error.status.message()));
    return verdict;
  }
  verdict.step = generated > 0 ? NextStep::kMigrate : NextStep::kRetry;
  return verdict;
}

}  // namespace tessera::router
