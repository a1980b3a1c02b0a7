// Multi-head latent attention on the CPU (cpu_mla_attention.h) on random
// DeepseekV3ForCausalLM checkpoints from test_model.h:
//   - one layer's attention against an independent double-precision
//     implementation of transformers' formulas (de-interleave + rotate_half,
//     YaRN-scaled cos/sin, per-head keys and values expanded from the
//     latent), with and without q_lora_rank, interleaved or not;
//   - the absorbed form (decode) against the naive form, over a whole model,
//     for prefill and every decode step;
//   - prefill in chunks and token by token equal to one prefill (the latent
//     cache holds what later tokens need);
//   - a token tree attending to its ancestors only;
//   - the runner refuses tensor parallelism for MLA.
// Tolerances: fp32 against double, 2e-5 relative to the output's scale;
// absorbed against naive (fp32 both, reassociated products) 1e-4 relative
// to the logits' scale; chunked against one prefill, 1e-5.
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8_e4m3.h"
#include "worker/model/rope.h"
#include "worker/model/weights.h"
#include "worker/runner/cpu_mla_attention.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::runner {
namespace {

std::string TempDir() {
  std::string pattern = "/tmp/tessera-mla-XXXXXX";
  char* dir = mkdtemp(pattern.data());
  return dir ? std::string(dir) : "/tmp";
}

TestModelSpec MlaSpec() {
  TestModelSpec s;
  s.architecture = "DeepseekV3ForCausalLM";
  s.layers = 3;
  s.heads = 4;
  s.kv_heads = 4;
  s.experts = 8;
  s.top_k = 2;
  s.groups = 4;
  s.topk_groups = 2;
  s.routed_scaling = 2.5;
  s.first_dense_layers = 1;
  s.weight_scale = 0.3f;  // attention far from uniform
  return s;
}

std::unique_ptr<model::LoadedModel> Load(const TestModelSpec& spec) {
  const std::string dir = TempDir();
  absl::Status written = WriteTestModel(dir, spec);
  EXPECT_TRUE(written.ok()) << written;
  auto m = model::LoadModel(dir);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<double> Doubles(const model::TensorView& t) {
  auto f = model::ToFloat32(t);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::vector<double>(f->begin(), f->end()) : std::vector<double>();
}

// y [rows] = W [rows, cols] x [cols].
std::vector<double> MatVec(const std::vector<double>& w, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  }
  return y;
}

std::vector<double> RmsNorm(std::vector<double> x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * inv * w[i];
  return x;
}

// transformers: (de-interleave), then x * cos + rotate_half(x) * sin with
// cos/sin scaled by the attention factor.
std::vector<double> Rope(std::vector<double> x, int pos, const std::vector<float>& inv_freq,
                         double factor, bool interleave) {
  const size_t half = x.size() / 2;
  std::vector<double> y = x;
  if (interleave) {
    for (size_t i = 0; i < half; ++i) {
      y[i] = x[2 * i];
      y[half + i] = x[2 * i + 1];
    }
  }
  std::vector<double> out(x.size());
  for (size_t i = 0; i < half; ++i) {
    const double angle = double{static_cast<float>(pos) * inv_freq[i]};
    const double c = std::cos(angle) * factor, s = std::sin(angle) * factor;
    out[i] = y[i] * c - y[half + i] * s;
    out[half + i] = y[half + i] * c + y[i] * s;
  }
  return out;
}

// Layer 0's attention output for the hidden states x [n][H] at positions
// 0..n-1 (causal), as transformers' DeepseekV3Attention computes it.
std::vector<std::vector<double>> ReferenceAttention(const model::LoadedModel& m,
                                                    const std::vector<std::vector<double>>& x) {
  const model::ModelConfig& c = m.config;
  const model::MlaConfig& mla = *c.mla;
  const model::LayerWeights& lw = m.weights.layers[0];
  const int heads = static_cast<int>(c.num_attention_heads);
  const int dn = mla.qk_nope_head_dim, dr = mla.qk_rope_head_dim, dv = mla.v_head_dim;
  const int r = mla.kv_lora_rank, qk = dn + dr;
  auto inv_freq = model::RopeInverseFrequencies(c);
  EXPECT_TRUE(inv_freq.ok());
  const std::vector<double> kv_a = Doubles(lw.mla->kv_a_proj_with_mqa);
  const std::vector<double> kv_norm = Doubles(lw.mla->kv_a_layernorm);
  const std::vector<double> kv_b = Doubles(lw.mla->kv_b_proj);
  const std::vector<double> o = Doubles(lw.o_proj);
  const size_t n = x.size();
  std::vector<std::vector<double>> q(n), k_pe(n), k_nope(n), v(n);
  for (size_t t = 0; t < n; ++t) {
    if (mla.q_lora_rank > 0) {
      q[t] = MatVec(Doubles(*lw.mla->q_b_proj), RmsNorm(MatVec(Doubles(*lw.mla->q_a_proj), x[t]),
                                                        Doubles(*lw.mla->q_a_layernorm), 1e-6));
    } else {
      q[t] = MatVec(Doubles(*lw.mla->q_proj), x[t]);
    }
    for (int h = 0; h < heads; ++h) {
      std::vector<double> pe(q[t].begin() + h * qk + dn, q[t].begin() + (h + 1) * qk);
      pe = Rope(pe, static_cast<int>(t), *inv_freq, mla.rope_attention_factor, mla.rope_interleave);
      std::copy(pe.begin(), pe.end(), q[t].begin() + h * qk + dn);
    }
    const std::vector<double> a = MatVec(kv_a, x[t]);
    const std::vector<double> latent =
        RmsNorm(std::vector<double>(a.begin(), a.begin() + r), kv_norm, 1e-6);
    k_pe[t] = Rope(std::vector<double>(a.begin() + r, a.end()), static_cast<int>(t), *inv_freq,
                   mla.rope_attention_factor, mla.rope_interleave);
    const std::vector<double> kv = MatVec(kv_b, latent);  // [heads * (dn + dv)]
    for (int h = 0; h < heads; ++h) {
      const auto head = kv.begin() + h * (dn + dv);
      k_nope[t].insert(k_nope[t].end(), head, head + dn);
      v[t].insert(v[t].end(), head + dn, head + dn + dv);
    }
  }
  std::vector<std::vector<double>> out(n);
  for (size_t t = 0; t < n; ++t) {
    std::vector<double> attn(heads * dv, 0.0);
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s(t + 1);
      double max_s = -1e300;
      for (size_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int i = 0; i < dn; ++i) dot += q[t][h * qk + i] * k_nope[j][h * dn + i];
        for (int i = 0; i < dr; ++i) dot += q[t][h * qk + dn + i] * k_pe[j][i];
        s[j] = dot * mla.softmax_scale;
        max_s = std::max(max_s, s[j]);
      }
      double total = 0;
      for (double& e : s) total += (e = std::exp(e - max_s));
      for (size_t j = 0; j <= t; ++j) {
        for (int d = 0; d < dv; ++d) attn[h * dv + d] += s[j] / total * v[j][h * dv + d];
      }
    }
    out[t] = MatVec(o, attn);
  }
  return out;
}

struct Variant {
  int q_lora_rank;
  bool interleave;
  bool yarn;
};

class MlaLayerTest : public ::testing::TestWithParam<Variant> {};

TEST_P(MlaLayerTest, MatchesTransformersFormulasInDouble) {
  TestModelSpec spec = MlaSpec();
  spec.q_lora_rank = GetParam().q_lora_rank;
  spec.rope_interleave = GetParam().interleave;
  spec.yarn = GetParam().yarn;
  auto m = Load(spec);
  ASSERT_NE(m, nullptr);
  auto inv_freq = model::RopeInverseFrequencies(m->config);
  ASSERT_TRUE(inv_freq.ok());
  CpuWeightLoader loader;
  auto attention = CpuMlaAttention::Prepare(m->config, m->weights.layers[0], *inv_freq, &loader);
  ASSERT_TRUE(attention.ok()) << attention.status();

  const int n = 11, H = spec.hidden, block_size = 4;
  std::vector<std::vector<double>> x(n, std::vector<double>(H));
  std::vector<float> xf(n * H);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < H; ++i) {
      x[t][i] = std::sin(0.37 * (t + 1) * (i + 3)) * 1.5;
      xf[t * H + i] = static_cast<float>(x[t][i]);
    }
  }
  ForwardBatch batch;
  batch.block_table_stride = 8;
  std::vector<int32_t> blocks = {5, 2, 7, 0};  // not in order: paging matters
  std::vector<int32_t> prompt(n, 3);
  batch.AddSequence(prompt, 0, blocks, block_size, true);
  const int64_t L = m->config.mla->latent_dim();
  std::vector<float> cache_data(8 * block_size * L, 0.0f);
  MlaLatentCache cache{cache_data.data(), 8 * block_size, L, block_size};
  for (MlaForm form : {MlaForm::kAbsorbed, MlaForm::kNaive}) {
    SCOPED_TRACE(form == MlaForm::kAbsorbed ? "absorbed" : "naive");
    MlaScratch scratch;
    std::vector<float> out(n * H);
    attention->Run(kernels::cpu::DefaultCpuContext(), kernels::ReferenceCpuKernels(), xf.data(),
                   batch, cache, form, &scratch, out.data());
    const auto want = ReferenceAttention(*m, x);
    double scale = 1e-3, err = 0;
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < H; ++i) {
        scale = std::max(scale, std::abs(want[t][i]));
        err = std::max(err, std::abs(want[t][i] - out[t * H + i]));
      }
    }
    EXPECT_LE(err, 2e-5 * scale) << "max abs error " << err << " at scale " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MlaLayerTest,
                         ::testing::Values(Variant{24, true, true}, Variant{0, true, true},
                                           Variant{24, false, true}, Variant{0, false, false}));

std::unique_ptr<CpuModelRunner> MakeRunner(const model::LoadedModel* m, MlaForm form) {
  CpuRunnerOptions o;
  o.block_size = 4;
  o.num_kv_blocks = 64;
  o.mla_form = form;
  auto r = CpuModelRunner::Create(m, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(*r) : nullptr;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 1;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(MlaRunnerTest, AbsorbedAndNaiveFormsAgreeOverAWholeModel) {
  for (int q_lora : {24, 0}) {
    SCOPED_TRACE(q_lora);
    TestModelSpec spec = MlaSpec();
    spec.q_lora_rank = q_lora;
    auto m = Load(spec);
    ASSERT_NE(m, nullptr);
    auto absorbed = MakeRunner(m.get(), MlaForm::kAbsorbed);
    auto naive = MakeRunner(m.get(), MlaForm::kNaive);
    ASSERT_TRUE(absorbed && naive);
    std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 41, 8, 8, 77, 120, 6, 33, 200};
    std::vector<int32_t> blocks(16);
    std::iota(blocks.begin(), blocks.end(), 0);
    ForwardBatch prefill;
    prefill.block_table_stride = 16;
    prefill.AddSequence(prompt, 0, blocks, 4, false);
    for (int i = 0; i < static_cast<int>(prompt.size()); ++i) prefill.logits_indices.push_back(i);
    std::vector<float> a, b;
    ASSERT_TRUE(absorbed->Forward(prefill, &a).ok());
    ASSERT_TRUE(naive->Forward(prefill, &b).ok());
    EXPECT_LE(MaxDiff(a, b), 1e-4f * MaxAbs(b));
    int32_t pos = static_cast<int32_t>(prompt.size());
    for (int step = 0; step < 6; ++step) {
      ForwardBatch decode;
      decode.block_table_stride = 16;
      decode.AddSequence({static_cast<int32_t>(10 + 31 * step)}, pos++, blocks, 4, true);
      ASSERT_TRUE(absorbed->Forward(decode, &a).ok());
      ASSERT_TRUE(naive->Forward(decode, &b).ok());
      EXPECT_LE(MaxDiff(a, b), 1e-4f * MaxAbs(b)) << "decode step " << step;
    }
  }
}

TEST(MlaRunnerTest, ChunkedPrefillAndDecodeEqualOnePrefill) {
  auto m = Load(MlaSpec());
  ASSERT_NE(m, nullptr);
  std::vector<int32_t> prompt = {9, 18, 27, 36, 45, 54, 63, 72, 81, 90, 99};
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  auto whole = MakeRunner(m.get(), MlaForm::kAbsorbed);
  ForwardBatch one;
  one.block_table_stride = 8;
  one.AddSequence(prompt, 0, blocks, 4, true);
  std::vector<float> want;
  ASSERT_TRUE(whole->Forward(one, &want).ok());

  auto chunked = MakeRunner(m.get(), MlaForm::kAbsorbed);
  std::vector<float> got;
  const std::vector<std::pair<int, int>> chunks = {{0, 5}, {5, 9}, {9, 10}, {10, 11}};
  for (auto [begin, end] : chunks) {
    ForwardBatch b;
    b.block_table_stride = 8;
    b.AddSequence(std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end), begin, blocks,
                  4, true);
    ASSERT_TRUE(chunked->Forward(b, &got).ok());
  }
  EXPECT_LE(MaxDiff(got, want), 1e-5f * MaxAbs(want));
}

// A tree of two branches after a shared prefix: each leaf sees its own
// branch only, so it matches a chain made of that branch.
TEST(MlaRunnerTest, TokenTreeAttendsToAncestorsOnly) {
  auto m = Load(MlaSpec());
  ASSERT_NE(m, nullptr);
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  const std::vector<int32_t> context = {4, 8, 15, 16};
  auto prefill = [&](CpuModelRunner* r) {
    ForwardBatch b;
    b.block_table_stride = 8;
    b.AddSequence(context, 0, blocks, 4, false);
    std::vector<float> unused;
    ASSERT_TRUE(r->Forward(b, &unused).ok());
  };
  auto tree_runner = MakeRunner(m.get(), MlaForm::kAbsorbed);
  prefill(tree_runner.get());
  // Tree: t0 (root) -> t1, and t0 -> t2.
  ForwardBatch tree;
  tree.block_table_stride = 8;
  tree.AddSequence({23, 42, 77}, 4, blocks, 4, false);
  tree.tree_parents = {-1, 0, 0};
  tree.positions[2] = 5;  // depth 1, as t1
  tree.logits_indices = {2};
  std::vector<float> tree_logits;
  absl::Status tree_status = tree_runner->Forward(tree, &tree_logits);
  ASSERT_TRUE(tree_status.ok()) << tree_status;

  auto chain_runner = MakeRunner(m.get(), MlaForm::kAbsorbed);
  prefill(chain_runner.get());
  ForwardBatch chain;
  chain.block_table_stride = 8;
  chain.AddSequence({23, 77}, 4, blocks, 4, true);
  std::vector<float> chain_logits;
  ASSERT_TRUE(chain_runner->Forward(chain, &chain_logits).ok());
  EXPECT_LE(MaxDiff(tree_logits, chain_logits), 1e-5f * MaxAbs(chain_logits));
}

// An FP8 kv_b_proj (block scales of 16 x 16, several per matrix) is
// dequantized exactly at load: the layer equals the same layer given the
// dequantized values as an fp32 matrix, bit for bit.
TEST(MlaRunnerTest, Fp8KvBIsDequantizedExactly) {
  auto m = Load(MlaSpec());
  ASSERT_NE(m, nullptr);
  const model::LayerWeights& base = m->weights.layers[0];
  const model::TensorView& kv_b = base.mla->kv_b_proj;
  const int64_t rows = kv_b.shape[0], cols = kv_b.shape[1], block = 16;
  const int64_t block_rows = (rows + block - 1) / block, block_cols = (cols + block - 1) / block;
  auto w = model::ToFloat32(kv_b);
  ASSERT_TRUE(w.ok());
  std::vector<float> scales(block_rows * block_cols, 0.0f);
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < cols; ++i) {
      float& s = scales[(o / block) * block_cols + i / block];
      s = std::max(s, std::abs((*w)[o * cols + i]) / kernels::cpu::kE4m3Max);
    }
  }
  std::vector<uint8_t> bits(rows * cols);
  std::vector<float> dequantized(rows * cols);
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < cols; ++i) {
      const float s = scales[(o / block) * block_cols + i / block];
      bits[o * cols + i] = kernels::cpu::FloatToE4m3((*w)[o * cols + i] / s);
      dequantized[o * cols + i] = kernels::cpu::E4m3ToFloat(bits[o * cols + i]) * s;
    }
  }
  auto view = [](const std::string& name, model::DType dtype, std::vector<int64_t> shape,
                 const void* data, size_t bytes) {
    model::TensorView t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = static_cast<const std::byte*>(data);
    t.size_bytes = bytes;
    return t;
  };
  model::ModelConfig config = m->config;
  model::QuantizationConfig q;
  q.block_out = q.block_in = block;
  config.quantization = q;
  model::LayerWeights fp8 = base;
  fp8.mla->kv_b_proj = view(kv_b.name, model::DType::kF8E4M3, kv_b.shape, bits.data(), bits.size());
  fp8.fp8[kv_b.name] =
      model::Fp8Scales{view(kv_b.name + "_scale_inv", model::DType::kF32, {block_rows, block_cols},
                            scales.data(), scales.size() * sizeof(float)),
                       std::nullopt};
  model::LayerWeights dense = base;
  dense.mla->kv_b_proj = view(kv_b.name, model::DType::kF32, kv_b.shape, dequantized.data(),
                              dequantized.size() * sizeof(float));

  auto inv_freq = model::RopeInverseFrequencies(config);
  ASSERT_TRUE(inv_freq.ok());
  CpuWeightLoader loader;
  auto from_fp8 = CpuMlaAttention::Prepare(config, fp8, *inv_freq, &loader);
  ASSERT_TRUE(from_fp8.ok()) << from_fp8.status();
  auto from_dense = CpuMlaAttention::Prepare(m->config, dense, *inv_freq, &loader);
  ASSERT_TRUE(from_dense.ok()) << from_dense.status();

  const int n = 6, H = 64;
  std::vector<float> x(n * H);
  for (int i = 0; i < n * H; ++i) x[i] = std::cos(0.1f * i);
  ForwardBatch batch;
  batch.block_table_stride = 4;
  batch.AddSequence(std::vector<int32_t>(n, 1), 0, {0, 1, 2, 3}, 4, true);
  const int64_t L = config.mla->latent_dim();
  std::vector<float> cache_a(16 * L), cache_b(16 * L), out_a(n * H), out_b(n * H);
  MlaScratch scratch;
  from_fp8->Run(kernels::cpu::DefaultCpuContext(), kernels::ReferenceCpuKernels(), x.data(), batch,
                {cache_a.data(), 16, L, 4}, MlaForm::kAbsorbed, &scratch, out_a.data());
  from_dense->Run(kernels::cpu::DefaultCpuContext(), kernels::ReferenceCpuKernels(), x.data(),
                  batch, {cache_b.data(), 16, L, 4}, MlaForm::kAbsorbed, &scratch, out_b.data());
  EXPECT_EQ(out_a, out_b);
  // And the FP8 values really differ from the original weights (the test
  // would prove nothing otherwise).
  EXPECT_NE(dequantized, *w);
}

TEST(MlaRunnerTest, TensorParallelismIsRefusedClearly) {
  auto m = Load(MlaSpec());
  ASSERT_NE(m, nullptr);
  auto plan = parallel::PlanShard(m->config, 0, 2, parallel::MoeParallelism::kTensor);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CpuRunnerOptions o;
  o.shard = *plan;
  auto r = CpuModelRunner::Create(m.get(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("multi-head latent"));
}

}  // namespace
}  // namespace tessera::runner
