#include "lib/model/io/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

// The published config.json files, verbatim (transformers 4.32-4.43 era).
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kQwen25_14B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 13824, "max_position_embeddings": 131072, "max_window_layers": 48,
  "model_type": "qwen2", "num_attention_heads": 40, "num_hidden_layers": 48,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

constexpr const char* kLlama2_13B = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 13824, "max_position_embeddings": 4096, "model_type": "llama",
  "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 40,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.32.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

ModelConfig MustParse(const std::string& text) {
  StatusOr<ModelConfig> c = ParseConfigJsonText(text, "test.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

ModelConfig MustSynthetic(std::string_view name) {
  StatusOr<ModelConfig> c = SyntheticConfig(name);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : ModelConfig{};
}

TEST(HfConfigTest, PublishedConfigsMatchSyntheticShapes) {
  const std::pair<const char*, const char*> cases[] = {
      {"llama-3.1-8b", kLlama31_8B},
      {"mistral-7b", kMistral7B},
      {"qwen2.5-14b", kQwen25_14B},
      {"llama-2-13b", kLlama2_13B},
  };
  for (const auto& [name, text] : cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(MustParse(text), MustSynthetic(name));
  }
}

TEST(HfConfigTest, Llama31Fields) {
  ModelConfig c = MustParse(kLlama31_8B);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.head_dim, 128);  // derived: hidden_size / num_attention_heads
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{128000}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(HfConfigTest, Qwen2AlwaysHasQkvBias) {
  ModelConfig c = MustParse(kQwen25_14B);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.attention_output_bias);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
}

TEST(HfConfigTest, LlamaAttentionBiasCoversOutputProjection) {
  ModelConfig c = MustParse(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
      "attention_bias": true})");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.attention_output_bias);
}

TEST(HfConfigTest, ParameterCounts) {
  EXPECT_EQ(ParameterCount(MustSynthetic("llama-3.1-8b")), 8'030'261'248);
  EXPECT_EQ(ParameterCount(MustSynthetic("mistral-7b")), 7'241'732'096);
  EXPECT_EQ(ParameterCount(MustSynthetic("qwen2.5-14b")), 14'770'033'664);
  EXPECT_EQ(ParameterCount(MustSynthetic("llama-2-13b")), 13'015'864'320);
  ModelConfig tied = MustSynthetic("llama-3.1-8b");
  tied.tie_word_embeddings = true;
  EXPECT_EQ(ParameterCount(tied), 8'030'261'248 - 128256LL * 4096);
}

TEST(HfConfigTest, DefaultsFollowTransformers) {
  ModelConfig c = MustParse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.type, "");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.torch_dtype, "float32");

  ModelConfig m = MustParse(R"({"model_type": "mistral", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  ModelConfig q = MustParse(R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(q.max_position_embeddings, 32768);
}

TEST(HfConfigTest, OptionalSpellings) {
  const std::string base = R"({"model_type": "mistral", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, )";
  ModelConfig c = MustParse(base + R"("sliding_window": null, "head_dim": 32, "dtype": "float16",
      "bos_token_id": [5], "eos_token_id": null, "rope_scaling": {"rope_type": "default"}})");
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_EQ(c.bos_token_ids, (std::vector<int64_t>{5}));
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.rope_scaling.type, "");
  // "type" is the older spelling of "rope_type".
  ModelConfig l = MustParse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_EQ(l.rope_scaling.factor, 32.0);
}

TEST(HfConfigTest, BadValuesNameTheKey) {
  const std::string base = R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4)";
  const std::string llama = R"({"model_type": "llama", )" + base;
  struct Case {
    std::string text;
    std::string needle;
  };
  const Case cases[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{" + base + "}", "\"model_type\" is required"},
      {R"({"model_type": "gpt2", )" + base + "}", "unsupported model_type \"gpt2\""},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4})",
       "\"vocab_size\" is required"},
      {R"({"model_type": "llama", "vocab_size": "100", "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})",
       "\"vocab_size\" must be an integer, got \"100\""},
      {llama + R"(, "num_hidden_layers": 2.5})", "\"num_hidden_layers\" must be an integer"},
      {R"({"model_type": "llama", "vocab_size": -5, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})",
       "\"vocab_size\" must be positive, got -5"},
      {llama + R"(, "num_key_value_heads": 3})",
       "\"num_attention_heads\" (4) is not a multiple of \"num_key_value_heads\" (3)"},
      {R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 66,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})",
       "\"hidden_size\" is not a multiple of \"num_attention_heads\""},
      {llama + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
       "unsupported rope_scaling type \"yarn\""},
      {llama + R"(, "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
       "rope_scaling: \"factor\" is required for llama3"},
      {llama + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
          "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8}})",
       "high_freq_factor > low_freq_factor"},
      {llama + R"(, "rope_scaling": 3})", "\"rope_scaling\" must be an object"},
      {llama + R"(, "hidden_act": "gelu"})", "\"hidden_act\" \"gelu\" is not supported"},
      {llama + R"(, "mlp_bias": true})", "\"mlp_bias\" true is not supported"},
      {llama + R"(, "attention_bias": 1})", "\"attention_bias\" must be true or false"},
      {llama + R"(, "torch_dtype": "int8"})", "unsupported torch_dtype \"int8\""},
      {llama + R"(, "eos_token_id": [1, "2"]})", "\"eos_token_id\" must be an integer or a list"},
      {llama + R"(, "bos_token_id": -1})", "token id -1 is negative"},
      {llama + R"(, "rms_norm_eps": 0})", "\"rms_norm_eps\" must be > 0"},
      {R"({"model_type": "qwen2", )" + base + R"(, "use_sliding_window": true})",
       "\"use_sliding_window\" true is not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    StatusOr<ModelConfig> parsed = ParseConfigJsonText(c.text, "dir/config.json");
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message().rfind("dir/config.json: ", 0), 0u)
        << parsed.status().ToString();
    EXPECT_NE(parsed.status().message().find(c.needle), std::string::npos)
        << parsed.status().ToString();
  }
}

TEST(HfConfigTest, ToJsonRoundTrips) {
  std::vector<ModelConfig> configs;
  for (const std::string& name : SyntheticConfigNames()) configs.push_back(MustSynthetic(name));
  ModelConfig tiny = MustSynthetic("llama-2-13b");
  tiny.tie_word_embeddings = true;
  tiny.attention_bias = tiny.attention_output_bias = true;
  tiny.bos_token_ids.clear();
  tiny.eos_token_ids = {7, 8};
  tiny.torch_dtype = "float32";
  tiny.rms_norm_eps = 1.0 / 3.0;  // not exactly representable in decimal: needs full precision
  configs.push_back(tiny);
  ModelConfig mistral_no_window = MustSynthetic("mistral-7b");
  mistral_no_window.sliding_window = 0;
  configs.push_back(mistral_no_window);
  for (const ModelConfig& c : configs) {
    SCOPED_TRACE(ConfigToJson(c));
    ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).ToString();
    EXPECT_EQ(MustParse(ConfigToJson(c)), c);
  }
}

TEST(HfConfigTest, WriteAndParseFile) {
  const fs::path dir = fs::temp_directory_path() / ("vtoken_hf_config_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  ModelConfig c = MustSynthetic("qwen2.5-14b");
  ASSERT_TRUE(WriteConfigJson(path, c).ok());
  StatusOr<ModelConfig> read = ParseConfigJson(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, c);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);

  StatusOr<ModelConfig> missing = ParseConfigJson((dir / "nope.json").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);

  std::ofstream(path) << R"({"model_type": "bert"})";
  StatusOr<ModelConfig> bad = ParseConfigJson(path);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind(path + ": ", 0), 0u) << bad.status().ToString();

  c.num_key_value_heads = 7;
  Status s = WriteConfigJson(path, c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_key_value_heads"), std::string::npos) << s.ToString();
  fs::remove_all(dir);
}

TEST(HfConfigTest, ValidateRejectsInconsistentBiasAndWindow) {
  ModelConfig q = MustSynthetic("qwen2.5-14b");
  q.attention_bias = false;
  EXPECT_EQ(ValidateConfig(q).code(), StatusCode::kInvalidArgument);
  ModelConfig l = MustSynthetic("llama-3.1-8b");
  l.attention_bias = true;  // o_proj bias left false: llama cannot express that
  EXPECT_EQ(ValidateConfig(l).code(), StatusCode::kInvalidArgument);
  l.attention_output_bias = true;
  EXPECT_TRUE(ValidateConfig(l).ok());
  l.sliding_window = 4096;
  Status s = ValidateConfig(l);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sliding_window"), std::string::npos);
}

// Found by tests/fuzz/config_json_fuzz: ParameterCount overflowed int64 (UBSan).
TEST(HfConfigTest, ShapesTooLargeToCountAreRejected) {
  const std::string base =
      R"({"model_type": "llama", "vocab_size": 2048, "hidden_size": 192, "intermediate_size": 512,
          "num_hidden_layers": 6, "head_dim": 64, "num_key_value_heads": 1, )";
  StatusOr<ModelConfig> c =
      ParseConfigJsonText(base + R"("num_attention_heads": 333333333333333333})", "cfg");
  EXPECT_EQ(c.status().message(),
            "cfg: \"num_attention_heads\" = 333333333333333333 exceeds 2147483647");
  std::string wide = base + R"("num_attention_heads": 3})";
  wide.replace(wide.find("192"), 3, "2000000000");
  wide.replace(wide.find("512"), 3, "2000000000");
  c = ParseConfigJsonText(wide, "cfg");
  EXPECT_NE(c.status().message().find("cfg: the shape gives more than 1125899906842624 parameters"),
            std::string::npos)
      << c.status().message();
  c = ParseConfigJsonText(base + R"("num_attention_heads": 3})", "cfg");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GT(ParameterCount(*c), 0);
}

TEST(HfConfigTest, UnknownSyntheticNameIsNotFound) {
  StatusOr<ModelConfig> c = SyntheticConfig("gpt-5");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("\"gpt-5\""), std::string::npos);
  EXPECT_NE(c.status().message().find("llama-3.1-8b"), std::string::npos);
  for (const std::string& name : SyntheticConfigNames()) {
    StatusOr<ModelConfig> known = SyntheticConfig(name);
    ASSERT_TRUE(known.ok()) << name;
    EXPECT_TRUE(ValidateConfig(*known).ok()) << name;
  }
}

}  // namespace
}  // namespace vtoken::model
