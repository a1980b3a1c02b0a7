#include "worker/runner/cuda/cuda_weights.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda_fp8_backend.h"
#include "worker/model/rope.h"

namespace tessera::runner {
namespace {

namespace kcu = ::tessera::kernels::cuda;
using kcu::Bf16;
using kcu::DeviceBuffer;

// Row i of the result is row order[i] of `rows` (rows.size() / order.size()
// values each).
template <class T>
std::vector<T> PermuteRows(const std::vector<T>& rows, const std::vector<int64_t>& order) {
  const size_t len = rows.size() / order.size();
  std::vector<T> out(rows.size());
  for (size_t i = 0; i < order.size(); ++i) {
    std::copy_n(rows.begin() + order[i] * len, len, out.begin() + i * len);
  }
  return out;
}

// The fused q/k/v rows (q_rows + k_rows + k_rows, heads of head_dim rows)
// with every q and k head's rows in RoPE order and the v rows as they are:
// entry i is the source row.
std::vector<int64_t> RopeRowOrder(int64_t q_rows, int64_t k_rows, int64_t head_dim) {
  std::vector<int64_t> order(q_rows + 2 * k_rows);
  for (int64_t r = 0; r < static_cast<int64_t>(order.size()); ++r) order[r] = r;
  for (int64_t base = 0; base < q_rows + k_rows; base += head_dim) {
    for (int64_t f = 0; f < head_dim; ++f) order[base + kcu::GemvRopeRow(f, head_dim)] = base + f;
  }
  return order;
}

// The fused [gate; up] rows (inter each) in the gate/up GEMV order: entry i
// is the source row.
std::vector<int64_t> GateUpRowOrder(int64_t inter) {
  std::vector<int64_t> order(2 * inter);
  for (int64_t r = 0; r < 2 * inter; ++r) order[kcu::GemvGateUpRow(r, inter)] = r;
  return order;
}

// A tensor's values as bf16 (a copy for bf16, a conversion otherwise).
absl::StatusOr<std::vector<Bf16>> ToBf16(const model::TensorView& t) {
  std::vector<Bf16> out(static_cast<size_t>(t.num_elements()));
  if (t.dtype == model::DType::kBF16) {
    std::memcpy(out.data(), t.data, t.size_bytes);
    return out;
  }
  absl::StatusOr<std::vector<float>> f = model::ToFloat32(t);
  if (!f.ok()) return f.status();
  RETURN_IF_ERROR(kcu::ConvertToBf16(f->data(), f->size(), &out));
  return out;
}

// Elements [start, start + len) along `dim` of `t`, as bf16 (dim 1 of a
// matrix: a strided read of `len` columns per row).
absl::StatusOr<std::vector<Bf16>> SliceBf16(const model::TensorView& t, int dim, int64_t start,
                                            int64_t len) {
  if (dim == 0) {
    absl::StatusOr<model::TensorView> rows = model::SliceRows(t, start, len);
    if (!rows.ok()) return rows.status();
    return ToBf16(*rows);
  }
  absl::StatusOr<std::vector<int64_t>> shape = model::SliceShape(t, dim, start, len);
  if (!shape.ok()) return shape.status();
  model::TensorView view;
  view.name = t.name;
  view.dtype = t.dtype;
  view.shape = *shape;
  std::vector<std::byte> bytes(static_cast<size_t>(view.num_elements()) *
                               model::DTypeSize(t.dtype));
  RETURN_IF_ERROR(model::ReadSlice(t, dim, start, len, absl::MakeSpan(bytes)));
  view.data = bytes.data();
  view.size_bytes = bytes.size();
  return ToBf16(view);
}

absl::StatusOr<std::vector<float>> SliceF32(const model::TensorView& t, int64_t start,
                                            int64_t len) {
  return model::ReadSliceAsFloat32(t, 0, start, len);
}

template <class T>
absl::StatusOr<DeviceBuffer> Upload(std::vector<T> host, std::string_view what,
                                    const std::vector<int64_t>* order = nullptr) {
  if (order != nullptr) host = PermuteRows(host, *order);
  absl::StatusOr<DeviceBuffer> buf = AllocateDevice(host.size() * sizeof(T), what);
  if (!buf.ok()) return buf.status();
  RETURN_IF_ERROR(kcu::CopyToDevice(buf->data(), host.data(), host.size() * sizeof(T)));
  return buf;
}

// A slice of one checkpoint tensor: along `dim` (0: rows, 1: columns).
struct SourceSlice {
  const model::TensorView* tensor;
  int dim;
  parallel::Range range;
};

// One fused linear layer: the weight row slices `rows` of each part, or
// column slice `cols` of one part (given as `sources`, or already read as
// `weight`); biases likewise (row slices).
struct LinearSpec {
  std::string name;
  std::vector<absl::StatusOr<std::vector<Bf16>>> weight;
  std::vector<absl::StatusOr<std::vector<float>>> bias;  // empty = no bias
  int64_t out = 0, in = 0;
  const std::vector<int64_t>* order = nullptr;
  std::vector<SourceSlice> sources;
};

// What an upload of an FP8 model shares across its linears.
struct Fp8Upload {
  const model::QuantizationConfig* quant = nullptr;  // null: no FP8 linears
  CudaFp8Prefill prefill = CudaFp8Prefill::kDequantize;
  CudaFp8Workspace::Needs needs;
  int64_t linears = 0, cublaslt_parts = 0, dequant_parts = 0, parts = 0;
};

// One FP8 part read from the checkpoint, before upload.
struct HostFp8Part {
  std::vector<uint8_t> bytes;  // e4m3 [rows, in]
  std::vector<float> grid;     // [grid_rows, ceil(in / block)]
  int64_t rows = 0, in = 0, row_block = kcu::kFp8Block, block = kcu::kFp8Block, grid_rows = 0;
  model::ActivationQuant activation = model::ActivationQuant::kDynamicTokenGroup;
  float input_scale = 0.f;
  int64_t grid_cols() const { return (in + block - 1) / block; }
};

int64_t CeilBlocks(int64_t n) { return (n + kcu::kFp8Block - 1) / kcu::kFp8Block; }

// The e4m3 bytes and scale grid of `s` (its slice only). A block-scaled
// slice must start and end (unless at the tensor's end) on a 128 boundary.
absl::StatusOr<HostFp8Part> ReadFp8Slice(const SourceSlice& s, const model::Fp8Scales& scales,
                                         const model::QuantizationConfig& q) {
  const model::TensorView& t = *s.tensor;
  if (t.dtype != model::DType::kF8E4M3 || t.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", t.name, "\": an FP8 linear needs an F8_E4M3 matrix"));
  }
  const int64_t R = t.shape[0], C = t.shape[1];
  ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                   model::SliceShape(t, s.dim, s.range.start, s.range.size));
  HostFp8Part h;
  h.rows = shape[0];
  h.in = shape[1];
  h.activation = q.activation;
  h.bytes.resize(static_cast<size_t>(h.rows * h.in));
  RETURN_IF_ERROR(model::ReadSlice(
      t, s.dim, s.range.start, s.range.size,
      absl::MakeSpan(reinterpret_cast<std::byte*>(h.bytes.data()), h.bytes.size())));
  ASSIGN_OR_RETURN(std::vector<float> grid, model::ToFloat32(scales.weight_scale));
  switch (q.weight_strategy) {
    case model::WeightScaleStrategy::kBlock: {
      const int64_t total = s.dim == 0 ? R : C;
      if (s.range.start % kcu::kFp8Block != 0 ||
          (s.range.size % kcu::kFp8Block != 0 && s.range.end() != total)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", t.name, "\": the slice [", s.range.start, ", ", s.range.end(), ") of ",
            s.dim == 0 ? "rows" : "columns", " cuts a 128 x 128 weight-scale block"));
      }
      const int64_t gr = CeilBlocks(R), gc = CeilBlocks(C);
      if (static_cast<int64_t>(grid.size()) != gr * gc) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", scales.weight_scale.name,
                                                       "\": ", grid.size(), " scales, expected ",
                                                       gr, " x ", gc));
      }
      const int64_t first = s.range.start / kcu::kFp8Block, n = CeilBlocks(s.range.size);
      const int64_t r0 = s.dim == 0 ? first : 0, rn = s.dim == 0 ? n : gr;
      const int64_t c0 = s.dim == 1 ? first : 0, cn = s.dim == 1 ? n : gc;
      for (int64_t r = r0; r < r0 + rn; ++r) {
        for (int64_t c = c0; c < c0 + cn; ++c) h.grid.push_back(grid[r * gc + c]);
      }
      h.grid_rows = rn;
      break;
    }
    case model::WeightScaleStrategy::kChannel:
      if (static_cast<int64_t>(grid.size()) != R) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", scales.weight_scale.name,
                                                       "\": ", grid.size(), " scales for ", R,
                                                       " rows"));
      }
      h.grid.assign(grid.begin() + (s.dim == 0 ? s.range.start : 0),
                    grid.begin() + (s.dim == 0 ? s.range.end() : R));
      h.row_block = 1;
      h.block = h.in;
      h.grid_rows = h.rows;
      break;
    case model::WeightScaleStrategy::kTensor:
      h.grid.assign(1, grid.at(0));
      h.row_block = h.rows;
      h.block = h.in;
      h.grid_rows = 1;
      break;
  }
  if (scales.input_scale) {
    ASSIGN_OR_RETURN(std::vector<float> v, model::ToFloat32(*scales.input_scale));
    h.input_scale = v.at(0);
  }
  return h;
}

// Per-tensor or per-channel scales as one scale per row (so parts stack).
void ExpandToRows(HostFp8Part* p) {
  if (p->row_block == 1) return;
  std::vector<float> rows(static_cast<size_t>(p->rows));
  for (int64_t r = 0; r < p->rows; ++r) rows[r] = p->grid[r / p->row_block];
  p->grid = std::move(rows);
  p->row_block = 1;
  p->grid_rows = p->rows;
}

// Whether `b`'s rows can follow `a`'s in one part: x quantized alike, and
// block scales only after whole 128-row blocks.
bool Stacks(const HostFp8Part& a, const HostFp8Part& b) {
  if (a.activation != b.activation || a.in != b.in || a.block != b.block) return false;
  if (a.activation == model::ActivationQuant::kStaticTensor && a.input_scale != b.input_scale) {
    return false;
  }
  if (a.block == kcu::kFp8Block && a.row_block == kcu::kFp8Block) {
    return b.row_block == kcu::kFp8Block && a.rows % kcu::kFp8Block == 0;
  }
  return a.row_block != kcu::kFp8Block && b.row_block != kcu::kFp8Block;
}

void Stack(HostFp8Part* a, HostFp8Part b) {
  if (a->row_block != kcu::kFp8Block) {
    ExpandToRows(a);
    ExpandToRows(&b);
  }
  a->bytes.insert(a->bytes.end(), b.bytes.begin(), b.bytes.end());
  a->grid.insert(a->grid.end(), b.grid.begin(), b.grid.end());
  a->rows += b.rows;
  a->grid_rows += b.grid_rows;
}

absl::StatusOr<CudaFp8Part> UploadFp8Part(HostFp8Part h, bool biased, const std::string& name,
                                          Fp8Upload* u, int64_t* bytes) {
  CudaFp8Part p;
  p.rows = h.rows;
  p.in = h.in;
  p.row_block = h.row_block;
  p.block = h.block;
  p.activation = h.activation;
  p.input_scale_value = h.input_scale;
  // K in whole 128-blocks: the shapes cuda_fp8_gemm_test checks cuBLASLt's
  // block mode on (partial blocks along N are among them, along K not).
  const bool lt_shape = h.row_block == kcu::kFp8Block && h.block == kcu::kFp8Block &&
                        h.activation == model::ActivationQuant::kDynamicTokenGroup && !biased &&
                        h.rows % 16 == 0 && h.in % kcu::kFp8Block == 0;
  p.prefill = u->prefill == CudaFp8Prefill::kCublasLtBlock && lt_shape
                  ? CudaFp8Prefill::kCublasLtBlock
                  : CudaFp8Prefill::kDequantize;
  *bytes += static_cast<int64_t>(h.bytes.size() + h.grid.size() * sizeof(float));
  ASSIGN_OR_RETURN(p.weight, Upload(std::move(h.bytes), name + " e4m3 weight"));
  ASSIGN_OR_RETURN(p.scales, Upload(std::move(h.grid), name + " FP8 scales"));
  if (h.activation == model::ActivationQuant::kStaticTensor) {
    ASSIGN_OR_RETURN(p.input_scale,
                     Upload(std::vector<float>{h.input_scale}, name + " input_scale"));
  }
  CudaFp8Workspace::Needs& n = u->needs;
  const bool dequantizes =
      p.prefill == CudaFp8Prefill::kDequantize || h.activation == model::ActivationQuant::kNone;
  if (dequantizes) n.max_dequant_elems = std::max(n.max_dequant_elems, p.rows * p.in);
  n.qdq |=
      p.prefill == CudaFp8Prefill::kDequantize && h.activation != model::ActivationQuant::kNone;
  n.cublaslt |= p.prefill == CudaFp8Prefill::kCublasLtBlock;
  ++(p.prefill == CudaFp8Prefill::kCublasLtBlock ? u->cublaslt_parts : u->dequant_parts);
  return p;
}

// The biases of `spec` as one fp32 vector of `out` values (none: empty).
absl::StatusOr<std::vector<float>> JoinBias(LinearSpec& spec) {
  std::vector<float> b;
  for (absl::StatusOr<std::vector<float>>& p : spec.bias) {
    if (!p.ok())
      return absl::Status(p.status().code(),
                          absl::StrCat(spec.name, " bias: ", p.status().message()));
    b.insert(b.end(), p->begin(), p->end());
  }
  if (!spec.bias.empty() && static_cast<int64_t>(b.size()) != spec.out) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.name, ": ", b.size(), " bias values, expected ", spec.out));
  }
  return b;
}

// An FP8 linear of `spec`'s sources (every one an FP8 tensor of `layer`).
absl::StatusOr<CudaLinear> MakeFp8Linear(LinearSpec spec, const model::LayerWeights& layer,
                                         Fp8Upload* u, int64_t* bytes) {
  if (spec.order != nullptr) {
    return absl::InternalError(absl::StrCat(spec.name, ": FP8 weights in a permuted row layout"));
  }
  std::vector<HostFp8Part> host;
  for (const SourceSlice& s : spec.sources) {
    absl::StatusOr<HostFp8Part> h = ReadFp8Slice(s, *layer.Fp8ScalesOf(*s.tensor), *u->quant);
    if (!h.ok()) {
      return absl::Status(h.status().code(), absl::StrCat(spec.name, ": ", h.status().message()));
    }
    if (!host.empty() && Stacks(host.back(), *h)) {
      Stack(&host.back(), *std::move(h));
    } else {
      host.push_back(*std::move(h));
    }
  }
  int64_t rows = 0;
  for (const HostFp8Part& h : host) {
    rows += h.rows;
    if (h.in != spec.in) rows = -1;
  }
  if (rows != spec.out) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": FP8 parts of ", rows,
                                                   " rows, expected ", spec.out, " x ", spec.in));
  }
  CudaLinear l;
  l.out = spec.out;
  l.in = spec.in;
  ASSIGN_OR_RETURN(std::vector<float> bias, JoinBias(spec));
  const bool biased = !bias.empty();
  if (biased) {
    ASSIGN_OR_RETURN(l.bias, Upload(std::move(bias), spec.name));
  }
  int64_t first_row = 0;
  for (HostFp8Part& h : host) {
    const int64_t part_rows = h.rows;
    ASSIGN_OR_RETURN(CudaFp8Part p, UploadFp8Part(std::move(h), biased, spec.name, u, bytes));
    p.first_row = first_row;
    first_row += part_rows;
    l.fp8.push_back(std::move(p));
  }
  CudaFp8Workspace::Needs& n = u->needs;
  n.max_in = std::max(n.max_in, l.in);
  n.max_out = std::max(n.max_out, l.out);
  if (l.fp8.size() > 1) {
    n.parts_out = true;
    for (const CudaFp8Part& p : l.fp8) n.max_part_rows = std::max(n.max_part_rows, p.rows);
  }
  ++u->linears;
  u->parts += static_cast<int64_t>(l.fp8.size());
  return l;
}

absl::StatusOr<CudaLinear> MakeLinear(LinearSpec spec, int64_t* bytes);

// A linear of `spec`'s sources: FP8 when `layer` holds scales for all of
// them, bf16 when for none; a mix is UNIMPLEMENTED (as on the CPU).
absl::StatusOr<CudaLinear> MakeLinearOf(LinearSpec spec, const model::LayerWeights* layer,
                                        Fp8Upload* u, int64_t* bytes) {
  size_t quantized = 0;
  for (const SourceSlice& s : spec.sources) {
    quantized += layer != nullptr && layer->Fp8ScalesOf(*s.tensor) != nullptr;
  }
  if (quantized > 0) {
    if (quantized != spec.sources.size() || u->quant == nullptr) {
      std::string names;
      for (const SourceSlice& s : spec.sources) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", s.tensor->name);
      }
      return absl::UnimplementedError(
          absl::StrCat(spec.name, ": fused linear of ", names,
                       " mixes FP8 and unquantized weights (not supported)"));
    }
    return MakeFp8Linear(std::move(spec), *layer, u, bytes);
  }
  for (const SourceSlice& s : spec.sources) {
    spec.weight.push_back(SliceBf16(*s.tensor, s.dim, s.range.start, s.range.size));
  }
  return MakeLinear(std::move(spec), bytes);
}

absl::StatusOr<CudaLinear> MakeLinear(LinearSpec spec, int64_t* bytes) {
  std::vector<Bf16> w;
  for (absl::StatusOr<std::vector<Bf16>>& p : spec.weight) {
    if (!p.ok())
      return absl::Status(p.status().code(), absl::StrCat(spec.name, ": ", p.status().message()));
    w.insert(w.end(), p->begin(), p->end());
  }
  if (static_cast<int64_t>(w.size()) != spec.out * spec.in) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": ", w.size(), " weight values, expected ", spec.out, " x ", spec.in));
  }
  CudaLinear l;
  l.out = spec.out;
  l.in = spec.in;
  *bytes += static_cast<int64_t>(w.size() * sizeof(Bf16));
  absl::StatusOr<DeviceBuffer> wb = Upload(std::move(w), spec.name, spec.order);
  if (!wb.ok()) return wb.status();
  l.weight = std::move(*wb);
  if (!spec.bias.empty()) {
    std::vector<float> b;
    for (absl::StatusOr<std::vector<float>>& p : spec.bias) {
      if (!p.ok())
        return absl::Status(p.status().code(),
                            absl::StrCat(spec.name, " bias: ", p.status().message()));
      b.insert(b.end(), p->begin(), p->end());
    }
    if (static_cast<int64_t>(b.size()) != spec.out) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": ", b.size(), " bias values, expected ", spec.out));
    }
    absl::StatusOr<DeviceBuffer> bb = Upload(std::move(b), spec.name, spec.order);
    if (!bb.ok()) return bb.status();
    l.bias = std::move(*bb);
  }
  return l;
}

absl::StatusOr<DeviceBuffer> UploadNorm(const model::TensorView& t,
                                        const std::vector<int64_t>* order = nullptr) {
  absl::StatusOr<std::vector<float>> f = model::ToFloat32(t);
  if (!f.ok()) return f.status();
  return Upload(std::move(*f), t.name, order);
}

// Entry i of the result is a[b[i]]: permutation b applied after a.
std::vector<int64_t> Compose(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out(b.size());
  for (size_t i = 0; i < b.size(); ++i) out[i] = a[b[i]];
  return out;
}

// The fused q/k/v rows with each q and k head in PartialRotaryOrder, v as
// it is.
std::vector<int64_t> PartialRotaryRowOrder(int64_t q_rows, int64_t k_rows, int64_t head_dim,
                                           int64_t rotary) {
  const std::vector<int64_t> head = PartialRotaryOrder(head_dim, rotary);
  std::vector<int64_t> order(q_rows + 2 * k_rows);
  for (int64_t r = 0; r < static_cast<int64_t>(order.size()); ++r) order[r] = r;
  for (int64_t base = 0; base < q_rows + k_rows; base += head_dim) {
    for (int64_t i = 0; i < head_dim; ++i) order[base + i] = base + head[i];
  }
  return order;
}

// What every layer's upload shares: the row orders decided once.
struct LayerLayouts {
  parallel::Range q_rows, kv_rows;
  std::vector<int64_t> qkv_order;     // empty = as stored
  std::vector<int64_t> head_order;    // q/k norm weights; empty = as stored
  std::vector<int64_t> dense_order;   // dense gate/up; empty = as stored
  std::vector<int64_t> shared_order;  // shared experts' gate/up; empty = as stored
};

LayerLayouts DecideLayouts(const model::ModelConfig& c, const parallel::ShardPlan& plan,
                           const CudaWeights& out) {
  const int64_t D = c.head_dim, R = c.rotary_dim();
  LayerLayouts l;
  l.q_rows = {plan.q_heads.start * D, plan.q_heads.size * D};
  l.kv_rows = {plan.kv_heads.start * D, plan.kv_heads.size * D};
  std::vector<int64_t> partial;
  if (R != D) {
    partial = PartialRotaryRowOrder(l.q_rows.size, l.kv_rows.size, D, R);
    l.head_order = PartialRotaryOrder(D, R);
  }
  if (out.qkv_rope_order) {
    const std::vector<int64_t> rope = RopeRowOrder(l.q_rows.size, l.kv_rows.size, D);
    l.qkv_order = partial.empty() ? rope : Compose(partial, rope);
  } else {
    l.qkv_order = std::move(partial);
  }
  if (out.gate_up_interleaved) {
    l.dense_order = GateUpRowOrder(plan.intermediate.size);
    if (plan.shared_intermediate.size > 0) {
      l.shared_order = GateUpRowOrder(plan.shared_intermediate.size);
    }
  }
  return l;
}

const std::vector<int64_t>* OrNull(const std::vector<int64_t>& order) {
  return order.empty() ? nullptr : &order;
}

// q/k/v (+ biases), o_proj, the norms of layer `name`.
absl::Status UploadAttention(const model::LayerWeights& lw, const parallel::ShardPlan& plan,
                             const LayerLayouts& lay, int64_t H, const std::string& name,
                             CudaLayerWeights* l, Fp8Upload* fp8, int64_t* bytes) {
  const parallel::Range q_rows = lay.q_rows, kv_rows = lay.kv_rows;
  LinearSpec qkv{absl::StrCat(name, " qkv"),     {}, {},
                 q_rows.size + 2 * kv_rows.size, H,  OrNull(lay.qkv_order)};
  qkv.sources = {{&lw.q_proj, 0, q_rows}, {&lw.k_proj, 0, kv_rows}, {&lw.v_proj, 0, kv_rows}};
  if (lw.q_bias && lw.k_bias && lw.v_bias) {
    qkv.bias.push_back(SliceF32(*lw.q_bias, q_rows.start, q_rows.size));
    qkv.bias.push_back(SliceF32(*lw.k_bias, kv_rows.start, kv_rows.size));
    qkv.bias.push_back(SliceF32(*lw.v_bias, kv_rows.start, kv_rows.size));
  }
  // o_proj is row-parallel: this rank's input columns; the rank that adds
  // row biases holds them.
  LinearSpec o{absl::StrCat(name, " o_proj"), {}, {}, H, q_rows.size, nullptr};
  o.sources = {{&lw.o_proj, 1, q_rows}};
  if (lw.o_bias && plan.add_row_bias) o.bias.push_back(model::ToFloat32(*lw.o_bias));
  ASSIGN_OR_RETURN(l->qkv, MakeLinearOf(std::move(qkv), &lw, fp8, bytes));
  ASSIGN_OR_RETURN(l->o, MakeLinearOf(std::move(o), &lw, fp8, bytes));
  ASSIGN_OR_RETURN(l->input_norm, UploadNorm(lw.input_layernorm));
  ASSIGN_OR_RETURN(l->post_norm, UploadNorm(lw.post_attention_layernorm));
  if (lw.q_norm) {
    ASSIGN_OR_RETURN(l->q_norm, UploadNorm(*lw.q_norm, OrNull(lay.head_order)));
  }
  if (lw.k_norm) {
    ASSIGN_OR_RETURN(l->k_norm, UploadNorm(*lw.k_norm, OrNull(lay.head_order)));
  }
  return absl::OkStatus();
}

// A SwiGLU MLP's fused gate/up (rows `rows` of each, in `order`) and its
// row-parallel down (the matching columns), with optional biases.
struct SwiGluSpec {
  const model::TensorView *gate, *up, *down;
  const std::optional<model::TensorView>*gate_bias = nullptr, *up_bias = nullptr,
        *down_bias = nullptr;
  parallel::Range rows;
  const std::vector<int64_t>* order = nullptr;
  bool add_row_bias = true;
  const model::LayerWeights* layer = nullptr;  // holds FP8 scales; null: bf16
  Fp8Upload* fp8 = nullptr;
};

absl::Status UploadSwiGlu(const SwiGluSpec& s, int64_t H, const std::string& name,
                          CudaLinear* gate_up_out, CudaLinear* down_out, int64_t* bytes) {
  LinearSpec gate_up{absl::StrCat(name, " gate_up"), {}, {}, 2 * s.rows.size, H, s.order};
  gate_up.sources = {{s.gate, 0, s.rows}, {s.up, 0, s.rows}};
  if (s.gate_bias && *s.gate_bias && s.up_bias && *s.up_bias) {
    gate_up.bias.push_back(SliceF32(**s.gate_bias, s.rows.start, s.rows.size));
    gate_up.bias.push_back(SliceF32(**s.up_bias, s.rows.start, s.rows.size));
  }
  LinearSpec down{absl::StrCat(name, " down_proj"), {}, {}, H, s.rows.size, nullptr};
  down.sources = {{s.down, 1, s.rows}};
  if (s.down_bias && *s.down_bias && s.add_row_bias) {
    down.bias.push_back(model::ToFloat32(**s.down_bias));
  }
  Fp8Upload none;
  Fp8Upload* fp8 = s.fp8 != nullptr ? s.fp8 : &none;
  ASSIGN_OR_RETURN(*gate_up_out, MakeLinearOf(std::move(gate_up), s.layer, fp8, bytes));
  ASSIGN_OR_RETURN(*down_out, MakeLinearOf(std::move(down), s.layer, fp8, bytes));
  return absl::OkStatus();
}

// Every held expert's gate/up rows and down columns (this rank's slice of
// each), stacked as moe_expert_weights.h wants.
absl::Status UploadExperts(const model::MoeWeights& w, const parallel::ShardPlan& plan,
                           const std::string& name, CudaMoeWeights* m, int64_t* bytes) {
  const parallel::Range held = plan.experts, inter = plan.expert_intermediate;
  if (held.end() > static_cast<int64_t>(w.experts.size()) || held.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": experts [", held.start, ", ", held.end(), ") of ", w.experts.size()));
  }
  std::vector<Bf16> gate_up, down;
  for (int64_t e = held.start; e < held.end(); ++e) {
    const model::ExpertWeights& ew = w.experts[e];
    for (absl::StatusOr<std::vector<Bf16>> part :
         {SliceBf16(ew.gate_proj, 0, inter.start, inter.size),
          SliceBf16(ew.up_proj, 0, inter.start, inter.size)}) {
      if (!part.ok()) return part.status();
      gate_up.insert(gate_up.end(), part->begin(), part->end());
    }
    absl::StatusOr<std::vector<Bf16>> d = SliceBf16(ew.down_proj, 1, inter.start, inter.size);
    if (!d.ok()) return d.status();
    down.insert(down.end(), d->begin(), d->end());
  }
  *bytes += static_cast<int64_t>((gate_up.size() + down.size()) * sizeof(Bf16));
  ASSIGN_OR_RETURN(m->gate_up, Upload(std::move(gate_up), absl::StrCat(name, " experts gate_up")));
  ASSIGN_OR_RETURN(m->down, Upload(std::move(down), absl::StrCat(name, " experts down")));
  m->num_experts = static_cast<int>(held.size);
  m->first_expert = static_cast<int32_t>(held.start);
  m->inter = inter.size;
  return absl::OkStatus();
}

absl::StatusOr<CudaMoeWeights> UploadMoe(const model::ModelConfig& c, const model::MoeWeights& w,
                                         const parallel::ShardPlan& plan, const LayerLayouts& lay,
                                         const std::string& name, int64_t* bytes) {
  const int64_t H = c.hidden_size, E = c.moe->num_experts;
  CudaMoeWeights m;
  ASSIGN_OR_RETURN(m.routing, MoeRoutingFor(*c.moe));
  // The router is replicated: every rank routes every token alike.
  LinearSpec router{absl::StrCat(name, " router"), {}, {}, E, H, nullptr};
  router.weight.push_back(ToBf16(w.router));
  ASSIGN_OR_RETURN(m.router, MakeLinear(std::move(router), bytes));
  if (c.moe->has_correction_bias()) {
    if (!w.correction_bias) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no e_score_correction_bias"));
    }
    ASSIGN_OR_RETURN(m.correction_bias, UploadNorm(*w.correction_bias));
    m.routing.correction_bias = m.correction_bias.as<float>();
  }
  RETURN_IF_ERROR(UploadExperts(w, plan, name, &m, bytes));
  RETURN_IF_ERROR(kcu::ValidateMoeExpertWeights(m.experts(H), name));
  if (w.shared && plan.shared_intermediate.size > 0) {
    SwiGluSpec s{&w.shared->gate_proj, &w.shared->up_proj, &w.shared->down_proj};
    s.rows = plan.shared_intermediate;
    s.order = OrNull(lay.shared_order);
    RETURN_IF_ERROR(UploadSwiGlu(s, H, absl::StrCat(name, " shared experts"), &m.shared_gate_up,
                                 &m.shared_down, bytes));
    m.shared_inter = plan.shared_intermediate.size;
  }
  return m;
}

absl::Status UploadLayer(const model::ModelConfig& c, const model::LayerWeights& lw,
                         const parallel::ShardPlan& plan, const LayerLayouts& lay, int64_t i,
                         CudaLayerWeights* l, Fp8Upload* fp8, int64_t* bytes) {
  const std::string name = absl::StrCat("layer ", i);
  RETURN_IF_ERROR(UploadAttention(lw, plan, lay, c.hidden_size, name, l, fp8, bytes));
  if (c.IsSparseLayer(i)) {
    if (!lw.moe) return absl::InvalidArgumentError(absl::StrCat(name, ": no MoE weights"));
    ASSIGN_OR_RETURN(l->moe, UploadMoe(c, *lw.moe, plan, lay, name, bytes));
    return absl::OkStatus();
  }
  SwiGluSpec s{&lw.gate_proj, &lw.up_proj, &lw.down_proj,
               &lw.gate_bias, &lw.up_bias, &lw.down_bias};
  s.rows = plan.intermediate;
  s.order = OrNull(lay.dense_order);
  s.add_row_bias = plan.add_row_bias;
  s.layer = &lw;
  s.fp8 = fp8;
  return UploadSwiGlu(s, c.hidden_size, name, &l->gate_up, &l->down, bytes);
}

// The FP8 linears' workspace and the plan line (CudaWeights::fp8_plan).
absl::Status FinishFp8(const model::ModelConfig& c, const Fp8Upload& fp8, CudaWeights* out) {
  ASSIGN_OR_RETURN(out->fp8_workspace, CudaFp8Workspace::Create(fp8.needs));
  for (CudaLayerWeights& l : out->layers) {
    for (CudaLinear* linear : {&l.qkv, &l.o, &l.gate_up, &l.down}) {
      if (linear->is_fp8()) linear->fp8_workspace = out->fp8_workspace.get();
    }
  }
  const bool weight_only = fp8.quant->activation == model::ActivationQuant::kNone;
  out->fp8_plan = absl::StrCat(
      c.quantization->Describe(), "; ", fp8.linears, " FP8 linears in ", fp8.parts,
      " parts; decode (<= ", kcu::kFp8GemvMaxRows, " tokens): ",
      weight_only ? "weight-only FP8 dequantizes to bf16 on every call (no bf16-activation FP8 "
                    "GEMV yet) + the bf16 GEMM"
                  : "fp8 GEMV (e4m3 weights, activations quantized as the format says)",
      "; prefill: ", fp8.cublaslt_parts, " parts ", std::string(kernels::kCublasLtFp8BlockBackend),
      ", ", fp8.dequant_parts, " parts ", std::string(kernels::kCudaFp8DequantBackend),
      fp8.prefill == CudaFp8Prefill::kCublasLtBlock
          ? " (cuBLASLt's block mode needs 128x128 weight scales, activations per group of 128 "
            "and no bias)"
          : " (the registry's choice on this device)",
      "; off for FP8 (their GEMV epilogues read bf16 weights): RoPE/KV in the qkv GEMV, the "
      "staged GEMV, SiLU*mul in the gate/up GEMV");
  LogInfo("cuda fp8 plan", {{"plan", out->fp8_plan}});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceBuffer> AllocateDevice(size_t bytes, std::string_view what) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating ", std::string(what), " (",
                                                     bytes >> 20,
                                                     " MiB) on the GPU: ", b.status().ToString()));
  }
  return b;
}

bool UsesQkvRopeOrder(const model::ModelConfig& config) {
  return !config.qk_norm && config.head_dim % 16 == 0 && !config.quantization;
}

bool UsesGateUpInterleaved(const parallel::ShardPlan& plan) {
  return plan.intermediate.size % 4 == 0 && plan.shared_intermediate.size % 4 == 0;
}

std::vector<int64_t> PartialRotaryOrder(int64_t head_dim, int64_t rotary) {
  const int64_t half = head_dim / 2, rot = rotary / 2, pass = half - rot;
  std::vector<int64_t> order(head_dim);
  for (int64_t i = 0; i < rot; ++i) {
    order[i] = i;               // the first halves of the rotated pairs
    order[half + i] = rot + i;  // their partners
  }
  for (int64_t i = 0; i < pass; ++i) {
    order[rot + i] = rotary + i;  // the pass-through dims, in two runs
    order[half + rot + i] = rotary + pass + i;
  }
  return order;
}

int64_t DenseMlpWidth(const model::ModelConfig& config, const parallel::ShardPlan& plan) {
  int64_t width = 0;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (!config.IsSparseLayer(i)) width = plan.intermediate.size;
  }
  return std::max(width, plan.shared_intermediate.size);
}

absl::StatusOr<kcu::MoeRoutingParams> MoeRoutingFor(const model::MoeConfig& moe) {
  kcu::MoeRoutingParams p;
  p.scoring = moe.scoring == model::MoeScoring::kSoftmax ? kcu::MoeScoring::kSoftmax
                                                         : kcu::MoeScoring::kSigmoidGrouped;
  p.num_experts = static_cast<int>(moe.num_experts);
  p.top_k = static_cast<int>(moe.top_k);
  p.renormalize = moe.norm_topk_prob;
  p.num_groups = static_cast<int>(moe.n_group);
  p.topk_groups = static_cast<int>(moe.topk_group);
  p.scaling_factor = static_cast<float>(moe.routed_scaling_factor);
  RETURN_IF_ERROR(kcu::ValidateMoeRouting(p));
  return p;
}

absl::StatusOr<DeviceBuffer> UploadRopeFrequencies(const model::ModelConfig& config) {
  absl::StatusOr<std::vector<float>> inv_freq = model::RopeInverseFrequencies(config);
  if (!inv_freq.ok()) return inv_freq.status();
  // Partial RoPE: the pass-through pairs rotate by angle 0.
  inv_freq->resize(static_cast<size_t>(config.head_dim / 2), 0.0f);
  return Upload(std::move(*inv_freq), "inv_freq");
}

absl::StatusOr<CudaWeights> UploadWeights(const model::LoadedModel& model,
                                          const parallel::ShardPlan& plan) {
  return UploadWeights(model, plan, CudaFp8UploadOptions{});
}

std::string DescribeFp8Plan(const CudaWeights& weights) { return weights.fp8_plan; }

absl::StatusOr<CudaWeights> UploadWeights(const model::LoadedModel& model,
                                          const parallel::ShardPlan& plan,
                                          const CudaFp8UploadOptions& fp8_options) {
  const model::ModelConfig& c = model.config;
  const model::ModelWeights& w = model.weights;
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("the model holds weights for ", w.layers.size(),
                                                   " layers, its config has ",
                                                   c.num_hidden_layers));
  }
  Fp8Upload fp8;
  if (c.quantization) {
    RETURN_IF_ERROR(CheckCudaFp8Support(c, plan));
    fp8.quant = &*c.quantization;
    if (fp8_options.prefill) {
      fp8.prefill = *fp8_options.prefill;
    } else {
      ASSIGN_OR_RETURN(fp8.prefill, SelectCudaFp8Prefill(nullptr));
    }
  }
  CudaWeights out;
  out.qkv_rope_order = UsesQkvRopeOrder(c);
  out.gate_up_interleaved = UsesGateUpInterleaved(plan) && !c.quantization;
  const LayerLayouts layouts = DecideLayouts(c, plan, out);

  absl::StatusOr<std::vector<Bf16>> embed =
      SliceBf16(w.embed_tokens, 0, plan.vocab.start, plan.vocab.size);
  if (!embed.ok()) return embed.status();
  out.bytes += static_cast<int64_t>(embed->size() * sizeof(Bf16));
  ASSIGN_OR_RETURN(out.embed, Upload(std::move(*embed), "embed_tokens"));
  if (!w.lm_head_tied) {
    absl::StatusOr<std::vector<Bf16>> head =
        SliceBf16(w.lm_head, 0, plan.vocab.start, plan.vocab.size);
    if (!head.ok()) return head.status();
    out.bytes += static_cast<int64_t>(head->size() * sizeof(Bf16));
    ASSIGN_OR_RETURN(out.lm_head_own, Upload(std::move(*head), "lm_head"));
  }
  ASSIGN_OR_RETURN(out.final_norm, UploadNorm(w.norm));
  ASSIGN_OR_RETURN(out.inv_freq, UploadRopeFrequencies(c));

  out.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const model::LayerWeights& lw = w.layers[i];
    if (out.qkv_rope_order && (lw.q_norm || lw.k_norm)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i, " has q/k norms, but the config does not say qk_norm"));
    }
    RETURN_IF_ERROR(UploadLayer(c, lw, plan, layouts, i, &out.layers[i], &fp8, &out.bytes));
  }
  if (fp8.linears > 0) RETURN_IF_ERROR(FinishFp8(c, fp8, &out));
  return out;
}

}  // namespace tessera::runner
