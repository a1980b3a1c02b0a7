// Build identity of the Tessera binaries.
#pragma once

namespace tessera::services {

inline constexpr const char kTesseraVersion[] = TESSERA_VERSION_STRING;
#if defined(TESSERA_HAVE_CUDA) && TESSERA_HAVE_CUDA
inline constexpr bool kTesseraCudaBuilt = true;
#else
inline constexpr bool kTesseraCudaBuilt = false;
#endif

}  // namespace tessera::services
