// Request priority classes as the router's core sees them (the adapter maps
// tessera.v1.Priority: UNSPECIFIED and NORMAL -> kNormal, LOW -> kLow,
// HIGH -> kHigh). Higher classes are admitted first, and workers schedule
// them ahead of lower ones.
//
// Thread-safety: constants only.
#pragma once

#include <string_view>

namespace tessera::router {

enum class Priority : int { kLow = 0, kNormal = 1, kHigh = 2 };
inline constexpr int kNumPriorities = 3;

inline std::string_view PriorityName(Priority p) {
  switch (p) {
    case Priority::kLow:
      return "low";
    case Priority::kNormal:
      return "normal";
    case Priority::kHigh:
      return "high";
  }
  return "normal";
}

}  // namespace tessera::router
