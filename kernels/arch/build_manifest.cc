#include "kernels/arch/build_manifest.h"

#include <algorithm>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera::kernels::arch {

std::string CodeImage::Name() const {
  std::string out = absl::StrCat(ptx ? "compute_" : "sm_", arch.major, arch.minor);
  if (suffix != '\0') out.push_back(suffix);
  return out;
}

bool CodeImage::RunsOn(SmArch device) const {
  switch (suffix) {
    case 'a':
      return device == arch;
    case 'f':
      return device.major == arch.major && device.minor >= arch.minor;
    default:
      if (ptx) return device >= arch;
      return device.major == arch.major && device.minor >= arch.minor;
  }
}

std::string BuildManifest::ImageList() const {
  if (images.empty()) return "none";
  std::vector<std::string> names;
  for (const CodeImage& i : images) names.push_back(i.Name());
  return absl::StrJoin(names, ", ");
}

std::string CudaVersionString(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

std::optional<BuildManifest> ManifestFromArchList(std::string_view list, int toolkit_version) {
  BuildManifest m;
  m.cuda_built = true;
  m.toolkit_version = toolkit_version;
  m.nvcc_version = CudaVersionString(toolkit_version);
  static const std::regex kEntry("(sm|compute)_([0-9]+)([af]?)");
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(list.data(), list.size()), ';', absl::SkipEmpty())) {
    std::smatch match;
    const std::string entry(part);
    if (!std::regex_match(entry, match, kEntry)) return std::nullopt;
    std::optional<SmArch> arch = ParseSmArch(match[2].str());
    if (!arch) return std::nullopt;
    CodeImage image;
    image.arch = *arch;
    image.ptx = match[1].str() == "compute";
    image.suffix = match[3].str().empty() ? '\0' : match[3].str()[0];
    m.images.push_back(image);
  }
  return m;
}

namespace {

// The entry a user would add to TESSERA_CUDA_ARCHS for `device`.
std::string SuggestedEntries(SmArch device) {
  const std::string sm = absl::StrCat(device.major, device.minor);
  if (!CapabilitiesOf(device)) {
    // A future arch: only PTX of an older virtual arch can reach it.
    return absl::StrCat("a compute_XY PTX entry for an arch <= ", device.ToString(),
                        " (e.g. compute_120), or sm_", sm, " with a newer toolkit");
  }
  return absl::StrCat("sm_", sm, " (SASS) or compute_", sm, " (PTX)");
}

}  // namespace

ImageMatch FindImage(const BuildManifest& build, SmArch device, int driver_version) {
  ImageMatch out;
  if (!build.cuda_built) {
    out.note =
        "this binary was built without the CUDA backend (TESSERA_CUDA=OFF or no nvcc); "
        "rebuild with -DTESSERA_CUDA=ON";
    return out;
  }
  if (driver_version > 0 && build.toolkit_version > 0 &&
      driver_version / 1000 < build.toolkit_version / 1000) {
    out.note = absl::StrCat("the driver supports CUDA ", CudaVersionString(driver_version),
                            " but this binary needs CUDA ", build.toolkit_version / 1000,
                            ".x (built with ", CudaVersionString(build.toolkit_version),
                            "); install a driver for CUDA ", build.toolkit_version / 1000,
                            " (580 or newer for 13.x)");
    return out;
  }
  // Native code first: the newest SASS image that runs on the device.
  const CodeImage* best_sass = nullptr;
  const CodeImage* best_ptx = nullptr;
  for (const CodeImage& image : build.images) {
    if (!image.RunsOn(device)) continue;
    const CodeImage*& best = image.ptx ? best_ptx : best_sass;
    if (best == nullptr || image.arch > best->arch) best = &image;
  }
  if (best_sass != nullptr) {
    out.kind = ImageKind::kSass;
    out.image = *best_sass;
    return out;
  }
  if (best_ptx != nullptr) {
    if (driver_version > 0 && driver_version < build.toolkit_version) {
      out.note = absl::StrCat("only PTX (", best_ptx->Name(), ") matches SM ", device.ToString(),
                              ", and the driver (CUDA ", CudaVersionString(driver_version),
                              ") is older than the toolkit that wrote it (CUDA ",
                              CudaVersionString(build.toolkit_version),
                              "), so it cannot JIT it; update the driver or add ",
                              SuggestedEntries(device), " to TESSERA_CUDA_ARCHS");
      return out;
    }
    out.kind = ImageKind::kPtxJit;
    out.image = *best_ptx;
    out.note = absl::StrCat("degraded: no SASS for SM ", device.ToString(), "; the driver JITs ",
                            best_ptx->Name(),
                            " PTX at first use (slower start-up, no arch-specific "
                            "kernels); add ",
                            SuggestedEntries(device), " to TESSERA_CUDA_ARCHS");
    return out;
  }
  std::vector<std::string> sass, ptx;
  for (const CodeImage& image : build.images) (image.ptx ? ptx : sass).push_back(image.Name());
  out.note =
      absl::StrCat("no code image for SM ", device.ToString(),
                   " in this binary (SASS: ", sass.empty() ? "none" : absl::StrJoin(sass, ", "),
                   "; PTX: ", ptx.empty() ? "none" : absl::StrJoin(ptx, ", "), "); rebuild with ",
                   SuggestedEntries(device), " added to -DTESSERA_CUDA_ARCHS");
  return out;
}

}  // namespace tessera::kernels::arch
