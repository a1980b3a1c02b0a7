// DraftClient against an in-process fake drafter: proposals taken within the
// deadline, stale and late proposals counted and dropped, no waiting while
// the drafter is gone, and reconnection re-opening every live sequence with
// its full tokens.
#include "services/worker/draft_client.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace tessera::services {
namespace {

using tessera::v1::DraftControl;
using tessera::v1::DraftProposal;
using ::testing::ElementsAre;

// Answers every Open/Commit with a proposal {42, 43}; `base_shift` and
// `delay` make it stale or late.
class FakeDrafter final : public tessera::v1::Drafter::Service {
 public:
  std::atomic<int> base_shift{0};
  std::atomic<int> delay_ms{0};

  grpc::Status Speculate(grpc::ServerContext* context,
                         grpc::ServerReaderWriter<DraftProposal, DraftControl>* stream) override {
    stream->SendInitialMetadata();
    absl::flat_hash_map<uint64_t, int64_t> lengths;
    DraftControl c;
    while (stream->Read(&c)) {
      uint64_t seq = 0;
      if (c.has_open()) {
        seq = c.open().seq();
        lengths[seq] = c.open().prompt_ids_size();
        absl::MutexLock lock(&mu_);
        opens_.push_back(
            std::vector<int32_t>(c.open().prompt_ids().begin(), c.open().prompt_ids().end()));
      } else if (c.has_commit()) {
        seq = c.commit().seq();
        lengths[seq] = c.commit().base_len() + c.commit().tokens_size();
      } else {
        continue;
      }
      if (delay_ms > 0) absl::SleepFor(absl::Milliseconds(delay_ms.load()));
      DraftProposal p;
      p.set_seq(seq);
      p.set_base_len(lengths[seq] + base_shift.load());
      p.add_tokens(42);
      p.add_tokens(43);
      if (!stream->Write(p)) break;
    }
    return grpc::Status::OK;
  }

  std::vector<std::vector<int32_t>> opens() {
    absl::MutexLock lock(&mu_);
    return opens_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::vector<int32_t>> opens_;
};

class Counts final : public DraftClientObserver {
 public:
  void OnStaleProposal() override { ++stale; }
  void OnLateProposal() override { ++late; }
  void OnProposalRoundTrip(absl::Duration) override { ++rtts; }
  std::atomic<int> stale{0}, late{0}, rtts{0};
};

std::unique_ptr<grpc::Server> Serve(FakeDrafter* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort(absl::StrCat("127.0.0.1:", *port), grpc::InsecureServerCredentials(), port);
  b.RegisterService(service);
  return b.BuildAndStart();
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(10)) {
  absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

TEST(DraftClientTest, DeadlineStaleLateAndReconnect) {
  FakeDrafter fake;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&fake, &port);
  ASSERT_NE(port, 0);
  Counts counts;
  DraftClientOptions o;
  o.target = absl::StrCat("127.0.0.1:", port);
  o.deadline = absl::Milliseconds(300);
  o.min_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(200);
  DraftClient client(o, &counts);
  ASSERT_TRUE(WaitFor([&] { return client.connected(); }));

  sampling::SamplingParams params;
  client.Open(1, {1, 2, 3}, params, 4);
  auto got = client.GetDrafts({{1, 3, 4}});
  ASSERT_TRUE(got[0].has_value());
  EXPECT_EQ(got[0]->base_len, 3);
  EXPECT_THAT(got[0]->tokens, ElementsAre(42, 43));
  EXPECT_EQ(counts.rtts, 1);

  // A proposal for a length the sequence does not have: stale, dropped.
  fake.base_shift = -1;
  client.Commit(1, 3, {42, 7}, 4);
  got = client.GetDrafts({{1, 5, 4}});
  EXPECT_FALSE(got[0].has_value());
  EXPECT_TRUE(WaitFor([&] { return counts.stale >= 1; }));
  fake.base_shift = 0;

  // Too slow for the deadline: the step goes on without it, then it is late.
  fake.delay_ms = 600;
  client.Commit(1, 5, {9}, 4);
  got = client.GetDrafts({{1, 6, 4}});
  EXPECT_FALSE(got[0].has_value());
  client.Commit(1, 6, {10}, 4);
  EXPECT_TRUE(WaitFor([&] { return counts.late >= 1; }));
  fake.delay_ms = 0;

  // The drafter goes away: no waiting at all.
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
  server.reset();
  ASSERT_TRUE(WaitFor([&] { return !client.connected(); }));
  absl::Time start = absl::Now();
  got = client.GetDrafts({{1, 7, 4}});
  EXPECT_FALSE(got[0].has_value());
  // Waiting would take the 300 ms deadline; not waiting takes microseconds.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150));
  client.Commit(1, 7, {11}, 4);  // kept in the mirror while disconnected

  // It comes back on the same port: reconnect, re-open with every token.
  FakeDrafter again;
  int same = port;
  server = Serve(&again, &same);
  ASSERT_EQ(same, port);
  ASSERT_TRUE(WaitFor([&] { return client.connections() == 2 && client.connected(); }));
  ASSERT_TRUE(WaitFor([&] { return !again.opens().empty(); }));
  EXPECT_THAT(again.opens()[0], ElementsAre(1, 2, 3, 42, 7, 9, 10, 11));
  got = client.GetDrafts({{1, 8, 4}});
  ASSERT_TRUE(got[0].has_value());
  EXPECT_EQ(got[0]->base_len, 8);
  client.Close(1);
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace tessera::services
