// LlamaModel: building blocks against hand-computed values, and the paged forward against the
// dense reference under random slot placement, evictions and relocations.
#include "lib/model/llama.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <random>

namespace vtoken::model {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 48;
  c.intermediate_size = 72;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;  // GQA, odd KV head count, group 2
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  return c;
}

// Random weights with non-trivial norms and biases, so every term of the forward matters.
LlamaModel RandomModel(const ModelConfig& c, uint64_t seed) {
  auto model = LlamaModel::RandomInit(c, seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& [name, t] : model->NamedParameters()) {
    if (t.dim() == 1) t.add_(torch::randn_like(t) * 0.3);
    if (t.dim() == 2) t.mul_(5.0);  // Sharper attention than std 0.02 gives.
  }
  return std::move(*model);
}

double RelError(const torch::Tensor& actual, const torch::Tensor& expected) {
  return (actual - expected).abs().max().item<double>() /
         std::max(1e-30, expected.abs().max().item<double>());
}

torch::Tensor Tokens(const std::vector<int32_t>& ids) {
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64).unsqueeze(0);
}

TEST(RopeTest, Llama3ScalingMatchesHandComputedFrequencies) {
  ModelConfig c = SmallConfig();
  c.head_dim = 128;
  c.rope_theta = 500000.0;
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  auto inv_freq = RopeInverseFrequencies(c);
  ASSERT_EQ(inv_freq.sizes(), torch::IntArrayRef({64}));
  for (int64_t i = 0; i < 64; ++i) {
    const double base = 1.0 / std::pow(500000.0, (2.0 * i) / 128.0);
    const double wavelen = 2 * std::numbers::pi / base;
    double expected;
    if (wavelen < 8192.0 / 4.0) {
      expected = base;  // High frequencies are kept.
    } else if (wavelen > 8192.0) {
      expected = base / 8.0;  // Low frequencies are divided by the factor.
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * base / 8.0 + smooth * base;
    }
    EXPECT_NEAR(inv_freq[i].item<double>(), expected, 1e-6 * expected) << "i=" << i;
  }
  EXPECT_FLOAT_EQ(inv_freq[0].item<float>(), 1.0f);
  c.rope_scaling = {};
  EXPECT_NEAR(RopeInverseFrequencies(c)[63].item<double>(), std::pow(500000.0, -126.0 / 128.0),
              1e-12);
}

TEST(RmsNormTest, MatchesFormula) {
  auto x = torch::tensor({3.0f, 4.0f}).unsqueeze(0);
  auto w = torch::tensor({1.0f, 2.0f});
  auto y = RmsNorm(x, w, 0.0);
  const double r = 1.0 / std::sqrt(12.5);  // mean(9, 16) = 12.5
  EXPECT_NEAR(y[0][0].item<double>(), 3 * r, 1e-6);
  EXPECT_NEAR(y[0][1].item<double>(), 8 * r, 1e-6);
}

TEST(LlamaModelTest, ShapesAndParameterCount) {
  ModelConfig c = SmallConfig();
  c.model_type = "qwen2";
  c.attention_bias = true;  // qwen2: q/k/v bias, none on o_proj
  c.tie_word_embeddings = false;
  auto model = LlamaModel::RandomInit(c, 7);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->NumParameters(), ParameterCount(c));
  torch::NoGradGuard no_grad;
  auto logits = model->ForwardDense(torch::zeros({2, 5}, torch::kInt64));
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 5, 61}));
  auto kv = KvTensors::Create(model->KvOptions(32));
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->k(1).sizes(), torch::IntArrayRef({32, 3, 8}));
  const auto names = model->NamedParameters();
  EXPECT_EQ(names.back().first, "lm_head.weight");
  EXPECT_EQ(names[6].first, "model.layers.0.self_attn.q_proj.bias");
}

TEST(LlamaModelTest, RejectsBadConfigAndMissingTensor) {
  ModelConfig c = SmallConfig();
  c.num_key_value_heads = 4;  // 6 heads are not a multiple of 4
  EXPECT_EQ(LlamaModel::RandomInit(c, 1).status().code(), StatusCode::kInvalidArgument);
  auto model = LlamaModel::RandomInit(SmallConfig(), 1);
  ASSERT_TRUE(model.ok());
  auto tensors = model->NamedParameters();
  tensors.erase(tensors.begin() + 3);  // model.layers.0.self_attn.k_proj.weight
  auto loaded = LlamaModel::FromNamedTensors(SmallConfig(), tensors);
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(loaded.status().message(),
            "checkpoint: missing tensor model.layers.0.self_attn.k_proj.weight");
}

TEST(LlamaModelTest, PagedRejectsBadInput) {
  auto model = RandomModel(SmallConfig(), 3);
  auto kv = KvTensors::Create(model.KvOptions(8));
  ASSERT_TRUE(kv.ok());
  PagedSeqInput in{{1, 2}, {0, 1}, {0, 8}, {}};
  auto out = model.ForwardPaged({in}, *kv);
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "KvTensors: slot 8 out of range [0, 8)");
  in = {{1, 99}, {0, 1}, {0, 1}, {}};
  EXPECT_EQ(model.ForwardPaged({in}, *kv).status().message(),
            "ForwardPaged: input 0: token id 99 outside the vocabulary");
}

// Decodes one sequence step by step at random slots, evicting and relocating at random, and
// checks every step's logits against a dense replay where each query sees exactly the keys that
// were live when it ran.
TEST(LlamaModelTest, PagedDecodeWithEvictionsAndRelocationsMatchesDense) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = SmallConfig();
  LlamaModel model = RandomModel(c, seed);
  const int64_t num_slots = 96, length = 40, prefill = 6;
  auto kv = KvTensors::Create(model.KvOptions(num_slots));
  ASSERT_TRUE(kv.ok());
  std::vector<int64_t> free_slots(num_slots);
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  auto take_slot = [&] {
    int64_t s = free_slots.back();
    free_slots.pop_back();
    return s;
  };
  std::vector<int32_t> tokens(length);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);

  struct Live {
    int64_t token, slot;
  };
  std::vector<Live> live;  // in logical order
  auto visible = torch::zeros({length, length}, torch::kBool);
  std::vector<torch::Tensor> paged_logits(length);
  int64_t evictions = 0, relocations = 0;
  for (int64_t pos = 0; pos < length;) {
    const int64_t n = pos == 0 ? prefill : 1;
    PagedSeqInput in;
    for (const Live& l : live) in.context_slots.push_back(l.slot);
    for (int64_t i = pos; i < pos + n; ++i) {
      in.tokens.push_back(tokens[i]);
      in.positions.push_back(i);
      in.write_slots.push_back(take_slot());
      for (const Live& l : live) visible[i][l.token] = true;
      for (int64_t j = pos; j <= i; ++j) visible[i][j] = true;
    }
    auto out = model.ForwardPaged({in}, *kv);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    paged_logits[pos + n - 1] = (*out)[0].last_logits;
    const auto& attn = (*out)[0].attn;
    ASSERT_EQ(attn.size(), live.size() + n);
    EXPECT_NEAR(std::accumulate(attn.begin(), attn.end(), 0.0), 1.0, 1e-5);
    for (int64_t i = pos; i < pos + n; ++i) live.push_back({i, in.write_slots[i - pos]});
    pos += n;
    // Evict a random token (never the newest) with probability 1/3.
    if (live.size() > 2 && rng() % 3 == 0) {
      const size_t victim = rng() % (live.size() - 1);
      free_slots.insert(free_slots.begin() + rng() % (free_slots.size() + 1), live[victim].slot);
      live.erase(live.begin() + victim);
      ++evictions;
    }
    // Relocate a random live token to a free slot with probability 1/3.
    if (rng() % 3 == 0) {
      Live& moved = live[rng() % live.size()];
      const int64_t dst = take_slot();
      ASSERT_TRUE(kv->CopySlots({moved.slot}, {dst}).ok());
      free_slots.insert(free_slots.begin(), moved.slot);
      moved.slot = dst;
      ++relocations;
    }
  }
  std::printf("%lld evictions, %lld relocations\n", static_cast<long long>(evictions),
              static_cast<long long>(relocations));
  torch::NoGradGuard no_grad;
  auto dense = model.ForwardDense(Tokens(tokens), visible)[0];
  for (int64_t i = prefill - 1; i < length; ++i) {
    EXPECT_LT(RelError(paged_logits[i], dense[i]), 1e-5) << "position " << i;
  }
}

// Runs `lengths.size()` sequences: prefill in chunks of `chunk` tokens, then `decode` steps,
// batched together or each alone; returns every step's logits per sequence.
std::vector<std::vector<torch::Tensor>> RunSequences(const LlamaModel& model,
                                                     const std::vector<std::vector<int32_t>>& seqs,
                                                     int64_t prompt_len, int64_t chunk,
                                                     bool batched, uint64_t slot_seed) {
  std::mt19937_64 rng(slot_seed);
  const int64_t num_slots = 256;
  std::vector<int64_t> free_slots(num_slots);
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  auto kv = KvTensors::Create(model.KvOptions(num_slots));
  std::vector<std::vector<int64_t>> slots(seqs.size());
  std::vector<int64_t> done(seqs.size(), 0);
  std::vector<std::vector<torch::Tensor>> logits(seqs.size());
  auto next_input = [&](size_t s) {
    PagedSeqInput in;
    in.context_slots = slots[s];
    const int64_t end = done[s] < prompt_len ? std::min(prompt_len, done[s] + chunk) : done[s] + 1;
    for (int64_t i = done[s]; i < std::min<int64_t>(end, seqs[s].size()); ++i) {
      in.tokens.push_back(seqs[s][i]);
      in.positions.push_back(i);
      in.write_slots.push_back(free_slots.back());
      free_slots.pop_back();
    }
    return in;
  };
  auto finish = [&](size_t s, const PagedSeqInput& in, const PagedSeqOutput& out) {
    slots[s].insert(slots[s].end(), in.write_slots.begin(), in.write_slots.end());
    done[s] += static_cast<int64_t>(in.tokens.size());
    logits[s].push_back(out.last_logits);
  };
  auto remaining = [&](size_t s) { return done[s] < static_cast<int64_t>(seqs[s].size()); };
  if (batched) {
    for (;;) {
      std::vector<size_t> ids;
      std::vector<PagedSeqInput> inputs;
      for (size_t s = 0; s < seqs.size(); ++s) {
        if (remaining(s)) {
          ids.push_back(s);
          inputs.push_back(next_input(s));
        }
      }
      if (ids.empty()) break;
      auto out = model.ForwardPaged(inputs, *kv);
      EXPECT_TRUE(out.ok());
      for (size_t i = 0; i < ids.size(); ++i) finish(ids[i], inputs[i], (*out)[i]);
    }
  } else {
    for (size_t s = 0; s < seqs.size(); ++s) {
      while (remaining(s)) {
        auto in = next_input(s);
        auto out = model.ForwardPaged({in}, *kv);
        EXPECT_TRUE(out.ok());
        finish(s, in, (*out)[0]);
      }
    }
  }
  return logits;
}

TEST(LlamaModelTest, ChunkedPrefillMatchesTokenByToken) {
  const ModelConfig c = SmallConfig();
  LlamaModel model = RandomModel(c, 11);
  std::vector<std::vector<int32_t>> seqs = {{}};
  for (int i = 0; i < 20; ++i) seqs[0].push_back((i * 7 + 3) % c.vocab_size);
  auto by_token = RunSequences(model, seqs, 17, 1, false, 1);
  auto chunked = RunSequences(model, seqs, 17, 5, false, 2);  // chunks 5, 5, 5, 2, then decode
  ASSERT_EQ(by_token[0].size(), 20u);
  ASSERT_EQ(chunked[0].size(), 7u);
  // Chunk ends at positions 4, 9, 14, 16, then 17, 18, 19.
  const std::vector<int> chunk_end = {4, 9, 14, 16, 17, 18, 19};
  for (size_t i = 0; i < chunk_end.size(); ++i) {
    EXPECT_LT(RelError(chunked[0][i], by_token[0][chunk_end[i]]), 1e-5) << "chunk " << i;
  }
}

TEST(LlamaModelTest, BatchOfDifferentLengthsMatchesEachAlone) {
  ModelConfig c = SmallConfig();
  c.attention_bias = true;  // llama's attention_bias: q/k/v and o_proj biases
  c.attention_output_bias = true;
  c.tie_word_embeddings = false;
  LlamaModel model = RandomModel(c, 5);
  std::vector<std::vector<int32_t>> seqs(3);
  std::mt19937_64 rng(5);
  const int lengths[] = {9, 14, 4};
  for (size_t s = 0; s < 3; ++s) {
    for (int i = 0; i < lengths[s]; ++i) seqs[s].push_back(rng() % c.vocab_size);
  }
  auto alone = RunSequences(model, seqs, 3, 3, false, 3);
  auto batched = RunSequences(model, seqs, 3, 3, true, 4);
  for (size_t s = 0; s < 3; ++s) {
    ASSERT_EQ(alone[s].size(), batched[s].size());
    for (size_t i = 0; i < alone[s].size(); ++i) {
      EXPECT_LT(RelError(batched[s][i], alone[s][i]), 1e-5) << "seq " << s << " step " << i;
    }
  }
}

TEST(LlamaModelTest, SignalsDoNotDependOnPlacement) {
  const ModelConfig c = SmallConfig();
  LlamaModel model = RandomModel(c, 21);
  auto run = [&](uint64_t slot_seed) {
    std::mt19937_64 rng(slot_seed);
    std::vector<int64_t> slots(64);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    auto kv = KvTensors::Create(model.KvOptions(64));
    PagedSeqInput prefill{{5, 9, 2, 7, 1, 3},
                          {0, 1, 2, 3, 4, 5},
                          {slots[0], slots[1], slots[2], slots[3], slots[4], slots[5]},
                          {},
                          {},
                          4};
    EXPECT_TRUE(model.ForwardPaged({prefill}, *kv).ok());
    PagedSeqInput decode{{8}, {6}, {slots[6]}, prefill.write_slots};
    return std::move((*model.ForwardPaged({decode}, *kv))[0]);
  };
  auto a = run(1), b = run(2);
  ASSERT_EQ(a.attn.size(), 7u);
  ASSERT_EQ(a.key_norm.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_NEAR(a.attn[i], b.attn[i], 1e-6) << i;
    EXPECT_NEAR(a.key_norm[i], b.key_norm[i], 1e-5) << i;
    EXPECT_GT(a.key_norm[i], 0.0f);
  }
  EXPECT_LT(RelError(a.last_logits, b.last_logits), 1e-6);
}

TEST(LlamaModelTest, Bf16ComputeTracksFp32) {
  const ModelConfig c = SmallConfig();
  LlamaModel fp32 = RandomModel(c, 13);
  LlamaOptions options;
  options.compute_dtype = torch::kBFloat16;
  auto bf16 = LlamaModel::FromNamedTensors(c, fp32.NamedParameters(), options);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  const std::vector<int32_t> tokens = {3, 14, 15, 9, 26, 5};
  torch::NoGradGuard no_grad;
  auto expected = fp32.ForwardDense(Tokens(tokens))[0][-1];
  auto dense = bf16->ForwardDense(Tokens(tokens))[0][-1];
  EXPECT_EQ(dense.scalar_type(), torch::kBFloat16);
  EXPECT_LT(RelError(dense.to(torch::kFloat32), expected), 0.05);
  auto kv = KvTensors::Create(bf16->KvOptions(16));
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->k(0).scalar_type(), torch::kBFloat16);
  PagedSeqInput in{tokens, {0, 1, 2, 3, 4, 5}, {9, 2, 7, 0, 11, 4}, {}};
  auto out = bf16->ForwardPaged({in}, *kv);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)[0].last_logits.scalar_type(), torch::kFloat32);
  EXPECT_LT(RelError((*out)[0].last_logits, expected), 0.05);
}

}  // namespace
}  // namespace vtoken::model
