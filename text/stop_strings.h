// StopStringMatcher: applies stop strings to a stream of text deltas.
//
// Text that could still turn out to be the start of a stop string is held
// back; once a stop string appears, the text before it is released and
// generation must stop (the router cancels the worker's stream). The stop
// string itself is never emitted, as in the OpenAI API and vLLM.
//
// Thread-safety: not thread-safe; one per request stream.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::router {

class StopStringMatcher {
 public:
  // Empty strings are ignored.
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;                    // safe to emit now
    std::optional<std::string> matched;  // the stop string, when one appeared
  };

  // Feeds a delta. After a match, further input is ignored.
  Result Add(std::string_view delta);
  // End of stream: releases what was held back (no match is possible now).
  std::string Finish();

  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;  // text not yet emitted
  bool matched_ = false;
};

}  // namespace tessera::router
