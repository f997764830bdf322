// LlamaModel::FromDirectory takes the prompt's BOS from the directory's tokenizer.json (its
// post-processor template, as Hugging Face encodes), not from config.json: a tokenizer without a
// BOS template (Qwen2-style) gives none although config.json names one; a config without
// bos_token_id whose tokenizer template adds one gets it; without a tokenizer the config's
// bos_token_id stays.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/model/llama.h"

namespace vtoken::model {
namespace {

ModelConfig Config(std::vector<int64_t> bos) {
  ModelConfig c;
  c.vocab_size = 2048 + 8;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.bos_token_ids = std::move(bos);
  return c;
}

class BosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("vtoken_bos_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Saves a random model with `config` and, unless `post_processor` is absent, vt-tiny's
  // tokenizer.json with that post_processor (its own template adds <|begin_of_text|> = 2046).
  std::string Make(const ModelConfig& config, const nlohmann::json* post_processor) {
    StatusOr<LlamaModel> m = LlamaModel::RandomInit(config, 1);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE(m->Save(dir_.string()).ok());
    if (post_processor != nullptr) {
      const char* src = std::getenv("VTOKEN_SOURCE_DIR");
      std::ifstream in(std::string(src != nullptr ? src : ".") + "/models/vt-tiny/tokenizer.json");
      nlohmann::json t = nlohmann::json::parse(in);
      if (!post_processor->is_string()) t["post_processor"] = *post_processor;
      std::ofstream(dir_ / "tokenizer.json") << t.dump();
    }
    return dir_.string();
  }

  std::filesystem::path dir_;
};

TEST_F(BosTest, ATokenizerWithoutABosTemplateGivesNoBos) {
  const nlohmann::json none = nullptr;
  StatusOr<LlamaModel> m = LlamaModel::FromDirectory(Make(Config({2046}), &none));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->config().bos_token_ids.empty());
}

TEST_F(BosTest, ATokenizerTemplateAddsItsBosWhenTheConfigHasNone) {
  const nlohmann::json keep = "keep";  // vt-tiny's own TemplateProcessing.
  StatusOr<LlamaModel> m = LlamaModel::FromDirectory(Make(Config({}), &keep));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config().bos_token_ids, (std::vector<int64_t>{2046}));
}

TEST_F(BosTest, WithoutATokenizerTheConfigsBosStays) {
  StatusOr<LlamaModel> m = LlamaModel::FromDirectory(Make(Config({7}), nullptr));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config().bos_token_ids, (std::vector<int64_t>{7}));
}

}  // namespace
}  // namespace vtoken::model
