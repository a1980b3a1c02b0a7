// Thin vector types for the optimized CPU kernels: one struct per ISA level
// (Scalar, Avx2, Avx512) with the same static interface, so that one kernel
// body (kernels/cpu/isa_kernels.inc) compiles once per level.
//
// Every intrinsic wrapper carries a function-level target attribute; the
// rest of the binary stays baseline x86-64. A function that calls these
// wrappers must carry the same attribute (TESSERA_TARGET in the .inc) and
// may only run where cpu_features.h says the level is supported.
//
// Interface of a vector struct V:
//   V::F, V::kLanes                  vector type and its fp32 lane count
//   Zero, Set1, Load(p), LoadPartial(p, n), Store, StorePartial
//     Load/LoadPartial accept const float*, const bf16_t*, const fp16_t*
//     and widen to fp32; LoadPartial zero-fills lanes >= n.
//   Add, Sub, Mul, Div, Max, Fma(a, b, c) = a * b + c
//   ReduceSum, ReduceMax, Exp (fast exp, ~2 ulp; exact 0 below ln(FLT_MIN))
//   ReduceSum4(a, b, c, d, out): out[0..3] = the lane sums of a, b, c, d
//   EqualMask(v, s): bit i set when lane i == s
//
// Thread-safety: stateless.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/dtype.h"

#define TESSERA_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TESSERA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace tessera::kernels::cpu::simd {

// Constants of the polynomial exp shared by the vector versions: exp(x) =
// 2^n * e^r with n = round(x / ln2), r = x - n ln2, |r| <= ln2/2, and e^r from
// a degree-6 polynomial (Cephes expf coefficients).
inline constexpr float kExpHi = 88.3762626647949f;   // ln(FLT_MAX)
inline constexpr float kExpLo = -87.3365447505531f;  // ln(FLT_MIN); below: 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

struct Scalar {
  using F = float;
  static constexpr int kLanes = 1;

  static TESSERA_ALWAYS_INLINE F Zero() { return 0.0f; }
  static TESSERA_ALWAYS_INLINE F Set1(float v) { return v; }
  template <typename T>
  static TESSERA_ALWAYS_INLINE F Load(const T* p) {
    return ToF32(*p);
  }
  template <typename T>
  static TESSERA_ALWAYS_INLINE F LoadPartial(const T* p, int n) {
    return n > 0 ? ToF32(*p) : 0.0f;
  }
  static TESSERA_ALWAYS_INLINE void Store(float* p, F v) { *p = v; }
  static TESSERA_ALWAYS_INLINE void StorePartial(float* p, F v, int n) {
    if (n > 0) *p = v;
  }
  static TESSERA_ALWAYS_INLINE F Add(F a, F b) { return a + b; }
  static TESSERA_ALWAYS_INLINE F Sub(F a, F b) { return a - b; }
  static TESSERA_ALWAYS_INLINE F Mul(F a, F b) { return a * b; }
  static TESSERA_ALWAYS_INLINE F Div(F a, F b) { return a / b; }
  static TESSERA_ALWAYS_INLINE F Max(F a, F b) { return std::max(a, b); }
  static TESSERA_ALWAYS_INLINE F Fma(F a, F b, F c) { return a * b + c; }
  static TESSERA_ALWAYS_INLINE float ReduceSum(F v) { return v; }
  static TESSERA_ALWAYS_INLINE float ReduceMax(F v) { return v; }
  static TESSERA_ALWAYS_INLINE void ReduceSum4(F a, F b, F c, F d, float* out) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
  static TESSERA_ALWAYS_INLINE F Exp(F x) { return std::exp(x); }
  static TESSERA_ALWAYS_INLINE uint32_t EqualMask(F v, float s) { return v == s ? 1u : 0u; }
};

struct Avx2 {
  using F = __m256;
  static constexpr int kLanes = 8;

  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Zero() { return _mm256_setzero_ps(); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Set1(float v) { return _mm256_set1_ps(v); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Load(const float* p) {
    return _mm256_loadu_ps(p);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Load(const bf16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Load(const fp16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE __m256i TailMask(int n) {
    static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n));
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F LoadPartial(const float* p, int n) {
    return _mm256_maskload_ps(p, TailMask(n));
  }
  template <typename T>
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F LoadPartial(const T* p, int n) {
    T tmp[kLanes] = {};
    std::memcpy(tmp, p, sizeof(T) * n);
    return Load(tmp);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE void Store(float* p, F v) {
    _mm256_storeu_ps(p, v);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE void StorePartial(float* p, F v, int n) {
    _mm256_maskstore_ps(p, TailMask(n), v);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Add(F a, F b) { return _mm256_add_ps(a, b); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Div(F a, F b) { return _mm256_div_ps(a, b); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Max(F a, F b) { return _mm256_max_ps(a, b); }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Fma(F a, F b, F c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE float ReduceSum(F v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // Sums within 128-bit lanes first: [a0+a2, b0+b2, a1+a3, b1+b3] and the
  // like for c, d; then regroup to [a, b, c, d] per lane and add the lanes.
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE void ReduceSum4(F a, F b, F c, F d, float* out) {
    const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const __m256 abcd = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE float ReduceMax(F v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE F Exp(F x) {
    const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpP0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP5));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n in two halves so that n = 128 (x near ln(FLT_MAX)) does not overflow the exponent.
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256 s1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    const __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_andnot_ps(underflow, result);
  }
  TESSERA_TARGET_AVX2 static TESSERA_ALWAYS_INLINE uint32_t EqualMask(F v, float s) {
    return static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(s), _CMP_EQ_OQ)));
  }
};

struct Avx512 {
  using F = __m512;
  static constexpr int kLanes = 16;

  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Zero() { return _mm512_setzero_ps(); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Set1(float v) { return _mm512_set1_ps(v); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Load(const float* p) {
    return _mm512_loadu_ps(p);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Load(const bf16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Load(const fp16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE __mmask16 TailMask(int n) {
    return static_cast<__mmask16>((1u << n) - 1u);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F LoadPartial(const float* p, int n) {
    return _mm512_maskz_loadu_ps(TailMask(n), p);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F LoadPartial(const bf16_t* p, int n) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(TailMask(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F LoadPartial(const fp16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(TailMask(n), p));
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE void Store(float* p, F v) {
    _mm512_storeu_ps(p, v);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE void StorePartial(float* p, F v, int n) {
    _mm512_mask_storeu_ps(p, TailMask(n), v);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Add(F a, F b) { return _mm512_add_ps(a, b); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Div(F a, F b) { return _mm512_div_ps(a, b); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Max(F a, F b) { return _mm512_max_ps(a, b); }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Fma(F a, F b, F c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE float ReduceSum(F v) {
    __m256 x = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_add_ps(y, _mm_movehl_ps(y, y));
    y = _mm_add_ss(y, _mm_movehdup_ps(y));
    return _mm_cvtss_f32(y);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE void ReduceSum4(F a, F b, F c, F d,
                                                                     float* out) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 halves =
        _mm256_add_ps(_mm512_castps512_ps256(abcd),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
    _mm_storeu_ps(out,
                  _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1)));
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE float ReduceMax(F v) {
    __m256 x = _mm256_max_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_max_ps(y, _mm_movehl_ps(y, y));
    y = _mm_max_ss(y, _mm_movehdup_ps(y));
    return _mm_cvtss_f32(y);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE F Exp(F x) {
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLo), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLo)), _mm512_set1_ps(kExpHi));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kExpP0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
  }
  TESSERA_TARGET_AVX512 static TESSERA_ALWAYS_INLINE uint32_t EqualMask(F v, float s) {
    return _mm512_cmp_ps_mask(v, _mm512_set1_ps(s), _CMP_EQ_OQ);
  }
};

}  // namespace tessera::kernels::cpu::simd
