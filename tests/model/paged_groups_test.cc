// ForwardPaged with per-layer and per-head KV groups (lib/core/types.h, Granularity): the same
// live set in every group gives token granularity's logits and signals; different live sets per
// group match an independent dense forward with per-(layer, KV head) masks; the fused kernel
// (decode and the BLAS prefill path) matches the torch reference at every granularity, with and
// without a sliding window; attention sums to 1 per group; KvTensors copies and hashes one
// group slot; malformed group inputs are refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "lib/model/llama.h"
#include "lib/model/llama_runner.h"
#include "lib/model/torch_copy_engine.h"

namespace vtoken::model {
namespace {

constexpr Granularity kAll[] = {Granularity::kToken, Granularity::kLayer, Granularity::kHead};

ModelConfig Config(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window = 0) {
  ModelConfig c;
  c.vocab_size = 53;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = 40;
  c.num_hidden_layers = 3;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 2048;
  if (window > 0) {
    c.model_type = "mistral";
    c.sliding_window = window;
  }
  return c;
}

LlamaModel Model(const ModelConfig& c, uint64_t seed, bool fused) {
  auto m = LlamaModel::RandomInit(c, seed, {.fused_cpu_attention = fused});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : m->NamedParameters()) {
    if (t.dim() == 2) t.mul_(5.0);  // Sharp attention, so a wrong key shows.
  }
  return std::move(*m);
}

int32_t Groups(const ModelConfig& c, Granularity g) {
  return NumKvGroups(g, c.num_hidden_layers, c.num_key_value_heads);
}

double RelErr(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// A dense forward of `m` written out here, independent of ForwardPaged: query t of layer l's
// query heads that read KV head h sees key j iff visible[l][h][t][j]. Returns [T, vocab] fp32.
torch::Tensor DenseReference(const LlamaModel& m, const std::vector<int32_t>& tokens,
                             const torch::Tensor& visible) {
  torch::NoGradGuard no_grad;
  const ModelConfig& c = m.config();
  std::map<std::string, torch::Tensor> w;
  for (const auto& [name, t] : m.NamedParameters()) w[name] = t;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.num_attention_heads;
  const int64_t KV = c.num_key_value_heads, hd = c.head_dim, per_kv = H / KV;
  auto x = w["model.embed_tokens.weight"].index_select(
      0, torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())));
  auto freqs = torch::arange(T, torch::kFloat32).unsqueeze(1) *
               RopeInverseFrequencies(c).unsqueeze(0);  // [T, hd / 2]
  auto emb = torch::cat({freqs, freqs}, 1).unsqueeze(1);
  auto cos = emb.cos(), sin = emb.sin();
  auto rope = [&](const torch::Tensor& t) {
    auto halves = t.chunk(2, -1);
    return t * cos + torch::cat({-halves[1], halves[0]}, -1) * sin;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = RmsNorm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps);
    auto q = rope(torch::matmul(h, w[p + "self_attn.q_proj.weight"].t()).view({T, H, hd}));
    auto k = rope(torch::matmul(h, w[p + "self_attn.k_proj.weight"].t()).view({T, KV, hd}));
    auto v = torch::matmul(h, w[p + "self_attn.v_proj.weight"].t()).view({T, KV, hd});
    std::vector<torch::Tensor> heads;
    for (int64_t qh = 0; qh < H; ++qh) {
      const int64_t kvh = qh / per_kv;
      auto scores = torch::matmul(q.select(1, qh), k.select(1, kvh).t()) / std::sqrt(hd * 1.0);
      scores = scores.masked_fill(visible[l][kvh].logical_not(),
                                  -std::numeric_limits<float>::infinity());
      heads.push_back(torch::matmul(torch::softmax(scores, -1), v.select(1, kvh)));
    }
    x = x + torch::matmul(torch::cat(heads, 1), w[p + "self_attn.o_proj.weight"].t());
    auto h2 = RmsNorm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps);
    auto gate = torch::silu(torch::matmul(h2, w[p + "mlp.gate_proj.weight"].t()));
    auto up = torch::matmul(h2, w[p + "mlp.up_proj.weight"].t());
    x = x + torch::matmul(gate * up, w[p + "mlp.down_proj.weight"].t());
  }
  return torch::matmul(RmsNorm(x, w["model.norm.weight"], c.rms_norm_eps), w["lm_head.weight"].t());
}

// One sequence through two paged steps at `gran`: a prefill of `ctx` tokens, then `n` tokens
// over group g's live context live[g] (sorted positions < ctx). Every group has its own shuffled
// slots. Returns the second step's output.
PagedSeqOutput TwoSteps(const LlamaModel& m, Granularity gran, const std::vector<int32_t>& tokens,
                        int64_t ctx, const std::vector<std::vector<int64_t>>& live, uint64_t seed) {
  const ModelConfig& c = m.config();
  const int64_t groups = Groups(c, gran), len = static_cast<int64_t>(tokens.size());
  auto kv = KvTensors::Create(m.KvOptions(groups * len, gran));
  EXPECT_TRUE(kv.ok());
  std::vector<int64_t> slots(static_cast<size_t>(groups * len));
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(slots.begin(), slots.end(), rng);
  auto slot = [&](int64_t g, int64_t pos) { return slots[g * len + pos]; };
  PagedSeqInput prefill{.tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + ctx)};
  PagedSeqInput step{.tokens = std::vector<int32_t>(tokens.begin() + ctx, tokens.end()),
                     .obs_window = 4};
  for (int64_t p = 0; p < len; ++p) (p < ctx ? prefill : step).positions.push_back(p);
  prefill.context_offsets.assign(groups + 1, 0);
  step.context_offsets = {0};
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t p = 0; p < len; ++p) (p < ctx ? prefill : step).write_slots.push_back(slot(g, p));
    for (int64_t p : live[g]) {
      step.context_slots.push_back(slot(g, p));
      step.context_positions.push_back(p);
    }
    step.context_offsets.push_back(static_cast<int64_t>(step.context_slots.size()));
  }
  EXPECT_TRUE(m.ForwardPaged({prefill}, *kv).ok());
  auto out = m.ForwardPaged({step}, *kv);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return std::move((*out)[0]);
}

std::vector<int64_t> RandomSubset(int64_t ctx, std::mt19937_64& rng) {
  std::vector<int64_t> live;
  for (int64_t p = 0; p < ctx; ++p) {
    if (rng() % 3 != 0) live.push_back(p);
  }
  if (live.empty()) live.push_back(ctx - 1);
  return live;
}

struct Case {
  int64_t heads, kv_heads, head_dim, new_tokens;
};

class PagedGroupsTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedGroupsTest, SameLiveSetInEveryGroupGivesTokenGranularity) {
  const Case p = GetParam();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = Config(p.heads, p.kv_heads, p.head_dim);
  const int64_t ctx = 40;
  std::vector<int32_t> tokens(static_cast<size_t>(ctx + p.new_tokens));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  const std::vector<int64_t> live = RandomSubset(ctx, rng);
  const int64_t keys = static_cast<int64_t>(live.size()) + p.new_tokens;
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "reference");
    const LlamaModel m = Model(c, seed, fused);
    const PagedSeqOutput token = TwoSteps(m, Granularity::kToken, tokens, ctx, {live}, seed);
    for (Granularity gran : {Granularity::kLayer, Granularity::kHead}) {
      SCOPED_TRACE(GranularityName(gran));
      const int64_t groups = Groups(c, gran);
      const PagedSeqOutput out =
          TwoSteps(m, gran, tokens, ctx, std::vector<std::vector<int64_t>>(groups, live), seed + 1);
      EXPECT_LT(RelErr(out.last_logits, token.last_logits), 1e-5);
      ASSERT_EQ(static_cast<int64_t>(out.attn.size()), groups * keys);
      ASSERT_EQ(out.key_norm.size(), out.attn.size());
      // Token granularity averages over every query head and KV row alike: the mean over groups.
      for (int64_t j = 0; j < keys; ++j) {
        double attn = 0, norm = 0;
        for (int64_t g = 0; g < groups; ++g) {
          attn += out.attn[g * keys + j];
          norm += out.key_norm[g * keys + j];
        }
        EXPECT_NEAR(attn / groups, token.attn[j], 1e-6 + 1e-4 * token.attn[j]) << j;
        EXPECT_NEAR(norm / groups, token.key_norm[j], 1e-4 * token.key_norm[j]) << j;
      }
    }
  }
}

TEST_P(PagedGroupsTest, DifferentLiveSetsPerGroupMatchADenseReference) {
  const Case p = GetParam();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = Config(p.heads, p.kv_heads, p.head_dim);
  const int64_t ctx = 40, len = ctx + p.new_tokens, L = c.num_hidden_layers;
  const int64_t KV = c.num_key_value_heads;
  std::vector<int32_t> tokens(static_cast<size_t>(len));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  // The dense reference is causal everywhere, except that the new tokens see only the live
  // context of the group their (layer, KV head) belongs to.
  {
    const LlamaModel m = Model(c, seed, true);
    auto causal = torch::ones({len, len}, torch::kBool).tril().expand({L, KV, len, len});
    EXPECT_LT(
        RelErr(
            DenseReference(m, tokens, causal),
            m.ForwardDense(
                torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).unsqueeze(0))[0]),
        1e-5)
        << "the reference itself";
  }
  for (Granularity gran : kAll) {
    SCOPED_TRACE(GranularityName(gran));
    const int64_t groups = Groups(c, gran);
    std::vector<std::vector<int64_t>> live;
    for (int64_t g = 0; g < groups; ++g) live.push_back(RandomSubset(ctx, rng));
    auto visible = torch::ones({len, len}, torch::kBool).tril().repeat({L, KV, 1, 1});
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < KV; ++h) {
        auto rows = visible[l][h].narrow(0, ctx, p.new_tokens).narrow(1, 0, ctx);
        rows.fill_(false);
        for (int64_t pos : live[KvGroupOf(gran, l, h, KV)]) rows.select(1, pos).fill_(true);
      }
    }
    for (bool fused : {true, false}) {
      SCOPED_TRACE(fused ? "fused" : "reference");
      const LlamaModel m = Model(c, seed, fused);
      const PagedSeqOutput out = TwoSteps(m, gran, tokens, ctx, live, seed + 2);
      EXPECT_LT(RelErr(out.last_logits, DenseReference(m, tokens, visible)[len - 1]), 1e-5);
      // The evictions matter: without them the logits are far off.
      auto causal = torch::ones({len, len}, torch::kBool).tril().expand({L, KV, len, len});
      EXPECT_GT(RelErr(out.last_logits, DenseReference(m, tokens, causal)[len - 1]), 1e-3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GqaAndChunks, PagedGroupsTest,
                         ::testing::Values(Case{4, 2, 8, 1}, Case{4, 2, 8, 17}, Case{6, 3, 10, 1},
                                           Case{4, 4, 8, 20}, Case{8, 1, 16, 1}));

// Per-group context: a random live subset of `ctx` positions, each group in its own slots.
struct BatchCase {
  Granularity gran;
  int64_t window;
};

class FusedGroupsTest : public ::testing::TestWithParam<BatchCase> {};

TEST_P(FusedGroupsTest, FusedMatchesTheTorchReferenceWithSignalsPerGroup) {
  const BatchCase bc = GetParam();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = Config(6, 2, 16, bc.window);
  const LlamaModel fused = Model(c, seed, true), reference = Model(c, seed, false);
  const int64_t groups = Groups(c, bc.gran);
  // A prefill without context, a decode over a long context, a BLAS prefill chunk over a context,
  // a one-token context, a decode without context.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {0, 5}, {300, 1}, {33, 17}, {1, 1}, {0, 1}};
  int64_t num_slots = 0;
  for (const auto& [ctx, n] : shapes) num_slots += groups * (ctx + n);
  std::vector<int64_t> free(static_cast<size_t>(num_slots));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  std::vector<PagedSeqInput> inputs;
  for (const auto& [ctx, n] : shapes) {
    PagedSeqInput in{.obs_window = 4};
    in.context_offsets = {0};
    for (int64_t i = 0; i < n; ++i) {
      in.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      in.positions.push_back(ctx + i);
    }
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t pos = 0; pos < ctx; ++pos) {
        const int64_t slot = free.back();
        free.pop_back();
        if (ctx > 1 && rng() % 3 == 0) continue;  // Evicted in this group.
        in.context_slots.push_back(slot);
        in.context_positions.push_back(pos);
      }
      in.context_offsets.push_back(static_cast<int64_t>(in.context_slots.size()));
      for (int64_t i = 0; i < n; ++i) {
        in.write_slots.push_back(free.back());
        free.pop_back();
      }
    }
    inputs.push_back(in);
  }
  auto kv_fused = KvTensors::Create(fused.KvOptions(num_slots, bc.gran));
  auto kv_ref = KvTensors::Create(reference.KvOptions(num_slots, bc.gran));
  ASSERT_TRUE(kv_fused.ok() && kv_ref.ok());
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < kv_fused->k_tensors().size(); ++i) {
      kv_fused->k_tensors()[i].normal_();
      kv_fused->v_tensors()[i].normal_();
      kv_ref->k_tensors()[i].copy_(kv_fused->k_tensors()[i]);
      kv_ref->v_tensors()[i].copy_(kv_fused->v_tensors()[i]);
    }
  }
  auto a = fused.ForwardPaged(inputs, *kv_fused);
  auto b = reference.ForwardPaged(inputs, *kv_ref);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t s = 0; s < inputs.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const PagedSeqOutput &fa = (*a)[s], &rb = (*b)[s];
    EXPECT_LT(RelErr(fa.last_logits, rb.last_logits), 1e-5);
    const int64_t n = static_cast<int64_t>(inputs[s].tokens.size());
    ASSERT_EQ(fa.attn.size(), inputs[s].context_slots.size() + groups * n);
    ASSERT_EQ(rb.attn.size(), fa.attn.size());
    for (size_t j = 0; j < fa.attn.size(); ++j) {
      EXPECT_NEAR(fa.attn[j], rb.attn[j], 1e-6 + 1e-4 * rb.attn[j]) << j;
      EXPECT_NEAR(fa.key_norm[j], rb.key_norm[j], 1e-4 * rb.key_norm[j]) << j;
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = inputs[s].context_offsets[g] + g * n;
      const int64_t end = inputs[s].context_offsets[g + 1] + (g + 1) * n;
      for (const PagedSeqOutput* o : {&fa, &rb}) {
        EXPECT_NEAR(std::accumulate(o->attn.begin() + begin, o->attn.begin() + end, 0.0), 1.0, 1e-5)
            << "group " << g;
      }
    }
  }
  for (size_t i = 0; i < kv_fused->k_tensors().size(); ++i) {
    EXPECT_LT((kv_fused->k_tensors()[i] - kv_ref->k_tensors()[i]).abs().max().item<double>(), 1e-4);
    EXPECT_LT((kv_fused->v_tensors()[i] - kv_ref->v_tensors()[i]).abs().max().item<double>(), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    GranularitiesAndWindows, FusedGroupsTest,
    ::testing::Values(BatchCase{Granularity::kToken, 0}, BatchCase{Granularity::kLayer, 0},
                      BatchCase{Granularity::kHead, 0}, BatchCase{Granularity::kToken, 7},
                      BatchCase{Granularity::kLayer, 7}, BatchCase{Granularity::kHead, 7}));

TEST(KvTensorsGroupsTest, LayoutCopyAndHashPerGranularity) {
  const int64_t L = 3, KV = 2, hd = 5, tokens = 8;
  for (Granularity gran : kAll) {
    SCOPED_TRACE(GranularityName(gran));
    const int64_t groups = NumKvGroups(gran, L, KV);
    auto kv = KvTensors::Create({.num_layers = L,
                                 .num_slots = tokens * groups,
                                 .num_kv_heads = KV,
                                 .head_dim = hd,
                                 .granularity = gran});
    ASSERT_TRUE(kv.ok());
    EXPECT_EQ(kv->num_kv_groups(), groups);
    EXPECT_EQ(kv->rows_per_slot(), L * KV / groups);
    EXPECT_EQ(kv->bytes_per_slot() * groups, 2 * L * KV * hd * 4);
    EXPECT_EQ(kv->k_tensors().size(), gran == Granularity::kToken ? size_t(L) : size_t(1));
    int64_t bytes = 0;
    for (const auto* ts : {&kv->k_tensors(), &kv->v_tensors()}) {
      for (const torch::Tensor& t : *ts) bytes += t.numel() * t.element_size();
    }
    EXPECT_EQ(bytes, tokens * 2 * L * KV * hd * 4) << "same bytes for the same token capacity";
    EXPECT_EQ(kv->k(L - 1).data_ptr(),
              kv->k_tensors()[gran == Granularity::kToken ? L - 1 : 0].data_ptr());
    torch::manual_seed(11);
    for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
      kv->k_tensors()[i].normal_();
      kv->v_tensors()[i].normal_();
    }
    std::vector<torch::Tensor> before;
    for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
      before.push_back(kv->k_tensors()[i].clone());
      before.push_back(kv->v_tensors()[i].clone());
    }
    std::vector<uint64_t> hashes;
    for (SlotIndex s = 0; s < kv->num_slots(); ++s) hashes.push_back(TokenKvHash(*kv, s));
    TorchCopyEngine engine(*kv, false);
    engine.Wait(engine.Submit({{3, 7}}));
    ASSERT_TRUE(engine.status().ok());
    EXPECT_EQ(engine.bytes_copied(), kv->bytes_per_slot());
    // Exactly slot 7's bytes changed, to slot 3's.
    int64_t changed = 0;
    for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
      for (const auto& [now, old] : {std::pair{kv->k_tensors()[i], before[2 * i]},
                                     std::pair{kv->v_tensors()[i], before[2 * i + 1]}}) {
        changed += now.ne(old).sum().item<int64_t>();
        EXPECT_TRUE(now[7].equal(old[3]));
      }
    }
    EXPECT_EQ(changed * 4, kv->bytes_per_slot());
    for (SlotIndex s = 0; s < kv->num_slots(); ++s) {
      EXPECT_EQ(TokenKvHash(*kv, s), s == 7 ? hashes[3] : hashes[s]) << s;
    }
    // One changed byte of the slot's last row changes its hash.
    torch::Tensor last_v = kv->v_tensors().back();
    const uint64_t hash5 = TokenKvHash(*kv, 5);
    reinterpret_cast<uint8_t*>(last_v[5].data_ptr())[last_v[5].numel() * 4 - 1] ^= 1;
    EXPECT_NE(TokenKvHash(*kv, 5), hash5);
  }
}

// Token signals read from the store (ModelRunner::TokenSignals): per slot, the bits of
// ReduceTokenSignals over the rows that slot holds (every layer's at token granularity, one
// layer's KV heads at layer, one row at head), in fp32 and, as rounded rows, in bf16; a relative
// signal's anchors (TokenSignalAnchors) are taken over the slots listed; views give a column per
// layer or row.
TEST(KvTensorsGroupsTest, TokenSignalsReduceTheRowsEachSlotHolds) {
  const int64_t L = 3, KV = 2, hd = 8, tokens = 6;
  std::vector<const TokenSignalInfo*> fns;
  for (const char* name : {"value_norm", "key_anchor_cosine", "value_l1_norm",
                           "key_anchor_cosine@layer", "value_norm@head"}) {
    StatusOr<const TokenSignalInfo*> info = FindTokenSignal(name);
    ASSERT_TRUE(info.ok()) << name;
    fns.push_back(*info);
  }
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (Granularity gran : kAll) {
      SCOPED_TRACE(std::string(GranularityName(gran)) +
                   (dtype == torch::kFloat32 ? " fp32" : " bf16"));
      const int64_t groups = NumKvGroups(gran, L, KV);
      auto kv = KvTensors::Create({.num_layers = L,
                                   .num_slots = tokens * groups,
                                   .num_kv_heads = KV,
                                   .head_dim = hd,
                                   .dtype = dtype,
                                   .granularity = gran});
      ASSERT_TRUE(kv.ok());
      torch::manual_seed(5);
      for (size_t i = 0; i < kv->k_tensors().size(); ++i) {
        kv->k_tensors()[i].normal_();
        kv->v_tensors()[i].normal_();
      }
      const std::vector<SlotIndex> slots = {4, 0, kv->num_slots() - 1, 4};
      std::vector<float> out = {-7.0f};  // Appended after what is there.
      ASSERT_TRUE(kv->TokenSignals(slots, fns, {}, {}, out).ok());
      const int64_t layers = static_cast<int64_t>(kv->k_tensors().size());
      const int64_t heads = kv->rows_per_slot() / layers;
      const KvGroupRows group_rows = KvGroupRowsOf(gran, L, KV);
      ASSERT_EQ(group_rows.layers, layers);
      ASSERT_EQ(group_rows.heads, heads);
      const auto width = static_cast<size_t>(TokenSignalWidth(fns, group_rows));
      ASSERT_EQ(width, 3 + layers + layers * heads);
      ASSERT_EQ(out.size(), 1 + slots.size() * width);
      EXPECT_EQ(out[0], -7.0f);
      const int64_t rows = layers * heads;
      std::vector<float> keys, values;  // [slot][row][hd]
      for (size_t i = 0; i < slots.size(); ++i) {
        for (int64_t l = 0; l < layers; ++l) {
          for (const auto& [t, dst] :
               {std::pair{kv->k_tensors()[l], &keys}, std::pair{kv->v_tensors()[l], &values}}) {
            const torch::Tensor row = t[slots[i]].to(torch::kFloat32).contiguous();
            dst->insert(dst->end(), row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
          }
        }
      }
      const std::vector<float> anchors = TokenSignalAnchors(
          fns, keys.data(), values.data(), static_cast<int64_t>(slots.size()), rows, hd);
      for (size_t i = 0; i < slots.size(); ++i) {
        const size_t at = i * static_cast<size_t>(rows * hd);
        std::vector<float> expected(width);
        ReduceTokenSignals(fns, keys.data() + at, values.data() + at, layers, heads, hd,
                           expected.data(), anchors.data());
        for (size_t c = 0; c < width; ++c) {
          EXPECT_EQ(out[1 + width * i + c], expected[c]) << "slot " << slots[i] << " column " << c;
        }
        EXPECT_GT(expected[0], 0.0f);
        EXPECT_NE(expected[1], 0.0f);
      }
      const std::vector<SlotIndex> outside = {kv->num_slots()};
      EXPECT_EQ(kv->TokenSignals(outside, fns, {}, {}, out).code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(KvTensorsGroupsTest, RunnerReportsGroupsAndKeepsBytesPerToken) {
  for (Granularity gran : kAll) {
    auto m = LlamaModel::RandomInit(Config(4, 2, 8), 1);
    ASSERT_TRUE(m.ok());
    auto runner = LlamaRunner::Create(std::move(*m), {.num_slots = 96, .granularity = gran});
    ASSERT_TRUE(runner.ok());
    EXPECT_EQ((*runner)->granularity(), gran);
    EXPECT_EQ((*runner)->num_kv_groups(), NumKvGroups(gran, 3, 2));
    EXPECT_EQ((*runner)->num_slots(), 96);
    EXPECT_EQ((*runner)->kv_bytes_per_token(), 2 * 3 * 2 * 8 * 4);
  }
}

TEST(KvTensorsGroupsTest, MalformedGroupInputsAreRefusedByName) {
  const ModelConfig c = Config(4, 2, 8);
  const LlamaModel m = Model(c, 5, true);
  auto kv = KvTensors::Create(m.KvOptions(64, Granularity::kLayer));  // 3 groups.
  ASSERT_TRUE(kv.ok());
  const PagedSeqInput good{.tokens = {1, 2},
                           .positions = {2, 3},
                           .write_slots = {10, 11, 20, 21, 30, 31},
                           .context_slots = {0, 1, 5, 6},
                           .context_positions = {0, 1, 1, 0},
                           .context_offsets = {0, 2, 3, 4}};
  ASSERT_TRUE(m.ForwardPaged({good}, *kv).ok());
  auto refused = [&](PagedSeqInput in, const std::string& field) {
    auto out = m.ForwardPaged({in}, *kv);
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(out.status().ToString().find(field), std::string::npos) << out.status().ToString();
  };
  PagedSeqInput in = good;
  in.write_slots.pop_back();
  refused(in, "write_slots");
  in = good;
  in.context_offsets = {};
  refused(in, "context_offsets");
  in = good;
  in.context_offsets = {0, 3, 2, 4};
  refused(in, "context_offsets");
  in = good;
  in.context_offsets = {0, 2, 3, 5};
  refused(in, "context_offsets");
  in = good;
  in.write_slots[4] = 64;
  refused(in, "slot 64");
}

}  // namespace
}  // namespace vtoken::model
