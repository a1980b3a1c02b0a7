#include "services/common/status.h"

#include "gtest/gtest.h"

namespace tessera::services {
namespace {

TEST(StatusTest, RoundTripsEveryCanonicalCode) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "detail");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    if (code != 0) {
      EXPECT_EQ(g.error_message(), "detail");
    }
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

TEST(StatusTest, SpecificCodesKeepTheirMeaning) {
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera::services
