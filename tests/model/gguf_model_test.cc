// GgufCheckpoint: vt-tiny written to GGUF by the tests' own converter (gguf_test_writer.h) reads
// back with vt-tiny's config and, tensor by tensor, vt-tiny's weights in Hugging Face layout (the
// Q/K permutation undone); every way the file can disagree with itself is a one-line error.
#include "lib/model/io/gguf_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/model/io/checkpoint.h"
#include "lib/model/io/safetensors.h"
#include "tests/model/gguf_test_writer.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

std::string Source() {
  const char* src = std::getenv("VTOKEN_SOURCE_DIR");
  return src != nullptr ? src : ".";
}

class GgufModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_gguf_model_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    StatusOr<Checkpoint> c = LoadCheckpoint(Source() + "/models/vt-tiny");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    tiny_.emplace(std::move(*c));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // vt-tiny as GGUF, with `edit` applied to the metadata first; returns the path.
  std::string Write(GgmlType type, const GgufMetadata& extra = {}) {
    const std::string path = (dir_ / "tiny.gguf").string();
    const std::string error = testing::WriteLlamaGguf(*tiny_, path, type, extra);
    EXPECT_EQ(error, "");
    return path;
  }

  fs::path dir_;
  std::optional<Checkpoint> tiny_;
};

TEST_F(GgufModelTest, ConfigMatchesTheHuggingFaceConfig) {
  StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(Write(GgmlType::kF32));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ModelConfig expected = tiny_->config();
  // What GGUF does not carry here: the token ids (no tokenizer metadata) and the file dtype.
  expected.bos_token_ids.clear();
  expected.eos_token_ids.clear();
  expected.torch_dtype = "float32";
  ModelConfig got = g->config();
  EXPECT_FLOAT_EQ(got.rms_norm_eps, expected.rms_norm_eps);
  got.rms_norm_eps = expected.rms_norm_eps;  // stored as float32 in the file
  EXPECT_EQ(got, expected);
  EXPECT_TRUE(got.tie_word_embeddings);
  EXPECT_EQ(GgufTypeMix(g->file()), "F32 x" + std::to_string(g->file().tensors().size()));
}

TEST_F(GgufModelTest, F32TensorsReadBackExactlyInHuggingFaceLayout) {
  StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(Write(GgmlType::kF32));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const TensorSpec& spec : RequiredTensors(tiny_->config())) {
    const TensorView* view = tiny_->Find(spec.name);
    std::vector<float> want(view->num_elements()), got(view->num_elements());
    ASSERT_TRUE(ConvertToFloat(*view, want).ok());
    ASSERT_TRUE(g->Read(spec.name, got).ok()) << spec.name;
    ASSERT_EQ(got, want) << spec.name;
  }
}

TEST_F(GgufModelTest, Q8_0TensorsReadBackWithinTheQuantizationStep) {
  StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(Write(GgmlType::kQ8_0));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(GgufTypeMix(g->file()).find("Q8_0 x"), std::string::npos);
  const std::string name = "model.layers.2.self_attn.k_proj.weight";
  const TensorView* view = tiny_->Find(name);
  std::vector<float> want(view->num_elements()), got(view->num_elements());
  ASSERT_TRUE(ConvertToFloat(*view, want).ok());
  ASSERT_TRUE(g->Read(name, got).ok());
  // Q8_0: each block of 32 is scaled by d = max|x| / 127, stored as fp16 (relative error 2^-11):
  // an element is off by at most half a step plus 127 steps' share of d's rounding.
  for (size_t b = 0; b < want.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(want[i]));
    for (size_t i = b; i < b + 32; ++i) {
      ASSERT_LE(std::abs(got[i] - want[i]), amax / 127 * (0.5f + 127.0f / 2048) + 1e-7f) << i;
    }
  }
}

TEST_F(GgufModelTest, ReadRefusesAWrongSizeAndAnUnknownName) {
  StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(Write(GgmlType::kF32));
  ASSERT_TRUE(g.ok());
  std::vector<float> small(3);
  EXPECT_EQ(g->Read("model.norm.weight", small).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Read("model.layers.99.mlp.up_proj.weight", small).code(), StatusCode::kNotFound);
  EXPECT_EQ(g->Read("nonsense", small).code(), StatusCode::kNotFound);
}

TEST(GgufTensorNameTest, MapsEveryRequiredNameAndNothingElse) {
  ModelConfig c;
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.attention_bias = true;
  c.attention_output_bias = true;
  std::set<std::string> seen;
  for (const TensorSpec& spec : RequiredTensors(c)) {
    const std::string name = GgufTensorName(spec.name);
    EXPECT_NE(name, "") << spec.name;
    EXPECT_TRUE(seen.insert(name).second) << name;
  }
  EXPECT_EQ(GgufTensorName("model.layers.11.self_attn.o_proj.bias"), "blk.11.attn_output.bias");
  EXPECT_EQ(GgufTensorName("model.layers.x.mlp.up_proj.weight"), "");
  EXPECT_EQ(GgufTensorName("model.layers..mlp.up_proj.weight"), "");
  EXPECT_EQ(GgufTensorName("model.layers.1.mlp.up_proj"), "");
}

// Each case: metadata set on top of the converter's, and a substring of the one-line error.
struct BadCase {
  std::string name;
  std::vector<std::pair<std::string, GgufValue>> set;
  StatusCode code;
  std::string message;
};

TEST_F(GgufModelTest, InconsistentFilesAreOneLineErrors) {
  const std::vector<BadCase> cases = {
      {"architecture",
       {{"general.architecture", GgufValue::String("mamba")}},
       StatusCode::kInvalidArgument,
       "architecture 'mamba' is not supported"},
      {"embedding",
       {{"llama.embedding_length", GgufValue::Uint32(256)}},
       StatusCode::kInvalidArgument,
       "tensor token_embd.weight has shape [2048, 192]"},
      {"heads",
       {{"llama.attention.head_count_kv", GgufValue::Uint32(3)},
        {"llama.attention.head_count", GgufValue::Uint32(3)}},
       StatusCode::kInvalidArgument,
       "tensor blk.0.attn_k.weight has shape"},
      {"vocab",
       {{"tokenizer.ggml.tokens", GgufValue::StringArray({"a", "b", "c"})},
        {"llama.vocab_size", GgufValue::Uint32(3)}},
       StatusCode::kInvalidArgument,
       "the vocabulary has 3 tokens but token_embd.weight has 2048"},
      {"layers",
       {{"llama.block_count", GgufValue::Uint32(7)}},
       StatusCode::kNotFound,
       "tensor blk.6.attn_norm.weight (model.layers.6.input_layernorm.weight) is missing"},
      {"scaling",
       {{"llama.rope.scaling.type", GgufValue::String("yarn")}},
       StatusCode::kInvalidArgument,
       "rope.scaling.type 'yarn' is not supported"},
      {"key type",
       {{"llama.block_count", GgufValue::String("six")}},
       StatusCode::kInvalidArgument,
       "llama.block_count"},
      {"zero",
       {{"llama.feed_forward_length", GgufValue::Uint32(0)}},
       StatusCode::kInvalidArgument,
       "llama.feed_forward_length = 0 is outside"},
  };
  for (const BadCase& c : cases) {
    GgufMetadata extra;
    // The converter sets the llama.* keys after `extra`: write, then patch by writing again
    // with the converter's keys overridden.
    const std::string path = (dir_ / (c.name + ".gguf")).string();
    ASSERT_EQ(testing::WriteLlamaGguf(*tiny_, path, GgmlType::kF32), "");
    StatusOr<GgufFile> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    GgufMetadata patched = file->metadata();
    for (const auto& [key, value] : c.set) patched.Set(key, value);
    std::vector<GgufTensorToWrite> tensors;
    for (const GgufTensor& t : file->tensors())
      tensors.push_back({t.name, t.type, t.dims, t.bytes});
    const std::string bad = (dir_ / (c.name + "_bad.gguf")).string();
    ASSERT_TRUE(WriteGguf(bad, patched, tensors).ok());
    StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(bad);
    ASSERT_FALSE(g.ok()) << c.name;
    EXPECT_EQ(g.status().code(), c.code) << c.name << ": " << g.status().ToString();
    EXPECT_NE(g.status().message().find(c.message), std::string::npos)
        << c.name << ": " << g.status().message();
    EXPECT_NE(g.status().message().find(bad), std::string::npos) << g.status().message();
    EXPECT_EQ(g.status().message().find('\n'), std::string::npos) << g.status().message();
  }
}

TEST_F(GgufModelTest, AMissingTensorIsNamed) {
  const std::string path = Write(GgmlType::kF32);
  StatusOr<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::vector<GgufTensorToWrite> tensors;
  for (const GgufTensor& t : file->tensors()) {
    if (t.name != "blk.3.ffn_up.weight") tensors.push_back({t.name, t.type, t.dims, t.bytes});
  }
  const std::string bad = (dir_ / "missing.gguf").string();
  ASSERT_TRUE(WriteGguf(bad, file->metadata(), tensors).ok());
  StatusOr<GgufCheckpoint> g = GgufCheckpoint::Open(bad);
  ASSERT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find("tensor blk.3.ffn_up.weight"), std::string::npos);
}

}  // namespace
}  // namespace vtoken::model
