#include "worker/model/checkpoint.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/test_util.h"

namespace tessera::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MakeTempDir;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TensorToWrite F32(std::string name, std::vector<float> values) {
  std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
  return *MakeTensor(std::move(name), DType::kF32, shape, values);
}

// A directory with two shards: a.safetensors {x, y} and b.safetensors {z}.
struct ShardedDir {
  std::string dir;
  std::string index;
};

ShardedDir WriteShards(const std::string& index_json) {
  ShardedDir d{MakeTempDir(), ""};
  EXPECT_TRUE(
      WriteSafetensorsFile(d.dir + "/a.safetensors", {F32("x", {1, 2}), F32("y", {3})}).ok());
  EXPECT_TRUE(WriteSafetensorsFile(d.dir + "/b.safetensors", {F32("z", {4, 5, 6})}).ok());
  d.index = d.dir + "/model.safetensors.index.json";
  EXPECT_TRUE(WriteBinaryFile(d.index, index_json).ok());
  return d;
}

constexpr char kGoodIndex[] = R"({"metadata": {"total_size": 24},
  "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}})";

TEST(CheckpointTest, OpensAShardedDirectory) {
  ShardedDir d = WriteShards(kGoodIndex);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->description(), d.index);
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->TensorNames(), (std::vector<std::string>{"x", "y", "z"}));
  absl::StatusOr<TensorView> z = (*ckpt)->Get("z");
  ASSERT_TRUE(z.ok());
  absl::StatusOr<std::vector<float>> values = ToFloat32(*z);
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, (std::vector<float>{4, 5, 6}));
  EXPECT_EQ((*ckpt)->Get("w").status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, OpensASingleFileDirectory) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/model.safetensors", {F32("x", {1})}).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_tensors(), 1u);
}

TEST(CheckpointTest, EmptyDirectoryIsNotFound) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("no model.safetensors.index.json or model.safetensors"));
}

TEST(CheckpointTest, IndexNamingAMissingShard) {
  ShardedDir d = WriteShards(R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                                                "z": "c.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(StartsWith(d.index), HasSubstr("tensor \"z\" is mapped to shard "
                                                   "\"c.safetensors\", which does not exist")));
}

TEST(CheckpointTest, IndexNamingATensorTheShardLacks) {
  ShardedDir d = WriteShards(R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                                                "w": "a.safetensors", "z": "b.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("tensor \"w\" is mapped to shard \"a.safetensors\", which holds no "
                        "tensor of that name"));
}

TEST(CheckpointTest, ShardHoldingATensorTheIndexDoesNotList) {
  ShardedDir d = WriteShards(R"({"weight_map": {"x": "a.safetensors", "z": "b.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(StartsWith(d.dir + "/a.safetensors"),
                    HasSubstr("holds tensor \"y\", which the index"), HasSubstr("does not list")));
}

TEST(CheckpointTest, ShardHoldingATensorMappedElsewhere) {
  ShardedDir d = WriteShards(R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors",
                                                "z": "b.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  // b.safetensors lacks y (NOT_FOUND) or a.safetensors holds it; the index
  // is checked shard by shard in name order, so a.safetensors comes first.
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("holds tensor \"y\", which the index"));
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("maps to shard \"b.safetensors\""));
}

TEST(CheckpointTest, ShardNamesMustStayInTheDirectory) {
  ShardedDir d = WriteShards(R"({"weight_map": {"x": "../a.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              HasSubstr("tensor \"x\" is mapped to \"../a.safetensors\", which is not a plain "
                        "file name"));
}

TEST(CheckpointTest, MalformedIndexes) {
  struct Case {
    const char* json;
    const char* expected;
  } cases[] = {
      {R"({"weight_map": {"x": "a.safetensors",)", "invalid JSON at byte"},
      {R"({"metadata": {}})", "expected a JSON object with a \"weight_map\""},
      {R"({"weight_map": {}})", "\"weight_map\" must be a non-empty object"},
      {R"({"weight_map": {"x": 3}})", "tensor \"x\" must map to a shard file name, got integer"},
      {R"({"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}})",
       "duplicate key \"x\" in object at /weight_map"},
  };
  for (const Case& c : cases) {
    ShardedDir d = WriteShards(c.json);
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
    ASSERT_FALSE(ckpt.ok()) << c.json;
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(Msg(ckpt.status()), AllOf(StartsWith(d.index), HasSubstr(c.expected)));
  }
}

TEST(CheckpointTest, CorruptShardIsReportedWithItsPath) {
  ShardedDir d = WriteShards(kGoodIndex);
  ASSERT_TRUE(WriteBinaryFile(d.dir + "/b.safetensors", "garbage").ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(d.dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(StartsWith(d.dir + "/b.safetensors"), HasSubstr("file is only 7 bytes")));
}

// A checkpoint sharded by transformers' save_pretrained (testdata/tiny_qwen3).
TEST(CheckpointTest, OpensATransformersShardedCheckpoint) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
      Checkpoint::Open(testing::TestDataDir() + "/tiny_qwen3");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 3u);
  EXPECT_NE((*ckpt)->Find("model.layers.1.self_attn.k_norm.weight"), nullptr);
}

}  // namespace
}  // namespace tessera::model
