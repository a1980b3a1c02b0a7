// Helpers shared by this folder's tests (test-only; not part of the library):
// a fresh temporary directory per call, raw safetensors images built from a
// header string, and the path of checked-in test data.
//
// Thread-safety: MakeTempDir is safe to call concurrently (mkdtemp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace tessera::model::testing {

// A new empty directory under gtest's temporary directory.
inline std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir();
  if (pattern.empty() || pattern.back() != '/') pattern += '/';
  pattern += "tessera_model_XXXXXX";
  char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp failed for " << pattern;
  return pattern;
}

// The 8-byte little-endian encoding of `n` alone.
inline std::string LengthPrefix(uint64_t n) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return out;
}

// 8-byte little-endian length of `header`, the header itself, then `data`.
inline std::string Image(std::string_view header, std::string_view data = {}) {
  std::string out = LengthPrefix(header.size());
  out.append(header);
  out.append(data);
  return out;
}

// worker/model/testdata in the source tree: under TESSERA_SOURCE_DIR when set
// (ctest sets it), else the path compiled in by CMakeLists.txt.
inline std::string TestDataDir() {
  if (const char* root = std::getenv("TESSERA_SOURCE_DIR")) {
    return std::string(root) + "/worker/model/testdata";
  }
#ifdef TESSERA_MODEL_TESTDATA
  return TESSERA_MODEL_TESTDATA;
#else
  return "worker/model/testdata";
#endif
}

}  // namespace tessera::model::testing
