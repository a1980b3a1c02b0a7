// The build manifest: which CUDA code images this binary carries, embedded at
// compile time from the one TESSERA_CUDA_ARCHS list (cmake/TesseraCuda.cmake),
// and the rules that say whether one of them runs on a device.
//
// Rules (CUDA's binary compatibility, as the driver applies them):
//   sm_XY   SASS   runs on X.y for every y >= Y (same major only)
//   sm_XYf  SASS   family-portable: the same, restricted to family features
//   sm_XYa  SASS   arch-specific: runs on exactly X.Y
//   compute_XY  PTX  JIT-compiled by the driver on any arch >= X.Y, if the
//                    driver is at least as new as the toolkit that wrote it
//   compute_XYa / compute_XYf PTX: exactly X.Y / same major, minor >= Y
// Native SASS is preferred over PTX (no JIT at start-up, arch-tuned code).
//
// Thread-safety: plain values; ThisBuildManifest() is built once.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/arch/sm_arch.h"

namespace tessera::kernels::arch {

struct CodeImage {
  SmArch arch;
  char suffix = '\0';  // '\0', 'a' (arch-specific) or 'f' (family)
  bool ptx = false;    // true: PTX for a virtual arch; false: SASS

  // "sm_90a", "compute_120".
  std::string Name() const;
  // Whether this image can run on `device` (ignoring the driver version).
  bool RunsOn(SmArch device) const;
};

struct BuildManifest {
  bool cuda_built = false;
  std::vector<CodeImage> images;  // in TESSERA_CUDA_ARCHS order
  std::string nvcc_version;       // "13.0.88"; empty without CUDA
  int toolkit_version = 0;        // CUDA version code of the toolkit, 13000 for 13.0

  // "sm_80, sm_86, ..., compute_120" or "none".
  std::string ImageList() const;
};

// Parses a TESSERA_CUDA_ARCHS list ("sm_80;sm_90a;compute_120"); nullopt on a
// malformed entry. Used by tests to describe other builds.
std::optional<BuildManifest> ManifestFromArchList(std::string_view list, int toolkit_version);

// This binary's manifest.
const BuildManifest& ThisBuildManifest();

// Which image the driver will load for a device, and how.
enum class ImageKind { kNone, kSass, kPtxJit };

struct ImageMatch {
  ImageKind kind = ImageKind::kNone;
  std::optional<CodeImage> image;
  // kNone: why, with the fix (which TESSERA_CUDA_ARCHS entry to add or which
  // driver to install). kPtxJit: the degradation to log.
  std::string note;
};

// `driver_version` is the CUDA version the driver supports (cudaDriverGetVersion,
// e.g. 13000). A driver older than the toolkit cannot run this binary at all
// (the runtime refuses), and cannot JIT its PTX.
ImageMatch FindImage(const BuildManifest& build, SmArch device, int driver_version);

// "13.0" from 13000.
std::string CudaVersionString(int version);

}  // namespace tessera::kernels::arch
