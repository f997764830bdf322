// AttendTorch (lib/model/paged_torch_attention.h), the torch-ops attention of long prefill
// chunks, which computes its queries in blocks of kAttendQueryRows rows, each over the keys its
// rows may see: against a dense double-precision computation written out here (every query over
// every key under the mask), for prefills that span several blocks over a context, with and
// without a sliding window, GQA, and the signals of the last rows or of all of them.
#include "lib/model/paged_torch_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace vtoken::model::internal {
namespace {

struct Case {
  int64_t ctx, n, heads, kv_heads, window, num_signal;
};

TEST(AttendTorchTest, QueryBlocksMatchADenseReference) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  torch::manual_seed(seed);
  std::mt19937_64 rng(seed);
  constexpr int64_t kHd = 16;
  const Case cases[] = {
      {0, 2 * kAttendQueryRows + 37, 4, 2, 0, 4},                 // Three blocks, no context.
      {53, kAttendQueryRows + 1, 6, 3, 0, kAttendQueryRows + 1},  // Signals of every row.
      {40, 3 * kAttendQueryRows, 4, 1, 100, 9},                   // A sliding window.
      {7, 17, 2, 2, 0, 1},                                        // One block.
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", ctx " + std::to_string(c.ctx) + ", n " +
                 std::to_string(c.n) + ", window " + std::to_string(c.window));
    const int64_t keys = c.ctx + c.n, slots = keys + 11, group = c.heads / c.kv_heads;
    const auto k_layer = torch::randn({slots, c.kv_heads, kHd});
    const auto v_layer = torch::randn({slots, c.kv_heads, kHd});
    const auto q = torch::randn({c.n, c.heads, kHd}) * 2.0;
    std::vector<int64_t> perm(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    const auto gather = torch::tensor(std::vector<int64_t>(perm.begin(), perm.begin() + keys));
    // Key positions 0..keys-1; the new tokens are the last n keys.
    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto mask = torch::full({c.n, keys}, neg_inf).triu(c.ctx + 1);
    if (c.window > 0) {
      auto qp = torch::arange(c.ctx, keys).unsqueeze(1), kp = torch::arange(keys).unsqueeze(0);
      mask = mask.masked_fill((qp - kp) >= c.window, neg_inf);
    }
    auto attn = torch::zeros({keys}), norm = torch::zeros({keys});
    SignalTensors signals{attn, norm};
    const auto out = AttendTorch(q, k_layer, v_layer, gather, mask, c.kv_heads, torch::kFloat32,
                                 c.num_signal, &signals);
    // Dense in double: every query over every key.
    const auto kd = k_layer.index_select(0, gather).to(torch::kFloat64);  // [S, KVH, hd]
    const auto vd = v_layer.index_select(0, gather).to(torch::kFloat64);
    const auto qd = q.to(torch::kFloat64);
    auto want = torch::zeros({c.n, c.heads, kHd}, torch::kFloat64);
    auto want_attn = torch::zeros({keys}, torch::kFloat64);
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / group;
      auto scores = torch::matmul(qd.select(1, h), kd.select(1, g).t()) / std::sqrt(double(kHd));
      auto probs = torch::softmax(scores + mask.to(torch::kFloat64), -1);  // [n, S]
      want.select(1, h).copy_(torch::matmul(probs, vd.select(1, g)));
      want_attn += probs.narrow(0, c.n - c.num_signal, c.num_signal).sum(0);
    }
    const double out_err =
        (out.view({c.n, c.heads, kHd}).to(torch::kFloat64) - want).abs().max().item<double>();
    EXPECT_LT(out_err, 1e-4);
    EXPECT_LT((attn.to(torch::kFloat64) - want_attn).abs().max().item<double>(), 1e-4);
    EXPECT_NEAR(attn.sum().item<double>(), double(c.heads * c.num_signal), 1e-3);
    const auto want_norm = kd.norm(2, -1).mean(-1);
    EXPECT_LT((norm.to(torch::kFloat64) - want_norm).abs().max().item<double>(), 1e-4);
  }
}

}  // namespace
}  // namespace vtoken::model::internal
