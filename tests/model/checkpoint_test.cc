#include "lib/model/io/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

ModelConfig TinyConfig(const std::string& model_type = "llama") {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.attention_bias = model_type == "qwen2";
  return c;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Deterministic contents: element j of the i-th tensor is i + j / 1000.
std::vector<float> Contents(size_t i, int64_t n) {
  std::vector<float> v(n);
  for (int64_t j = 0; j < n; ++j) v[j] = static_cast<float>(i) + static_cast<float>(j) / 1000.0f;
  return v;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("vtoken_checkpoint_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Writes config.json and the required tensors (F32, or BF16 every third tensor) split over
  // `num_shards` files (num_shards == 0: a single model.safetensors, no index).
  void WriteModel(const ModelConfig& config, int num_shards = 0,
                  const std::vector<TensorSpec>& override_specs = {}) {
    ASSERT_TRUE(WriteConfigJson(Path("config.json"), config).ok());
    specs_ = override_specs.empty() ? RequiredTensors(config) : override_specs;
    data_.clear();
    bf16_.clear();
    std::vector<std::vector<TensorToWrite>> files(std::max(num_shards, 1));
    weight_map_.clear();
    for (size_t i = 0; i < specs_.size(); ++i) {
      data_.push_back(Contents(i, NumElements(specs_[i].shape)));
    }
    for (size_t i = 0; i < specs_.size(); ++i) {
      const size_t shard = num_shards == 0 ? 0 : i % num_shards;
      if (i % 3 == 2) {
        std::vector<uint16_t> half;
        for (float f : data_[i]) half.push_back(FloatToBF16(f));
        bf16_[i] = std::move(half);
        files[shard].push_back({specs_[i].name, DType::kBF16, specs_[i].shape, bf16_[i].data()});
      } else {
        files[shard].push_back({specs_[i].name, DType::kF32, specs_[i].shape, data_[i].data()});
      }
      weight_map_.push_back({specs_[i].name, ShardName(shard, num_shards)});
    }
    if (num_shards == 0) {
      ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), files[0]).ok());
      return;
    }
    for (int s = 0; s < num_shards; ++s) {
      ASSERT_TRUE(WriteSafetensors(Path(ShardName(s, num_shards)), files[s]).ok());
    }
    WriteIndex(weight_map_);
  }

  static std::string ShardName(size_t shard, int num_shards) {
    return "model-0000" + std::to_string(shard + 1) + "-of-0000" + std::to_string(num_shards) +
           ".safetensors";
  }

  void WriteIndex(const std::vector<std::pair<std::string, std::string>>& weight_map) {
    std::ofstream out(Path("model.safetensors.index.json"));
    out << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
    for (size_t i = 0; i < weight_map.size(); ++i) {
      out << (i ? ", " : "") << '"' << weight_map[i].first << "\": \"" << weight_map[i].second
          << '"';
    }
    out << "}}";
  }

  // The stored value of required tensor i, as the reader must return it.
  std::vector<float> Expected(size_t i) const {
    if (!bf16_.contains(i)) return data_[i];
    std::vector<float> out;
    for (uint16_t h : bf16_.at(i)) out.push_back(BF16ToFloat(h));
    return out;
  }

  void ExpectLoadError(StatusCode code, const std::vector<std::string>& needles) {
    StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), code) << ckpt.status().ToString();
    for (const std::string& needle : needles) {
      EXPECT_NE(ckpt.status().message().find(needle), std::string::npos)
          << ckpt.status().ToString() << " lacks " << needle;
    }
  }

  std::string dir_;
  std::vector<TensorSpec> specs_;
  std::vector<std::vector<float>> data_;
  std::map<size_t, std::vector<uint16_t>> bf16_;
  std::vector<std::pair<std::string, std::string>> weight_map_;
};

TEST(RequiredTensorsTest, NamesAndShapesForOneQwen2Layer) {
  ModelConfig c = TinyConfig("qwen2");
  c.num_hidden_layers = 1;
  c.tie_word_embeddings = true;
  const std::vector<TensorSpec> expected = {
      {"model.embed_tokens.weight", {11, 8}},
      {"model.layers.0.input_layernorm.weight", {8}},
      {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.q_proj.bias", {8}},
      {"model.layers.0.self_attn.k_proj.bias", {4}},
      {"model.layers.0.self_attn.v_proj.bias", {4}},
      {"model.layers.0.post_attention_layernorm.weight", {8}},
      {"model.layers.0.mlp.gate_proj.weight", {12, 8}},
      {"model.layers.0.mlp.up_proj.weight", {12, 8}},
      {"model.layers.0.mlp.down_proj.weight", {8, 12}},
      {"model.norm.weight", {8}},
  };
  EXPECT_EQ(RequiredTensors(c), expected);
}

TEST(RequiredTensorsTest, LlamaBiasAndUntiedHead) {
  ModelConfig c = TinyConfig();
  c.attention_bias = c.attention_output_bias = true;
  std::vector<TensorSpec> specs = RequiredTensors(c);
  auto has = [&](const std::string& name) {
    return std::ranges::any_of(specs, [&](const TensorSpec& s) { return s.name == name; });
  };
  EXPECT_TRUE(has("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_TRUE(has("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_EQ(specs.back(), (TensorSpec{"lm_head.weight", {11, 8}}));
}

TEST(RequiredTensorsTest, ElementCountsSumToParameterCount) {
  std::vector<ModelConfig> configs = {TinyConfig(), TinyConfig("qwen2")};
  for (const std::string& name : SyntheticConfigNames()) configs.push_back(*SyntheticConfig(name));
  for (const ModelConfig& c : configs) {
    int64_t total = 0;
    for (const TensorSpec& s : RequiredTensors(c)) total += NumElements(s.shape);
    EXPECT_EQ(total, ParameterCount(c)) << ConfigToJson(c);
  }
}

TEST_F(CheckpointTest, LoadsSingleFile) {
  ModelConfig config = TinyConfig();
  WriteModel(config);
  StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(ckpt->config(), config);
  EXPECT_EQ(ckpt->files().size(), 1u);
  EXPECT_EQ(ckpt->TensorNames().size(), specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    const TensorView* t = ckpt->Find(specs_[i].name);
    ASSERT_NE(t, nullptr) << specs_[i].name;
    EXPECT_EQ(t->shape, specs_[i].shape);
    EXPECT_EQ(t->dtype, i % 3 == 2 ? DType::kBF16 : DType::kF32);
    std::vector<float> values(t->num_elements());
    ASSERT_TRUE(ConvertToFloat(*t, values).ok());
    EXPECT_EQ(values, Expected(i)) << specs_[i].name;
    EXPECT_EQ(ckpt->FileOf(specs_[i].name), Path("model.safetensors"));
  }
  EXPECT_EQ(ckpt->Find("model.layers.2.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(ckpt->FileOf("nope"), "");
}

TEST_F(CheckpointTest, LoadsShardsThroughIndex) {
  ModelConfig config = TinyConfig("qwen2");
  WriteModel(config, /*num_shards=*/3);
  StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(ckpt->files().size(), 3u);
  for (size_t i = 0; i < specs_.size(); ++i) {
    EXPECT_EQ(ckpt->FileOf(specs_[i].name), Path(ShardName(i % 3, 3)));
    const TensorView* t = ckpt->Find(specs_[i].name);
    ASSERT_NE(t, nullptr);
    std::vector<float> values(t->num_elements());
    ASSERT_TRUE(ConvertToFloat(*t, values).ok());
    EXPECT_EQ(values, Expected(i));
  }
  // Moving the checkpoint keeps views in place.
  const TensorView* before = ckpt->Find("model.norm.weight");
  Checkpoint moved = std::move(*ckpt);
  EXPECT_EQ(moved.Find("model.norm.weight"), before);
}

TEST_F(CheckpointTest, SingleFileWinsOverIndex) {
  WriteModel(TinyConfig(), /*num_shards=*/2);
  fs::copy_file(Path(ShardName(0, 2)), Path("model.safetensors"));
  // model.safetensors holds only half the tensors; loading it (not the index) must fail.
  ExpectLoadError(StatusCode::kNotFound, {"required tensor", Path("model.safetensors")});
}

TEST_F(CheckpointTest, TiedEmbeddingsNeedNoHead) {
  ModelConfig config = TinyConfig();
  config.tie_word_embeddings = true;
  WriteModel(config);
  StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ(ckpt->Find("lm_head.weight"), nullptr);
}

TEST_F(CheckpointTest, MissingConfig) {
  ExpectLoadError(StatusCode::kNotFound, {Path("config.json"), "no such file"});
}

TEST_F(CheckpointTest, BadConfigValue) {
  WriteModel(TinyConfig());
  std::ofstream(Path("config.json")) << R"({"model_type": "llama", "vocab_size": 11,
      "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 3})";
  ExpectLoadError(StatusCode::kInvalidArgument, {Path("config.json"), "num_key_value_heads"});
}

TEST_F(CheckpointTest, MissingWeights) {
  ASSERT_TRUE(WriteConfigJson(Path("config.json"), TinyConfig()).ok());
  ExpectLoadError(StatusCode::kNotFound,
                  {dir_, "no model.safetensors or model.safetensors.index.json"});
}

TEST_F(CheckpointTest, MissingRequiredTensor) {
  std::vector<TensorSpec> specs = RequiredTensors(TinyConfig());
  std::erase_if(
      specs, [](const TensorSpec& s) { return s.name == "model.layers.1.mlp.down_proj.weight"; });
  WriteModel(TinyConfig(), 0, specs);
  ExpectLoadError(StatusCode::kNotFound,
                  {"required tensor 'model.layers.1.mlp.down_proj.weight' is missing",
                   Path("model.safetensors")});
}

// Removes `name` from the header of a safetensors file, leaving its bytes in the data area (the
// header is padded with spaces to its old length, so every other offset stays valid).
void DropFromHeader(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  ASSERT_EQ(header.erase(name), 1u) << name;
  std::string text = header.dump();
  ASSERT_LE(text.size(), n);
  text.resize(n, ' ');
  bytes.replace(8, n, text);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_F(CheckpointTest, TensorDroppedFromTheHeaderIsNamedNotReportedAsAGap) {
  for (const char* name : {"model.norm.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    SCOPED_TRACE(name);
    WriteModel(TinyConfig());
    DropFromHeader(Path("model.safetensors"), name);
    ExpectLoadError(StatusCode::kNotFound,
                    {"required tensor '" + std::string(name) + "' is missing"});
  }
  // Every required tensor present: leftover bytes are still corruption.
  std::vector<TensorSpec> specs = RequiredTensors(TinyConfig());
  specs.push_back({"extra.weight", {4}});
  WriteModel(TinyConfig(), 0, specs);
  DropFromHeader(Path("model.safetensors"), "extra.weight");
  StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir_);
  EXPECT_EQ(ckpt.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(ckpt.status().message().find("leaves a gap of") != std::string::npos ||
              ckpt.status().message().find("trailing bytes after the last tensor") !=
                  std::string::npos)
      << ckpt.status().message();
}

TEST_F(CheckpointTest, MissingBiasForQwen2) {
  ModelConfig llama = TinyConfig();
  std::vector<TensorSpec> specs = RequiredTensors(llama);  // no biases
  ModelConfig qwen = TinyConfig("qwen2");
  WriteModel(qwen, 0, specs);
  ExpectLoadError(StatusCode::kNotFound, {"'model.layers.0.self_attn.q_proj.bias'"});
}

TEST_F(CheckpointTest, WrongShape) {
  std::vector<TensorSpec> specs = RequiredTensors(TinyConfig());
  for (TensorSpec& s : specs) {
    if (s.name == "model.layers.0.self_attn.k_proj.weight") s.shape = {8, 8};
  }
  WriteModel(TinyConfig(), 2, specs);
  ExpectLoadError(StatusCode::kInvalidArgument,
                  {Path(ShardName(1, 2)),  // tensor 3 goes to shard 3 % 2
                   "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 8], "
                   "config.json needs [4, 8]"});
}

TEST_F(CheckpointTest, MissingShard) {
  WriteModel(TinyConfig(), 2);
  fs::remove(Path(ShardName(1, 2)));
  ExpectLoadError(StatusCode::kNotFound, {Path(ShardName(1, 2)), "model.safetensors.index.json"});
}

TEST_F(CheckpointTest, IndexedTensorMissingFromShard) {
  WriteModel(TinyConfig(), 2);
  auto weight_map = weight_map_;
  weight_map.push_back({"model.extra.weight", ShardName(0, 2)});
  WriteIndex(weight_map);
  ExpectLoadError(StatusCode::kDataLoss,
                  {"model.safetensors.index.json", "tensor 'model.extra.weight'",
                   Path(ShardName(0, 2)), "does not contain it"});
}

TEST_F(CheckpointTest, CorruptShard) {
  WriteModel(TinyConfig(), 2);
  fs::resize_file(Path(ShardName(1, 2)), fs::file_size(Path(ShardName(1, 2))) - 4);
  ExpectLoadError(StatusCode::kDataLoss, {Path(ShardName(1, 2))});
}

TEST_F(CheckpointTest, BadIndex) {
  WriteModel(TinyConfig(), 2);
  std::ofstream(Path("model.safetensors.index.json")) << "{\"weight_map\": [";
  ExpectLoadError(StatusCode::kDataLoss, {"model.safetensors.index.json", "not a JSON object"});
  std::ofstream(Path("model.safetensors.index.json")) << "{\"metadata\": {}}";
  ExpectLoadError(StatusCode::kDataLoss, {"no \"weight_map\" object"});
  WriteIndex({{"model.norm.weight", "../outside.safetensors"}});
  ExpectLoadError(StatusCode::kDataLoss,
                  {"tensor 'model.norm.weight' maps to invalid shard \"../outside.safetensors\""});
}

}  // namespace
}  // namespace vtoken::model
