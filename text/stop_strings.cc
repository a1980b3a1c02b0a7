#include "text/stop_strings.h"

#include <algorithm>

namespace tessera::router {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::Add(std::string_view delta) {
  Result r;
  if (matched_) return r;
  pending_.append(delta);
  if (stops_.empty()) {
    r.text.swap(pending_);
    return r;
  }
  // The earliest complete occurrence of any stop string wins.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      which = &s;
    }
  }
  if (which != nullptr) {
    matched_ = true;
    r.text = pending_.substr(0, best);
    r.matched = *which;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  const size_t limit = std::min(pending_.size(), max_len_ - 1);
  for (size_t n = limit; n > 0; --n) {
    std::string_view tail(pending_.data() + pending_.size() - n, n);
    bool prefix = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) {
      return s.size() > n && std::string_view(s).substr(0, n) == tail;
    });
    if (prefix) {
      hold = n;
      break;
    }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopStringMatcher::Finish() {
  std::string rest;
  if (!matched_) rest.swap(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tessera::router
