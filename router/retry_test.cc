#include "router/retry.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

UpstreamError Err(absl::StatusCode code, UpstreamErrorKind kind = UpstreamErrorKind::kStatus) {
  return UpstreamError{absl::Status(code, "upstream said no"), kind};
}

TEST(ClassifyTest, RetryableAndBreakerFailuresFollowTheTable) {
  struct Row {
    UpstreamError error;
    bool retryable;
    bool failure;
  };
  const std::vector<Row> table = {
      {Err(absl::StatusCode::kUnavailable, UpstreamErrorKind::kConnectFailure), true, true},
      {Err(absl::StatusCode::kUnavailable, UpstreamErrorKind::kWorkerDraining), true, false},
      {Err(absl::StatusCode::kUnavailable), true, true},
      {Err(absl::StatusCode::kResourceExhausted), true, false},
      {Err(absl::StatusCode::kAborted), true, false},
      {Err(absl::StatusCode::kInternal), false, true},
      {Err(absl::StatusCode::kUnknown), false, true},
      {Err(absl::StatusCode::kDataLoss), false, true},
      {Err(absl::StatusCode::kInvalidArgument), false, false},
      {Err(absl::StatusCode::kFailedPrecondition), false, false},
      {Err(absl::StatusCode::kOutOfRange), false, false},
      {Err(absl::StatusCode::kCancelled), false, false},
      {Err(absl::StatusCode::kDeadlineExceeded), false, false},
      {Err(absl::StatusCode::kUnimplemented), false, false},
      {Err(absl::StatusCode::kPermissionDenied), false, false},
  };
  for (const Row& row : table) {
    EXPECT_EQ(IsRetryable(row.error), row.retryable) << row.error.status;
    EXPECT_EQ(CountsAsWorkerFailure(row.error), row.failure) << row.error.status;
  }
}

TEST(RequestAttemptsTest, RetriesBeforeTheFirstTokenExcludingTriedWorkers) {
  const std::vector<TokenId> prompt = {1, 2, 3};
  RequestAttempts r(RetryOptions{3, true}, prompt, 10, 42);
  r.OnAttemptStarted("a");
  RetryVerdict v = r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable));
  EXPECT_EQ(v.step, NextStep::kRetry);
  r.OnAttemptStarted("b");
  v = r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable, UpstreamErrorKind::kConnectFailure));
  EXPECT_EQ(v.step, NextStep::kRetry);
  EXPECT_THAT(r.tried_workers(), ElementsAre("a", "b"));
  EXPECT_TRUE(r.generated_ids().empty());
  EXPECT_THAT(r.prompt_ids(), ElementsAre(1, 2, 3));
  r.OnAttemptStarted("c");
  v = r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable));
  EXPECT_EQ(v.step, NextStep::kFail);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(v.status.message()), HasSubstr("after 3 attempts"));
}

TEST(RequestAttemptsTest, ClientErrorsAreNotRetried) {
  RequestAttempts r(RetryOptions{}, std::vector<TokenId>{1}, 10, 1);
  r.OnAttemptStarted("a");
  RetryVerdict v = r.OnAttemptFailed(Err(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(v.step, NextStep::kFail);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status.message(), "upstream said no");  // passed through unchanged
}

TEST(RequestAttemptsTest, MigrationResumesWithTheGeneratedTokensAndTheOriginalLimit) {
  const std::vector<TokenId> prompt = {10, 11, 12, 13};
  RequestAttempts r(RetryOptions{3, true}, prompt, /*max_tokens=*/8, /*seed=*/777);
  r.OnAttemptStarted("a");
  r.OnTokens(std::vector<TokenId>{50, 51});
  r.OnTokens(std::vector<TokenId>{52});
  RetryVerdict v =
      r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable, UpstreamErrorKind::kWorkerDraining));
  EXPECT_EQ(v.step, NextStep::kMigrate);
  EXPECT_THAT(r.prompt_ids(), ElementsAre(10, 11, 12, 13));
  EXPECT_THAT(r.generated_ids(), ElementsAre(50, 51, 52));
  EXPECT_THAT(r.routing_tokens(), ElementsAre(10, 11, 12, 13, 50, 51, 52));
  EXPECT_EQ(r.max_tokens(), 8);  // the original: the 3 generated count towards it
  EXPECT_EQ(r.remaining_tokens(), 5);
  EXPECT_EQ(r.seed(), 777u);

  r.OnAttemptStarted("b");
  r.OnTokens(std::vector<TokenId>{53});
  v = r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable));
  EXPECT_EQ(v.step, NextStep::kMigrate);
  EXPECT_THAT(r.generated_ids(), ElementsAre(50, 51, 52, 53));
  EXPECT_THAT(r.tried_workers(), ElementsAre("a", "b"));
}

TEST(RequestAttemptsTest, StreamBrokenAfterTheLastAllowedTokenCompletes) {
  RequestAttempts r(RetryOptions{3, true}, std::vector<TokenId>{1}, 2, 5);
  r.OnAttemptStarted("a");
  r.OnTokens(std::vector<TokenId>{7, 8});
  EXPECT_EQ(r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable)).step, NextStep::kComplete);
}

TEST(RequestAttemptsTest, MigrationOffFailsAfterTheFirstToken) {
  RequestAttempts r(RetryOptions{3, false}, std::vector<TokenId>{1}, 10, 5);
  r.OnAttemptStarted("a");
  EXPECT_EQ(r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable)).step, NextStep::kRetry);
  r.OnAttemptStarted("b");
  r.OnTokens(std::vector<TokenId>{7});
  RetryVerdict v = r.OnAttemptFailed(Err(absl::StatusCode::kUnavailable));
  EXPECT_EQ(v.step, NextStep::kFail);
  EXPECT_THAT(std::string(v.status.message()), HasSubstr("migration is off"));
}

TEST(RequestAttemptsTest, ChoosesASeedWhenTheClientGaveNone) {
  RequestAttempts a(RetryOptions{}, std::vector<TokenId>{1}, 4, std::nullopt);
  RequestAttempts b(RetryOptions{}, std::vector<TokenId>{1}, 4, std::nullopt);
  EXPECT_NE(a.seed(), b.seed());
  const uint64_t first = a.seed();
  a.OnAttemptStarted("x");
  a.OnTokens(std::vector<TokenId>{3});
  a.OnAttemptFailed(Err(absl::StatusCode::kUnavailable));
  EXPECT_EQ(a.seed(), first);  // the same seed for every attempt
}

TEST(RequestAttemptsTest, OkStatusIsNotAFailureToRetry) {
  RequestAttempts r(RetryOptions{}, std::vector<TokenId>{1}, 4, 1);
  r.OnAttemptStarted("a");
  RetryVerdict v = r.OnAttemptFailed(UpstreamError{absl::OkStatus()});
  EXPECT_EQ(v.step, NextStep::kFail);
  EXPECT_EQ(v.status.code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tessera::router
