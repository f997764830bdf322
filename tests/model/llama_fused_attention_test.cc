// The fused CPU paged-attention kernel against the per-sequence torch reference (logits and
// signals), over GQA ratios, block layouts of odd sizes, empty and long contexts, prefill chunks
// and decode in one batch; signals only when wanted; and Mistral's sliding window against the
// dense forward with a per-query window mask, after evictions; and over fp16 KV stores.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>

#include "lib/model/blas_info.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/llama.h"

namespace vtoken::model {
namespace {

ModelConfig Config(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  ModelConfig c;
  c.vocab_size = 53;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 2048;
  return c;
}

LlamaModel Model(const ModelConfig& c, uint64_t seed, bool fused, bool kv_half = false) {
  LlamaOptions options{.fused_cpu_attention = fused};
  if (kv_half) options.kv_dtype = torch::kHalf;
  auto m = LlamaModel::RandomInit(c, seed, options);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& [name, t] : m->NamedParameters()) {
    if (t.dim() == 2) t.mul_(5.0);  // Sharp attention, so errors in the kernel show.
  }
  return std::move(*m);
}

// Slots for `count` tokens taken from blocks of `block_size` in a shuffled block order: the
// layout a paged cache leaves behind.
std::vector<int64_t> BlockSlots(int64_t count, int64_t block_size, int64_t first_block,
                                std::mt19937_64& rng) {
  const int64_t blocks = (count + block_size - 1) / block_size;
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), first_block);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> slots;
  for (int64_t b : order) {
    for (int64_t o = 0; o < block_size && static_cast<int64_t>(slots.size()) < count; ++o) {
      slots.push_back(b * block_size + o);
    }
  }
  return slots;
}

// Fills `a` with normal noise and copies it into `b` (two stores of one shape).
void FillAlike(KvTensors& a, KvTensors& b) {
  torch::NoGradGuard no_grad;
  for (size_t l = 0; l < a.k_tensors().size(); ++l) {
    a.k_tensors()[l].normal_();
    a.v_tensors()[l].normal_();
    b.k_tensors()[l].copy_(a.k_tensors()[l]);
    b.v_tensors()[l].copy_(a.v_tensors()[l]);
  }
}

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  bool kv_half = false;  // Both stores in fp16 (LlamaOptions::kv_dtype).
};

class FusedAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAttentionTest, MatchesTheTorchReference) {
  const Case p = GetParam();
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = Config(p.heads, p.kv_heads, p.head_dim);
  const LlamaModel fused = Model(c, seed, true, p.kv_half);
  const LlamaModel reference = Model(c, seed, false, p.kv_half);
  // One batch: a prefill with no context, a decode over a long context, a prefill chunk over a
  // context, a one-token context, a decode without context.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {0, 5}, {700, 1}, {33, 17}, {1, 1}, {0, 1}};
  int64_t next_block = 0;
  std::vector<PagedSeqInput> inputs;
  for (const auto& [ctx, n] : shapes) {
    PagedSeqInput in;
    std::vector<int64_t> slots = BlockSlots(ctx + n, p.block_size, next_block, rng);
    next_block += (ctx + n + p.block_size - 1) / p.block_size;
    in.context_slots.assign(slots.begin(), slots.begin() + ctx);
    in.write_slots.assign(slots.begin() + ctx, slots.end());
    for (int64_t i = 0; i < n; ++i) {
      in.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
      in.positions.push_back(ctx + i);
    }
    in.obs_window = 4;
    inputs.push_back(in);
  }
  const int64_t num_slots = next_block * p.block_size;
  auto kv_fused = KvTensors::Create(fused.KvOptions(num_slots));
  auto kv_ref = KvTensors::Create(reference.KvOptions(num_slots));
  ASSERT_TRUE(kv_fused.ok() && kv_ref.ok());
  ASSERT_EQ(kv_fused->options().dtype, p.kv_half ? torch::kHalf : torch::kFloat32);
  FillAlike(*kv_fused, *kv_ref);
  auto a = fused.ForwardPaged(inputs, *kv_fused);
  auto b = reference.ForwardPaged(inputs, *kv_ref);
  ASSERT_TRUE(a.ok() && b.ok());
  const double tol = p.kv_half ? 1e-2 : 1e-4;  // Below.
  for (size_t s = 0; s < inputs.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const double err = ((*a)[s].last_logits - (*b)[s].last_logits).abs().max().item<double>() /
                       (*b)[s].last_logits.abs().max().item<double>();
    // fp32 in two summation orders: over 6,250 (seed, case, sequence) samples the largest error
    // was 3.2e-5 and 1 in 70 runs of one case passed 1e-5 (2026-12-04); a wrong key or scale is
    // off by far more than 1e-4. In fp16 the step's new K/V, computed in two orders, can round
    // to neighbouring halves (2^-11 apart, relative), which the sharp attention here amplifies:
    // 1e-2 (a cache read as the wrong type or a row out of place is off by order 1).
    EXPECT_LT(err, tol);
    ASSERT_EQ((*a)[s].attn.size(), (*b)[s].attn.size());
    ASSERT_EQ((*a)[s].attn.size(), inputs[s].context_slots.size() + inputs[s].tokens.size());
    for (size_t j = 0; j < (*a)[s].attn.size(); ++j) {
      EXPECT_NEAR((*a)[s].attn[j], (*b)[s].attn[j], 1e-6 + tol * (1e-2 + (*b)[s].attn[j])) << j;
      EXPECT_NEAR((*a)[s].key_norm[j], (*b)[s].key_norm[j], tol * (*b)[s].key_norm[j]) << j;
    }
    EXPECT_NEAR(std::accumulate((*a)[s].attn.begin(), (*a)[s].attn.end(), 0.0), 1.0, 1e-5);
  }
  // Both wrote the same K/V. In fp16 the first layer's to one half's rounding (2^-10 relative);
  // the next layers' inputs carry the first one's roundings, amplified: to the logits' tolerance.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (auto [x, y] : {std::pair{kv_fused->k(l), kv_ref->k(l)}, {kv_fused->v(l), kv_ref->v(l)}}) {
      const torch::Tensor gap = (x.to(torch::kFloat64) - y.to(torch::kFloat64)).abs();
      const double rel = !p.kv_half ? 0 : l == 0 ? 0x1p-10 : tol;
      const torch::Tensor bound = y.to(torch::kFloat64).abs() * rel + (l == 0 ? 1e-4 : tol);
      EXPECT_TRUE((gap <= bound).all().item<bool>()) << gap.max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GqaAndBlocks, FusedAttentionTest,
                         ::testing::Values(Case{4, 4, 8, 1}, Case{4, 2, 16, 3}, Case{6, 3, 10, 7},
                                           Case{8, 1, 64, 17}, Case{3, 1, 64, 16},
                                           Case{4, 2, 16, 3, true}, Case{3, 1, 64, 16, true}));

// The step's threads (torch's pool and the fused step's CpuPool, sized together) split output
// features and sequences, never a sum: the logits, signals and K/V are the same bits on 1 and 3
// threads, for decode-sized batches (CpuLinear's tiles, up to kCpuLinearMaxRows rows: 3 and 10
// here) and one with a 600-token prefill chunk (projections by CpuGemm's panels at the AVX-512
// level, else by BLAS calls of kPoolSgemmRows rows; CpuPrefillAttention's query blocks), which
// the threads share out differently.
TEST(FusedAttentionTest, ThreadCountDoesNotChangeTheStep) {
  const ModelConfig c = Config(6, 2, 16);
  const LlamaModel m = Model(c, 11, true);
  std::mt19937_64 rng(11);
  for (const auto& shapes : std::vector<std::vector<std::pair<int64_t, int64_t>>>{
           {{40, 1}, {300, 1}, {0, 2}},
           {{0, 5}, {90, 1}, {700, 1}, {3, 2}, {10, 1}},
           {{0, 600}, {20, 1}}}) {
    std::vector<PagedSeqInput> inputs;
    int64_t next_block = 0;
    for (const auto& [ctx, n] : shapes) {
      PagedSeqInput in;
      std::vector<int64_t> slots = BlockSlots(ctx + n, 3, next_block, rng);
      next_block += (ctx + n + 2) / 3;
      in.context_slots.assign(slots.begin(), slots.begin() + ctx);
      in.write_slots.assign(slots.begin() + ctx, slots.end());
      for (int64_t i = 0; i < n; ++i) {
        in.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
        in.positions.push_back(ctx + i);
      }
      inputs.push_back(in);
    }
    auto kv1 = KvTensors::Create(m.KvOptions(next_block * 3));
    auto kv3 = KvTensors::Create(m.KvOptions(next_block * 3));
    ASSERT_TRUE(kv1.ok() && kv3.ok());
    FillAlike(*kv1, *kv3);
    const int before = torch::get_num_threads();
    torch::set_num_threads(1);
    auto one = m.ForwardPaged(inputs, *kv1);
    torch::set_num_threads(3);
    auto three = m.ForwardPaged(inputs, *kv3);
    torch::set_num_threads(before);
    ASSERT_TRUE(one.ok() && three.ok());
    for (size_t s = 0; s < inputs.size(); ++s) {
      SCOPED_TRACE(testing::Message() << shapes.size() << " sequences, sequence " << s);
      EXPECT_TRUE(torch::equal((*one)[s].last_logits, (*three)[s].last_logits));
      EXPECT_EQ((*one)[s].attn, (*three)[s].attn);
      EXPECT_EQ((*one)[s].key_norm, (*three)[s].key_norm);
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_TRUE(torch::equal(kv1->k(l), kv3->k(l)));
      EXPECT_TRUE(torch::equal(kv1->v(l), kv3->v(l)));
    }
  }
}
// The prefill chunks above go through torch's BLAS. Under MKL (PyPI's torch) the runtime turns on
// MKL's strict reproducibility mode when the process starts, unless MKL_CBWR was set already:
// /proc/self/environ holds the environment the process started with.
TEST(FusedAttentionTest, MklRunsInStrictReproducibleMode) {
  std::ifstream in("/proc/self/environ", std::ios::binary);
  const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string expected = "AUTO,STRICT";
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (env.compare(at, 9, "MKL_CBWR=") == 0) expected = env.substr(at + 9, end - at - 9);
    at = end + 1;
  }
  EXPECT_EQ(std::string(MklCbwr()), expected);
  const std::string blas = BlasDescription();
  SCOPED_TRACE(blas);
  if (blas.find("Math Kernel Library") != std::string::npos) {
    EXPECT_NE(blas.find("(MKL_CBWR=" + expected + ")"), std::string::npos);
  } else {
    EXPECT_NE(blas.find("OpenBLAS"), std::string::npos);
  }
}

TEST(FusedAttentionTest, SignalsOnlyWhenWanted) {
  const ModelConfig c = Config(4, 2, 8);
  const LlamaModel m = Model(c, 3, true);
  auto kv = KvTensors::Create(m.KvOptions(64));
  ASSERT_TRUE(kv.ok());
  PagedSeqInput in{.tokens = {1, 2, 3}, .positions = {0, 1, 2}, .write_slots = {5, 9, 2}};
  PagedSeqInput quiet = in;
  quiet.write_slots = {20, 21, 22};
  quiet.want_signals = false;
  auto out = m.ForwardPaged({in, quiet}, *kv);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0].attn.size(), 3u);
  EXPECT_EQ((*out)[0].key_norm.size(), 3u);
  EXPECT_TRUE((*out)[1].attn.empty());
  EXPECT_TRUE((*out)[1].key_norm.empty());
  // The logits do not depend on whether signals were computed.
  EXPECT_LT(((*out)[0].last_logits - (*out)[1].last_logits).abs().max().item<double>(), 1e-6);
}

// PagedSeqInput::signals (the policy's declaration): the fused and the reference path compute
// the declared signals exactly as with both, and return the others at zero, full length.
class SignalBitsTest : public ::testing::TestWithParam<bool> {};

TEST_P(SignalBitsTest, DeclaredSignalsMatchAndTheOthersAreZero) {
  const ModelConfig c = Config(4, 2, 8);
  const LlamaModel m = Model(c, 5, GetParam());
  auto kv = KvTensors::Create(m.KvOptions(128));
  ASSERT_TRUE(kv.ok());
  // A 12-token context then one decode token, in each of four sequences with its own slots.
  std::vector<PagedSeqInput> batch;
  for (int64_t s = 0; s < 4; ++s) {
    PagedSeqInput prefill{.tokens = {}, .positions = {}, .write_slots = {}};
    for (int64_t t = 0; t < 12; ++t) {
      prefill.tokens.push_back(static_cast<int32_t>(1 + (t * 7 + s) % 50));
      prefill.positions.push_back(t);
      prefill.write_slots.push_back(s * 32 + t);
    }
    auto written = m.ForwardPaged({prefill}, *kv);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    PagedSeqInput decode{.tokens = {5}, .positions = {12}, .write_slots = {s * 32 + 12}};
    decode.context_slots = prefill.write_slots;
    decode.context_positions = prefill.positions;
    decode.signals = static_cast<uint8_t>(s);  // none, attention, norms, both
    batch.push_back(decode);
  }
  auto out = m.ForwardPaged(batch, *kv);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::vector<PagedSeqInput> full = batch;
  for (PagedSeqInput& in : full) in.signals = kAttnSignal | kKeyNormSignal;
  auto ref = m.ForwardPaged(full, *kv);
  ASSERT_TRUE(ref.ok());
  for (size_t s = 0; s < batch.size(); ++s) {
    SCOPED_TRACE("signals " + std::to_string(s));
    const PagedSeqOutput& o = (*out)[s];
    const PagedSeqOutput& r = (*ref)[s];
    ASSERT_EQ(o.attn.size(), 13u);
    ASSERT_EQ(o.key_norm.size(), 13u);
    for (size_t j = 0; j < 13; ++j) {
      EXPECT_EQ(o.attn[j], (s & kAttnSignal) ? r.attn[j] : 0.0f) << j;
      EXPECT_EQ(o.key_norm[j], (s & kKeyNormSignal) ? r.key_norm[j] : 0.0f) << j;
      EXPECT_GT(r.key_norm[j], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FusedAndReference, SignalBitsTest, ::testing::Bool());

class SlidingWindowTest : public ::testing::TestWithParam<bool> {};

TEST_P(SlidingWindowTest, MatchesDenseWithAWindowMaskAfterEvictions) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelConfig c = Config(4, 2, 8);
  c.model_type = "mistral";
  c.sliding_window = 6;
  const LlamaModel m = Model(c, seed, /*fused=*/GetParam());
  const int64_t length = 30, prefill = 9;
  auto kv = KvTensors::Create(m.KvOptions(64));
  ASSERT_TRUE(kv.ok());
  std::vector<int32_t> tokens(length);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  std::vector<int64_t> slots(64);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<std::pair<int64_t, int64_t>> live;  // (position, slot)
  auto visible = torch::zeros({length, length}, torch::kBool);
  std::vector<torch::Tensor> logits(length);
  for (int64_t pos = 0; pos < length;) {
    const int64_t n = pos == 0 ? prefill : 1;
    PagedSeqInput in;
    for (const auto& [p, s] : live) {
      in.context_slots.push_back(s);
      in.context_positions.push_back(p);
    }
    for (int64_t i = pos; i < pos + n; ++i) {
      in.tokens.push_back(tokens[i]);
      in.positions.push_back(i);
      in.write_slots.push_back(slots[i]);
      for (const auto& [p, s] : live) visible[i][p] = i - p < c.sliding_window;
      for (int64_t j = pos; j <= i; ++j) visible[i][j] = i - j < c.sliding_window;
    }
    auto out = m.ForwardPaged({in}, *kv);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    logits[pos + n - 1] = (*out)[0].last_logits;
    for (int64_t i = pos; i < pos + n; ++i) live.push_back({i, slots[i]});
    pos += n;
    if (live.size() > 3 && rng() % 2 == 0) live.erase(live.begin() + rng() % (live.size() - 1));
  }
  torch::NoGradGuard no_grad;
  // Every row of the dense mask keeps at least the query itself.
  auto dense = m.ForwardDense(
      torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).unsqueeze(0), visible)[0];
  for (int64_t i = prefill - 1; i < length; ++i) {
    const double err =
        (logits[i] - dense[i]).abs().max().item<double>() / dense[i].abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << "position " << i;
  }
  // Without context positions a windowed model refuses the step.
  PagedSeqInput bad{.tokens = {1}, .positions = {40}, .write_slots = {63}, .context_slots = {0}};
  EXPECT_EQ(m.ForwardPaged({bad}, *kv).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(FusedAndReference, SlidingWindowTest, ::testing::Bool());

}  // namespace
}  // namespace vtoken::model
