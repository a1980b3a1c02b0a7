#include "kernels/cpu/op_args.h"

#include "absl/strings/str_cat.h"

namespace tessera::kernels::cpu {
namespace {

absl::Status ValidateCacheShape(const PagedKvCache& c) {
  if (c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache dimensions must be positive: num_blocks=", c.num_blocks,
        " block_size=", c.block_size, " num_kv_heads=", c.num_kv_heads, " head_dim=", c.head_dim));
  }
  if (c.k == nullptr || c.v == nullptr) {
    return absl::InvalidArgumentError("KV cache has a null K or V pointer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePagedAttention(const PagedAttentionArgs& a) {
  if (absl::Status s = ValidateCacheShape(a.cache); !s.ok()) return s;
  const PagedKvCache& c = a.cache;
  if (a.num_heads <= 0 || a.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads=", a.num_heads,
                     " must be a positive multiple of num_kv_heads=", c.num_kv_heads));
  }
  const int num_seqs = a.num_seqs();
  if (a.query_start_loc.size() != static_cast<size_t>(num_seqs) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_start_loc has ", a.query_start_loc.size(),
                     " entries; expected num_seqs + 1 = ", num_seqs + 1));
  }
  if (a.query_start_loc[0] != 0) {
    return absl::InvalidArgumentError("query_start_loc[0] must be 0");
  }
  if (a.block_table_stride < 0 ||
      a.block_tables.size() < static_cast<size_t>(num_seqs * a.block_table_stride)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_tables has ", a.block_tables.size(), " entries; need num_seqs (",
                     num_seqs, ") * block_table_stride (", a.block_table_stride, ")"));
  }
  if (a.num_tokens() > 0) {
    if (a.q == nullptr || a.out == nullptr) {
      return absl::InvalidArgumentError("attention q or out is null");
    }
    if (a.q_token_stride < int64_t{a.num_heads} * c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("q_token_stride=", a.q_token_stride,
                       " is less than num_heads * head_dim = ", int64_t{a.num_heads} * c.head_dim));
    }
  }
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t q_len = int64_t{a.query_start_loc[s + 1]} - a.query_start_loc[s];
    const int64_t seq_len = a.seq_lens[s];
    if (q_len < 0) {
      return absl::InvalidArgumentError(absl::StrCat("query_start_loc decreases at sequence ", s));
    }
    if (q_len > seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " has ", q_len, " query tokens but seq_len=", seq_len));
    }
    const int64_t blocks_needed = (seq_len + c.block_size - 1) / c.block_size;
    if (blocks_needed > a.block_table_stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " has seq_len=", seq_len, " which needs ", blocks_needed,
                       " blocks; its block table holds ", a.block_table_stride));
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = a.block_tables[s * a.block_table_stride + b];
      if (id < 0 || id >= c.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s, " block ", b, " is ", id, "; the cache has ", c.num_blocks, " blocks"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSlotMapping(absl::Span<const int64_t> slot_mapping,
                                 const PagedKvCache& cache) {
  if (absl::Status s = ValidateCacheShape(cache); !s.ok()) return s;
  for (size_t t = 0; t < slot_mapping.size(); ++t) {
    if (slot_mapping[t] >= cache.num_slots()) {
      return absl::InvalidArgumentError(absl::StrCat("slot_mapping[", t, "]=", slot_mapping[t],
                                                     " is outside the cache (", cache.num_slots(),
                                                     " slots)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenIds(absl::Span<const int32_t> ids, const WeightMatrix& table) {
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= table.rows) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[t], " at index ", t,
                                                     " is outside the vocabulary [0, ", table.rows,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels::cpu
