#include "text/jinja/template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "text/jinja/parser.h"

namespace tessera::text::jinja {

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source,
                                                          const LexOptions& options) {
  std::string copy(source);
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(copy, options));
  ASSIGN_OR_RETURN(NodePtr program, jinja::Parse(tokens, copy));
  return std::unique_ptr<Template>(new Template(std::move(copy), std::move(program)));
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& variables,
                                             const RenderOptions& options) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError("template variables must be a JSON object");
  }
  ValueMap map;
  for (auto it = variables.begin(); it != variables.end(); ++it) {
    ASSIGN_OR_RETURN(Value v, ValueFromJson(it.value(), options.limits.max_input_depth));
    map.Set(it.key(), std::move(v));
  }
  return Render(map, options);
}

absl::StatusOr<std::string> Template::Render(const ValueMap& variables,
                                             const RenderOptions& options) const {
  return Interpret(*program_, source_, variables, options.limits,
                   options.now.value_or(absl::Now()));
}

}  // namespace tessera::text::jinja
