#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/reference_ops.h"

namespace tessera::kernels::cpu {
namespace {

// Work below this many scalar operations is not worth waking the pool for.
constexpr int64_t kMinParallelWork = 1 << 15;

int Threads(const CpuContext& ctx) { return ctx.pool != nullptr ? ctx.pool->num_threads() : 1; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Chunk size for `items` units of `unit_work` operations each: about
// `chunks_per_thread` chunks per thread, but never chunks smaller than
// kMinParallelWork, and a multiple of `align` units.
int64_t Grain(const CpuContext& ctx, int64_t items, int64_t unit_work, int chunks_per_thread = 1,
              int64_t align = 1) {
  const int64_t by_threads = CeilDiv(items, int64_t{Threads(ctx)} * chunks_per_thread);
  const int64_t by_work = CeilDiv(kMinParallelWork, std::max<int64_t>(1, unit_work));
  const int64_t grain = std::max<int64_t>({1, by_threads, by_work});
  return CeilDiv(grain, align) * align;
}

}  // namespace

CpuContext DefaultCpuContext() {
  return CpuContext{DefaultThreadPool(), BestCpuIsa(HostCpuFeatures())};
}

const IsaKernels& KernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return Avx512Kernels();
    case CpuIsa::kAvx2:
      return Avx2Kernels();
    case CpuIsa::kScalar:
      break;
  }
  return ScalarKernels();
}

absl::Status Embedding(const CpuContext& ctx, const WeightMatrix& table,
                       absl::Span<const int32_t> ids, float* out) {
  if (absl::Status s = ValidateTokenIds(ids, table); !s.ok()) return s;
  const IsaKernels& k = KernelsFor(ctx.isa);
  const int64_t hidden = table.cols;
  const size_t row_bytes = hidden * DTypeSize(table.dtype);
  ParallelFor(ctx.pool, ids.size(), Grain(ctx, ids.size(), hidden), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const char* row = static_cast<const char*>(table.data) + ids[t] * row_bytes;
      k.widen(row, table.dtype, hidden, out + t * hidden);
    }
  });
  return absl::OkStatus();
}

void RmsNorm(const CpuContext& ctx, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps, float* out) {
  const IsaKernels& k = KernelsFor(ctx.isa);
  ParallelFor(ctx.pool, rows, Grain(ctx, rows, 2 * dim), [&](int64_t b, int64_t e) {
    k.rms_norm(x + b * dim, weight, e - b, dim, eps, out + b * dim);
  });
}

void FusedAddRmsNorm(const CpuContext& ctx, float* x, float* residual, const float* weight,
                     int64_t rows, int64_t dim, float eps) {
  const IsaKernels& k = KernelsFor(ctx.isa);
  ParallelFor(ctx.pool, rows, Grain(ctx, rows, 3 * dim), [&](int64_t b, int64_t e) {
    k.fused_add_rms_norm(x + b * dim, residual + b * dim, weight, e - b, dim, eps);
  });
}

void Rope(const CpuContext& ctx, absl::Span<const int32_t> positions,
          absl::Span<const float> inv_freq, int head_dim, float* q, int num_heads, int64_t q_stride,
          float* k, int num_kv_heads, int64_t k_stride) {
  if (head_dim > 512) {  // beyond the optimized kernel's stack tables; see REQUIRES
    reference::Rope(positions, inv_freq, head_dim, q, num_heads, q_stride, k, num_kv_heads,
                    k_stride);
    return;
  }
  const IsaKernels& kernels = KernelsFor(ctx.isa);
  const int64_t n = positions.size();
  const int64_t work = int64_t{num_heads + (k != nullptr ? num_kv_heads : 0)} * head_dim * 3;
  ParallelFor(ctx.pool, n, Grain(ctx, n, work), [&](int64_t b, int64_t e) {
    kernels.rope(positions.data() + b, e - b, inv_freq.data(), head_dim,
                 q != nullptr ? q + b * q_stride : nullptr, num_heads, q_stride,
                 k != nullptr ? k + b * k_stride : nullptr, num_kv_heads, k_stride);
  });
}

void Gemm(const CpuContext& ctx, const float* x, int64_t m, const WeightMatrix& w,
          const float* bias, float* y) {
  const IsaKernels& k = KernelsFor(ctx.isa);
  // Columns are handed out in multiples of 24 (a multiple of every register
  // tile width) so that only the last chunk has a partial tile.
  const int64_t grain = Grain(ctx, w.rows, m * w.cols, /*chunks_per_thread=*/m == 1 ? 2 : 4,
                              /*align=*/24);
  ParallelFor(ctx.pool, w.rows, grain,
              [&](int64_t b, int64_t e) { k.gemm_columns(x, m, w, bias, b, e, y); });
}

void SiluMul(const CpuContext& ctx, const float* gate_up, int64_t rows, int64_t inter, float* out) {
  if (rows <= 0 || inter <= 0) return;
  const IsaKernels& k = KernelsFor(ctx.isa);
  // Split long rows too, so that one decode row still uses every thread.
  const int64_t chunk =
      std::min<int64_t>(inter, std::max<int64_t>(1024, CeilDiv(inter, Threads(ctx))));
  const int64_t chunks_per_row = CeilDiv(inter, chunk);
  const int64_t items = rows * chunks_per_row;
  ParallelFor(ctx.pool, items, Grain(ctx, items, chunk * 8), [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t r = item / chunks_per_row;
      const int64_t begin = (item % chunks_per_row) * chunk;
      const int64_t len = std::min(chunk, inter - begin);
      const float* gate = gate_up + r * 2 * inter + begin;
      k.silu_mul(gate, gate + inter, len, out + r * inter + begin);
    }
  });
}

absl::Status WriteKvCache(const CpuContext& ctx, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, absl::Span<const int64_t> slot_mapping,
                          const PagedKvCache& cache) {
  if (absl::Status s = ValidateSlotMapping(slot_mapping, cache); !s.ok()) return s;
  const int64_t row = cache.slot_stride();
  const int64_t n = slot_mapping.size();
  ParallelFor(ctx.pool, n, Grain(ctx, n, 2 * row), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t slot = slot_mapping[t];
      if (slot < 0) continue;
      std::memcpy(cache.k + slot * row, k + t * k_stride, row * sizeof(float));
      std::memcpy(cache.v + slot * row, v + t * v_stride, row * sizeof(float));
    }
  });
  return absl::OkStatus();
}

absl::Status PagedAttention(const CpuContext& ctx, const PagedAttentionArgs& args) {
  if (absl::Status s = ValidatePagedAttention(args); !s.ok()) return s;
  const IsaKernels& k = KernelsFor(ctx.isa);
  const int kv_heads = args.cache.num_kv_heads;
  const int group = args.num_heads / kv_heads;
  // A work item is (sequence, a range of kv heads, a tile of query tokens).
  // A tile holds about 32 query rows per kv head (tokens x the heads of its
  // group) that share every K/V load. Walking several kv heads per block
  // reads the block's [slot, heads, d] rows as long contiguous runs, which
  // matters for decode, where K/V stream from memory; heads are split only
  // to give every thread work or to bound an item's rows.
  const int64_t tile_tokens = std::max(1, 32 / group);
  int64_t tiles = 0;
  for (int s = 0; s < args.num_seqs(); ++s) {
    tiles += CeilDiv(args.query_start_loc[s + 1] - args.query_start_loc[s], tile_tokens);
  }
  if (tiles == 0) return absl::OkStatus();
  const int64_t max_rows_per_item = 128;
  const int64_t want_groups =
      std::max(CeilDiv(2 * Threads(ctx), tiles),
               CeilDiv(int64_t{kv_heads} * tile_tokens * group, max_rows_per_item));
  int head_groups = kv_heads;
  for (int g = 1; g <= kv_heads; ++g) {
    if (kv_heads % g == 0 && g >= want_groups) {
      head_groups = g;
      break;
    }
  }
  const int heads_per_item = kv_heads / head_groups;
  struct Item {
    int seq;
    int h_begin;
    int64_t t_begin;
    int64_t t_end;
    int64_t keys;  // keys the item's last token attends to: its cost
  };
  std::vector<Item> items;
  for (int s = 0; s < args.num_seqs(); ++s) {
    const int64_t q_len = args.query_start_loc[s + 1] - args.query_start_loc[s];
    const int64_t context_start = args.seq_lens[s] - q_len;
    for (int64_t t = 0; t < q_len; t += tile_tokens) {
      const int64_t t_end = std::min(q_len, t + tile_tokens);
      for (int h = 0; h < kv_heads; h += heads_per_item) {
        items.push_back({s, h, t, t_end, context_start + t_end});
      }
    }
  }
  // Costlier items first, so that the last ones to start are short.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.keys > b.keys; });
  ParallelFor(ctx.pool, items.size(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[i];
      k.attention(args, it.seq, it.h_begin, it.h_begin + heads_per_item, it.t_begin, it.t_end);
    }
  });
  return absl::OkStatus();
}

void Softmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols, float* out) {
  if (cols <= 0) return;
  const IsaKernels& k = KernelsFor(ctx.isa);
  ParallelFor(ctx.pool, rows, Grain(ctx, rows, 4 * cols), [&](int64_t b, int64_t e) {
    k.softmax(logits + b * cols, e - b, cols, out + b * cols);
  });
}

void LogSoftmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols,
                float* out) {
  if (cols <= 0) return;
  const IsaKernels& k = KernelsFor(ctx.isa);
  ParallelFor(ctx.pool, rows, Grain(ctx, rows, 4 * cols), [&](int64_t b, int64_t e) {
    k.log_softmax(logits + b * cols, e - b, cols, out + b * cols);
  });
}

void Argmax(const CpuContext& ctx, const float* logits, int64_t rows, int64_t cols, int32_t* out) {
  if (cols <= 0) return;
  const IsaKernels& k = KernelsFor(ctx.isa);
  ParallelFor(ctx.pool, rows, Grain(ctx, rows, 2 * cols),
              [&](int64_t b, int64_t e) { k.argmax(logits + b * cols, e - b, cols, out + b); });
}

void ReduceSum(const CpuContext& ctx, absl::Span<const float* const> inputs, int64_t n,
               float* out) {
  const IsaKernels& k = KernelsFor(ctx.isa);
  const int num_inputs = static_cast<int>(inputs.size());
  ParallelFor(ctx.pool, n, Grain(ctx, n, num_inputs, 1, 64),
              [&](int64_t b, int64_t e) { k.reduce_sum(inputs.data(), num_inputs, b, e, out); });
}

}  // namespace tessera::kernels::cpu
