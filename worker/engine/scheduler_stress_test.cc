// Randomized workload (fixed seeds) against a tight KV pool: thousands of
// requests with random lengths, shared prefixes, priorities, resumed outputs,
// cancellations in every phase and preemptions. After every step all
// invariants must hold; at the end no block may leak, every completed
// request must equal its run-alone reference, and the KV event stream must
// balance.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "worker/engine/fake_model.h"
#include "worker/engine/scheduler.h"

namespace tessera::engine {
namespace {

struct Config {
  std::string name;
  int block_size;
  int num_blocks;
  int max_num_batched_tokens;
  int max_num_seqs;
  int max_model_len;
  bool prefix_caching;
  double watermark;
  int vocab_size;
  int num_requests;
  uint64_t seed;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

struct Request {
  SequenceId id;
  std::vector<TokenId> prompt;
  std::vector<TokenId> given;  // resumed output
  SamplingOptions opts;
  bool admissible;
};

struct Counts {
  int refused = 0;
  int aborted_waiting = 0;
  int aborted_mid_prefill = 0;
  int aborted_mid_decode = 0;
  int aborted_in_flight = 0;
  int completed = 0;
};

class StressTest : public ::testing::TestWithParam<Config> {};

TEST_P(StressTest, NoLeaksAndExactOutputs) {
  const Config& c = GetParam();
  std::mt19937_64 rng(c.seed);
  auto uniform = [&](int lo, int hi) {  // [lo, hi]
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto random_tokens = [&](int n) {
    std::vector<TokenId> v(n);
    for (auto& t : v) t = static_cast<TokenId>(rng() % c.vocab_size);
    return v;
  };

  SchedulerOptions o;
  o.block_size = c.block_size;
  o.num_blocks = c.num_blocks;
  o.max_num_batched_tokens = c.max_num_batched_tokens;
  o.max_num_seqs = c.max_num_seqs;
  o.max_model_len = c.max_model_len;
  o.vocab_size = c.vocab_size;
  o.enable_prefix_caching = c.prefix_caching;
  o.watermark = c.watermark;
  auto created = Scheduler::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  Scheduler& sched = **created;
  FakeModel model(c.num_blocks, c.block_size, c.vocab_size);
  const int kv_capacity = c.num_blocks * c.block_size;

  // The workload.
  std::vector<std::vector<TokenId>> prefixes;
  for (int i = 0; i < 6; ++i) prefixes.push_back(random_tokens(uniform(c.block_size, 200)));
  std::vector<Request> requests;
  for (int i = 0; i < c.num_requests; ++i) {
    Request r;
    r.id = 1000 + i;
    if (chance(0.4)) {
      r.prompt = prefixes[rng() % prefixes.size()];
      const auto suffix = random_tokens(uniform(1, 100));
      r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
    } else {
      r.prompt = random_tokens(uniform(1, 250));
    }
    if (static_cast<int>(r.prompt.size()) >= c.max_model_len) r.prompt.resize(c.max_model_len - 1);
    const int room = c.max_model_len - static_cast<int>(r.prompt.size());
    r.opts.max_tokens = uniform(1, std::min(80, room));
    if (chance(0.03)) r.opts.max_tokens = room + uniform(1, 50);  // beyond the context
    r.opts.priority = uniform(0, 2);
    r.opts.eos_token_ids = {0};
    r.opts.ignore_eos = chance(0.3);
    if (chance(0.2)) r.opts.stop_token_ids = {1, 2};
    if (chance(0.05) && r.opts.max_tokens > 3) {
      // Resumed elsewhere: the first few tokens of its own stream.
      auto stream = FakeModel::Reference(r.prompt, {}, r.opts, c.max_model_len, c.vocab_size);
      const int k = std::min<int>(uniform(1, 3), static_cast<int>(stream.size()) - 1);
      if (k > 0) r.given.assign(stream.begin(), stream.begin() + k);
    }
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.opts.max_tokens;
    r.admissible = total <= c.max_model_len && total - 1 <= kv_capacity;
    requests.push_back(std::move(r));
  }

  Counts counts;
  absl::flat_hash_map<SequenceId, const Request*> by_id;
  std::map<SequenceId, std::vector<TokenId>> generated;
  std::map<SequenceId, FinishReason> finished;
  std::vector<SequenceId> active;       // ids added and not yet known to be done
  std::map<uint64_t, int> live_hashes;  // stored minus removed, from events
  auto drain_events = [&] {
    for (const KvCacheEvent& e : sched.TakeKvEvents()) {
      for (uint64_t h : e.block_hashes) {
        live_hashes[h] += e.kind == KvCacheEvent::Kind::kStored ? 1 : -1;
        ASSERT_GE(live_hashes[h], 0) << "removed a hash that was never stored";
      }
    }
  };
  enum Phase { kQueued, kPrefilling, kDecoding };
  auto phase_of = [&](SequenceId id) {
    const Sequence* seq = sched.FindSequence(id);
    if (seq->status() != SequenceStatus::kRunning) return kQueued;
    return seq->num_uncomputed_tokens() > 1 ? kPrefilling : kDecoding;
  };
  // Cancels a random active request, preferring a random phase.
  auto abort_random = [&](bool in_flight) {
    if (active.empty()) return;
    const Phase wanted = static_cast<Phase>(rng() % 3);
    size_t i = rng() % active.size();
    for (size_t k = 0; k < active.size(); ++k) {
      const size_t j = (i + k) % active.size();
      if (phase_of(active[j]) == wanted) {
        i = j;
        break;
      }
    }
    const SequenceId id = active[i];
    if (in_flight) {
      ++counts.aborted_in_flight;
    } else {
      switch (phase_of(id)) {
        case kQueued:
          ++counts.aborted_waiting;
          break;
        case kPrefilling:
          ++counts.aborted_mid_prefill;
          break;
        case kDecoding:
          ++counts.aborted_mid_decode;
          break;
      }
    }
    ASSERT_TRUE(sched.Abort(id).ok());
    active[i] = active.back();
    active.pop_back();
  };

  size_t next = 0;
  int steps = 0;
  while (next < requests.size() || sched.HasUnfinished()) {
    ASSERT_LT(++steps, 2'000'000) << "no progress";
    // Arrivals.
    for (int n = uniform(0, 3); n > 0 && next < requests.size(); --n, ++next) {
      const Request& r = requests[next];
      absl::Status s = sched.AddSequence(r.id, r.prompt, r.opts, r.given);
      if (r.admissible) {
        ASSERT_TRUE(s.ok()) << s;
        by_id[r.id] = &r;
        active.push_back(r.id);
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
        ++counts.refused;
      }
    }
    if (chance(0.03)) abort_random(/*in_flight=*/false);

    absl::StatusOr<ScheduledBatch> batch = sched.Schedule();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (batch->empty()) {
      ASSERT_FALSE(sched.HasUnfinished()) << "work left but nothing scheduled";
      continue;
    }
    ASSERT_LE(batch->num_batched_tokens, c.max_num_batched_tokens);
    ASSERT_LE(sched.num_running(), c.max_num_seqs);
    absl::StatusOr<std::vector<SampledTokens>> sampled = model.Run(*batch, &sched.block_manager());
    ASSERT_TRUE(sampled.ok()) << sampled.status();
    if (chance(0.01)) abort_random(/*in_flight=*/true);
    ASSERT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
    absl::StatusOr<std::vector<SequenceOutput>> outputs = sched.OnStepDone(*sampled);
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    for (const SequenceOutput& out : *outputs) {
      auto& g = generated[out.id];
      g.insert(g.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) {
        finished[out.id] = out.finish_reason;
        active.erase(std::find(active.begin(), active.end(), out.id));
      }
    }
    ASSERT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
    drain_events();
  }

  // Every completed request produced exactly its run-alone output.
  for (const auto& [id, reason] : finished) {
    const Request& r = *by_id.at(id);
    ASSERT_NE(reason, FinishReason::kAbort);
    EXPECT_EQ(generated[id],
              FakeModel::Reference(r.prompt, r.given, r.opts, c.max_model_len, c.vocab_size))
        << "request " << id;
    ++counts.completed;
  }

  // No leaks: nothing is referenced; what is left is cached and evictable.
  const BlockManager& bm = sched.block_manager();
  EXPECT_EQ(bm.num_used_blocks(), 0);
  EXPECT_EQ(bm.num_free_blocks(), c.num_blocks);
  EXPECT_EQ(bm.num_evictable_blocks(), bm.num_cached_blocks());
  const int cached = bm.num_cached_blocks();
  EXPECT_EQ(sched.ResetPrefixCache(), cached);
  EXPECT_EQ(bm.num_cached_blocks(), 0);
  EXPECT_TRUE(sched.CheckInvariants().ok()) << sched.CheckInvariants();
  drain_events();
  for (const auto& [hash, n] : live_hashes) EXPECT_EQ(n, 0) << "hash " << hash;

  // The workload really exercised every path.
  const SchedulerStats stats = sched.stats();
  EXPECT_GT(counts.completed, c.num_requests / 2);
  EXPECT_GT(counts.refused, 0);
  EXPECT_GT(counts.aborted_waiting, 0);
  EXPECT_GT(counts.aborted_mid_prefill, 0);
  EXPECT_GT(counts.aborted_mid_decode, 0);
  EXPECT_GT(counts.aborted_in_flight, 0);
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_EQ(stats.num_finished, counts.completed);
  if (c.prefix_caching) {
    EXPECT_GT(stats.blocks.prefix_hit_tokens, 0);
    EXPECT_GT(stats.blocks.num_evictions, 0);
  }
  std::cout << c.name << ": " << steps << " steps, " << counts.completed << " completed, "
            << counts.refused << " refused, aborted " << counts.aborted_waiting << " waiting / "
            << counts.aborted_mid_prefill << " mid-prefill / " << counts.aborted_mid_decode
            << " mid-decode / " << counts.aborted_in_flight << " in flight, "
            << stats.num_preemptions << " preemptions, prefix hits "
            << stats.blocks.prefix_hit_tokens << "/" << stats.blocks.prefix_query_tokens
            << " tokens, " << stats.blocks.num_evictions << " evictions\n";
}

INSTANTIATE_TEST_SUITE_P(
    Workloads, StressTest,
    ::testing::Values(Config{"cached_bs16", 16, 40, 96, 12, 400, true, 0.0, 64, 2500, 1},
                      Config{"uncached_bs4", 4, 100, 40, 16, 300, false, 0.0, 64, 2000, 2},
                      Config{"cached_bs8_watermark", 8, 64, 64, 8, 500, true, 0.05, 64, 2000, 3}),
    [](const ::testing::TestParamInfo<Config>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::engine
