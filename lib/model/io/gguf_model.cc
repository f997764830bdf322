#include "lib/model/io/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "lib/model/io/checkpoint.h"
#include "lib/model/io/ggml_quants.h"
#include "lib/model/io/gguf_tokenizer.h"

namespace vtoken::model {
namespace {

// One metadata integer in [lo, hi]; `fallback` when absent (nullopt: required).
StatusOr<int64_t> IntKey(const GgufMetadata& m, const std::string& key, const std::string& name,
                         std::optional<int64_t> fallback, int64_t lo, int64_t hi) {
  if (!m.Has(key)) {
    if (fallback) return *fallback;
    return InvalidArgumentError(name + ": metadata key " + key + " is missing");
  }
  StatusOr<int64_t> v = m.GetInt(key);
  if (!v.ok()) return InvalidArgumentError(name + ": " + v.status().message());
  if (*v < lo || *v > hi) {
    return InvalidArgumentError(name + ": " + key + " = " + std::to_string(*v) + " is outside [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return *v;
}

StatusOr<double> FloatKey(const GgufMetadata& m, const std::string& key, const std::string& name,
                          double fallback) {
  if (!m.Has(key)) return fallback;
  StatusOr<double> v = m.GetFloat(key);
  if (!v.ok()) return InvalidArgumentError(name + ": " + v.status().message());
  if (!(*v > 0)) return InvalidArgumentError(name + ": " + key + " must be > 0");
  return *v;
}

// Hugging Face per-layer suffix -> llama.cpp per-block suffix.
const std::map<std::string, std::string, std::less<>>& LayerNames() {
  static const auto* names = new std::map<std::string, std::string, std::less<>>{
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  return *names;
}

// Number of rotary heads whose rows llama.cpp permuted in `hf_name`; 0 for other tensors.
int64_t PermutedHeads(std::string_view hf_name, const ModelConfig& c) {
  auto ends = [&](std::string_view suffix) {
    return hf_name.size() >= suffix.size() &&
           hf_name.substr(hf_name.size() - suffix.size()) == suffix;
  };
  if (ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias")) {
    return c.num_attention_heads;
  }
  if (ends("self_attn.k_proj.weight") || ends("self_attn.k_proj.bias")) {
    return c.num_key_value_heads;
  }
  return 0;
}

}  // namespace

StatusOr<ModelConfig> ModelConfigFromGgufMetadata(const GgufMetadata& m, const std::string& name) {
  if (!m.Has("general.architecture")) {
    return InvalidArgumentError(name + ": metadata key general.architecture is missing");
  }
  StatusOr<std::string> arch = m.GetString("general.architecture");
  if (!arch.ok()) return InvalidArgumentError(name + ": " + arch.status().message());
  if (*arch != "llama" && *arch != "qwen2") {
    return InvalidArgumentError(name + ": architecture '" + *arch +
                                "' is not supported (supported: llama, qwen2)");
  }
  const std::string a = *arch + ".";
  constexpr int64_t kMax = int64_t{1} << 31;
  ModelConfig c;
  c.model_type = *arch;
  VTOKEN_ASSIGN_OR_RETURN(c.num_hidden_layers, IntKey(m, a + "block_count", name, {}, 1, 4096));
  VTOKEN_ASSIGN_OR_RETURN(c.hidden_size, IntKey(m, a + "embedding_length", name, {}, 1, kMax));
  VTOKEN_ASSIGN_OR_RETURN(c.intermediate_size,
                          IntKey(m, a + "feed_forward_length", name, {}, 1, kMax));
  VTOKEN_ASSIGN_OR_RETURN(c.num_attention_heads,
                          IntKey(m, a + "attention.head_count", name, {}, 1, 65536));
  VTOKEN_ASSIGN_OR_RETURN(c.num_key_value_heads, IntKey(m, a + "attention.head_count_kv", name,
                                                        c.num_attention_heads, 1, 65536));
  VTOKEN_ASSIGN_OR_RETURN(c.head_dim, IntKey(m, a + "attention.key_length", name,
                                             c.hidden_size / c.num_attention_heads, 1, 65536));
  VTOKEN_ASSIGN_OR_RETURN(const int64_t value_length,
                          IntKey(m, a + "attention.value_length", name, c.head_dim, 1, 65536));
  if (value_length != c.head_dim) {
    return InvalidArgumentError(name + ": " + a + "attention.value_length " +
                                std::to_string(value_length) + " differs from key_length " +
                                std::to_string(c.head_dim) + " (not supported)");
  }
  VTOKEN_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          IntKey(m, a + "context_length", name, {}, 1, kMax));
  VTOKEN_ASSIGN_OR_RETURN(c.rms_norm_eps,
                          FloatKey(m, a + "attention.layer_norm_rms_epsilon", name, 1e-5));
  VTOKEN_ASSIGN_OR_RETURN(c.rope_theta, FloatKey(m, a + "rope.freq_base", name, 10000.0));
  if (m.Has(a + "rope.dimension_count")) {
    VTOKEN_ASSIGN_OR_RETURN(const int64_t rope_dims,
                            IntKey(m, a + "rope.dimension_count", name, {}, 1, 65536));
    if (rope_dims != c.head_dim) {
      return InvalidArgumentError(name + ": " + a + "rope.dimension_count " +
                                  std::to_string(rope_dims) + " differs from the head size " +
                                  std::to_string(c.head_dim) + " (partial RoPE is not supported)");
    }
  }
  if (m.Has(a + "rope.scaling.type")) {
    StatusOr<std::string> type = m.GetString(a + "rope.scaling.type");
    if (!type.ok()) return InvalidArgumentError(name + ": " + type.status().message());
    if (*type != "none") {
      return InvalidArgumentError(name + ": " + a + "rope.scaling.type '" + *type +
                                  "' is not supported");
    }
  }
  if (m.Has("tokenizer.ggml.tokens")) {
    const GgufValue* tokens = m.Find("tokenizer.ggml.tokens");
    c.vocab_size = static_cast<int64_t>(tokens->elements.size());
  }
  VTOKEN_ASSIGN_OR_RETURN(
      c.vocab_size, IntKey(m, a + "vocab_size", name,
                           c.vocab_size > 0 ? std::optional(c.vocab_size) : std::nullopt, 1, kMax));
  for (auto [key, ids] : {std::pair{"tokenizer.ggml.bos_token_id", &c.bos_token_ids},
                          std::pair{"tokenizer.ggml.eos_token_id", &c.eos_token_ids}}) {
    if (!m.Has(key)) continue;
    VTOKEN_ASSIGN_OR_RETURN(const int64_t id, IntKey(m, key, name, {}, 0, c.vocab_size - 1));
    ids->push_back(id);
  }
  if (*arch == "qwen2") c.attention_bias = true;
  c.torch_dtype = "float32";
  return c;
}

std::string GgufTensorName(std::string_view hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  constexpr std::string_view kLayer = "model.layers.";
  if (hf.substr(0, kLayer.size()) != kLayer) return "";
  hf.remove_prefix(kLayer.size());
  const size_t dot = hf.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 6 ||
      hf.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos) {
    return "";
  }
  auto it = LayerNames().find(hf.substr(dot + 1));
  if (it == LayerNames().end()) return "";
  return "blk." + std::string(hf.substr(0, dot)) + "." + it->second;
}

StatusOr<GgufCheckpoint> GgufCheckpoint::Open(const std::string& path) {
  VTOKEN_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  VTOKEN_ASSIGN_OR_RETURN(ModelConfig c, ModelConfigFromGgufMetadata(file.metadata(), path));
  c.tie_word_embeddings = file.Find("output.weight") == nullptr;
  if (file.Find("rope_freqs.weight") != nullptr) {
    return InvalidArgumentError(path +
                                ": tensor rope_freqs.weight (RoPE frequency scaling, as llama.cpp "
                                "stores Llama 3.1's) is not supported");
  }
  if (c.model_type == "llama") c.attention_bias = file.Find("blk.0.attn_q.bias") != nullptr;
  c.attention_output_bias = file.Find("blk.0.attn_output.bias") != nullptr;
  if (Status valid = ValidateConfig(c); !valid.ok()) {
    return InvalidArgumentError(path + ": " + valid.message());
  }
  if (file.metadata().Has("tokenizer.ggml.model")) {
    // The prompt's BOS and the tokens that end a generation, as llama.cpp's vocabulary has them:
    // BOS only when the file says to add one; EOS and the end-of-turn token both stop.
    VTOKEN_ASSIGN_OR_RETURN(Tokenizer tokenizer, TokenizerFromGguf(file.metadata(), path));
    c.bos_token_ids.clear();
    if (tokenizer.template_bos_id()) c.bos_token_ids.push_back(*tokenizer.template_bos_id());
    c.eos_token_ids.clear();
    for (std::optional<int32_t> id : {tokenizer.eos_id(), tokenizer.eot_id()}) {
      if (id &&
          std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *id) == c.eos_token_ids.end()) {
        c.eos_token_ids.push_back(*id);
      }
    }
  }
  const GgufTensor* embedding = file.Find("token_embd.weight");
  if (embedding != nullptr && embedding->shape.size() == 2 && embedding->shape[0] != c.vocab_size) {
    return InvalidArgumentError(path + ": the vocabulary has " + std::to_string(c.vocab_size) +
                                " tokens but token_embd.weight has " +
                                std::to_string(embedding->shape[0]) + " rows");
  }
  for (const TensorSpec& spec : RequiredTensors(c)) {
    const std::string gguf_name = GgufTensorName(spec.name);
    const GgufTensor* t = file.Find(gguf_name);
    if (t == nullptr) {
      return NotFoundError(path + ": tensor " + gguf_name + " (" + spec.name + ") is missing");
    }
    if (t->shape != spec.shape) {
      return InvalidArgumentError(path + ": tensor " + gguf_name + " has shape " +
                                  ShapeString(t->shape) + " (row-major), the metadata implies " +
                                  ShapeString(spec.shape));
    }
    if (!CanDequantize(t->type)) {
      return InvalidArgumentError(path + ": tensor " + gguf_name + " has type " +
                                  GgmlTypeInfo(static_cast<uint32_t>(t->type))->name +
                                  ", which is not supported (supported: F32, F16, BF16, Q8_0, "
                                  "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
    }
  }
  const bool permuted = c.model_type == "llama";
  return GgufCheckpoint(std::move(file), std::move(c), permuted);
}

Status GgufCheckpoint::Read(std::string_view hf_name, std::span<float> out) const {
  const std::string gguf_name = GgufTensorName(hf_name);
  const GgufTensor* t = gguf_name.empty() ? nullptr : file_.Find(gguf_name);
  if (t == nullptr) {
    return NotFoundError(path() + ": no tensor for " + std::string(hf_name));
  }
  if (static_cast<int64_t>(out.size()) != t->num_elements()) {
    return InvalidArgumentError(path() + ": tensor " + gguf_name + " has " +
                                std::to_string(t->num_elements()) + " elements, the buffer " +
                                std::to_string(out.size()));
  }
  VTOKEN_RETURN_IF_ERROR(DequantizeTensor(*t, out));
  const int64_t heads = permuted_qk_ ? PermutedHeads(hf_name, config_) : 0;
  if (heads == 0) return Status::Ok();
  // llama.cpp stored row h*d + 2i + j of each head from Hugging Face's row h*d + j*d/2 + i
  // (d = head_dim, i < d/2, j in {0, 1}): put every row back.
  const int64_t d = config_.head_dim;
  const int64_t row = t->shape.size() == 2 ? t->shape[1] : 1;
  std::vector<float> head(static_cast<size_t>(d * row));
  for (int64_t h = 0; h < heads; ++h) {
    float* base = out.data() + h * d * row;
    std::memcpy(head.data(), base, head.size() * sizeof(float));
    for (int64_t i = 0; i < d / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(base + (j * (d / 2) + i) * row, head.data() + (2 * i + j) * row,
                    static_cast<size_t>(row) * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

StatusOr<GgufCheckpoint::Stored> GgufCheckpoint::ReadStored(std::string_view hf_name) const {
  const std::string gguf_name = GgufTensorName(hf_name);
  const GgufTensor* t = gguf_name.empty() ? nullptr : file_.Find(gguf_name);
  if (t == nullptr) {
    return NotFoundError(path() + ": no tensor for " + std::string(hf_name));
  }
  Stored stored{t->type, std::vector<std::byte>(t->bytes.begin(), t->bytes.end())};
  const int64_t heads = permuted_qk_ ? PermutedHeads(hf_name, config_) : 0;
  if (heads == 0) return stored;
  // Read's permutation, on rows of bytes.
  const int64_t d = config_.head_dim;
  const int64_t rows = t->shape.empty() ? 1 : t->shape[0];
  const size_t row = stored.bytes.size() / static_cast<size_t>(rows);
  std::vector<std::byte> head(static_cast<size_t>(d) * row);
  for (int64_t h = 0; h < heads; ++h) {
    std::byte* base = stored.bytes.data() + static_cast<size_t>(h * d) * row;
    std::memcpy(head.data(), base, head.size());
    for (int64_t i = 0; i < d / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(base + static_cast<size_t>(j * (d / 2) + i) * row,
                    head.data() + static_cast<size_t>(2 * i + j) * row, row);
      }
    }
  }
  return stored;
}

std::string GgufTypeMix(const GgufFile& file) {
  std::map<std::string, int64_t> counts;
  for (const GgufTensor& t : file.tensors()) {
    ++counts[GgmlTypeInfo(static_cast<uint32_t>(t.type))->name];
  }
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  for (const auto& [type, n] : sorted) {
    s += (s.empty() ? "" : ", ") + type + " x" + std::to_string(n);
  }
  return s;
}

}  // namespace vtoken::model
