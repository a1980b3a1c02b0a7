// libFuzzer target: config.json parsing (strict JSON, every field rule) and
// the RoPE table of any config it accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "worker/model/config.h"
#include "worker/model/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::model;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text, "fuzz");
  if (!config.ok()) return 0;
  if (config->num_attention_heads % config->num_key_value_heads != 0) std::abort();
  if (config->head_dim < 2 || config->head_dim % 2 != 0) std::abort();
  absl::StatusOr<std::vector<float>> inv_freq = RopeInverseFrequencies(*config);
  if (!inv_freq.ok() || inv_freq->size() * 2 != static_cast<size_t>(config->head_dim)) {
    std::abort();
  }
  (void)CheckContextLength(*config, config->max_position_embeddings);
  return 0;
}
