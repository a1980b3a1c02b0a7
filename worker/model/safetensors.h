// Reader for the safetensors format (https://huggingface.co/docs/safetensors):
//
//   [8 bytes: N, little-endian uint64][N bytes: JSON header][data section]
//
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin,
// end]} (offsets relative to the data section) and may hold a
// "__metadata__" object of string values. Files are memory-mapped; a
// TensorView points straight into the mapping, nothing is copied.
//
// Validation is strict: every rule below gives INVALID_ARGUMENT (NOT_FOUND
// for a missing file or tensor) whose message starts with the file path,
// names the tensor when one is at fault, and states the problem. No input
// makes the reader read outside the file or crash.
//   - the file is a regular file of at least 8 bytes;
//   - 2 <= N <= min(kMaxHeaderBytes, file size - 8);
//   - the header is one JSON object without duplicate keys (at any depth);
//   - "__metadata__", if present, is an object whose values are strings;
//   - every other key is a non-empty tensor name whose value is an object
//     with exactly the keys dtype, shape, data_offsets;
//   - dtype is one of DType's spellings (F32, F16, BF16, ...);
//   - shape is an array of non-negative integers whose product times the
//     dtype size does not overflow 64 bits;
//   - data_offsets is [begin, end] with integers 0 <= begin <= end <= size
//     of the data section, and end - begin == elements * dtype size;
//   - spans do not overlap and tile the data section exactly: sorted by
//     offset, the first begins at 0, each begins where the previous ends and
//     the last ends at the end of the file. A gap or trailing bytes are an
//     error, as in the reference implementation (they mean a writer bug or a
//     file truncated/padded by something else). An empty data section with
//     no tensors, or only zero-sized tensors, is valid.
//
// Files that change: the header is read with pread() and only then is the
// file mapped; after parsing, fstat() must report the same size, inode and
// modification time, else the open fails. A file truncated *after* it was
// opened makes reads of the lost pages raise SIGBUS (true of every mmap
// loader); checkpoints must not be rewritten in place while a worker runs.
//
// Thread-safety: SafetensorsFile is immutable after construction; all const
// methods may be called from any number of threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/model/dtype.h"
#include "worker/model/tensor.h"

namespace tessera::model {

// Upper bound on the JSON header length N (the reference implementation's
// limit): a larger value means a corrupt or hostile file.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One header entry, validated.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets within the data section
  uint64_t end = 0;
};

// A parsed, validated header.
struct SafetensorsHeader {
  uint64_t header_bytes = 0;                    // N
  uint64_t data_bytes = 0;                      // size of the data section
  std::vector<SafetensorsEntry> tensors;        // sorted by (begin, end, name)
  std::map<std::string, std::string> metadata;  // "__metadata__"

  uint64_t data_offset() const { return 8 + header_bytes; }  // file offset of data
};

// Checks the 8-byte prefix `prefix` (little-endian N) of a file of
// `file_size` bytes and returns N. Messages do not name the file.
// REQUIRES: prefix.size() == 8.
absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(std::string_view prefix, uint64_t file_size);

// Parses and validates the JSON header given the size of the data section
// that follows it. Messages name the tensor but not the file.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json,
                                                         uint64_t data_bytes);

// Both steps on a complete file image held in memory.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsImage(std::string_view image);

class SafetensorsFile {
 public:
  // Opens, validates and memory-maps `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Validates an in-memory image (tests, fuzzing, small downloads). `name`
  // stands in for the path in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string name);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t file_size() const { return size_; }

  // All tensors, in data-offset order.
  const std::vector<TensorView>& tensors() const { return views_; }

  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;

  // NOT_FOUND "<path>: no tensor named "x"" when absent.
  absl::StatusOr<TensorView> Get(std::string_view name) const;

  // For mapped files: OK when the file on disk still has the size, inode and
  // modification time it had when opened; FAILED_PRECONDITION otherwise.
  absl::Status CheckUnchanged() const;

 private:
  SafetensorsFile() = default;
  void Index();  // builds views_ and by_name_ from header_ and base_

  std::string path_;
  SafetensorsHeader header_;
  const std::byte* base_ = nullptr;  // first byte of the file image
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // mmap()ed region (Open) or nullptr (FromBytes)
  std::string owned_bytes_;  // the image for FromBytes
  uint64_t inode_ = 0;
  int64_t mtime_ns_ = 0;
  std::vector<TensorView> views_;
  absl::flat_hash_map<std::string_view, size_t> by_name_;  // keys view views_[i].name
};

}  // namespace tessera::model
