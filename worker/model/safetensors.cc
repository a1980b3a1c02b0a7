#include "worker/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "base/json.h"
#include "base/str_cat.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

// A JSON value for an error message, cut to a readable length.
std::string Brief(const Json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
  if (text.size() > 48) text = Cat(text.substr(0, 45), "...");
  return text;
}

absl::Status TensorError(std::string_view tensor, std::string_view problem) {
  return absl::InvalidArgumentError(Cat("tensor \"", tensor, "\": ", problem));
}

// Reads a non-negative integer that fits in int64 from `value`; `what` names
// it in the message ("shape[1]", "data_offsets[0]").
absl::StatusOr<uint64_t> NonNegativeInt(const Json& value, std::string_view tensor,
                                        std::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      return TensorError(tensor, Cat(what, " = ", v, " is too large"));
    }
    return v;
  }
  if (value.is_number_integer()) {
    return TensorError(tensor, Cat(what, " = ", value.get<int64_t>(), " is negative"));
  }
  return TensorError(tensor, Cat(what, " must be a non-negative integer, got ", JsonTypeName(value),
                                 " ", Brief(value)));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value,
                                            uint64_t data_bytes) {
  if (name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
  if (!value.is_object()) {
    return TensorError(name, Cat("must be an object with dtype, shape and "
                                 "data_offsets, got ",
                                 JsonTypeName(value), " ", Brief(value)));
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return TensorError(name,
                         Cat("unexpected key \"", key, "\" (allowed: dtype, shape, data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) return TensorError(name, Cat("missing \"", key, "\""));
  }

  SafetensorsEntry entry;
  entry.name = name;
  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    return TensorError(name,
                       Cat("dtype must be a string, got ", JsonTypeName(dtype), " ", Brief(dtype)));
  }
  absl::StatusOr<DType> parsed_dtype = ParseSafetensorsDType(dtype.get_ref<const std::string&>());
  if (!parsed_dtype.ok()) return TensorError(name, std::string(parsed_dtype.status().message()));
  entry.dtype = *parsed_dtype;

  const Json& shape = value["shape"];
  if (!shape.is_array()) {
    return TensorError(name, Cat("shape must be an array of integers, got ", JsonTypeName(shape),
                                 " ", Brief(shape)));
  }
  uint64_t need_bytes = DTypeSize(entry.dtype);
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StatusOr<uint64_t> dim = NonNegativeInt(shape[i], name, Cat("shape[", i, "]"));
    if (!dim.ok()) return dim.status();
    entry.shape.push_back(static_cast<int64_t>(*dim));
    if (__builtin_mul_overflow(need_bytes, *dim, &need_bytes)) {
      return TensorError(name,
                         Cat("shape ", ShapeString(entry.shape), " overflows 64-bit byte counts"));
    }
  }

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return TensorError(name,
                       Cat("data_offsets must be an array [begin, end], got ", Brief(offsets)));
  }
  absl::StatusOr<uint64_t> begin = NonNegativeInt(offsets[0], name, "data_offsets[0]");
  if (!begin.ok()) return begin.status();
  absl::StatusOr<uint64_t> end = NonNegativeInt(offsets[1], name, "data_offsets[1]");
  if (!end.ok()) return end.status();
  entry.begin = *begin;
  entry.end = *end;
  const std::string span = Cat("data_offsets [", entry.begin, ", ", entry.end, "]");
  if (entry.begin > entry.end) {
    return TensorError(name, Cat(span, " end before they begin"));
  }
  if (entry.end > data_bytes) {
    return TensorError(name, Cat(span, " reach past the end of the data section (", data_bytes,
                                 " bytes; is the file truncated?)"));
  }
  if (entry.end - entry.begin != need_bytes) {
    return TensorError(name, Cat(span, " span ", entry.end - entry.begin, " bytes but shape ",
                                 ShapeString(entry.shape), " of ", DTypeName(entry.dtype),
                                 " needs ", need_bytes, " bytes"));
  }
  return entry;
}

// Spans must tile [0, data_bytes) exactly (see the header comment).
absl::Status CheckTiling(const std::vector<SafetensorsEntry>& tensors, uint64_t data_bytes) {
  uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : tensors) {
    if (e.begin < expected) {
      return absl::InvalidArgumentError(Cat("tensor \"", e.name, "\" bytes [", e.begin, ", ", e.end,
                                            ") overlap tensor \"", previous->name, "\" bytes [",
                                            previous->begin, ", ", previous->end, ")"));
    }
    if (e.begin > expected) {
      return absl::InvalidArgumentError(Cat("gap of ", e.begin - expected, " unused bytes [",
                                            expected, ", ", e.begin, ") before tensor \"", e.name,
                                            "\" in the data section"));
    }
    expected = e.end;
    previous = &e;
  }
  if (expected != data_bytes) {
    if (previous == nullptr) {
      return absl::InvalidArgumentError(
          Cat("the header lists no tensors but the data section holds ", data_bytes, " bytes"));
    }
    return absl::InvalidArgumentError(
        Cat(data_bytes - expected, " unused bytes after the last tensor \"", previous->name,
            "\" (it ends at ", expected, ", the data section at ", data_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status WithPath(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), Cat(path, ": ", status.message()));
}

absl::Status CheckMinimumSize(uint64_t file_size) {
  if (file_size == 0) {
    return absl::InvalidArgumentError(
        "file is empty (0 bytes); a safetensors file starts with an 8-byte header length");
  }
  if (file_size < 8) {
    return absl::InvalidArgumentError(Cat("file is only ", file_size,
                                          " bytes; a safetensors file starts with an 8-byte header "
                                          "length"));
  }
  return absl::OkStatus();
}

// pread() exactly `n` bytes at `offset`; false on a short read or error.
bool ReadFully(int fd, uint64_t offset, size_t n, char* out) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { close(fd_); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(std::string_view prefix,
                                                       uint64_t file_size) {
  if (absl::Status s = CheckMinimumSize(file_size); !s.ok()) return s;
  if (prefix.size() != 8) {
    return absl::InvalidArgumentError("the header length prefix must be 8 bytes");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[i]);
  if (n < 2) {
    return absl::InvalidArgumentError(
        Cat("header length ", n, " is too small (the JSON header is at least \"{}\")"));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        Cat("header length ", n, " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > file_size - 8) {
    return absl::InvalidArgumentError(Cat("header length ", n, " exceeds the ", file_size - 8,
                                          " bytes that follow the length prefix (file is ",
                                          file_size, " bytes; truncated?)"));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json,
                                                         uint64_t data_bytes) {
  absl::StatusOr<Json> json = ParseJsonStrict(header_json);
  if (!json.ok()) {
    return absl::InvalidArgumentError(Cat("header is not valid JSON: ", json.status().message()));
  }
  if (!json->is_object()) {
    return absl::InvalidArgumentError(
        Cat("header must be a JSON object, got ", JsonTypeName(*json)));
  }
  SafetensorsHeader header;
  header.header_bytes = header_json.size();
  header.data_bytes = data_bytes;
  for (const auto& [key, value] : json->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            Cat("__metadata__ must be an object of strings, got ", JsonTypeName(value)));
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return absl::InvalidArgumentError(Cat("__metadata__ value of \"", mkey,
                                                "\" must be a string, got ", JsonTypeName(mvalue),
                                                " ", Brief(mvalue)));
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> entry = ParseEntry(key, value, data_bytes);
    if (!entry.ok()) return entry.status();
    header.tensors.push_back(*std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  if (absl::Status s = CheckTiling(header.tensors, data_bytes); !s.ok()) return s;
  return header;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsImage(std::string_view image) {
  if (absl::Status s = CheckMinimumSize(image.size()); !s.ok()) return s;
  absl::StatusOr<uint64_t> n = DecodeSafetensorsHeaderLength(image.substr(0, 8), image.size());
  if (!n.ok()) return n.status();
  return ParseSafetensorsHeader(image.substr(8, *n), image.size() - 8 - *n);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        Cat(path, ": cannot open: ", std::strerror(err)));
  }
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        Cat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(Cat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (absl::Status s = CheckMinimumSize(size); !s.ok()) return WithPath(path, s);

  char prefix[8];
  if (!ReadFully(fd, 0, sizeof(prefix), prefix)) {
    return absl::InvalidArgumentError(
        Cat(path, ": cannot read the 8-byte header length (did the file shrink?)"));
  }
  absl::StatusOr<uint64_t> n =
      DecodeSafetensorsHeaderLength(std::string_view(prefix, sizeof(prefix)), size);
  if (!n.ok()) return WithPath(path, n.status());
  std::string header_json(static_cast<size_t>(*n), '\0');
  if (!ReadFully(fd, 8, header_json.size(), header_json.data())) {
    return absl::InvalidArgumentError(
        Cat(path, ": cannot read the ", *n, "-byte header (did the file shrink?)"));
  }
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(header_json, size - 8 - *n);
  if (!header.ok()) return WithPath(path, header.status());

  void* mapping = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        Cat(path, ": mmap failed: ", std::strerror(err)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->header_ = *std::move(header);
  file->mapping_ = mapping;
  file->base_ = static_cast<const std::byte*>(mapping);
  file->size_ = size;
  file->inode_ = static_cast<uint64_t>(st.st_ino);
  file->mtime_ns_ = MtimeNs(st);

  struct stat after;
  if (fstat(fd, &after) != 0 || static_cast<uint64_t>(after.st_size) != size ||
      MtimeNs(after) != file->mtime_ns_) {
    return absl::FailedPreconditionError(Cat(path, ": the file changed while it was being opened"));
  }
  file->Index();
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string name) {
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsImage(bytes);
  if (!header.ok()) return WithPath(name, header.status());
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(name);
  file->header_ = *std::move(header);
  file->owned_bytes_ = std::move(bytes);
  file->base_ = reinterpret_cast<const std::byte*>(file->owned_bytes_.data());
  file->size_ = file->owned_bytes_.size();
  file->Index();
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, static_cast<size_t>(size_));
}

void SafetensorsFile::Index() {
  views_.reserve(header_.tensors.size());
  const std::byte* data = base_ + header_.data_offset();
  for (const SafetensorsEntry& e : header_.tensors) {
    TensorView view;
    view.name = e.name;
    view.dtype = e.dtype;
    view.shape = e.shape;
    view.data = data + e.begin;
    view.size_bytes = static_cast<size_t>(e.end - e.begin);
    views_.push_back(std::move(view));
  }
  by_name_.reserve(views_.size());
  for (size_t i = 0; i < views_.size(); ++i) by_name_.emplace(views_[i].name, i);
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &views_[it->second];
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    return absl::NotFoundError(Cat(path_, ": no tensor named \"", name, "\""));
  }
  return *view;
}

absl::Status SafetensorsFile::CheckUnchanged() const {
  if (mapping_ == nullptr) return absl::OkStatus();
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        Cat(path_, ": the file was removed or became unreadable after it was opened"));
  }
  if (static_cast<uint64_t>(st.st_size) != size_ || static_cast<uint64_t>(st.st_ino) != inode_ ||
      MtimeNs(st) != mtime_ns_) {
    return absl::FailedPreconditionError(
        Cat(path_, ": the file changed on disk after it was opened (size ", size_, " -> ",
            st.st_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::model
