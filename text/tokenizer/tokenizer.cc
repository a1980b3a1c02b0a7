#include "text/tokenizer/tokenizer.h"

#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/string_util.h"
#include "text/tokenizer/unicode.h"
#include "text/tokenizer/utf8.h"

namespace tessera {

using Json = nlohmann::json;
using tokenizer::AddedToken;
using tokenizer::AddedTokenMatcher;
using tokenizer::BpeConfig;
using tokenizer::BpeModel;
using tokenizer::PreTokenizer;
using tokenizer::RegexSplitter;
using tokenizer::Segment;

namespace {

constexpr uint64_t kMaxFileBytes = 1ull << 30;
// Bounds that keep hostile files from exhausting memory or the stack. Real
// vocabularies have at most a few hundred thousand ids.
constexpr int64_t kMaxTokenId = (1 << 24) - 1;
constexpr int kMaxNesting = 16;

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view source) {
  absl::StatusOr<Json> json = ParseJsonStrict(std::string_view(text.data(), text.size()));
  if (json.ok()) return json;
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", json.status().message()));
}

absl::StatusOr<std::string> ReadFile(absl::string_view path) {
  return ReadFileBounded(std::string(path), kMaxFileBytes);
}

absl::string_view TypeName(const Json& v) {
  const std::string_view name = JsonTypeName(v);
  return absl::string_view(name.data(), name.size());
}

// Small typed accessors that turn type mismatches into errors naming the
// file and the JSON path.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  absl::Status Error(absl::string_view path, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", problem));
  }
  absl::Status TypeError(absl::string_view path, const Json& v, absl::string_view want) const {
    return Error(path, absl::StrCat("expected ", want, ", found ", TypeName(v)));
  }

  // Optional boolean: missing or null gives `def`.
  absl::StatusOr<bool> Bool(const Json& obj, absl::string_view key, absl::string_view path,
                            bool def) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) return TypeError(Member(path, key), *it, "boolean");
    return it->get<bool>();
  }

  // Optional string: missing or null gives nullopt.
  absl::StatusOr<std::optional<std::string>> String(const Json& obj, absl::string_view key,
                                                    absl::string_view path) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::optional<std::string>();
    if (!it->is_string()) return TypeError(Member(path, key), *it, "string");
    return std::optional<std::string>(it->get<std::string>());
  }

  absl::StatusOr<std::string> Type(const Json& obj, absl::string_view path) const {
    if (!obj.is_object()) return TypeError(path, obj, "object");
    auto it = obj.find("type");
    if (it == obj.end()) return Error(path, "missing \"type\"");
    if (!it->is_string()) return TypeError(absl::StrCat(path, ".type"), *it, "string");
    return it->get<std::string>();
  }

  const std::string& source() const { return source_; }

  // "path.key", or "key" at the top level.
  static std::string Member(absl::string_view path, absl::string_view key) {
    return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
  }

 private:
  std::string source_;
};

// A token named in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> ConfigTokenContent(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    auto it = v.find("content");
    if (it != v.end() && it->is_string()) return it->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

// Builds a Tokenizer from parsed JSON.
class TokenizerLoader {
 public:
  TokenizerLoader(std::string tokenizer_source, std::string config_source)
      : tok_(std::move(tokenizer_source)), cfg_(std::move(config_source)) {}

  absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const Json& root, const Json* config);

 private:
  absl::Status LoadModel(const Json& model);
  absl::Status LoadAddedTokens(const Json& root, const Json* config);
  absl::Status LoadNormalizer(const Json& normalizer, absl::string_view path, int depth = 0);
  absl::Status LoadPreTokenizer(const Json& pre, absl::string_view path, int depth = 0);
  absl::Status LoadPostProcessor(const Json& post, absl::string_view path, int depth = 0);
  absl::Status LoadDecoder(const Json& decoder, absl::string_view path, int depth = 0);
  absl::Status LoadConfig(const Json& config);
  absl::Status Finish();
  std::optional<int32_t> Lookup(absl::string_view token) const;

  Reader tok_;
  Reader cfg_;
  std::unique_ptr<Tokenizer> t_{new Tokenizer};
  std::vector<std::string> additional_special_;
  bool template_processing_ = false;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::Load(const Json& root,
                                                                 const Json* config) {
  if (!root.is_object()) return tok_.TypeError("top level", root, "object");
  auto model = root.find("model");
  if (model == root.end()) return tok_.Error("top level", "missing \"model\"");
  if (absl::Status s = LoadModel(*model); !s.ok()) return s;
  t_->pre_tokenizer_ = std::make_unique<PreTokenizer>();
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    if (absl::Status s = LoadNormalizer(*it, "normalizer"); !s.ok()) return s;
  }
  if (auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null()) {
    if (absl::Status s = LoadPreTokenizer(*it, "pre_tokenizer"); !s.ok()) return s;
  }
  if (!t_->pre_tokenizer_->has_byte_level()) {
    return tok_.Error("pre_tokenizer",
                      "no ByteLevel step: only byte-level BPE tokenizers are supported");
  }
  if (auto it = root.find("decoder"); it != root.end() && !it->is_null()) {
    if (absl::Status s = LoadDecoder(*it, "decoder"); !s.ok()) return s;
  } else {
    return tok_.Error("decoder", "missing: a ByteLevel decoder is required");
  }
  if (absl::Status s = LoadAddedTokens(root, config); !s.ok()) return s;
  if (config != nullptr) {
    if (absl::Status s = LoadConfig(*config); !s.ok()) return s;
  }
  if (auto it = root.find("post_processor"); it != root.end() && !it->is_null()) {
    if (absl::Status s = LoadPostProcessor(*it, "post_processor"); !s.ok()) return s;
  }
  if (auto it = root.find("truncation"); it != root.end() && !it->is_null()) {
    LogWarning("tokenizer.json truncation settings are ignored", {{"file", tok_.source()}});
  }
  if (absl::Status s = Finish(); !s.ok()) return s;
  return std::move(t_);
}

absl::Status TokenizerLoader::LoadModel(const Json& model) {
  if (!model.is_object()) return tok_.TypeError("model", model, "object");
  std::string type;
  if (auto it = model.find("type"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) return tok_.TypeError("model.type", *it, "string");
    type = it->get<std::string>();
  } else if (model.contains("merges")) {
    type = "BPE";  // Older files omit the type.
  }
  if (type != "BPE") {
    return tok_.Error("model.type",
                      absl::StrCat("model type \"", type, "\" is not supported (supported: BPE)"));
  }
  BpeConfig config;
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return vocab == model.end() ? tok_.Error("model.vocab", "missing")
                                : tok_.TypeError("model.vocab", *vocab, "object");
  }
  config.vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer()) {
      return tok_.TypeError(absl::StrCat("model.vocab[\"", it.key(), "\"]"), *it, "integer id");
    }
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return tok_.Error(absl::StrCat("model.vocab[\"", it.key(), "\"]"),
                        absl::StrCat("id ", id, " is out of range"));
    }
    config.vocab.emplace_back(it.key(), static_cast<int32_t>(id));
  }
  auto merges = model.find("merges");
  if (merges != model.end() && !merges->is_null()) {
    if (!merges->is_array()) return tok_.TypeError("model.merges", *merges, "array");
    config.merges.reserve(merges->size());
    for (size_t i = 0; i < merges->size(); ++i) {
      const Json& m = (*merges)[i];
      const std::string path = absl::StrCat("model.merges[", i, "]");
      if (m.is_string()) {
        // Older encoding "left right": exactly one space separates the parts.
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos ||
            space == 0 || space + 1 == s.size()) {
          return tok_.Error(
              path, absl::StrCat("merge \"", s, "\" is not two tokens separated by one space"));
        }
        config.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        config.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return tok_.TypeError(path, m, "\"a b\" string or [a, b] pair of strings");
      }
    }
  }
  absl::StatusOr<std::optional<std::string>> unk = tok_.String(model, "unk_token", "model");
  if (!unk.ok()) return unk.status();
  config.unk_token = *unk;
  absl::StatusOr<bool> b = tok_.Bool(model, "ignore_merges", "model", false);
  if (!b.ok()) return b.status();
  config.ignore_merges = *b;
  b = tok_.Bool(model, "fuse_unk", "model", false);
  if (!b.ok()) return b.status();
  config.fuse_unk = *b;
  b = tok_.Bool(model, "byte_fallback", "model", false);
  if (!b.ok()) return b.status();
  if (*b) return tok_.Error("model.byte_fallback", "byte_fallback BPE is not supported");
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return tok_.Error("model.dropout", "BPE dropout is not supported");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    absl::StatusOr<std::optional<std::string>> v = tok_.String(model, key, "model");
    if (!v.ok()) return v.status();
    if (v->has_value() && !(*v)->empty()) {
      return tok_.Error(absl::StrCat("model.", key), "is not supported by byte-level BPE");
    }
  }
  absl::StatusOr<std::unique_ptr<BpeModel>> bpe =
      BpeModel::Create(std::move(config), tok_.source());
  if (!bpe.ok()) return bpe.status();
  t_->model_ = *std::move(bpe);
  return absl::OkStatus();
}

absl::Status TokenizerLoader::LoadNormalizer(const Json& normalizer, absl::string_view path,
                                             int depth) {
  if (depth > kMaxNesting) return tok_.Error(path, "nested too deeply");
  absl::StatusOr<std::string> type = tok_.Type(normalizer, path);
  if (!type.ok()) return type.status();
  if (*type == "NFC") {
    t_->nfc_ = true;
    return absl::OkStatus();
  }
  if (*type == "Sequence") {
    auto list = normalizer.find("normalizers");
    if (list == normalizer.end() || !list->is_array()) {
      return tok_.Error(path, "Sequence needs a \"normalizers\" array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      if (absl::Status s =
              LoadNormalizer((*list)[i], absl::StrCat(path, ".normalizers[", i, "]"), depth + 1);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  return tok_.Error(path,
                    absl::StrCat("normalizer \"", *type, "\" is not supported (supported: NFC)"));
}

absl::Status TokenizerLoader::LoadPreTokenizer(const Json& pre, absl::string_view path, int depth) {
  if (depth > kMaxNesting) return tok_.Error(path, "nested too deeply");
  absl::StatusOr<std::string> type = tok_.Type(pre, path);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto list = pre.find("pretokenizers");
    if (list == pre.end() || !list->is_array()) {
      return tok_.Error(path, "Sequence needs a \"pretokenizers\" array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      if (absl::Status s = LoadPreTokenizer(
              (*list)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), depth + 1);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (*type == "Split") {
    auto pattern = pre.find("pattern");
    if (pattern == pre.end() || !pattern->is_object()) {
      return tok_.Error(path, "Split needs a \"pattern\" object");
    }
    std::string behavior_name = "Isolated";
    if (auto it = pre.find("behavior"); it != pre.end() && it->is_string()) {
      behavior_name = it->get<std::string>();
    }
    absl::StatusOr<tokenizer::SplitBehavior> behavior =
        tokenizer::ParseSplitBehavior(behavior_name);
    if (!behavior.ok()) return tok_.Error(path, behavior.status().message());
    absl::StatusOr<bool> invert = tok_.Bool(pre, "invert", path, false);
    if (!invert.ok()) return invert.status();
    absl::StatusOr<std::unique_ptr<RegexSplitter>> splitter;
    if (auto re = pattern->find("Regex"); re != pattern->end() && re->is_string()) {
      splitter = RegexSplitter::Create(re->get<std::string>(), *behavior, *invert);
    } else if (auto str = pattern->find("String"); str != pattern->end() && str->is_string()) {
      splitter = RegexSplitter::CreateLiteral(str->get<std::string>(), *behavior, *invert);
    } else {
      return tok_.Error(absl::StrCat(path, ".pattern"), "needs a \"Regex\" or \"String\"");
    }
    if (!splitter.ok()) return tok_.Error(path, splitter.status().message());
    if ((*splitter)->jit_compiled()) t_->regex_jit_ = true;
    t_->pre_tokenizer_->AddSplit(*std::move(splitter));
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") {
    // Hugging Face defaults: add_prefix_space=true, use_regex=true.
    absl::StatusOr<bool> add_prefix_space = tok_.Bool(pre, "add_prefix_space", path, true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    absl::StatusOr<bool> use_regex = tok_.Bool(pre, "use_regex", path, true);
    if (!use_regex.ok()) return use_regex.status();
    std::unique_ptr<RegexSplitter> splitter;
    if (*use_regex) {
      absl::StatusOr<std::unique_ptr<RegexSplitter>> s =
          RegexSplitter::Create(tokenizer::kGpt2Pattern, tokenizer::SplitBehavior::kIsolated);
      if (!s.ok()) return tok_.Error(path, s.status().message());
      if ((*s)->jit_compiled()) t_->regex_jit_ = true;
      splitter = *std::move(s);
    }
    t_->pre_tokenizer_->AddByteLevel(*add_prefix_space, std::move(splitter));
    return absl::OkStatus();
  }
  return tok_.Error(path,
                    absl::StrCat("pre-tokenizer \"", *type,
                                 "\" is not supported (supported: Sequence, Split, ByteLevel)"));
}

absl::Status TokenizerLoader::LoadDecoder(const Json& decoder, absl::string_view path, int depth) {
  if (depth > kMaxNesting) return tok_.Error(path, "nested too deeply");
  absl::StatusOr<std::string> type = tok_.Type(decoder, path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();
  if (*type == "Sequence") {
    auto list = decoder.find("decoders");
    if (list == decoder.end() || !list->is_array() || list->empty()) {
      return tok_.Error(path, "Sequence needs a non-empty \"decoders\" array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      if (absl::Status s =
              LoadDecoder((*list)[i], absl::StrCat(path, ".decoders[", i, "]"), depth + 1);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  return tok_.Error(
      path, absl::StrCat("decoder \"", *type, "\" is not supported (supported: ByteLevel)"));
}

absl::Status TokenizerLoader::LoadPostProcessor(const Json& post, absl::string_view path,
                                                int depth) {
  if (depth > kMaxNesting) return tok_.Error(path, "nested too deeply");
  absl::StatusOr<std::string> type = tok_.Type(post, path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();  // Only adjusts offsets.
  if (*type == "Sequence") {
    auto list = post.find("processors");
    if (list == post.end() || !list->is_array()) {
      return tok_.Error(path, "Sequence needs a \"processors\" array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      if (absl::Status s =
              LoadPostProcessor((*list)[i], absl::StrCat(path, ".processors[", i, "]"), depth + 1);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    auto single = post.find("single");
    if (single == post.end() || !single->is_array()) {
      return tok_.Error(path, "TemplateProcessing needs a \"single\" array");
    }
    auto specials = post.find("special_tokens");
    std::vector<int32_t> prefix, suffix;
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& item = (*single)[i];
      const std::string item_path = absl::StrCat(path, ".single[", i, "]");
      if (item.contains("Sequence")) {
        if (seen_sequence)
          return tok_.Error(item_path, "more than one Sequence in a single template");
        seen_sequence = true;
        continue;
      }
      auto special = item.find("SpecialToken");
      if (special == item.end() || !special->is_object()) {
        return tok_.Error(item_path, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      auto name = special->find("id");
      if (name == special->end() || !name->is_string()) {
        return tok_.Error(item_path, "SpecialToken needs a string \"id\"");
      }
      std::vector<int32_t> ids;
      const std::string token = name->get<std::string>();
      if (specials != post.end() && specials->is_object() && specials->contains(token)) {
        const Json& entry = (*specials)[token];
        auto list = entry.find("ids");
        if (list == entry.end() || !list->is_array()) {
          return tok_.Error(absl::StrCat(path, ".special_tokens[\"", token, "\"]"),
                            "needs an \"ids\" array");
        }
        for (const Json& id : *list) {
          if (!id.is_number_integer()) {
            return tok_.Error(absl::StrCat(path, ".special_tokens[\"", token, "\"]"),
                              "ids must be integers");
          }
          ids.push_back(id.get<int32_t>());
        }
      } else if (std::optional<int32_t> id = Lookup(token)) {
        ids.push_back(*id);
      } else {
        return tok_.Error(item_path, absl::StrCat("special token \"", token, "\" is unknown"));
      }
      (seen_sequence ? suffix : prefix)
          .insert((seen_sequence ? suffix : prefix).end(), ids.begin(), ids.end());
    }
    t_->prefix_ids_ = std::move(prefix);
    t_->suffix_ids_ = std::move(suffix);
    template_processing_ = true;
    return absl::OkStatus();
  }
  return tok_.Error(path, absl::StrCat("post-processor \"", *type,
                                       "\" is not supported (supported: ByteLevel, "
                                       "TemplateProcessing, Sequence)"));
}

absl::Status TokenizerLoader::LoadAddedTokens(const Json& root, const Json* config) {
  absl::flat_hash_map<int32_t, size_t> by_id;
  auto add = [&](const Json& entry, absl::string_view path, const Reader& r,
                 std::optional<int32_t> id_from_key) -> absl::Status {
    if (!entry.is_object()) return r.TypeError(path, entry, "object");
    AddedToken token;
    auto content = entry.find("content");
    if (content == entry.end() || !content->is_string()) {
      return r.Error(path, "needs a string \"content\"");
    }
    token.content = content->get<std::string>();
    if (absl::Status s = tokenizer::ValidateUtf8(token.content); !s.ok()) {
      return r.Error(path, s.message());
    }
    if (id_from_key.has_value()) {
      token.id = *id_from_key;
    } else {
      auto id = entry.find("id");
      if (id == entry.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() > kMaxTokenId) {
        return r.Error(path, absl::StrCat("needs an integer \"id\" in [0, ", kMaxTokenId, "]"));
      }
      token.id = id->get<int32_t>();
    }
    struct Flag {
      const char* key;
      bool* value;
      bool def;
    };
    for (const Flag& f :
         {Flag{"special", &token.special, false}, Flag{"single_word", &token.single_word, false},
          Flag{"lstrip", &token.lstrip, false}, Flag{"rstrip", &token.rstrip, false},
          Flag{"normalized", &token.normalized, false}}) {
      absl::StatusOr<bool> b = r.Bool(entry, f.key, path, f.def);
      if (!b.ok()) return b.status();
      *f.value = *b;
    }
    if (by_id.contains(token.id)) {
      if (id_from_key.has_value()) return absl::OkStatus();  // tokenizer.json wins.
      return r.Error(path, absl::StrCat("id ", token.id, " appears twice"));
    }
    by_id[token.id] = t_->added_.size();
    t_->added_.push_back(std::move(token));
    return absl::OkStatus();
  };
  if (auto list = root.find("added_tokens"); list != root.end() && !list->is_null()) {
    if (!list->is_array()) return tok_.TypeError("added_tokens", *list, "array");
    for (size_t i = 0; i < list->size(); ++i) {
      if (absl::Status s =
              add((*list)[i], absl::StrCat("added_tokens[", i, "]"), tok_, std::nullopt);
          !s.ok()) {
        return s;
      }
    }
  }
  // transformers also registers tokenizer_config.json's added_tokens_decoder.
  if (config != nullptr && config->is_object()) {
    if (auto dec = config->find("added_tokens_decoder"); dec != config->end() && dec->is_object()) {
      for (auto it = dec->begin(); it != dec->end(); ++it) {
        const std::string path = absl::StrCat("added_tokens_decoder[\"", it.key(), "\"]");
        int32_t id = 0;
        if (!absl::SimpleAtoi(it.key(), &id) || id < 0 || id > kMaxTokenId) {
          return cfg_.Error(path, "key is not a token id");
        }
        if (absl::Status s = add(*it, path, cfg_, id); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TokenizerLoader::LoadConfig(const Json& config) {
  if (!config.is_object()) return cfg_.TypeError("top level", config, "object");
  absl::StatusOr<bool> b = cfg_.Bool(config, "add_bos_token", "", false);
  if (!b.ok()) return b.status();
  t_->add_bos_token_ = *b;
  b = cfg_.Bool(config, "add_eos_token", "", false);
  if (!b.ok()) return b.status();
  t_->add_eos_token_ = *b;
  b = cfg_.Bool(config, "clean_up_tokenization_spaces", "", false);
  if (!b.ok()) return b.status();
  t_->config_clean_up_ = *b;
  if (auto list = config.find("additional_special_tokens");
      list != config.end() && list->is_array()) {
    for (const Json& v : *list) {
      if (std::optional<std::string> content = ConfigTokenContent(v)) {
        additional_special_.push_back(*content);
      }
    }
  }
  if (auto tmpl = config.find("chat_template"); tmpl != config.end()) {
    if (tmpl->is_string()) {
      t_->chat_template_ = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      // A list of {"name", "template"}: keep "default", else the first.
      for (const Json& entry : *tmpl) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
          continue;
        }
        const bool is_default = entry.contains("name") && entry["name"] == "default";
        if (t_->chat_template_.empty() || is_default) {
          t_->chat_template_ = entry["template"].get<std::string>();
        }
        if (is_default) break;
      }
    }
  }
  struct Named {
    const char* key;
    std::optional<int32_t>* id;
  };
  for (const Named& n : {Named{"bos_token", &t_->bos_id_}, Named{"eos_token", &t_->eos_id_},
                         Named{"pad_token", &t_->pad_id_}}) {
    auto it = config.find(n.key);
    if (it == config.end() || it->is_null()) continue;
    std::optional<std::string> content = ConfigTokenContent(*it);
    if (!content.has_value()) return cfg_.TypeError(n.key, *it, "string or {\"content\": ...}");
    *n.id = Lookup(*content);
    if (!n.id->has_value()) {
      LogWarning("tokenizer_config.json names a token that is not in the vocabulary",
                 {{"file", cfg_.source()}, {"key", n.key}, {"token", *content}});
    }
  }
  return absl::OkStatus();
}

std::optional<int32_t> TokenizerLoader::Lookup(absl::string_view token) const {
  for (const AddedToken& t : t_->added_) {
    if (t.content == token) return t.id;
  }
  return t_->model_->TokenToId(tokenizer::StdView(token));
}

absl::Status TokenizerLoader::Finish() {
  Tokenizer& t = *t_;
  for (const std::string& content : additional_special_) {
    for (AddedToken& token : t.added_) {
      if (token.content == content) token.special = true;
    }
  }
  // Id table for decoding.
  int32_t max_id = t.model_->max_id();
  for (const AddedToken& token : t.added_) max_id = std::max(max_id, token.id);
  t.pieces_.assign(max_id + 1, TokenPiece{});
  t.present_.assign(max_id + 1, false);
  for (int32_t id = 0; id <= t.model_->max_id(); ++id) {
    if (const std::string* bytes = t.model_->IdToBytes(id)) {
      t.pieces_[id].text = *bytes;
      t.present_[id] = true;
    }
  }
  const bool bytes_vanish =
      t.model_->missing_byte_tokens() > 0 && (!t.model_->has_unk() || t.model_->fuse_unk());
  size_t longest = 1;
  for (const TokenPiece& piece : t.pieces_) longest = std::max(longest, piece.text.size());
  for (const AddedToken& token : t.added_) longest = std::max(longest, token.content.size());
  t.max_bytes_per_token_ = bytes_vanish ? 0 : longest;
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& token : t.added_) {
    t.added_ids_[token.content] = token.id;
    t.pieces_[token.id] = TokenPiece{token.content, /*added=*/true, token.special};
    t.present_[token.id] = true;
    (token.normalized ? normalized : raw).push_back(&token);
  }
  t.raw_matcher_ = std::make_unique<AddedTokenMatcher>(raw);
  // Tokens matched after normalization are matched in their normalized form.
  // Their content is kept for decoding; the matcher needs its own copies.
  t.normalized_matcher_ = std::make_unique<AddedTokenMatcher>(normalized);
  if (t.nfc_) {
    for (const AddedToken* token : normalized) {
      if (tokenizer::NormalizeNfc(token->content) != token->content) {
        return tok_.Error("added_tokens", absl::StrCat("normalized token \"", token->content,
                                                       "\" is not in NFC; not supported"));
      }
    }
  }
  if (!template_processing_) {
    if (t.add_bos_token_) {
      if (!t.bos_id_.has_value())
        return cfg_.Error("add_bos_token", "set but bos_token is unknown");
      t.prefix_ids_ = {*t.bos_id_};
    }
    if (t.add_eos_token_) {
      if (!t.eos_id_.has_value())
        return cfg_.Error("add_eos_token", "set but eos_token is unknown");
      t.suffix_ids_ = {*t.eos_id_};
    }
  }
  for (int32_t id : t.prefix_ids_) {
    if (id < 0 || id >= t.vocab_size() || !t.present_[id]) {
      return tok_.Error("post_processor",
                        absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  for (int32_t id : t.suffix_ids_) {
    if (id < 0 || id >= t.vocab_size() || !t.present_[id]) {
      return tok_.Error("post_processor",
                        absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  if (const int missing = t.model_->missing_byte_tokens(); missing > 0) {
    LogWarning(
        "byte-level vocabulary lacks single-byte tokens; such bytes encode to unk or are dropped",
        {{"file", tok_.source()}, {"missing_bytes", missing}});
  }
  return absl::OkStatus();
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(std::string_view dir) {
  std::string base(dir);
  if (!base.empty() && base.back() != '/') base += '/';
  const std::string config = base + "tokenizer_config.json";
  return FromFiles(base + "tokenizer.json", PathExists(config) ? config : "");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFiles(
    std::string_view tokenizer_json_path_std, std::string_view tokenizer_config_path_std) {
  const absl::string_view tokenizer_json_path = tokenizer::AbslView(tokenizer_json_path_std);
  const absl::string_view tokenizer_config_path = tokenizer::AbslView(tokenizer_config_path_std);
  absl::StatusOr<std::string> text = ReadFile(tokenizer_json_path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Json> root = ParseJson(*text, tokenizer_json_path);
  if (!root.ok()) return root.status();
  text->clear();
  std::optional<Json> config;
  if (!tokenizer_config_path.empty()) {
    absl::StatusOr<std::string> config_text = ReadFile(tokenizer_config_path);
    if (!config_text.ok()) return config_text.status();
    absl::StatusOr<Json> parsed = ParseJson(*config_text, tokenizer_config_path);
    if (!parsed.ok()) return parsed.status();
    config = *std::move(parsed);
  }
  TokenizerLoader loader{std::string(tokenizer_json_path), std::string(tokenizer_config_path)};
  return loader.Load(*root, config.has_value() ? &*config : nullptr);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view source_std) {
  const absl::string_view source = tokenizer::AbslView(source_std);
  absl::StatusOr<Json> root = ParseJson(tokenizer::AbslView(tokenizer_json), source);
  if (!root.ok()) return root.status();
  const std::string config_source = absl::StrCat(source, " (tokenizer_config.json)");
  std::optional<Json> config;
  if (!tokenizer_config_json.empty()) {
    absl::StatusOr<Json> parsed =
        ParseJson(tokenizer::AbslView(tokenizer_config_json), config_source);
    if (!parsed.ok()) return parsed.status();
    config = *std::move(parsed);
  }
  TokenizerLoader loader{std::string(source), config_source};
  return loader.Load(*root, config.has_value() ? &*config : nullptr);
}

absl::Status Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces;
  std::deque<std::string> storage;
  if (absl::Status s = pre_tokenizer_->Run(text, &pieces, &storage); !s.ok()) return s;
  for (std::string_view piece : pieces) model_->EncodeWord(piece, ids);
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const {
  if (normalized_matcher_->empty()) return EncodeOrdinary(text, ids);
  std::vector<Segment> segments;
  normalized_matcher_->Split(text, /*skip_special=*/false, &segments);
  for (const Segment& segment : segments) {
    if (segment.token >= 0) {
      ids->push_back(normalized_matcher_->token(segment.token).id);
    } else if (absl::Status s = EncodeOrdinary(segment.text, ids); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       const EncodeOptions& options) const {
  if (absl::Status s = tokenizer::ValidateUtf8(text); !s.ok()) return s;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids = prefix_ids_;
  std::vector<Segment> segments;
  raw_matcher_->Split(text, options.split_special_tokens, &segments);
  for (const Segment& segment : segments) {
    if (segment.token >= 0) {
      ids.push_back(raw_matcher_->token(segment.token).id);
      continue;
    }
    absl::Status s;
    if (nfc_ && !tokenizer::IsNfcQuick(segment.text)) {
      s = EncodeNormalized(tokenizer::NormalizeNfc(segment.text), &ids);
    } else {
      s = EncodeNormalized(segment.text, &ids);
    }
    if (!s.ok()) return s;
  }
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              const DecodeOptions& options) const {
  std::string out;
  std::string bytes;  // Pending run of byte-level tokens.
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenPiece* piece = Piece(ids[i]);
    if (piece == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is not in the vocabulary (size ",
                                                     vocab_size(), ")"));
    }
    if (piece->special && options.skip_special_tokens) continue;
    if (piece->added) {
      // Byte runs are decoded on their own, never across an added token.
      tokenizer::AppendUtf8Lossy(bytes, /*final=*/true, &out);
      bytes.clear();
      out.append(piece->text);
    } else {
      bytes.append(piece->text);
    }
  }
  tokenizer::AppendUtf8Lossy(bytes, /*final=*/true, &out);
  if (options.clean_up_tokenization_spaces) {
    return CleanUpTokenizationSpaces(out);
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(tokenizer::AbslView(token)); it != added_ids_.end()) {
    return it->second;
  }
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const TokenPiece* piece = Piece(id);
  if (piece == nullptr) return std::nullopt;
  if (piece->added) return std::string(piece->text);
  const std::string* token = model_->IdToToken(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

const TokenPiece* Tokenizer::Piece(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !present_[id]) return nullptr;
  return &pieces_[id];
}

bool Tokenizer::IsSpecialToken(int32_t id) const {
  const TokenPiece* piece = Piece(id);
  return piece != nullptr && piece->special;
}

size_t Tokenizer::CachedWords() const { return model_->CachedWords(); }

std::string CleanUpTokenizationSpaces(std::string_view text) {
  std::string out(text);
  // Applied one after another, in this order, as Hugging Face does.
  static constexpr std::pair<absl::string_view, absl::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  for (const auto& [from, to] : kRules) {
    if (out.find(from.data(), 0, from.size()) != std::string::npos)
      out = absl::StrReplaceAll(out, {{from, to}});
  }
  return out;
}

}  // namespace tessera
