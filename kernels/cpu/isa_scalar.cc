// The optimized CPU kernels compiled for portable scalar C++ (baseline x86-64 or any other target).
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

#define TESSERA_TARGET

namespace tessera::kernels::cpu {
namespace isa_scalar {

using V = simd::Scalar;
#include "kernels/cpu/isa_kernels.inc"

}  // namespace isa_scalar

const IsaKernels& ScalarKernels() { return isa_scalar::Kernels(); }

}  // namespace tessera::kernels::cpu
