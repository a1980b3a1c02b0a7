#include "base/json.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "base/file.h"
#include "base/str_cat.h"

namespace tessera {
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

// Checks syntax and key uniqueness, then builds the value as JsonType.
template <typename JsonType>
absl::StatusOr<JsonType> ParseStrict(std::string_view text) {
  StrictChecker checker;
  const bool ok = Json::sax_parse(text.begin(), text.end(), &checker);
  if (checker.error().has_value()) return *checker.error();
  if (!ok) return absl::InvalidArgumentError("invalid JSON");
  JsonType value =
      JsonType::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InvalidArgumentError("invalid JSON");
  return value;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text) {
  return ParseStrict<nlohmann::json>(text);
}

absl::StatusOr<nlohmann::ordered_json> ParseOrderedJsonStrict(std::string_view text) {
  return ParseStrict<nlohmann::ordered_json>(text);
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<std::string> text = ReadFileBounded(path, max_bytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<nlohmann::json> json = ParseJsonStrict(*text);
  if (!json.ok()) {
    return absl::InvalidArgumentError(Cat(path, ": ", json.status().message()));
  }
  return json;
}

std::string_view JsonTypeName(const nlohmann::json& value) { return JsonTypeName(value.type()); }

std::string_view JsonTypeName(const nlohmann::ordered_json& value) {
  return JsonTypeName(value.type());
}

std::string_view JsonTypeName(nlohmann::json::value_t type) {
  switch (type) {
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

}  // namespace tessera
