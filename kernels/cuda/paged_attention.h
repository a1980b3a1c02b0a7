// Paged attention on CUDA: decode (one query token per sequence, split-K
// "flash decoding" with a combine pass) and prefill (causal, chunked, flash
// attention on bf16 tensor cores), both reading K/V from the paged cache
// through the block table. Semantics are those of
// kernels/cpu/reference_ops.h PagedAttention (see PagedAttentionArgs in
// kernels/cpu/op_args.h): new token i of sequence s sits at position
// seq_lens[s] - q_len + i and attends to every cached key at a position
// <= its own; query head h reads kv head h / (num_heads / num_kv_heads);
// scores are scale * q.k; softmax and accumulation are fp32.
//
// Token trees (prefill only; speculative decoding, worker/runner/
// forward_batch.h): with tree_ancestors set, each new token carries a 64-bit
// mask, and each sequence a trunk length P = tree_prefix[s] (0 when
// tree_prefix is null): the chunk's first P tokens form a chain that every
// token of the chunk descends from (a tree's root, the token that follows
// the context). New token i of sequence s (chunk start c = seq_lens[s] -
// q_len) attends causally (keys <= c + i) to the keys at positions
// < c + P, and to key c + P + j (the K/V the chunk's token P + j wrote:
// chunk tokens sit in the cache by index, whatever their RoPE positions)
// iff bit j of its mask is set (its ancestors and itself past the trunk).
// An all-ones mask means plain causal (key c + P + j iff P + j <= i): what
// the 64th token of a 64-token chain has anyway, so chunks without a tree,
// of any length, share the batch with P = 0 and all-ones masks. A token
// with any other mask sees no key past c + P + 63: a tree has at most 64
// tokens after its trunk. Decode ignores the masks (one new token per
// sequence attends to its context and itself under either rule).
//
// Data types: q, the cache and out are bf16 (stored as uint16_t bit
// patterns); tables and lengths are int32. Supported head_dim: 64, 128, 256.
// block_size must be a power of two. q, out, k_cache, v_cache and the
// workspace must be 16-byte aligned and the token strides multiples of 8.
//
// Device-side data (block table entries, seq_lens, query_start_loc) cannot
// be checked without a host synchronisation, so the caller guarantees:
// every block the batch reads is inside the cache, q_len <= max_query_len,
// seq_lens[s] <= max_seq_len and q_len <= seq_lens[s]. A sequence with no
// context (seq_len <= 0, or seq_len < q_len) gets zeros instead of NaNs.
//
// Neither call synchronises, allocates or copies host memory; grid sizes
// depend only on host-side parameters, so both can be captured in a CUDA
// graph (re-capture when num_seqs, max_seq_len or max_query_len change).
//
// Thread-safety: the functions are reentrant; concurrent calls on
// different streams must use different workspaces and outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;

namespace tessera::kernels::cuda {

// Decode only: the step's RoPE and K/V-cache write done by the attention
// kernel instead of a Rope launch before it (kernels/cuda/rope.h with `kv`:
// the same normalization and rotation, bit for bit). With q_norm (k_norm)
// each q head (the new k head) is first RMS-normalized over its head_dim
// values with those weights and norm_eps, as Qwen3 does; the norms need
// the normal order (not rope_order). q (p.q) and the new
// k and v rows are read as the qkv projection left them, unrotated; q and
// k in the normal order, or with rope_order in the RoPE row order of the
// qkv GEMV (gemv.h GemvRopeRow). Token t's rotated K and its V are stored
// at cache slot slots[t] (rows of num_kv_heads * head_dim, the layout
// k_cache / v_cache have) unless the slot is outside [0, num_slots), by
// the CTA whose split holds the token's position seq_lens[s] - 1, before
// it reads that key; attention then reads the cache as usual.
struct DecodeRope {
  const int32_t* positions = nullptr;  // device [tokens]: the RoPE positions
  const float* inv_freq = nullptr;     // device [head_dim / 2], scaling folded in
  bool rope_order = false;
  const uint16_t* k = nullptr;  // bf16 [tokens, num_kv_heads, head_dim] at kv_token_stride
  const uint16_t* v = nullptr;
  int64_t kv_token_stride = 0;
  const int64_t* slots = nullptr;  // device [tokens]
  int64_t num_slots = 0;
  uint16_t* k_cache = nullptr;  // the caches of PagedAttentionParams, writable
  uint16_t* v_cache = nullptr;
  const float* q_norm = nullptr;  // device fp32 [head_dim] or null
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
};

struct PagedAttentionParams {
  const uint16_t* q = nullptr;            // bf16 [tokens, num_heads, head_dim]
  int64_t q_token_stride = 0;             // elements between consecutive tokens
  const uint16_t* k_cache = nullptr;      // bf16 [num_blocks, block_size, num_kv_heads, head_dim]
  const uint16_t* v_cache = nullptr;      // same layout as k_cache
  const int32_t* block_tables = nullptr;  // device [num_seqs, block_table_stride]
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;         // device [num_seqs], incl. the new tokens
  const int32_t* query_start_loc = nullptr;  // device [num_seqs + 1]; decode: may be null
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  float scale = 1.0f;
  int max_seq_len = 0;      // host-known upper bound of seq_lens
  int max_query_len = 0;    // host-known upper bound of q_len (prefill)
  uint16_t* out = nullptr;  // bf16 [tokens, num_heads, head_dim]
  int64_t out_token_stride = 0;
  void* workspace = nullptr;  // device scratch for decode split-K partials
  size_t workspace_bytes = 0;
  // Prefill only: null = causal; else device [tokens], one mask per new
  // token (bit j: chunk token P + j is an ancestor of it or itself; ~0 =
  // causal), and device [num_seqs] trunk lengths P (null = all 0).
  const uint64_t* tree_ancestors = nullptr;
  const int32_t* tree_prefix = nullptr;
  // Decode only (host pointer, read at the call): RoPE and the K/V write
  // fused in (see DecodeRope); null = q and the cache are ready.
  const DecodeRope* rope = nullptr;
};

// Device scratch PagedAttentionDecode needs for these sizes (0 when one
// split covers max_seq_len, in which case workspace may be null).
size_t PagedAttentionDecodeWorkspaceBytes(int num_seqs, int num_heads, int head_dim,
                                          int max_seq_len);

// Exactly one query token per sequence: token s (or query_start_loc[s] when
// given) at position seq_lens[s] - 1. One CTA per (sequence, kv head, split
// of the context) serves all query heads of that kv head; a second small
// kernel merges the splits when there is more than one.
absl::Status PagedAttentionDecode(const PagedAttentionParams& p, CUstream_st* stream);

// q_len = query_start_loc[s + 1] - query_start_loc[s] >= 0 new tokens per
// sequence after seq_lens[s] - q_len tokens of earlier context; causal, or
// masked by tree_ancestors when set.
absl::Status PagedAttentionPrefill(const PagedAttentionParams& p, CUstream_st* stream);

}  // namespace tessera::kernels::cuda
