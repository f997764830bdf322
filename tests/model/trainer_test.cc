// Trainer: loss falls on a learnable synthetic corpus; a saved model loads back through the
// safetensors reader and decodes the same greedy tokens.
#include "lib/model/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "lib/model/io/hf_config.h"
#include "lib/model/llama.h"
#include "lib/model/sampler.h"

namespace vtoken::model {
namespace {

ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.bos_token_ids = {0};
  c.eos_token_ids = {1};
  return c;
}

// A corpus with structure: repeated "words" (fixed token strings) in random order.
TrainData SyntheticCorpus(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<int32_t>> words = {{2, 3, 4}, {5, 6},       {7, 8, 9, 10},
                                                   {11, 12},  {13, 14, 15}, {16, 17, 18, 19, 20}};
  TrainData data;
  while (data.tokens.size() < 6000) {
    const auto& w = words[rng() % words.size()];
    data.tokens.insert(data.tokens.end(), w.begin(), w.end());
    data.tokens.push_back(31);  // separator
  }
  data.token_bytes.assign(32, 2);
  data.bos_id = 0;
  return data;
}

std::vector<int32_t> Greedy(const LlamaModel& model, std::vector<int32_t> prompt, int steps) {
  torch::NoGradGuard no_grad;
  Sampler sampler;
  for (int i = 0; i < steps; ++i) {
    auto tokens = torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end())).unsqueeze(0);
    prompt.push_back(sampler.Sample(model.ForwardDense(tokens)[0][-1]));
  }
  return prompt;
}

TEST(TrainerTest, LossFallsAndSavedModelLoadsBack) {
  torch::manual_seed(1);
  auto model = LlamaModel::RandomInit(TinyConfig(), 1);
  ASSERT_TRUE(model.ok());
  TrainOptions o;
  o.context = 24;
  o.batch = 8;
  o.steps = 60;
  o.lr = 1e-2;
  o.warmup_steps = 5;
  o.eval_every = 20;
  o.eval_windows = 16;
  o.val_fraction = 0.1;
  o.val_chunk_windows = 2;
  int64_t steps_seen = 0;
  TrainCallbacks callbacks;
  callbacks.on_step = [&](const TrainLogRow&) { ++steps_seen; };
  auto result = Train(*model, SyntheticCorpus(3), o, callbacks);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->steps_done, 60);
  EXPECT_EQ(steps_seen, 60);
  EXPECT_EQ(result->stop_reason, "steps");
  ASSERT_EQ(result->log.size(), 60u);
  EXPECT_TRUE(std::isnan(result->log[0].val_loss));
  ASSERT_FALSE(std::isnan(result->log[19].val_loss));
  EXPECT_EQ(result->val_scored_tokens, 16 * 24);
  EXPECT_EQ(result->val_scored_bytes, 2 * 16 * 24);
  EXPECT_NEAR(result->final_val_nats_per_byte, result->final_val_loss / 2, 1e-9);
  // Uniform guessing costs log(32) = 3.47 nats; the words make much less achievable.
  EXPECT_GT(result->log[0].train_loss, 3.0);
  EXPECT_LT(result->final_val_loss, 2.0);
  EXPECT_LT(result->final_val_loss, result->log[19].val_loss);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("vtoken_trainer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(model->Save(dir.string()).ok());
  auto loaded = LlamaModel::FromDirectory(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->config(), model->config());
  const std::vector<int32_t> prompt = {0, 7, 8};
  EXPECT_EQ(Greedy(*loaded, prompt, 12), Greedy(*model, prompt, 12));
  std::filesystem::remove_all(dir);
}

TEST(TrainerTest, ScheduleWarmsUpAndDecaysToMinimum) {
  TrainOptions o;
  o.lr = 1.0;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 0, 0.0), 0.1);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 9, 0.0), 1.0);
  EXPECT_NEAR(ScheduledLr(o, 50, 0.5), 0.55, 1e-12);
  EXPECT_NEAR(ScheduledLr(o, 99, 1.0), 0.1, 1e-12);
}

TEST(TrainerTest, RejectsCorpusShorterThanAWindow) {
  auto model = LlamaModel::RandomInit(TinyConfig(), 1);
  ASSERT_TRUE(model.ok());
  TrainData data;
  data.tokens = {2, 3, 4};
  data.token_bytes.assign(32, 1);
  TrainOptions o;
  o.context = 8;
  o.val_fraction = 0;
  auto result = Train(*model, data, o);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "train: 3 training tokens, fewer than one window of 8");
}

}  // namespace
}  // namespace vtoken::model
