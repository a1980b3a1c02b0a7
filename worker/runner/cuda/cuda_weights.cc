#include "worker/runner/cuda/cuda_weights.h"

#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/gemv.h"
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

// One fused linear layer: the weight row slices `rows` of each part, or
// column slice `cols` of one part; biases likewise (row slices).
struct LinearSpec {
  std::string name;
  std::vector<absl::StatusOr<std::vector<Bf16>>> weight;
  std::vector<absl::StatusOr<std::vector<float>>> bias;  // empty = no bias
  int64_t out = 0, in = 0;
  const std::vector<int64_t>* order = nullptr;
};

absl::StatusOr<CudaLinear> MakeLinear(LinearSpec spec, int64_t* bytes) {
  std::vector<Bf16> w;
  for (absl::StatusOr<std::vector<Bf16>>& p : spec.weight) {
    if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(spec.name, ": ", p.status().message()));
    w.insert(w.end(), p->begin(), p->end());
  }
  if (static_cast<int64_t>(w.size()) != spec.out * spec.in) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": ", w.size(),
                                                   " weight values, expected ", spec.out, " x ",
                                                   spec.in));
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
      if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(spec.name, " bias: ", p.status().message()));
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

absl::StatusOr<DeviceBuffer> UploadNorm(const model::TensorView& t) {
  absl::StatusOr<std::vector<float>> f = model::ToFloat32(t);
  if (!f.ok()) return f.status();
  return Upload(std::move(*f), t.name);
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
  return !config.qk_norm && config.head_dim % 16 == 0;
}

bool UsesGateUpInterleaved(const parallel::ShardPlan& plan) {
  return plan.intermediate.size % 4 == 0;
}

absl::StatusOr<DeviceBuffer> UploadRopeFrequencies(const model::ModelConfig& config) {
  absl::StatusOr<std::vector<float>> inv_freq = model::RopeInverseFrequencies(config);
  if (!inv_freq.ok()) return inv_freq.status();
  return Upload(std::move(*inv_freq), "inv_freq");
}

absl::StatusOr<CudaWeights> UploadWeights(const model::LoadedModel& model,
                                          const parallel::ShardPlan& plan) {
  const model::ModelConfig& c = model.config;
  const model::ModelWeights& w = model.weights;
  CudaWeights out;
  const int64_t D = c.head_dim, H = c.hidden_size;
  const parallel::Range q_rows{plan.q_heads.start * D, plan.q_heads.size * D};
  const parallel::Range kv_rows{plan.kv_heads.start * D, plan.kv_heads.size * D};
  const parallel::Range inter = plan.intermediate;
  out.qkv_rope_order = UsesQkvRopeOrder(c);
  out.gate_up_interleaved = UsesGateUpInterleaved(plan);
  const std::vector<int64_t> qkv_order =
      out.qkv_rope_order ? RopeRowOrder(q_rows.size, kv_rows.size, D) : std::vector<int64_t>{};
  const std::vector<int64_t> gate_up_order =
      out.gate_up_interleaved ? GateUpRowOrder(inter.size) : std::vector<int64_t>{};

  absl::StatusOr<std::vector<Bf16>> embed = SliceBf16(w.embed_tokens, 0, plan.vocab.start, plan.vocab.size);
  if (!embed.ok()) return embed.status();
  out.bytes += static_cast<int64_t>(embed->size() * sizeof(Bf16));
  absl::StatusOr<DeviceBuffer> e = Upload(std::move(*embed), "embed_tokens");
  if (!e.ok()) return e.status();
  out.embed = std::move(*e);
  if (!w.lm_head_tied) {
    absl::StatusOr<std::vector<Bf16>> head = SliceBf16(w.lm_head, 0, plan.vocab.start, plan.vocab.size);
    if (!head.ok()) return head.status();
    out.bytes += static_cast<int64_t>(head->size() * sizeof(Bf16));
    absl::StatusOr<DeviceBuffer> h = Upload(std::move(*head), "lm_head");
    if (!h.ok()) return h.status();
    out.lm_head_own = std::move(*h);
  }
  absl::StatusOr<DeviceBuffer> norm = UploadNorm(w.norm);
  if (!norm.ok()) return norm.status();
  out.final_norm = std::move(*norm);
  absl::StatusOr<DeviceBuffer> freq = UploadRopeFrequencies(c);
  if (!freq.ok()) return freq.status();
  out.inv_freq = std::move(*freq);

  out.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const model::LayerWeights& lw = w.layers[i];
    CudaLayerWeights& l = out.layers[i];
    const std::string name = absl::StrCat("layer ", i);
    if (out.qkv_rope_order && (lw.q_norm || lw.k_norm)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " has q/k norms, but the config does not say qk_norm"));
    }
    LinearSpec qkv{absl::StrCat(name, " qkv"),
                   {},
                   {},
                   q_rows.size + 2 * kv_rows.size,
                   H,
                   out.qkv_rope_order ? &qkv_order : nullptr};
    qkv.weight.push_back(SliceBf16(lw.q_proj, 0, q_rows.start, q_rows.size));
    qkv.weight.push_back(SliceBf16(lw.k_proj, 0, kv_rows.start, kv_rows.size));
    qkv.weight.push_back(SliceBf16(lw.v_proj, 0, kv_rows.start, kv_rows.size));
    if (lw.q_bias && lw.k_bias && lw.v_bias) {
      qkv.bias.push_back(SliceF32(*lw.q_bias, q_rows.start, q_rows.size));
      qkv.bias.push_back(SliceF32(*lw.k_bias, kv_rows.start, kv_rows.size));
      qkv.bias.push_back(SliceF32(*lw.v_bias, kv_rows.start, kv_rows.size));
    }
    // o_proj and down_proj are row-parallel: this rank's input columns; the
    // rank that adds row biases holds them.
    LinearSpec o{absl::StrCat(name, " o_proj"), {}, {}, H, q_rows.size, nullptr};
    o.weight.push_back(SliceBf16(lw.o_proj, 1, q_rows.start, q_rows.size));
    if (lw.o_bias && plan.add_row_bias) o.bias.push_back(model::ToFloat32(*lw.o_bias));
    LinearSpec gate_up{absl::StrCat(name, " gate_up"), {}, {}, 2 * inter.size, H,
                       out.gate_up_interleaved ? &gate_up_order : nullptr};
    gate_up.weight.push_back(SliceBf16(lw.gate_proj, 0, inter.start, inter.size));
    gate_up.weight.push_back(SliceBf16(lw.up_proj, 0, inter.start, inter.size));
    if (lw.gate_bias && lw.up_bias) {
      gate_up.bias.push_back(SliceF32(*lw.gate_bias, inter.start, inter.size));
      gate_up.bias.push_back(SliceF32(*lw.up_bias, inter.start, inter.size));
    }
    LinearSpec down{absl::StrCat(name, " down_proj"), {}, {}, H, inter.size, nullptr};
    down.weight.push_back(SliceBf16(lw.down_proj, 1, inter.start, inter.size));
    if (lw.down_bias && plan.add_row_bias) down.bias.push_back(model::ToFloat32(*lw.down_bias));
    for (auto [spec, dst] : {std::pair{&qkv, &l.qkv}, std::pair{&o, &l.o},
                             std::pair{&gate_up, &l.gate_up}, std::pair{&down, &l.down}}) {
      absl::StatusOr<CudaLinear> linear = MakeLinear(std::move(*spec), &out.bytes);
      if (!linear.ok()) return linear.status();
      *dst = std::move(*linear);
    }
    for (auto [src, dst] : {std::pair{&lw.input_layernorm, &l.input_norm},
                            std::pair{&lw.post_attention_layernorm, &l.post_norm}}) {
      absl::StatusOr<DeviceBuffer> n = UploadNorm(*src);
      if (!n.ok()) return n.status();
      *dst = std::move(*n);
    }
    if (lw.q_norm) {
      absl::StatusOr<DeviceBuffer> n = UploadNorm(*lw.q_norm);
      if (!n.ok()) return n.status();
      l.q_norm = std::move(*n);
    }
    if (lw.k_norm) {
      absl::StatusOr<DeviceBuffer> n = UploadNorm(*lw.k_norm);
      if (!n.ok()) return n.status();
      l.k_norm = std::move(*n);
    }
  }
  return out;
}

}  // namespace tessera::runner
