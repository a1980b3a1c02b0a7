#include "worker/model/json_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "worker/model/str_cat.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

// A SAX consumer that builds nothing: it only checks key uniqueness per
// object and records the first syntax error.
class StrictChecker {
 public:
  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(Json::number_integer_t) { return Value(); }
  bool number_unsigned(Json::number_unsigned_t) { return Value(); }
  bool number_float(Json::number_float_t, const Json::string_t&) { return Value(); }
  bool string(Json::string_t&) { return Value(); }
  bool binary(Json::binary_t&) { return Value(); }

  bool start_object(std::size_t) {
    Enter();
    frames_.push_back(Frame{.keys = absl::flat_hash_set<std::string>()});
    return true;
  }
  bool key(Json::string_t& key) {
    Frame& frame = frames_.back();
    if (!frame.keys->insert(key).second) {
      error_ = absl::InvalidArgumentError(Cat("duplicate key \"", key, "\" ", Where()));
      return false;
    }
    frame.label = Cat("/", key);
    return true;
  }
  bool end_object() {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    Enter();
    frames_.push_back(Frame{});
    return true;
  }
  bool end_array() {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    error_ = absl::InvalidArgumentError(
        Cat("invalid JSON at byte ", position, ": ", std::string_view(ex.what())));
    return false;
  }

  const std::optional<absl::Status>& error() const { return error_; }

 private:
  struct Frame {
    std::optional<absl::flat_hash_set<std::string>> keys;  // set for objects
    std::string label;                                     // "/key" or "/index"
    size_t next_index = 0;
  };

  // Called when a value (scalar or container) starts inside the current frame.
  void Enter() {
    if (!frames_.empty() && !frames_.back().keys.has_value()) {
      frames_.back().label = Cat("/", frames_.back().next_index++);
    }
  }
  bool Value() {
    Enter();
    return true;
  }

  // Where the innermost object is: "at the top level" or "in object at /a/0".
  std::string Where() const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) path += frames_[i].label;
    return path.empty() ? "at the top level" : Cat("in object at ", path);
  }

  std::vector<Frame> frames_;
  std::optional<absl::Status> error_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text) {
  StrictChecker checker;
  const bool ok = Json::sax_parse(text.begin(), text.end(), &checker);
  if (checker.error().has_value()) return *checker.error();
  if (!ok) return absl::InvalidArgumentError("invalid JSON");
  Json value = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InvalidArgumentError("invalid JSON");
  return value;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        Cat(path, ": cannot open: ", std::strerror(err)));
  }
  std::string text;
  absl::Status status;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(Cat(path, ": not a regular file"));
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    status = absl::InvalidArgumentError(
        Cat(path, ": file is ", st.st_size, " bytes, more than the limit of ", max_bytes));
  } else {
    char buffer[1 << 16];
    while (true) {
      const ssize_t got = read(fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = absl::DataLossError(Cat(path, ": read error: ", std::strerror(errno)));
        break;
      }
      if (got == 0) break;
      text.append(buffer, static_cast<size_t>(got));
      if (text.size() > max_bytes) {
        status = absl::InvalidArgumentError(
            Cat(path, ": file grew past the limit of ", max_bytes, " bytes"));
        break;
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  absl::StatusOr<nlohmann::json> json = ParseJsonStrict(text);
  if (!json.ok()) {
    return absl::InvalidArgumentError(Cat(path, ": ", json.status().message()));
  }
  return json;
}

std::string_view JsonTypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

}  // namespace tessera::model
