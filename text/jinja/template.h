// A parsed Jinja template and its rendering: the entry point of text/jinja.
//
// Template::Parse tokenizes and parses once (with trim_blocks and
// lstrip_blocks, as transformers renders chat templates); anything the
// interpreter does not implement that parsing can detect is an error there,
// naming the line and column. Render evaluates the tree with a JSON object
// of variables; errors (including the template's own raise_exception) are
// absl::Status values naming where in the template they happened.
//
// Thread-safety: a Template is immutable after Parse; Render is const and may
// be called from many threads at once.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace tessera::text::jinja {

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() formats; the current time when unset.
  std::optional<absl::Time> now;
};

class Template {
 public:
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source,
                                                         const LexOptions& options = LexOptions());

  // `variables` must be a JSON object; each member becomes a global variable.
  // Objects keep their key order (see ValueFromJson); a nlohmann::json
  // argument converts, with its keys sorted.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options = RenderOptions()) const;
  // The same with variables already converted to values.
  absl::StatusOr<std::string> Render(const ValueMap& variables,
                                     const RenderOptions& options = RenderOptions()) const;

  const std::string& source() const { return source_; }

 private:
  Template(std::string source, NodePtr program)
      : source_(std::move(source)), program_(std::move(program)) {}

  std::string source_;
  NodePtr program_;
};

}  // namespace tessera::text::jinja
