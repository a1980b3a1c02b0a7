// How many values and bytes one token occupies in the KV cache, for sizing
// the cache from a memory budget (blocks = budget / (bytes per token x
// block size)) and for reporting.
//   GQA: 2 (K and V) x num_key_value_heads x head_dim per layer;
//   MLA (config.mla): kv_lora_rank + qk_rope_head_dim per layer, the latent
//        c and the roped k_pe shared by every head (mla_config.h). At
//        DeepSeek-V3's dimensions in bf16: (512 + 64) x 2 = 1152 bytes per
//        layer, against 2 x 128 x (128 + 64) x 2 = 98304 for its keys and
//        values expanded per head.
// Counted over the whole model (every layer, every head; the caller scales
// for replication across tensor-parallel ranks).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "worker/model/config.h"

namespace tessera::model {

// Cached values per token and layer.
inline int64_t KvCacheValuesPerTokenLayer(const ModelConfig& c) {
  if (c.mla) return c.mla->latent_dim();
  return 2 * c.num_key_value_heads * c.head_dim;
}

// Bytes per token over all layers at `element_bytes` per value (2 for bf16,
// 4 for the CPU runner's fp32 cache).
inline int64_t KvCacheBytesPerToken(const ModelConfig& c, int64_t element_bytes) {
  return c.num_hidden_layers * KvCacheValuesPerTokenLayer(c) * element_bytes;
}

}  // namespace tessera::model
