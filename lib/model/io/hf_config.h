// ModelConfig: the shape and hyperparameters of a Llama-family decoder (Llama 2/3/3.1, Mistral,
// Qwen2), read from and written to a Hugging Face config.json; plus the real published shapes of
// a few models ("synthetic" configs for timing without weights) and exact parameter counts.
//
// Parsing follows the defaults of the matching transformers config classes (LlamaConfig,
// MistralConfig, Qwen2Config) for keys a config.json omits, and rejects what the runtime cannot
// run (another model_type, hidden_act other than silu, rope scaling other than llama3, MLP bias)
// instead of silently running a different model.
//
// All functions are pure or touch only the named file; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::model {

// RoPE frequency scaling. Only Llama 3.1's "llama3" scheme is supported.
struct RopeScaling {
  std::string type;                              // "" = none, "llama3"
  double factor = 1.0;                           // llama3: 8 for Llama 3.1
  double low_freq_factor = 1.0;                  // llama3: 1
  double high_freq_factor = 1.0;                 // llama3: 4
  int64_t original_max_position_embeddings = 0;  // llama3: 8192

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string model_type = "llama";  // "llama", "mistral", "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU inner width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // config default: num_attention_heads (no GQA)
  int64_t head_dim = 0;             // config default: hidden_size / num_attention_heads
  // config default: 2048 (llama), 131072 (mistral), 32768 (qwen2), as in transformers.
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;        // config default 1e-6
  double rope_theta = 10000.0;       // config default 10000
  RopeScaling rope_scaling;          // config default: none
  bool tie_word_embeddings = false;  // true: lm_head reuses embed_tokens; config default false
  // q/k/v projections have a bias: always for qwen2; llama's "attention_bias" (default false).
  bool attention_bias = false;
  // o_proj has a bias: llama's "attention_bias" covers o_proj too; qwen2's o_proj has none.
  bool attention_output_bias = false;
  // Tokens of the attention window; 0 = full causal attention. Mistral v0.1's "sliding_window"
  // (4096), qwen2's only when "use_sliding_window" is true. The runtime decides what to do with it.
  int64_t sliding_window = 0;
  std::vector<int64_t> bos_token_ids;  // config may give an int, a list or null
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "float32";  // "float32", "bfloat16", "float16"; default float32

  bool operator==(const ModelConfig&) const = default;
};

// Parses the config.json at `path`. NotFound when the file is missing; otherwise as
// ParseConfigJsonText with the path as name.
StatusOr<ModelConfig> ParseConfigJson(const std::string& path);

// Parses config.json text. Errors are InvalidArgument, each one line starting with
// `name_for_errors` and naming the key: not JSON / not an object, unknown model_type, a missing
// required key (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads), a value of the wrong type or out of range, heads not divisible by KV
// heads, unsupported rope_scaling type, hidden_act or torch_dtype, "mlp_bias": true.
// Accepts "dtype" (newer transformers) as well as "torch_dtype", and rope_scaling null or of
// rope_type "default" as no scaling.
StatusOr<ModelConfig> ParseConfigJsonText(std::string_view text,
                                          const std::string& name_for_errors);

// Checks the invariants ParseConfigJsonText enforces, for configs built in code. InvalidArgument
// naming the first offending field.
Status ValidateConfig(const ModelConfig& config);

// A Hugging Face-compatible config.json (architectures, model_type, every field above, hidden_act
// "silu"); ParseConfigJsonText(ConfigToJson(c)) == c for every valid c.
std::string ConfigToJson(const ModelConfig& config);

// Writes ConfigToJson(config) to `path` atomically (temporary file + rename).
// InvalidArgument naming the path on I/O failure or an invalid config.
Status WriteConfigJson(const std::string& path, const ModelConfig& config);

// The published configuration of a known model: "llama-3.1-8b", "mistral-7b" (v0.1),
// "qwen2.5-14b", "llama-2-13b". NotFound naming `name` and listing the known names otherwise.
StatusOr<ModelConfig> SyntheticConfig(std::string_view name);
// The names SyntheticConfig accepts, sorted.
std::vector<std::string> SyntheticConfigNames();

// Number of parameters (embeddings, every projection and bias, every norm weight; lm_head unless
// tied), by arithmetic. Llama-3.1-8B: 8,030,261,248. REQUIRES: ValidateConfig(config).ok().
int64_t ParameterCount(const ModelConfig& config);

}  // namespace vtoken::model
