#include "worker/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "base/json.h"
#include "base/str_cat.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (!dir.empty() && dir.back() == '/') return Cat(dir, name);
  return Cat(dir, "/", name);
}

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

absl::Status CheckShardName(const std::string& index_path, const std::string& tensor,
                            const std::string& shard) {
  if (shard.empty() || shard == "." || shard == ".." ||
      shard.find_first_of(std::string_view("/\\\0", 3)) != std::string::npos) {
    return absl::InvalidArgumentError(
        Cat(index_path, ": tensor \"", tensor, "\" is mapped to \"", shard,
            "\", which is not a plain file name in the index's directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  if (IsDirectory(path)) {
    const std::string index = JoinPath(path, kSafetensorsIndexName);
    if (Exists(index)) return OpenIndex(index);
    const std::string single = JoinPath(path, kSafetensorsSingleName);
    if (!Exists(single)) {
      return absl::NotFoundError(Cat(path, ": no ", kSafetensorsIndexName, " or ",
                                     kSafetensorsSingleName, " in this directory"));
    }
    return Open(single);
  }
  if (EndsWith(path, ".json")) return OpenIndex(path);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(*std::move(file));
  return FromFiles(std::move(files), path);
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenIndex(const std::string& index_path) {
  absl::StatusOr<Json> json = ReadJsonFile(index_path);
  if (!json.ok()) return json.status();
  if (!json->is_object() || !json->contains("weight_map")) {
    return absl::InvalidArgumentError(
        Cat(index_path, ": expected a JSON object with a \"weight_map\""));
  }
  const Json& weight_map = (*json)["weight_map"];
  if (!weight_map.is_object() || weight_map.empty()) {
    return absl::InvalidArgumentError(Cat(
        index_path, ": \"weight_map\" must be a non-empty object of tensor name -> shard file"));
  }

  // shard file name -> tensors the index maps to it (sorted, for stable errors).
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(Cat(index_path, ": tensor \"", tensor,
                                            "\" must map to a shard file name, got ",
                                            JsonTypeName(shard)));
    }
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (absl::Status s = CheckShardName(index_path, tensor, shard_name); !s.ok()) return s;
    shards[shard_name].push_back(tensor);
  }

  const std::string dir = DirName(index_path);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (auto& [shard_name, tensors] : shards) {
    std::sort(tensors.begin(), tensors.end());
    const std::string shard_path = JoinPath(dir, shard_name);
    if (!Exists(shard_path)) {
      return absl::NotFoundError(Cat(index_path, ": tensor \"", tensors.front(),
                                     "\" is mapped to shard \"", shard_name,
                                     "\", which does not exist (", shard_path, ")"));
    }
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
    if (!file.ok()) return file.status();
    for (const std::string& tensor : tensors) {
      if ((*file)->Find(tensor) == nullptr) {
        return absl::NotFoundError(Cat(index_path, ": tensor \"", tensor,
                                       "\" is mapped to shard \"", shard_name,
                                       "\", which holds no tensor of that name"));
      }
    }
    for (const TensorView& view : (*file)->tensors()) {
      auto it = weight_map.find(view.name);
      if (it == weight_map.end()) {
        return absl::InvalidArgumentError(Cat(shard_path, ": holds tensor \"", view.name,
                                              "\", which the index ", index_path,
                                              " does not list"));
      }
      if (it->get_ref<const std::string&>() != shard_name) {
        return absl::InvalidArgumentError(
            Cat(shard_path, ": holds tensor \"", view.name, "\", which the index ", index_path,
                " maps to shard \"", it->get_ref<const std::string&>(), "\""));
      }
    }
    files.push_back(*std::move(file));
  }
  return FromFiles(std::move(files), index_path);
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromFiles(
    std::vector<std::unique_ptr<SafetensorsFile>> files, std::string description) {
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->description_ = std::move(description);
  checkpoint->files_ = std::move(files);
  for (const std::unique_ptr<SafetensorsFile>& file : checkpoint->files_) {
    for (const TensorView& view : file->tensors()) {
      auto [it, inserted] = checkpoint->by_name_.emplace(view.name, &view);
      if (!inserted) {
        return absl::InvalidArgumentError(Cat(checkpoint->description_, ": tensor \"", view.name,
                                              "\" is held by both ", file->path(),
                                              " and another file"));
      }
    }
  }
  return checkpoint;
}

const TensorView* Checkpoint::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

absl::StatusOr<TensorView> Checkpoint::Get(std::string_view name) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    return absl::NotFoundError(Cat(description_, ": no tensor named \"", name, "\""));
  }
  return *view;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, view] : by_name_) names.emplace_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tessera::model
