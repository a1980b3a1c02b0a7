#include "text/parsers/tool_call_emitter.h"

#include <random>
#include <utility>

#include "text/parsers/tag_scan.h"

namespace tessera::text {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

ToolCallEmitter::ToolCallEmitter(uint64_t id_seed) : rng_(id_seed) {
  if (rng_ == 0) {
    std::random_device device;
    rng_ = (uint64_t{device()} << 32) ^ device();
  }
}

std::string ToolCallEmitter::NextId() {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string id = "call_";
  uint64_t bits = 0;
  for (int i = 0; i < 24; ++i) {
    if (i % 12 == 0) bits = SplitMix64(&rng_);
    id.push_back(kAlphabet[bits % 36]);
    bits /= 36;
  }
  return id;
}

void ToolCallEmitter::Content(absl::string_view text, ParsedDelta* out) {
  if (drop_leading_space_) {
    while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    drop_leading_space_ = false;
  }
  size_t end = text.size();
  while (end > 0 && IsSpace(text[end - 1])) --end;
  absl::string_view tail = text.substr(end);
  if (end > 0) {
    out->content += held_space_;
    held_space_.clear();
    space_committed_ = false;
    out->content.append(text.data(), end);
  }
  if (tail.empty()) return;
  if (space_committed_) {
    out->content.append(tail.data(), tail.size());
    return;
  }
  held_space_.append(tail.data(), tail.size());
  if (held_space_.size() > kMaxHeldWhitespace) {
    out->content += held_space_;
    held_space_.clear();
    space_committed_ = true;
  }
}

void ToolCallEmitter::Call(std::string name, std::string arguments, ParsedDelta* out) {
  held_space_.clear();
  space_committed_ = false;
  drop_leading_space_ = true;
  ToolCallDelta delta;
  delta.index = next_index_++;
  delta.id = NextId();
  delta.name = std::move(name);
  delta.arguments = std::move(arguments);
  out->tool_calls.push_back(std::move(delta));
}

void ToolCallEmitter::Finish(ParsedDelta* out) {
  out->content += held_space_;
  held_space_.clear();
}

}  // namespace tessera::text
