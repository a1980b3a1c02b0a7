#include "worker/model/rope.h"

#include <bit>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/test_util.h"

namespace tessera::model {
namespace {

using ::testing::HasSubstr;

// Distance in units in the last place between two positive finite floats.
int64_t UlpDistance(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST(RopeTest, DefaultFollowsTheFormulaInDoublePrecision) {
  for (double theta : {10000.0, 500000.0, 1e6}) {
    absl::StatusOr<std::vector<float>> inv = RopeInverseFrequencies(128, theta, RopeScaling{});
    ASSERT_TRUE(inv.ok());
    ASSERT_EQ(inv->size(), 64u);
    for (size_t i = 0; i < inv->size(); ++i) {
      const double expected = 1.0 / std::pow(theta, 2.0 * i / 128.0);
      EXPECT_NEAR((*inv)[i], expected, expected * 1e-6) << "theta " << theta << " i " << i;
    }
  }
}

TEST(RopeTest, LinearDividesEveryFrequency) {
  RopeScaling linear{.type = RopeScalingType::kLinear, .factor = 4.0};
  absl::StatusOr<std::vector<float>> base = RopeInverseFrequencies(64, 10000.0, RopeScaling{});
  absl::StatusOr<std::vector<float>> scaled = RopeInverseFrequencies(64, 10000.0, linear);
  ASSERT_TRUE(base.ok() && scaled.ok());
  for (size_t i = 0; i < base->size(); ++i) EXPECT_EQ((*scaled)[i], (*base)[i] / 4.0f);
}

TEST(RopeTest, Llama3KeepsHighDividesLowAndBlendsTheMiddle) {
  RopeScaling s{.type = RopeScalingType::kLlama3,
                .factor = 8.0,
                .low_freq_factor = 1.0,
                .high_freq_factor = 4.0,
                .original_max_position_embeddings = 8192};
  absl::StatusOr<std::vector<float>> base = RopeInverseFrequencies(128, 500000.0, RopeScaling{});
  absl::StatusOr<std::vector<float>> scaled = RopeInverseFrequencies(128, 500000.0, s);
  ASSERT_TRUE(base.ok() && scaled.ok());
  int high = 0, low = 0, middle = 0;
  for (size_t i = 0; i < base->size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / (*base)[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_EQ((*scaled)[i], (*base)[i]) << i;
      ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      EXPECT_EQ((*scaled)[i], (*base)[i] / 8.0f) << i;
      ++low;
    } else {
      // Strictly between the two limits, and following the blend formula.
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      const double expected = (1 - smooth) * (*base)[i] / 8.0 + smooth * (*base)[i];
      EXPECT_NEAR((*scaled)[i], expected, expected * 1e-6) << i;
      EXPECT_LT((*scaled)[i], (*base)[i]);
      EXPECT_GT((*scaled)[i], (*base)[i] / 8.0f);
      ++middle;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(middle, 0);
}

TEST(RopeTest, RejectsInvalidParameters) {
  EXPECT_THAT(std::string(RopeInverseFrequencies(7, 1e4, {}).status().message()),
              HasSubstr("must be even"));
  EXPECT_FALSE(RopeInverseFrequencies(8, 0.0, {}).ok());
  EXPECT_FALSE(
      RopeInverseFrequencies(8, 1e4, {.type = RopeScalingType::kLinear, .factor = 0.5}).ok());
  EXPECT_FALSE(RopeInverseFrequencies(8, 1e4,
                                      {.type = RopeScalingType::kLlama3,
                                       .factor = 8,
                                       .low_freq_factor = 4,
                                       .high_freq_factor = 1,
                                       .original_max_position_embeddings = 8192})
                   .ok());
}

// testdata/rope_inv_freq.json holds the float32 tables transformers computed
// (make_reference.py). Every config is re-parsed from its rope parameters.
TEST(RopeTest, MatchesTransformersTables) {
  std::ifstream in(testing::TestDataDir() + "/rope_inv_freq.json");
  ASSERT_TRUE(in) << "missing testdata";
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json fixture = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(fixture.is_discarded());
  ASSERT_GE(fixture["tables"].size(), 5u);
  for (const auto& [name, table] : fixture["tables"].items()) {
    const nlohmann::json& cfg = table["config"];
    nlohmann::json config = {{"model_type", "llama"},
                             {"vocab_size", 16},
                             {"hidden_size", cfg["hidden_size"]},
                             {"intermediate_size", 16},
                             {"num_hidden_layers", 1},
                             {"num_attention_heads", cfg["num_attention_heads"]},
                             {"head_dim", table["head_dim"]},
                             {"rope_parameters", cfg["rope_scaling"]}};
    absl::StatusOr<ModelConfig> parsed = ParseModelConfig(config.dump(), name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    absl::StatusOr<std::vector<float>> inv = RopeInverseFrequencies(*parsed);
    ASSERT_TRUE(inv.ok()) << inv.status();
    const std::vector<int32_t> bits = table["inv_freq_bits"].get<std::vector<int32_t>>();
    ASSERT_EQ(inv->size(), bits.size()) << name;
    int64_t worst = 0;
    for (size_t i = 0; i < bits.size(); ++i) {
      worst = std::max(worst, UlpDistance((*inv)[i], std::bit_cast<float>(bits[i])));
    }
    EXPECT_LE(worst, 1) << name << ": max ulp distance from transformers";
    EXPECT_EQ(table["attention_scaling"].get<double>(), 1.0) << name;
  }
}

}  // namespace
}  // namespace tessera::model
