// The optimized CPU kernels compiled for AVX2 + FMA + F16C (8 fp32 lanes).
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

#define TESSERA_TARGET TESSERA_TARGET_AVX2

namespace tessera::kernels::cpu {
namespace isa_avx2 {

using V = simd::Avx2;
#include "kernels/cpu/isa_kernels.inc"

}  // namespace isa_avx2

const IsaKernels& Avx2Kernels() { return isa_avx2::Kernels(); }

}  // namespace tessera::kernels::cpu
