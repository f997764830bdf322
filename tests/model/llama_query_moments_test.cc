// Query statistics (lib/model/query_moments.h): the table's merged moments against a two-pass
// double reference, recomputed and sink positions left out, the query heads of a KV row; and the
// runner keeping them: the fused CPU path and the torch path (and a static-decode runner, which
// then decodes eagerly) add the same queries before RoPE, a signal reading them is refused for a
// request that kept none, and ForgetRequest drops them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "lib/model/llama_runner.h"
#include "lib/model/query_moments.h"
#include "tests/model/small_model_config.h"

namespace vtoken::model {
namespace {

TEST(QueryMomentsTableTest, ChunksMergeToTheMeanAndCovarianceOfTheQueriesPastTheSinks) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  constexpr int64_t kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 6, kRows = 40;
  QueryMomentsTable table(kLayers, kHeads, kKvHeads, kDim, std::vector<float>(kDim / 2, 1.0f));
  std::vector<float> q(kRows * kHeads * kDim);
  for (float& x : q) x = normal(rng);
  std::vector<int64_t> positions(kRows);
  for (int64_t i = 0; i < kRows; ++i) positions[i] = i;
  // Chunks of 3 (all sinks), 6 (one sink), 1, 30; then the first 20 again (a recomputation).
  for (const auto& [begin, end] :
       {std::pair{0, 3}, std::pair{3, 9}, std::pair{9, 10}, std::pair{10, 40}, std::pair{0, 20}}) {
    for (int64_t l = 0; l < kLayers; ++l) {
      table.Add(l, q.data() + begin * kHeads * kDim, end - begin, positions.data() + begin);
    }
    table.Advance(end);
  }
  EXPECT_EQ(table.next_position(), 40);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t kv = 0; kv < kKvHeads; ++kv) {
      const QueryMoments m = table.Of(l, kv);
      ASSERT_EQ(m.heads, 2);
      EXPECT_EQ(m.count, kRows - kQueryMomentsFirstPosition);
      EXPECT_EQ(m.next_position, 40);
      for (int64_t g = 0; g < m.heads; ++g) {
        const int64_t head = kv * m.heads + g;
        std::vector<double> mean(kDim, 0.0);
        for (int64_t r = 4; r < kRows; ++r) {
          for (int64_t c = 0; c < kDim; ++c) mean[c] += q[(r * kHeads + head) * kDim + c];
        }
        for (double& x : mean) x /= kRows - 4;
        for (int64_t i = 0; i < kDim; ++i) {
          EXPECT_NEAR(m.mean[g * kDim + i], mean[i], 1e-5) << "seed " << seed;
          for (int64_t j = 0; j < kDim; ++j) {
            double cov = 0;
            for (int64_t r = 4; r < kRows; ++r) {
              cov += (q[(r * kHeads + head) * kDim + i] - mean[i]) *
                     (q[(r * kHeads + head) * kDim + j] - mean[j]);
            }
            cov /= kRows - 4;
            EXPECT_NEAR(m.cov[(g * kDim + i) * kDim + j], cov, 1e-4 * (1 + std::abs(cov)))
                << "seed " << seed;
          }
        }
      }
    }
  }
}

// The window holds each head's last kQueryWindow queries (sinks too) at their positions, after
// chunks longer and shorter than it, single decode queries and a recomputation (left out).
TEST(QueryMomentsTableTest, TheWindowHoldsTheLastQueries) {
  constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 4, kRows = 80;
  QueryMomentsTable table(1, kHeads, kKvHeads, kDim, std::vector<float>(kDim / 2, 1.0f));
  EXPECT_EQ(table.Of(0, 0).recent, 0);
  std::vector<float> q(kRows * kHeads * kDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
  std::vector<int64_t> positions(kRows);
  for (int64_t i = 0; i < kRows; ++i) positions[i] = i;
  auto add = [&](int64_t begin, int64_t end) {
    table.Add(0, q.data() + begin * kHeads * kDim, end - begin, positions.data() + begin);
    table.Advance(end);
  };
  auto expect_last = [&](int64_t end) {
    const int64_t want = std::min(end, kQueryWindow);
    for (int64_t kv = 0; kv < kKvHeads; ++kv) {
      const QueryMoments m = table.Of(0, kv);
      ASSERT_EQ(m.recent, want);
      std::vector<int64_t> seen(m.recent_positions, m.recent_positions + m.recent);
      std::sort(seen.begin(), seen.end());
      for (int64_t j = 0; j < want; ++j) EXPECT_EQ(seen[j], end - want + j) << "end " << end;
      for (int64_t j = 0; j < m.recent; ++j) {
        for (int64_t g = 0; g < m.heads; ++g) {
          const int64_t r = m.recent_positions[j], head = kv * m.heads + g;
          EXPECT_EQ(m.recent_queries[(g * kQueryWindow + j) * kDim], q[(r * kHeads + head) * kDim]);
        }
      }
    }
  };
  add(0, 5);
  expect_last(5);
  add(5, 50);  // Longer than the window.
  expect_last(50);
  add(51 - 1, 51);
  add(51, 52);
  expect_last(52);
  add(0, 52);  // A recomputation: nothing new.
  expect_last(52);
  add(52, 60);
  expect_last(60);
}

// A prompt of 12 tokens, then two decode steps of request 7 keeping query statistics (or not).
const QueryMomentsTable* RunKeeping(LlamaRunner& runner, bool keep = true) {
  RunnerInput in;
  in.request = 7;
  in.keep_query_moments = keep;
  in.want_signals = false;
  for (int64_t i = 0; i < 12; ++i) {
    in.tokens.push_back(static_cast<int32_t>(2 + (i * 37) % 90));
    in.positions.push_back(i);
    in.write_slots.push_back(i);
  }
  EXPECT_TRUE(runner.Forward({in}).ok());
  for (int64_t step = 12; step < 14; ++step) {
    RunnerInput next = in;
    next.context_slots.assign(in.write_slots.begin(), in.write_slots.end());
    for (int64_t i = 12; i < step; ++i) next.context_slots.push_back(i);
    next.context_positions = next.context_slots;
    next.tokens = {static_cast<int32_t>(step)};
    next.positions = {step};
    next.write_slots = {step};
    EXPECT_TRUE(runner.Forward({next}).ok());
  }
  return runner.query_moments(7);
}

TEST(QueryMomentsRunnerTest, EveryPathKeepsTheSameQueriesBeforeRope) {
  std::vector<std::vector<float>> means;
  for (const auto& [fused, decode] :
       {std::pair{true, DecodeMode::kEager}, std::pair{false, DecodeMode::kEager},
        std::pair{true, DecodeMode::kStatic}}) {
    SCOPED_TRACE(std::string(fused ? "fused" : "torch") +
                 (decode == DecodeMode::kStatic ? ", static decode" : ""));
    StatusOr<LlamaModel> m =
        LlamaModel::RandomInit(test_configs::SmallConfig(), 3, {.fused_cpu_attention = fused});
    ASSERT_TRUE(m.ok());
    StatusOr<std::unique_ptr<LlamaRunner>> runner =
        LlamaRunner::Create(std::move(*m), {.num_slots = 64, .decode = decode});
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    const QueryMomentsTable* table = RunKeeping(**runner);
    ASSERT_NE(table, nullptr);
    EXPECT_EQ((*runner)->decode_stats().static_steps, 0);  // Kept: decoded eagerly.
    EXPECT_EQ(table->next_position(), 14);
    std::vector<float> mean;
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        const QueryMoments q = table->Of(l, kv);
        EXPECT_EQ(q.count, 14 - kQueryMomentsFirstPosition);
        mean.insert(mean.end(), q.mean, q.mean + q.heads * 12);
        mean.insert(mean.end(), q.cov, q.cov + q.heads * 12 * 12);
        ASSERT_EQ(q.recent, 14);  // The window: every query (12 prompt, 2 decode).
        for (int64_t g = 0; g < q.heads; ++g) {
          mean.insert(mean.end(), q.recent_queries + g * kQueryWindow * 12,
                      q.recent_queries + (g * kQueryWindow + q.recent) * 12);
        }
      }
    }
    means.push_back(mean);
    // The signals read them for request 7, not for a request that kept none.
    const TokenSignalInfo* ea = *FindTokenSignal("expected_attention");
    const TokenSignalInfo* window = *FindTokenSignal("window_attention");
    const std::vector<SlotIndex> slots = {0, 1, 5, 9, 13};
    const std::vector<int64_t> positions = {0, 1, 5, 9, 13};
    std::vector<float> out;
    const std::vector<const TokenSignalInfo*> signals = {ea};
    ASSERT_TRUE(
        (*runner)->TokenSignals(slots, signals, {.request = 7, .positions = positions}, out).ok());
    ASSERT_EQ(out.size(), slots.size());
    for (float x : out) EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
    out.clear();
    const std::vector<const TokenSignalInfo*> windowed = {window};
    ASSERT_TRUE(
        (*runner)->TokenSignals(slots, windowed, {.request = 7, .positions = positions}, out).ok());
    ASSERT_EQ(out.size(), slots.size());
    for (float x : out) EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
    out.clear();
    Status none =
        (*runner)->TokenSignals(slots, signals, {.request = 8, .positions = positions}, out);
    EXPECT_EQ(none.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(none.message().find("expected_attention reads query statistics"), std::string::npos)
        << none.message();
    (*runner)->ForgetRequest(7);
    EXPECT_EQ((*runner)->query_moments(7), nullptr);
    if (decode == DecodeMode::kStatic) {  // Without them the same steps decode statically.
      EXPECT_EQ(RunKeeping(**runner, /*keep=*/false), nullptr);
      EXPECT_EQ((*runner)->decode_stats().static_steps, 2);
    }
  }
  ASSERT_EQ(means.size(), 3u);
  for (size_t i = 0; i < means[0].size(); ++i) {
    EXPECT_NEAR(means[1][i], means[0][i], 1e-4 * (1 + std::abs(means[0][i]))) << i;
    EXPECT_EQ(means[2][i], means[0][i]) << i;
  }
}

}  // namespace
}  // namespace vtoken::model
