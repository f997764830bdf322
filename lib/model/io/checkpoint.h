// Checkpoint: a Hugging Face model directory (config.json plus model.safetensors, or shards listed
// by model.safetensors.index.json), memory-mapped and validated against the tensor set its
// architecture requires. The libtorch model copies the views into its own tensors.
//
// Thread safety: immutable after LoadCheckpoint; concurrent readers are safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/hf_config.h"
#include "lib/model/io/safetensors.h"

namespace vtoken::model {

// A tensor the architecture needs, with its exact shape (Hugging Face name and layout: linear
// weights are [out_features, in_features]).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;

  bool operator==(const TensorSpec&) const = default;
};

// "[2048, 192]": a shape as error messages print it.
std::string ShapeString(const std::vector<int64_t>& shape);

// Every tensor a Llama-family model with `config` reads, in load order: model.embed_tokens.weight;
// per layer model.layers.{i}.input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight (+ q/k/v
// bias when attention_bias, + o_proj bias when attention_output_bias),
// post_attention_layernorm.weight, mlp.{gate,up,down}_proj.weight; model.norm.weight; and
// lm_head.weight unless tie_word_embeddings. The element counts sum to ParameterCount(config).
std::vector<TensorSpec> RequiredTensors(const ModelConfig& config);

class Checkpoint {
 public:
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  // The safetensors files, in the order they were opened (one unless sharded).
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // Returns the tensor called `name`, or nullptr. Every name in RequiredTensors(config()) is
  // present with the required shape. Views stay valid while this Checkpoint lives (moves included).
  const TensorView* Find(std::string_view name) const;
  // Path of the file holding `name`, or "" when there is no such tensor (for error messages).
  std::string FileOf(std::string_view name) const;
  // All tensor names, sorted. With an index, exactly the names in its weight_map.
  std::vector<std::string> TensorNames() const;

 private:
  friend StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);
  Checkpoint() = default;

  struct Entry {
    const TensorView* view;
    size_t file;  // index into files_
  };
  std::string dir_;
  ModelConfig config_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

// Loads `dir`: config.json, then model.safetensors if present (as transformers prefers it),
// else model.safetensors.index.json and every shard its weight_map names. Every file is fully
// validated (see SafetensorsFile::Open); tensors in a shard that the weight_map does not list
// are ignored. Errors, each naming the file and tensor at fault:
//   NotFound         no config.json, no weights file, a shard the index names does not exist, a
//                    required tensor is missing;
//   DataLoss         corrupt safetensors or index (not JSON, no "weight_map" object, a
//                    non-string or path-like shard name), a tensor the index maps to a shard that
//                    does not contain it;
//   InvalidArgument  a bad config.json value (see ParseConfigJsonText), a required tensor with
//                    the wrong shape, an unsupported dtype.
// Every dtype the reader accepts (F32, F16, BF16) is a float, so a loaded tensor is always one.
StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);

}  // namespace vtoken::model
