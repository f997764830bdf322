// The tests' own GGUF converter: a Hugging Face Llama checkpoint written as llama.cpp's
// convert_hf_to_gguf.py would write it (its tensor names, its Q/K row permutation, the
// `llama.*` metadata keys), independently of lib/model/io/gguf_model.cc, so a test can check
// that a model reads the same from either file.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "lib/model/io/checkpoint.h"
#include "lib/model/io/ggml_quants.h"
#include "lib/model/io/gguf.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::model::testing {

// llama.cpp's name for a Hugging Face tensor name, written out by hand (not GgufTensorName).
inline std::string LlamaCppName(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string rest = hf.substr(std::string("model.layers.").size());
  const std::string layer = rest.substr(0, rest.find('.'));
  const std::string suffix = rest.substr(rest.find('.') + 1);
  const std::vector<std::pair<std::string, std::string>> table = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  for (const auto& [from, to] : table) {
    if (suffix == from) return "blk." + layer + "." + to;
  }
  return "";
}

// convert_hf_to_gguf.py's LlamaModel.permute: per head, row j*d/2 + i moves to row 2i + j.
inline std::vector<float> PermuteRows(const std::vector<float>& w, int64_t heads, int64_t cols) {
  const int64_t d = static_cast<int64_t>(w.size()) / cols / heads;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(&out[(h * d + 2 * i + j) * cols], &w[(h * d + j * (d / 2) + i) * cols],
                    cols * sizeof(float));
      }
    }
  }
  return out;
}

// `tokenizer` as llama.cpp's converter writes a byte-level BPE vocabulary: tokenizer.ggml.model
// "gpt2", the pre-tokenizer's name, tokens by id (added tokens as their text, control type),
// merges as "a b", BOS / EOS ids and whether a BOS is added.
inline GgufMetadata TokenizerMetadata(const Tokenizer& tokenizer) {
  const TokenizerSpec& spec = tokenizer.spec();
  std::vector<std::string> tokens(tokenizer.vocab_size());
  std::vector<int32_t> types(tokenizer.vocab_size(), 1);
  for (const auto& [text, id] : spec.vocab) tokens[id] = text;
  for (const AddedToken& t : spec.added_tokens) {
    tokens[t.id] = t.content;
    types[t.id] = t.special ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (const auto& [a, b] : spec.merges) merges.push_back(a + " " + b);
  const char* pre = spec.pattern == SplitPattern::kLlama3  ? "llama-bpe"
                    : spec.pattern == SplitPattern::kQwen2 ? "qwen2"
                    : spec.pattern == SplitPattern::kGpt2  ? "gpt-2"
                                                           : "smollm";
  GgufMetadata m;
  m.Set("tokenizer.ggml.model", GgufValue::String("gpt2"));
  m.Set("tokenizer.ggml.pre", GgufValue::String(pre));
  m.Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  m.Set("tokenizer.ggml.token_type", GgufValue::Int32Array(types));
  m.Set("tokenizer.ggml.merges", GgufValue::StringArray(merges));
  if (tokenizer.bos_id()) {
    m.Set("tokenizer.ggml.bos_token_id", GgufValue::Uint32(*tokenizer.bos_id()));
  }
  if (tokenizer.eos_id()) {
    m.Set("tokenizer.ggml.eos_token_id", GgufValue::Uint32(*tokenizer.eos_id()));
  }
  m.Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(tokenizer.template_bos_id().has_value()));
  return m;
}

// Writes `checkpoint` to `path` as a GGUF file of architecture `arch` ("llama": Q and K rows
// permuted as the converter does; "qwen2": as they are, with their biases); 2-D tensors as
// `matrix_type` (F32, F16, Q8_0, Q4_0 or Q4_1), 1-D tensors as F32. No tokenizer metadata unless
// `metadata` brings it. Returns "" or an error message.
inline std::string WriteLlamaGguf(const Checkpoint& checkpoint, const std::string& path,
                                  GgmlType matrix_type, GgufMetadata metadata = {},
                                  const std::string& arch = "llama") {
  const ModelConfig& c = checkpoint.config();
  metadata.Set("general.architecture", GgufValue::String(arch));
  metadata.Set("general.alignment", GgufValue::Uint32(32));
  metadata.Set(arch + ".block_count", GgufValue::Uint32(c.num_hidden_layers));
  metadata.Set(arch + ".context_length", GgufValue::Uint32(c.max_position_embeddings));
  metadata.Set(arch + ".embedding_length", GgufValue::Uint32(c.hidden_size));
  metadata.Set(arch + ".feed_forward_length", GgufValue::Uint32(c.intermediate_size));
  metadata.Set(arch + ".attention.head_count", GgufValue::Uint32(c.num_attention_heads));
  metadata.Set(arch + ".attention.head_count_kv", GgufValue::Uint32(c.num_key_value_heads));
  metadata.Set(arch + ".attention.key_length", GgufValue::Uint32(c.head_dim));
  metadata.Set(arch + ".attention.value_length", GgufValue::Uint32(c.head_dim));
  metadata.Set(arch + ".rope.freq_base", GgufValue::Float32(static_cast<float>(c.rope_theta)));
  metadata.Set(arch + ".attention.layer_norm_rms_epsilon",
               GgufValue::Float32(static_cast<float>(c.rms_norm_eps)));
  metadata.Set(arch + ".vocab_size", GgufValue::Uint32(c.vocab_size));
  std::vector<std::string> blobs;  // the tensors' bytes, alive until WriteGguf returns
  std::vector<GgufTensorToWrite> tensors;
  blobs.reserve(RequiredTensors(c).size());
  for (const TensorSpec& spec : RequiredTensors(c)) {
    const TensorView* view = checkpoint.Find(spec.name);
    std::vector<float> w(view->num_elements());
    if (Status s = ConvertToFloat(*view, w); !s.ok()) return s.ToString();
    const int64_t cols = spec.shape.size() == 2 ? spec.shape[1] : 1;
    if (arch == "llama" && spec.name.find("q_proj.weight") != std::string::npos) {
      w = PermuteRows(w, c.num_attention_heads, cols);
    } else if (arch == "llama" && spec.name.find("k_proj.weight") != std::string::npos) {
      w = PermuteRows(w, c.num_key_value_heads, cols);
    }
    const GgmlType type = spec.shape.size() == 2 ? matrix_type : GgmlType::kF32;
    StatusOr<std::string> bytes = QuantizeRow(type, w);
    if (!bytes.ok()) return bytes.status().ToString();
    blobs.push_back(std::move(*bytes));
    std::vector<int64_t> dims(spec.shape.rbegin(), spec.shape.rend());
    tensors.push_back({LlamaCppName(spec.name), type, dims,
                       std::as_bytes(std::span(blobs.back().data(), blobs.back().size()))});
  }
  Status s = WriteGguf(path, metadata, tensors);
  return s.ok() ? "" : s.ToString();
}

}  // namespace vtoken::model::testing
