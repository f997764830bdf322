#include "lib/model/io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace vtoken::model {

namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Reads and validates the index; returns tensor name -> shard file name.
StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLossError(path + ": not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLossError(path + ": no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    // Shards live beside the index; a path-like name could point anywhere on the machine.
    if (!shard.is_string() || shard.get<std::string>().empty() ||
        shard.get<std::string>().find('/') != std::string::npos ||
        shard.get<std::string>() == "..") {
      return DataLossError(path + ": tensor '" + name + "' maps to invalid shard " + shard.dump());
    }
    weight_map[name] = shard.get<std::string>();
  }
  return weight_map;
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}});
    specs.push_back({p + "self_attn.q_proj.weight", {q_width, h}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_width, h}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_width, h}});
    specs.push_back({p + "self_attn.o_proj.weight", {h, q_width}});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q_width}});
      specs.push_back({p + "self_attn.k_proj.bias", {kv_width}});
      specs.push_back({p + "self_attn.v_proj.bias", {kv_width}});
    }
    if (c.attention_output_bias) specs.push_back({p + "self_attn.o_proj.bias", {h}});
    specs.push_back({p + "post_attention_layernorm.weight", {h}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
    specs.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  VTOKEN_ASSIGN_OR_RETURN(ckpt.config_, ParseConfigJson((fs::path(dir) / "config.json").string()));

  const std::string single = (fs::path(dir) / kSingleFile).string();
  const std::string index = (fs::path(dir) / kIndexFile).string();
  std::error_code ec;
  if (fs::exists(single, ec)) {
    VTOKEN_ASSIGN_OR_RETURN(SafetensorsFile file,
                            SafetensorsFile::Open(single, /*tolerate_gaps=*/true));
    ckpt.files_.push_back(std::move(file));
    // Views are registered only once files_ stops growing; see below.
    for (const TensorView& t : ckpt.files_[0].tensors()) ckpt.tensors_[t.name] = {nullptr, 0};
  } else if (fs::exists(index, ec)) {
    VTOKEN_ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index));
    std::map<std::string, size_t> shard_ids;
    for (const auto& [name, shard] : weight_map) {
      if (shard_ids.contains(shard)) continue;
      auto file = SafetensorsFile::Open((fs::path(dir) / shard).string(), /*tolerate_gaps=*/true);
      if (!file.ok()) {
        return Status(file.status().code(),
                      file.status().message() + " (shard listed in " + index + ")");
      }
      shard_ids[shard] = ckpt.files_.size();
      ckpt.files_.push_back(std::move(*file));
    }
    for (const auto& [name, shard] : weight_map) {
      const size_t id = shard_ids.at(shard);
      if (ckpt.files_[id].Find(name) == nullptr) {
        return DataLossError(index + ": tensor '" + name + "' is mapped to " +
                             ckpt.files_[id].path() + ", which does not contain it");
      }
      ckpt.tensors_[name] = {nullptr, id};
    }
  } else {
    return NotFoundError(dir + ": no " + kSingleFile + " or " + kIndexFile);
  }
  for (auto& [name, entry] : ckpt.tensors_) entry.view = ckpt.files_[entry.file].Find(name);

  for (const TensorSpec& spec : RequiredTensors(ckpt.config_)) {
    const TensorView* view = ckpt.Find(spec.name);
    if (view == nullptr) {
      std::string where;
      for (const SafetensorsFile& f : ckpt.files_) where += (where.empty() ? "" : ", ") + f.path();
      return NotFoundError(dir + ": required tensor '" + spec.name + "' is missing (looked in " +
                           where + ")");
    }
    if (view->shape != spec.shape) {
      return InvalidArgumentError(ckpt.FileOf(spec.name) + ": tensor '" + spec.name +
                                  "' has shape " + ShapeString(view->shape) +
                                  ", config.json needs " + ShapeString(spec.shape));
    }
  }
  // Every required tensor is there: a gap now is corruption, not a tensor left out.
  for (const SafetensorsFile& f : ckpt.files_) VTOKEN_RETURN_IF_ERROR(f.layout_error());
  return ckpt;
}

const TensorView* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.view;
}

std::string Checkpoint::FileOf(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? std::string() : files_[it->second.file].path();
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

}  // namespace vtoken::model
