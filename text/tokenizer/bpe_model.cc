#include "text/tokenizer/bpe_model.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/string_util.h"
#include "text/tokenizer/utf8.h"

namespace tessera::tokenizer {

// A bounded map from word bytes to ids, split into independently locked
// shards. A full shard is emptied before the next insertion, which keeps the
// bound without per-entry bookkeeping.
class WordCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kEntriesPerShard = 1024;
  static constexpr size_t kMaxWordBytes = 128;

  using Ids = absl::InlinedVector<int32_t, 4>;

  bool Lookup(std::string_view word, std::vector<int32_t>* out) const {
    const Shard& shard = shards_[ShardOf(word)];
    absl::MutexLock lock(&shard.mu);
    auto it = shard.map.find(AbslView(word));
    if (it == shard.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(std::string_view word, const int32_t* ids, size_t n) {
    if (word.size() > kMaxWordBytes) return;
    Shard& shard = shards_[ShardOf(word)];
    absl::MutexLock lock(&shard.mu);
    if (shard.map.size() >= kEntriesPerShard) shard.map.clear();
    shard.map.try_emplace(std::string(word), ids, ids + n);
  }

  size_t Size() const {
    size_t total = 0;
    for (const Shard& shard : shards_) {
      absl::MutexLock lock(&shard.mu);
      total += shard.map.size();
    }
    return total;
  }

 private:
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, Ids> map ABSL_GUARDED_BY(mu);
  };
  static size_t ShardOf(std::string_view word) {
    return absl::Hash<absl::string_view>{}(AbslView(word)) % kShards;
  }
  Shard shards_[kShards];
};

namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// A symbol in the word being merged: a doubly linked list over a vector.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

// A candidate merge of symbols[pos] with its right neighbour.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t left_id;
  int32_t right_id;
  int32_t new_id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

BpeModel::BpeModel() : cache_(std::make_unique<WordCache>()) { byte_id_.fill(-1); }
BpeModel::~BpeModel() = default;

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(BpeConfig config,
                                                           std::string_view source_name) {
  const absl::string_view source = AbslView(source_name);
  std::unique_ptr<BpeModel> model(new BpeModel);
  model->ignore_merges_ = config.ignore_merges;
  model->fuse_unk_ = config.fuse_unk;

  int32_t max_id = -1;
  for (const auto& [token, id] : config.vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vocabulary token \"", token, "\" has negative id ", id));
    }
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.resize(max_id + 1);
  model->id_to_bytes_.resize(max_id + 1);
  model->id_present_.assign(max_id + 1, false);
  model->token_to_id_.reserve(config.vocab.size());
  for (auto& [token, id] : config.vocab) {
    if (model->id_present_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": vocabulary id ", id,
                                                     " is used by both \"", model->id_to_token_[id],
                                                     "\" and \"", token, "\""));
    }
    if (!model->token_to_id_.try_emplace(token, id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vocabulary token \"", token, "\" appears twice"));
    }
    std::string bytes;
    if (!ByteLevelToBytes(token, &bytes)) {
      // Outside the byte-level alphabet: the token stands for its own UTF-8
      // (what the Hugging Face ByteLevel decoder does with such tokens).
      bytes = token;
    }
    model->id_present_[id] = true;
    model->id_to_bytes_[id] = std::move(bytes);
    model->id_to_token_[id] = std::move(token);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = model->token_to_id_.find(BytesToByteLevel(std::string(1, static_cast<char>(b))));
    if (it != model->token_to_id_.end()) model->byte_id_[b] = it->second;
  }
  if (config.unk_token.has_value()) {
    auto it = model->token_to_id_.find(*config.unk_token);
    if (it == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unk_token \"", *config.unk_token, "\" is not in the vocabulary"));
    }
    model->unk_id_ = it->second;
  }

  model->merges_.reserve(config.merges.size());
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    // Named references, not a structured binding: clang 14 (the fuzz
    // build) cannot capture those in a lambda.
    const std::string& left = config.merges[rank].first;
    const std::string& right = config.merges[rank].second;
    auto describe = [&] {
      return absl::StrCat(source, ": merge #", rank, " (\"", left, "\", \"", right, "\")");
    };
    auto l = model->token_to_id_.find(left);
    if (l == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " names unknown token \"", left, "\""));
    }
    auto r = model->token_to_id_.find(right);
    if (r == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " names unknown token \"", right, "\""));
    }
    const std::string joined = absl::StrCat(left, right);
    auto j = model->token_to_id_.find(joined);
    if (j == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), " produces \"", joined, "\", which is not in the vocabulary"));
    }
    // A repeated pair takes its last rank, as in Hugging Face tokenizers.
    model->merges_.insert_or_assign(PairKey(l->second, r->second),
                                    Merge{static_cast<int32_t>(rank), j->second});
  }
  return model;
}

int BpeModel::missing_byte_tokens() const {
  int missing = 0;
  for (int32_t id : byte_id_) missing += id < 0 ? 1 : 0;
  return missing;
}

size_t BpeModel::CachedWords() const { return cache_->Size(); }

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(AbslView(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id > max_id() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

const std::string* BpeModel::IdToBytes(int32_t id) const {
  if (id < 0 || id > max_id() || !id_present_[id]) return nullptr;
  return &id_to_bytes_[id];
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = token_to_id_.find(BytesToByteLevel(word));
    if (it != token_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1 && byte_id_[static_cast<unsigned char>(word[0])] >= 0) {
    ids->push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (cache_->Lookup(word, ids)) return;
  const size_t before = ids->size();
  MergeWord(word, ids);
  cache_->Insert(word, ids->data() + before, ids->size() - before);
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (unsigned char b : word) {
    int32_t id = byte_id_[b];
    if (id < 0) {
      if (unk_id_ < 0) continue;  // No token and no unk: the byte is dropped.
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == unk_id_) continue;
      id = unk_id_;
    }
    const int32_t pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, pos - 1, pos + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, pos, symbols[pos].id, symbols[next].id, it->second.new_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) consider(pos);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.pos];
    // Skip candidates made stale by earlier merges: the pair must still be
    // exactly <left_id, right_id> at this position. Ids only grow longer, so
    // a stale entry can never match again by accident.
    if (left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.new_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    right.id = -1;  // Dead.
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) out->push_back(symbols[pos].id);
}

}  // namespace tessera::tokenizer
