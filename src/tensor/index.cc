// TensorIndex: where every tensor of a (possibly sharded) model lives.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "daisy/safetensors.h"

namespace daisy {

namespace {
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kSingleFile = "model.safetensors";
}  // namespace

Result<TensorIndex> TensorIndex::Open(ModelSource& source) {
  TensorIndex idx;
  auto index_json = source.ReadFile(kIndexFile);
  if (index_json.ok()) {
    idx.sharded_ = true;
    const std::string where = source.Describe() + "/" + std::string(kIndexFile);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(*index_json);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(where + ": invalid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return InvalidArgument(where + ": no \"weight_map\" object");
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return InvalidArgument(where + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string file = it.value().get<std::string>();
      if (!IsSafeFileName(file) || !file.ends_with(".safetensors"))
        return InvalidArgument(where + ": weight_map names an unsafe or non-safetensors file '" + file + "'");
      idx.weight_map_[it.key()] = file;
      files.insert(file);
    }
    idx.header_bytes_ += index_json->size();
    idx.files_.assign(files.begin(), files.end());
    for (const auto& f : idx.files_) idx.file_loaded_[f] = false;
    return idx;
  }
  if (index_json.status().code() != ErrorCode::kNotFound) return index_json.status();

  // A single file: its header is the index.
  DAISY_ASSIGN_OR_RETURN(auto file, source.OpenFile(kSingleFile));
  DAISY_ASSIGN_OR_RETURN(auto header, ReadSafetensorsHeader(*file, source.Describe() + "/" + std::string(kSingleFile)));
  for (auto& t : header.tensors) t.file = std::string(kSingleFile);
  header.file = std::string(kSingleFile);
  idx.files_.push_back(std::string(kSingleFile));
  for (const auto& t : header.tensors) idx.weight_map_[t.name] = std::string(kSingleFile);
  DAISY_RETURN_IF_ERROR(idx.AddHeader(std::move(header)));
  return idx;
}

Result<TensorIndex> TensorIndex::Load(ModelSource& source) {
  DAISY_ASSIGN_OR_RETURN(TensorIndex idx, Open(source));
  DAISY_RETURN_IF_ERROR(idx.LoadAllHeaders(source));
  return idx;
}

Status TensorIndex::AddHeader(SafetensorsHeader header) {
  header_bytes_ += 8 + header.header_len;
  for (auto& t : header.tensors) {
    auto wm = weight_map_.find(t.name);
    // A shard may hold tensors the index does not list; the index is the authority.
    if (wm == weight_map_.end() || wm->second != header.file) continue;
    if (by_name_.count(t.name)) return InvalidArgument(header.file + ": tensor '" + t.name + "' appears twice");
    tensors_.push_back(std::move(t));
  }
  file_loaded_[header.file] = true;
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  by_name_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  return Status::Ok();
}

Status TensorIndex::LoadHeadersFor(ModelSource& source, const std::vector<std::string>& names) {
  std::set<std::string> needed;
  for (const auto& n : names) {
    auto wm = weight_map_.find(n);
    if (wm == weight_map_.end()) return NotFound("tensor '" + n + "' is not in " + source.Describe());
    if (!file_loaded_[wm->second]) needed.insert(wm->second);
  }
  for (const auto& f : needed) {
    DAISY_ASSIGN_OR_RETURN(auto file, source.OpenFile(f));
    DAISY_ASSIGN_OR_RETURN(auto header, ReadSafetensorsHeader(*file, source.Describe() + "/" + f));
    for (auto& t : header.tensors) t.file = f;
    header.file = f;
    DAISY_RETURN_IF_ERROR(AddHeader(std::move(header)));
  }
  for (const auto& n : names)
    if (!Find(n))
      return InvalidArgument("the index of " + source.Describe() + " puts tensor '" + n + "' in " +
                             weight_map_.find(n)->second + ", whose header does not have it");
  return Status::Ok();
}

Status TensorIndex::LoadAllHeaders(ModelSource& source) {
  std::vector<std::string> all;
  all.reserve(weight_map_.size());
  for (const auto& [name, file] : weight_map_) all.push_back(name);
  return LoadHeadersFor(source, all);
}

bool TensorIndex::Has(std::string_view name) const {
  return weight_map_.find(name) != weight_map_.end();
}

const TensorInfo* TensorIndex::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

bool TensorIndex::AllHeadersLoaded() const {
  for (const auto& [f, loaded] : file_loaded_)
    if (!loaded) return false;
  return true;
}

uint64_t TensorIndex::ParameterCount() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.Elements();
  return n;
}

}  // namespace daisy
