#include "worker/model/safetensors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
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
using testing::Image;
using testing::LengthPrefix;
using testing::MakeTempDir;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Writes `bytes` to a fresh file and opens it; returns the status and sets
// *path to the file written.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenBytes(const std::string& bytes,
                                                           std::string* path) {
  *path = MakeTempDir() + "/model.safetensors";
  EXPECT_TRUE(WriteBinaryFile(*path, bytes).ok());
  return SafetensorsFile::Open(*path);
}

// Opens `bytes` from disk and expects INVALID_ARGUMENT whose message starts
// with the path and contains every one of `parts`.
void ExpectCorrupt(const std::string& bytes, std::vector<std::string> parts) {
  std::string path;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = OpenBytes(bytes, &path);
  ASSERT_FALSE(file.ok()) << "accepted a corrupt file";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(Msg(file.status()), StartsWith(path + ": "));
  for (const std::string& part : parts) EXPECT_THAT(Msg(file.status()), HasSubstr(part));
  // The in-memory path must agree with the file path.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> mem = SafetensorsFile::FromBytes(bytes, "mem");
  ASSERT_FALSE(mem.ok());
  for (const std::string& part : parts) EXPECT_THAT(Msg(mem.status()), HasSubstr(part));
}

std::string Floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// --- Corrupt files: one test per rule. -------------------------------------

TEST(SafetensorsCorruptTest, EmptyFile) { ExpectCorrupt("", {"file is empty (0 bytes)"}); }

TEST(SafetensorsCorruptTest, TruncatedHeaderLength) {
  ExpectCorrupt(std::string("\x10\x00\x00", 3), {"file is only 3 bytes", "8-byte header length"});
}

TEST(SafetensorsCorruptTest, HeaderLengthBeyondFile) {
  std::string bytes = LengthPrefix(1000) + "{}";
  ExpectCorrupt(bytes, {"header length 1000 exceeds the 2 bytes", "file is 10 bytes"});
}

TEST(SafetensorsCorruptTest, HeaderLengthAboveLimit) {
  std::string bytes = LengthPrefix(uint64_t{1} << 62) + "{}";
  ExpectCorrupt(bytes, {"exceeds the limit of 100000000 bytes"});
}

TEST(SafetensorsCorruptTest, HeaderLengthTooSmall) {
  ExpectCorrupt(LengthPrefix(0) + "{}", {"header length 0 is too small"});
}

TEST(SafetensorsCorruptTest, BadJson) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "shape": [1], )"),
                {"header is not valid JSON", "invalid JSON at byte"});
}

TEST(SafetensorsCorruptTest, HeaderIsNotAnObject) {
  ExpectCorrupt(Image("[1, 2]"), {"header must be a JSON object, got array"});
}

TEST(SafetensorsCorruptTest, UnknownDtype) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", Floats({1})),
      {"tensor \"w\"", "unsupported dtype \"F7\"", "BF16"});
}

TEST(SafetensorsCorruptTest, ShapeDisagreesWithSpan) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", Floats({1, 2})),
      {"tensor \"w\"", "data_offsets [0, 8] span 8 bytes", "shape [3] of F32 needs 12 bytes"});
}

TEST(SafetensorsCorruptTest, SpanOutsideFile) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", Floats({1, 2})),
      {"tensor \"w\"", "data_offsets [0, 16] reach past the end of the data section", "8 bytes"});
}

TEST(SafetensorsCorruptTest, OverlappingSpans) {
  ExpectCorrupt(Image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      Floats({1, 2, 3})),
                {"tensor \"b\" bytes [4, 12) overlap tensor \"a\" bytes [0, 8)"});
}

TEST(SafetensorsCorruptTest, GapBetweenSpans) {
  ExpectCorrupt(Image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                      Floats({1, 2, 3})),
                {"gap of 4 unused bytes [4, 8) before tensor \"b\""});
}

TEST(SafetensorsCorruptTest, TrailingBytes) {
  ExpectCorrupt(
      Image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({1, 2})),
      {"4 unused bytes after the last tensor \"a\""});
}

TEST(SafetensorsCorruptTest, DataWithoutTensors) {
  ExpectCorrupt(Image("{}", "abcd"), {"lists no tensors but the data section holds 4 bytes"});
}

TEST(SafetensorsCorruptTest, NegativeDimension) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 0]}})"),
                {"tensor \"w\"", "shape[0] = -1 is negative"});
}

TEST(SafetensorsCorruptTest, NonIntegerDimension) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": [1, 2.5], "data_offsets": [0, 4]}})", Floats({1})),
      {"tensor \"w\"", "shape[1] must be a non-negative integer, got number 2.5"});
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})", Floats({1, 2})),
      {"tensor \"w\"", "shape[0] must be a non-negative integer, got string \"2\""});
}

TEST(SafetensorsCorruptTest, ShapeOverflow) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F64",
                                "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})"),
                {"tensor \"w\"", "overflows 64-bit byte counts"});
}

TEST(SafetensorsCorruptTest, DuplicateTensorName) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      Floats({1, 2})),
                {"duplicate key \"w\" at the top level"});
}

TEST(SafetensorsCorruptTest, OffsetsEndBeforeBegin) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", Floats({1})),
      {"tensor \"w\"", "data_offsets [4, 0] end before they begin"});
}

TEST(SafetensorsCorruptTest, OffsetsNotAPair) {
  ExpectCorrupt(
      Image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", Floats({1})),
      {"tensor \"w\"", "data_offsets must be an array [begin, end], got [0,4,8]"});
}

TEST(SafetensorsCorruptTest, MissingAndUnexpectedKeys) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", Floats({1})),
                {"tensor \"w\"", "missing \"shape\""});
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4],
                                "strides": [1]}})",
                      Floats({1})),
                {"tensor \"w\"", "unexpected key \"strides\""});
  ExpectCorrupt(
      Image(R"({"w": [0, 4]})", Floats({1})),
      {"tensor \"w\"", "must be an object with dtype, shape and data_offsets, got array"});
}

TEST(SafetensorsCorruptTest, EmptyTensorName) {
  ExpectCorrupt(
      Image(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", Floats({1})),
      {"a tensor has an empty name"});
}

TEST(SafetensorsCorruptTest, MetadataMustHoldStrings) {
  ExpectCorrupt(Image(R"({"__metadata__": {"format": 1}})"),
                {"__metadata__ value of \"format\" must be a string, got integer 1"});
  ExpectCorrupt(Image(R"({"__metadata__": "pt"})"),
                {"__metadata__ must be an object of strings, got string"});
}

TEST(SafetensorsCorruptTest, EveryTruncationOfAValidFileIsRejected) {
  absl::StatusOr<std::string> image = SerializeSafetensors(
      {{"a", DType::kF32, {2, 2}, Floats({1, 2, 3, 4})}, {"b", DType::kBF16, {3}, "abcdef"}});
  ASSERT_TRUE(image.ok()) << image.status();
  for (size_t len = 0; len < image->size(); ++len) {
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsImage(image->substr(0, len));
    EXPECT_FALSE(header.ok()) << "accepted a file cut to " << len << " of " << image->size();
  }
  // The file-backed reader reports the truncation of the data section.
  std::string path;
  auto file = OpenBytes(image->substr(0, image->size() - 1), &path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(Msg(file.status()), AllOf(StartsWith(path), HasSubstr("tensor \"b\""),
                                        HasSubstr("reach past the end of the data section")));
}

TEST(SafetensorsCorruptTest, RandomByteFlipsNeverCrashAndKeepInvariants) {
  absl::StatusOr<std::string> image = SerializeSafetensors(
      {{"x", DType::kF16, {2, 3}, std::string(12, '\x01')}, {"y", DType::kF32, {1}, Floats({5})}},
      {{"format", "pt"}});
  ASSERT_TRUE(image.ok());
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = *image;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::FromBytes(bytes, "fuzz");
    if (!file.ok()) {
      EXPECT_THAT(Msg(file.status()), StartsWith("fuzz: "));
      continue;
    }
    ++accepted;
    // Whatever was accepted must describe bytes inside the image.
    for (const TensorView& t : (*file)->tensors()) {
      EXPECT_EQ(static_cast<size_t>(t.num_elements()) * DTypeSize(t.dtype), t.size_bytes);
      EXPECT_LE((*file)->header().data_offset() + t.size_bytes, bytes.size());
    }
  }
  // Flips inside tensor data keep the file valid, so some must be accepted.
  EXPECT_GT(accepted, 0);
}

TEST(SafetensorsOpenTest, MissingFileIsNotFound) {
  const std::string path = MakeTempDir() + "/absent.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(file.status()), AllOf(StartsWith(path), HasSubstr("cannot open")));
}

TEST(SafetensorsOpenTest, DirectoryIsRejected) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(dir);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(Msg(file.status()), HasSubstr("not a regular file"));
}

// --- Valid files. ------------------------------------------------------------

TEST(SafetensorsReadTest, RoundTripsEveryFloatDtypeAndMetadata) {
  const std::vector<float> values = {0.5f, -1.25f, 3.0f, 65504.0f, -0.0f, 1e-3f};
  std::vector<TensorToWrite> tensors;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<TensorToWrite> t =
        MakeTensor(std::string(DTypeName(dtype)), dtype, {2, 3}, values);
    ASSERT_TRUE(t.ok()) << t.status();
    tensors.push_back(*std::move(t));
  }
  tensors.push_back({"empty", DType::kI64, {0, 7}, ""});
  tensors.push_back({"scalar", DType::kI32, {}, std::string("\x2a\0\0\0", 4)});
  std::string path = MakeTempDir() + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors, {{"format", "pt"}}).ok());

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 5u);
  EXPECT_EQ((*file)->header().metadata.at("format"), "pt");
  EXPECT_EQ((*file)->header().data_offset() % 8, 0u) << "writer pads the header to 8 bytes";
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<TensorView> t = (*file)->Get(DTypeName(dtype));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    absl::StatusOr<std::vector<float>> back = ToFloat32(*t);
    ASSERT_TRUE(back.ok()) << back.status();
    // Rounding to nearest keeps the relative error within half an ulp:
    // 2^-8 for BF16 (8 significand bits), 2^-11 for F16 (11), exact for F32.
    const double rel = dtype == DType::kF32 ? 0.0 : (dtype == DType::kF16 ? 0x1p-11 : 0x1p-8);
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR((*back)[i], values[i], std::abs(values[i]) * rel)
          << DTypeName(dtype) << " element " << i;
    }
  }
  const TensorView* empty = (*file)->Find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(empty->size_bytes, 0u);
  const TensorView* scalar = (*file)->Find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_EQ(scalar->rank(), 0);
  int32_t v = 0;
  std::memcpy(&v, scalar->data, 4);
  EXPECT_EQ(v, 42);
  absl::StatusOr<std::vector<float>> not_float = ToFloat32(*scalar);
  EXPECT_EQ(not_float.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(not_float.status()), HasSubstr("I32"));

  absl::StatusOr<TensorView> absent = (*file)->Get("nope");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(absent.status()), HasSubstr("no tensor named \"nope\""));
  EXPECT_TRUE((*file)->CheckUnchanged().ok());
}

TEST(SafetensorsReadTest, UnalignedDataIsReadCorrectly) {
  // A 3-byte header padding puts the data section at an odd offset.
  std::string header = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})";
  header += std::string((8 - (header.size() + 8) % 8) % 8 + 3, ' ');
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(Image(header, Floats({1.5f, -2.0f, 7.0f})), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorView* w = (*file)->Find("w");
  ASSERT_NE(w, nullptr);
  absl::StatusOr<std::vector<float>> back = ToFloat32(*w);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, (std::vector<float>{1.5f, -2.0f, 7.0f}));
}

TEST(SafetensorsReadTest, DetectsAFileThatChangedAfterOpening) {
  std::string path = MakeTempDir() + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, {{"a", DType::kF32, {1}, Floats({1})}}).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  // Replace it with a different file (a new inode of another size).
  std::string tmp = path + ".new";
  ASSERT_TRUE(WriteSafetensorsFile(tmp, {{"a", DType::kF32, {2}, Floats({1, 2})}}).ok());
  ASSERT_EQ(rename(tmp.c_str(), path.c_str()), 0);
  absl::Status changed = (*file)->CheckUnchanged();
  EXPECT_EQ(changed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(changed), HasSubstr("changed on disk after it was opened"));
}

TEST(SafetensorsReadTest, DuplicateKeyInsideAnEntryIsRejected) {
  ExpectCorrupt(Image(R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1],
                                "data_offsets": [0, 4]}})",
                      Floats({1})),
                {"duplicate key \"dtype\" in object at /w"});
}

}  // namespace
}  // namespace tessera::model
