// GgufCheckpoint: a Llama-family model in one GGUF file (llama.cpp's format), seen through the
// same names and layouts as a Hugging Face checkpoint, so the runtime loads either alike.
//
// Architectures: `general.architecture` "llama" (Llama 2/3, SmolLM, Mistral files converted by
// llama.cpp) and "qwen2". The ModelConfig comes from the architecture's metadata keys (block
// count, embedding and feed-forward lengths, head counts, key length, RMS epsilon, RoPE base,
// context length) and the tensors (`output.weight` absent: tied embeddings; q/k/v biases). Tensor
// names map from llama.cpp's (`token_embd.weight`, `blk.N.attn_q.weight`, ...) to Hugging Face's
// (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ...).
//
// llama.cpp's converter permutes the rows of Q and K of "llama" models so that its rotary
// embedding can rotate adjacent pairs (GPT-J style); Read undoes it, so the model's
// rotate-half RoPE (as in transformers) applies unchanged. "qwen2" files are not permuted.
//
// Not supported (one-line InvalidArgument each): other architectures, RoPE scaling (a
// `rope.scaling.type` other than none, or a `rope_freqs.weight` tensor: Llama 3.1's scaling as
// llama.cpp stores it), a key length other than embedding / heads when the value length differs.
//
// Thread safety: immutable after Open; concurrent Reads are safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/gguf.h"
#include "lib/model/io/hf_config.h"

namespace vtoken::model {

// The ModelConfig the metadata of a "llama" or "qwen2" GGUF file describes (tensors are not
// consulted: tie_word_embeddings and attention_bias are left false). InvalidArgument naming
// `name_for_errors` and the key for a missing or out-of-range key or an unsupported architecture.
StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const GgufMetadata& metadata,
                                                  const std::string& name_for_errors);

// The llama.cpp name of a Hugging Face tensor name that RequiredTensors can return, e.g.
// "model.layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"; "" for any other name.
std::string GgufTensorName(std::string_view hf_name);

// "Q4_1 x210, F32 x61, Q8_0 x1": the tensor types of `file`, most frequent first.
std::string GgufTypeMix(const GgufFile& file);

class GgufCheckpoint {
 public:
  // Opens `path` (GgufFile::Open's errors) and checks that every tensor RequiredTensors(config)
  // names is present, with the shape the metadata implies (NotFound / InvalidArgument naming the
  // tensor), of a type Dequantize supports (InvalidArgument naming tensor and type), and that the
  // vocabulary (tokenizer.ggml.tokens, when present) has as many tokens as the embedding has rows.
  // With a tokenizer in the file (TokenizerFromGguf, whose errors pass through), config()'s
  // bos_token_ids is the BOS a prompt starts with (none unless add_bos_token, as llama.cpp
  // tokenizes) and eos_token_ids the EOS and end-of-turn tokens (llama.cpp's end of generation);
  // without one, the metadata's bos/eos ids.
  static StatusOr<GgufCheckpoint> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const GgufFile& file() const { return file_; }
  const ModelConfig& config() const { return config_; }

  // Dequantizes the tensor Hugging Face calls `hf_name` into `out` (row-major, HF layout: Q and K
  // rows un-permuted). InvalidArgument when out.size() differs from the tensor's size; NotFound for
  // a name RequiredTensors(config()) does not list.
  Status Read(std::string_view hf_name, std::span<float> out) const;

  // The tensor Hugging Face calls `hf_name` as the file stores it: its ggml type and its bytes,
  // rows in HF order (Q and K rows un-permuted as Read does, whole rows of blocks moved). A 2-D
  // tensor [rows, columns] holds each row's columns / block_size blocks contiguously. NotFound as
  // Read.
  struct Stored {
    GgmlType type = GgmlType::kF32;
    std::vector<std::byte> bytes;
  };
  StatusOr<Stored> ReadStored(std::string_view hf_name) const;

 private:
  GgufCheckpoint(GgufFile file, ModelConfig config, bool permuted_qk)
      : file_(std::move(file)), config_(std::move(config)), permuted_qk_(permuted_qk) {}

  GgufFile file_;
  ModelConfig config_;
  bool permuted_qk_;
};

}  // namespace vtoken::model
