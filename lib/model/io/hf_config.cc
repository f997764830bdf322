#include "lib/model/io/hf_config.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace vtoken::model {

namespace {

using nlohmann::json;

// Typed access to one config object; every error names the config and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, const std::string& name) : j_(j), name_(name) {}

  Status Error(const std::string& key, const std::string& what) const {
    return InvalidArgumentError(name_ + ": \"" + key + "\" " + what);
  }

  bool Has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  // Required when `fallback` is nullopt; absent or null keys take the fallback.
  StatusOr<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Error(key, "is required");
    }
    const json& v = j_[key];
    if (!v.is_number_integer()) return Error(key, "must be an integer, got " + v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, "is out of range: " + v.dump());
    }
    return v.get<int64_t>();
  }

  StatusOr<double> Double(const std::string& key, double fallback) const {
    if (!Has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number()) return Error(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }

  StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_boolean()) return Error(key, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  StatusOr<std::string> String(const std::string& key, const std::string& fallback) const {
    if (!Has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_string()) return Error(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }

  // An integer, a list of integers, or null/absent (empty).
  StatusOr<std::vector<int64_t>> IntOrList(const std::string& key) const {
    std::vector<int64_t> out;
    if (!Has(key)) return out;
    const json& v = j_[key];
    if (v.is_number_integer()) {
      out.push_back(v.get<int64_t>());
      return out;
    }
    if (!v.is_array()) return Error(key, "must be an integer or a list of integers");
    for (const json& e : v) {
      if (!e.is_number_integer()) return Error(key, "must be an integer or a list of integers");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  const json& j_;
  const std::string& name_;
};

const std::map<std::string, std::string, std::less<>>& Architectures() {
  static const auto* kArchitectures = new std::map<std::string, std::string, std::less<>>{
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
  };
  return *kArchitectures;
}

// transformers' default max_position_embeddings per config class.
int64_t DefaultMaxPositions(const std::string& model_type) {
  if (model_type == "mistral") return 4096 * 32;
  if (model_type == "qwen2") return 32768;
  return 2048;
}

bool IsKnownTorchDtype(const std::string& dtype) {
  return dtype == "float32" || dtype == "bfloat16" || dtype == "float16";
}

Status CheckPositive(const std::string& name, const char* key, int64_t value) {
  if (value > 0) return Status::Ok();
  return InvalidArgumentError(name + ": \"" + key + "\" must be positive, got " +
                              std::to_string(value));
}

// Largest dimension, head count, layer count, vocabulary or context a config may give, and the
// most parameters its shape may describe (2^50, about 10^15).
constexpr int64_t kMaxDimension = 2147483647;
constexpr int64_t kMaxParameters = int64_t{1} << 50;

Status ValidateNamed(const ModelConfig& c, const std::string& name) {
  if (!Architectures().contains(c.model_type)) {
    return InvalidArgumentError(name + ": unsupported model_type \"" + c.model_type +
                                "\" (supported: llama, mistral, qwen2)");
  }
  const std::pair<const char*, int64_t> positives[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [key, value] : positives)
    VTOKEN_RETURN_IF_ERROR(CheckPositive(name, key, value));
  // Bounded so that every product below (and in ParameterCount) fits: no real model comes near.
  for (const auto& [key, value] : positives) {
    if (value > kMaxDimension) {
      return InvalidArgumentError(name + ": \"" + key + "\" = " + std::to_string(value) +
                                  " exceeds " + std::to_string(kMaxDimension));
    }
  }
  {
    using Wide = __int128;
    const Wide h = c.hidden_size, q = Wide{c.num_attention_heads} * c.head_dim,
               kv = Wide{c.num_key_value_heads} * c.head_dim;
    const Wide per_layer =
        2 * h * q + 2 * h * kv + q + 2 * kv + h + 3 * h * c.intermediate_size + 2 * h;
    const Wide total = c.num_hidden_layers * per_layer + 2 * Wide{c.vocab_size} * h + h;
    if (total > Wide{kMaxParameters}) {
      return InvalidArgumentError(name + ": the shape gives more than " +
                                  std::to_string(kMaxParameters) +
                                  " parameters (hidden_size, heads x head_dim, "
                                  "intermediate_size, num_hidden_layers, vocab_size)");
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgumentError(name + ": \"num_attention_heads\" (" +
                                std::to_string(c.num_attention_heads) +
                                ") is not a multiple of \"num_key_value_heads\" (" +
                                std::to_string(c.num_key_value_heads) + ")");
  }
  if (!(c.rms_norm_eps > 0)) return InvalidArgumentError(name + ": \"rms_norm_eps\" must be > 0");
  if (!(c.rope_theta > 0)) return InvalidArgumentError(name + ": \"rope_theta\" must be > 0");
  if (c.rope_scaling.type == "llama3") {
    const RopeScaling& r = c.rope_scaling;
    if (!(r.factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
        r.original_max_position_embeddings <= 0) {
      return InvalidArgumentError(name +
                                  ": \"rope_scaling\" llama3 needs factor > 0, "
                                  "high_freq_factor > low_freq_factor > 0 and "
                                  "original_max_position_embeddings > 0");
    }
  } else if (!c.rope_scaling.type.empty()) {
    return InvalidArgumentError(name + ": unsupported rope_scaling type \"" + c.rope_scaling.type +
                                "\" (supported: llama3)");
  }
  const bool qwen2 = c.model_type == "qwen2";
  if (qwen2 && (!c.attention_bias || c.attention_output_bias)) {
    return InvalidArgumentError(name + ": qwen2 has q/k/v bias and no o_proj bias");
  }
  if (!qwen2 && c.attention_bias != c.attention_output_bias) {
    return InvalidArgumentError(name + ": \"attention_bias\" covers q/k/v and o_proj alike");
  }
  if (c.model_type == "mistral" && c.attention_bias) {
    return InvalidArgumentError(name + ": mistral has no attention bias");
  }
  if (c.sliding_window < 0 || (c.sliding_window > 0 && c.model_type != "mistral")) {
    return InvalidArgumentError(name + ": \"sliding_window\" is only supported for mistral");
  }
  for (const auto* ids : {&c.bos_token_ids, &c.eos_token_ids}) {
    for (int64_t id : *ids) {
      if (id < 0) {
        return InvalidArgumentError(name + ": token id " + std::to_string(id) + " is negative");
      }
    }
  }
  if (!IsKnownTorchDtype(c.torch_dtype)) {
    return InvalidArgumentError(name + ": unsupported torch_dtype \"" + c.torch_dtype +
                                "\" (supported: float32, bfloat16, float16)");
  }
  return Status::Ok();
}

StatusOr<RopeScaling> ParseRopeScaling(const json& j, const std::string& name) {
  RopeScaling r;
  if (j.is_null()) return r;
  if (!j.is_object()) return InvalidArgumentError(name + ": \"rope_scaling\" must be an object");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (j.contains(key) && j[key].is_string()) {
      type = j[key].get<std::string>();
      break;
    }
  }
  if (type == "default") return r;  // transformers' spelling of "no scaling"
  if (type != "llama3") {
    return InvalidArgumentError(name + ": unsupported rope_scaling type \"" + type +
                                "\" (supported: llama3)");
  }
  const std::string scope = name + ": rope_scaling";
  ConfigReader in(j, scope);
  r.type = type;
  VTOKEN_ASSIGN_OR_RETURN(r.factor, in.Double("factor", 0.0));
  VTOKEN_ASSIGN_OR_RETURN(r.low_freq_factor, in.Double("low_freq_factor", 0.0));
  VTOKEN_ASSIGN_OR_RETURN(r.high_freq_factor, in.Double("high_freq_factor", 0.0));
  VTOKEN_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                          in.Int("original_max_position_embeddings", std::nullopt));
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
    if (!in.Has(key)) return in.Error(key, "is required for llama3");
  }
  return r;
}

Status WriteTextAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return InvalidArgumentError(tmp + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (ok && std::rename(tmp.c_str(), path.c_str()) == 0) return Status::Ok();
  if (err == 0) err = errno;
  std::remove(tmp.c_str());
  return InvalidArgumentError(path + ": write failed: " + std::strerror(err));
}

}  // namespace

StatusOr<ModelConfig> ParseConfigJsonText(std::string_view text,
                                          const std::string& name_for_errors) {
  const std::string& name = name_for_errors;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(name + ": not valid JSON");
  if (!j.is_object()) return InvalidArgumentError(name + ": not a JSON object");
  ConfigReader in(j, name);

  ModelConfig c;
  VTOKEN_ASSIGN_OR_RETURN(c.model_type, in.String("model_type", ""));
  if (c.model_type.empty()) return in.Error("model_type", "is required");
  if (!Architectures().contains(c.model_type)) {
    return InvalidArgumentError(name + ": unsupported model_type \"" + c.model_type +
                                "\" (supported: llama, mistral, qwen2)");
  }
  VTOKEN_ASSIGN_OR_RETURN(c.vocab_size, in.Int("vocab_size", std::nullopt));
  VTOKEN_ASSIGN_OR_RETURN(c.hidden_size, in.Int("hidden_size", std::nullopt));
  VTOKEN_ASSIGN_OR_RETURN(c.intermediate_size, in.Int("intermediate_size", std::nullopt));
  VTOKEN_ASSIGN_OR_RETURN(c.num_hidden_layers, in.Int("num_hidden_layers", std::nullopt));
  VTOKEN_ASSIGN_OR_RETURN(c.num_attention_heads, in.Int("num_attention_heads", std::nullopt));
  VTOKEN_RETURN_IF_ERROR(CheckPositive(name, "num_attention_heads", c.num_attention_heads));
  VTOKEN_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          in.Int("num_key_value_heads", c.num_attention_heads));
  if (!in.Has("head_dim") && c.hidden_size % c.num_attention_heads != 0) {
    return in.Error("hidden_size",
                    "is not a multiple of \"num_attention_heads\" and no "
                    "\"head_dim\" is given");
  }
  VTOKEN_ASSIGN_OR_RETURN(c.head_dim, in.Int("head_dim", c.hidden_size / c.num_attention_heads));
  VTOKEN_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          in.Int("max_position_embeddings", DefaultMaxPositions(c.model_type)));
  VTOKEN_ASSIGN_OR_RETURN(c.rms_norm_eps, in.Double("rms_norm_eps", 1e-6));
  VTOKEN_ASSIGN_OR_RETURN(c.rope_theta, in.Double("rope_theta", 10000.0));
  if (j.contains("rope_scaling")) {
    VTOKEN_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j["rope_scaling"], name));
  }
  VTOKEN_ASSIGN_OR_RETURN(c.tie_word_embeddings, in.Bool("tie_word_embeddings", false));

  VTOKEN_ASSIGN_OR_RETURN(std::string hidden_act, in.String("hidden_act", "silu"));
  if (hidden_act != "silu")
    return in.Error("hidden_act", "\"" + hidden_act + "\" is not supported");
  VTOKEN_ASSIGN_OR_RETURN(bool mlp_bias, in.Bool("mlp_bias", false));
  if (mlp_bias) return in.Error("mlp_bias", "true is not supported");
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2's q/k/v always carry a bias, whatever the config says.
    VTOKEN_ASSIGN_OR_RETURN(bool use_sliding_window, in.Bool("use_sliding_window", false));
    if (use_sliding_window) return in.Error("use_sliding_window", "true is not supported");
  } else if (c.model_type == "llama") {
    VTOKEN_ASSIGN_OR_RETURN(c.attention_bias, in.Bool("attention_bias", false));
    c.attention_output_bias = c.attention_bias;
  } else if (c.model_type == "mistral") {
    // MistralConfig's default window is 4096; an explicit null (v0.2 and later) disables it.
    VTOKEN_ASSIGN_OR_RETURN(c.sliding_window,
                            in.Int("sliding_window", j.contains("sliding_window") ? 0 : 4096));
  }
  VTOKEN_ASSIGN_OR_RETURN(c.bos_token_ids, in.IntOrList("bos_token_id"));
  VTOKEN_ASSIGN_OR_RETURN(c.eos_token_ids, in.IntOrList("eos_token_id"));
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  VTOKEN_ASSIGN_OR_RETURN(c.torch_dtype, in.String("torch_dtype", "float32"));
  if (!in.Has("torch_dtype")) {
    VTOKEN_ASSIGN_OR_RETURN(c.torch_dtype, in.String("dtype", "float32"));
  }

  VTOKEN_RETURN_IF_ERROR(ValidateNamed(c, name));
  return c;
}

StatusOr<ModelConfig> ParseConfigJson(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return InvalidArgumentError(path + ": read failed");
  return ParseConfigJsonText(text.str(), path);
}

Status ValidateConfig(const ModelConfig& config) { return ValidateNamed(config, "model config"); }

std::string ConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  auto arch = Architectures().find(c.model_type);
  j["architectures"] = {arch == Architectures().end() ? "LlamaForCausalLM" : arch->second};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {
        {"rope_type", c.rope_scaling.type},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = false;
  } else if (c.model_type == "mistral") {
    if (c.sliding_window > 0) {
      j["sliding_window"] = c.sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
  } else if (c.model_type == "qwen2") {
    j["use_sliding_window"] = false;
  }
  for (auto [key, ids] :
       {std::pair{"bos_token_id", &c.bos_token_ids}, std::pair{"eos_token_id", &c.eos_token_ids}}) {
    if (ids->empty()) {
      j[key] = nullptr;
    } else if (ids->size() == 1) {
      j[key] = ids->front();
    } else {
      j[key] = *ids;
    }
  }
  j["torch_dtype"] = c.torch_dtype;
  return j.dump(2) + "\n";
}

Status WriteConfigJson(const std::string& path, const ModelConfig& config) {
  VTOKEN_RETURN_IF_ERROR(ValidateNamed(config, path));
  return WriteTextAtomically(path, ConfigToJson(config));
}

StatusOr<ModelConfig> SyntheticConfig(std::string_view name) {
  ModelConfig c;
  c.rms_norm_eps = 1e-5;
  c.head_dim = 128;
  c.torch_dtype = "bfloat16";
  if (name == "llama-3.1-8b") {
    c.model_type = "llama";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
    c.bos_token_ids = {128000};
    c.eos_token_ids = {128001, 128008, 128009};
  } else if (name == "mistral-7b") {  // Mistral-7B-v0.1
    c.model_type = "mistral";
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 32768;
    c.rope_theta = 10000.0;
    c.sliding_window = 4096;
    c.bos_token_ids = {1};
    c.eos_token_ids = {2};
  } else if (name == "qwen2.5-14b") {
    c.model_type = "qwen2";
    c.vocab_size = 152064;
    c.hidden_size = 5120;
    c.intermediate_size = 13824;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 40;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 1000000.0;
    c.attention_bias = true;
    c.bos_token_ids = {151643};
    c.eos_token_ids = {151643};
  } else if (name == "llama-2-13b") {
    c.model_type = "llama";
    c.vocab_size = 32000;
    c.hidden_size = 5120;
    c.intermediate_size = 13824;
    c.num_hidden_layers = 40;
    c.num_attention_heads = 40;
    c.num_key_value_heads = 40;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000.0;
    c.bos_token_ids = {1};
    c.eos_token_ids = {2};
    c.torch_dtype = "float16";
  } else {
    std::string known;
    for (const std::string& n : SyntheticConfigNames()) known += (known.empty() ? "" : ", ") + n;
    return NotFoundError("unknown synthetic model \"" + std::string(name) + "\" (known: " + known +
                         ")");
  }
  return c;
}

std::vector<std::string> SyntheticConfigNames() {
  return {"llama-2-13b", "llama-3.1-8b", "mistral-7b", "qwen2.5-14b"};
}

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  int64_t attention = h * q_width + 2 * h * kv_width + q_width * h;
  if (c.attention_bias) attention += q_width + 2 * kv_width;
  if (c.attention_output_bias) attention += h;
  const int64_t mlp = 3 * h * c.intermediate_size;
  const int64_t norms = 2 * h;
  const int64_t embeddings = c.vocab_size * h;
  return embeddings + c.num_hidden_layers * (attention + mlp + norms) + h +
         (c.tie_word_embeddings ? 0 : embeddings);
}

}  // namespace vtoken::model
