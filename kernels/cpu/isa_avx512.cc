// The optimized CPU kernels compiled for AVX-512 F/BW/VL/DQ (16 fp32 lanes).
// Only the functions carry the target attribute; see isa_kernels.inc.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd.h"

#define TESSERA_TARGET TESSERA_TARGET_AVX512

// GCC 12 reports the deliberately undefined pass-through operands inside its
// own avx512fintrin.h (_mm512_undefined_*) as uninitialized (GCC PR 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tessera::kernels::cpu {
namespace isa_avx512 {

using V = simd::Avx512;
#include "kernels/cpu/isa_kernels.inc"

}  // namespace isa_avx512

const IsaKernels& Avx512Kernels() { return isa_avx512::Kernels(); }

}  // namespace tessera::kernels::cpu
