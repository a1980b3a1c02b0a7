#include "worker/engine/fake_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera::engine {
namespace {

uint64_t Mix(uint64_t x) {
  // splitmix64's finalizer.
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool Contains(const std::vector<TokenId>& ids, TokenId t) {
  return std::find(ids.begin(), ids.end(), t) != ids.end();
}

}  // namespace

FakeModel::FakeModel(int num_blocks, int block_size, int vocab_size)
    : block_size_(block_size),
      vocab_size_(vocab_size),
      slots_(static_cast<size_t>(num_blocks) * block_size) {}

uint64_t FakeModel::Kv(uint64_t previous_kv, TokenId token, int position) {
  return Mix(previous_kv ^ Mix(static_cast<uint64_t>(static_cast<uint32_t>(token)) ^
                               (static_cast<uint64_t>(position) << 32)));
}

TokenId FakeModel::Sample(uint64_t kv, int vocab_size) {
  return static_cast<TokenId>(Mix(kv) % static_cast<uint64_t>(vocab_size));
}

absl::StatusOr<std::vector<SampledTokens>> FakeModel::Run(const ScheduledBatch& batch,
                                                          const BlockManager* blocks) {
  auto fail = [](auto&&... parts) { return absl::FailedPreconditionError(absl::StrCat(parts...)); };
  std::vector<SampledTokens> sampled;
  for (const ScheduledSequence& s : batch.sequences) {
    if (static_cast<int>(s.token_ids.size()) != s.num_tokens ||
        static_cast<int>(s.slot_mapping.size()) != s.num_tokens) {
      return fail("sequence ", s.id, ": token/slot count mismatch");
    }
    if (static_cast<int64_t>(s.block_table.size()) * block_size_ < s.context_len()) {
      return fail("sequence ", s.id, ": block table too short for ", s.context_len(), " tokens");
    }
    uint64_t kv = kInitialKv;
    for (int i = 0; i < s.num_tokens; ++i) {
      const int pos = s.start_position + i;
      if (pos > 0) {
        const int64_t prev_slot = BlockManager::SlotOf(s.block_table, block_size_, pos - 1);
        const Slot& prev = slots_[prev_slot];
        if (prev.position != pos - 1) {
          return fail("sequence ", s.id, ": slot ", prev_slot, " holds position ", prev.position,
                      ", expected ", pos - 1);
        }
        kv = prev.kv;
      }
      const int64_t slot = BlockManager::SlotOf(s.block_table, block_size_, pos);
      if (slot != s.slot_mapping[i]) {
        return fail("sequence ", s.id, ": slot_mapping[", i, "] = ", s.slot_mapping[i],
                    ", block table says ", slot);
      }
      if (blocks != nullptr) {
        const BlockId b = static_cast<BlockId>(slot / block_size_);
        if (blocks->RefCount(b) != 1 || blocks->IsCached(b)) {
          return fail("sequence ", s.id, ": writes into block ", b, " (refs ", blocks->RefCount(b),
                      blocks->IsCached(b) ? ", cached)" : ")");
        }
      }
      slots_[slot] = Slot{Kv(kv, s.token_ids[i], pos), pos};
    }
    if (s.needs_logits) {
      const int64_t last = s.slot_mapping.back();
      sampled.push_back({s.id, {Sample(slots_[last].kv, vocab_size_)}});
    }
  }
  return sampled;
}

std::vector<TokenId> FakeModel::Reference(absl::Span<const TokenId> prompt,
                                          absl::Span<const TokenId> output,
                                          const SamplingOptions& options, int max_model_len,
                                          int vocab_size) {
  std::vector<TokenId> tokens(prompt.begin(), prompt.end());
  tokens.insert(tokens.end(), output.begin(), output.end());
  uint64_t kv = kInitialKv;
  for (size_t p = 0; p < tokens.size(); ++p) kv = Kv(kv, tokens[p], static_cast<int>(p));
  std::vector<TokenId> generated;
  int num_output = static_cast<int>(output.size());
  while (num_output < options.max_tokens && static_cast<int>(tokens.size()) < max_model_len) {
    const TokenId t = Sample(kv, vocab_size);
    generated.push_back(t);
    tokens.push_back(t);
    ++num_output;
    if (!options.ignore_eos && Contains(options.eos_token_ids, t)) break;
    if (Contains(options.stop_token_ids, t)) break;
    kv = Kv(kv, t, static_cast<int>(tokens.size()) - 1);
  }
  return generated;
}

}  // namespace tessera::engine
