// KV groups under load: the model-based check (CheckHarness's per-group reference) with 1, 4 and
// 16 groups, with a policy choosing per-head victims, and the memory target of per-head eviction:
// after H2O-like eviction to 25% in every head, vtoken repacks each group to its ideal block
// count while naive mode keeps almost every block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "lib/core/check_harness.h"
#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/reclaimer.h"
#include "lib/core/synthetic_signals.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

struct CheckConfig {
  int32_t num_groups;
  bool async;
  Mode mode;
};

void PrintTo(const CheckConfig& c, std::ostream* os) {
  *os << c.num_groups << " groups, " << (c.async ? "async" : "sync") << ", " << ModeName(c.mode);
}

class GroupCheckTest : public ::testing::TestWithParam<CheckConfig> {};

TEST_P(GroupCheckTest, RandomOperationsKeepEveryGroupsBytes) {
  const CheckConfig& c = GetParam();
  for (uint64_t seed : {11u, 12u, 13u}) {
    CheckOptions o;
    o.seed = seed;
    o.steps = 3000;
    o.mode = c.mode;
    o.num_groups = c.num_groups;
    // Room for a few sequences of every group, and still pool exhaustion now and then.
    o.pool = {.num_blocks = 40 * c.num_groups, .block_size = 16, .headroom_blocks = 8};
    o.num_layers = 1;
    o.bytes_per_token = 8;
    o.async_copies = c.async;
    o.copy_delay_us = c.async ? 10 : 0;
    SCOPED_TRACE("seed " + std::to_string(seed));
    StatusOr<CheckReport> r = RunCheck(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->violations, 0) << (r->first_violations.empty() ? "" : r->first_violations[0]);
    EXPECT_EQ(r->steps, o.steps);
    EXPECT_GT(r->tokens_verified, 0);
    EXPECT_GT(r->evictions, 0);
    EXPECT_EQ(r->invariant_checks, o.steps + 1);
    if (c.mode == Mode::kVtoken) {
      EXPECT_GT(r->tokens_moved, 0);
      EXPECT_EQ(r->hash_checks, r->tokens_moved);
    } else {
      EXPECT_EQ(r->tokens_moved, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, GroupCheckTest,
    ::testing::Values(CheckConfig{1, false, Mode::kVtoken}, CheckConfig{1, true, Mode::kVtoken},
                      CheckConfig{1, false, Mode::kNaive}, CheckConfig{4, false, Mode::kVtoken},
                      CheckConfig{4, true, Mode::kVtoken}, CheckConfig{4, false, Mode::kNaive},
                      CheckConfig{16, false, Mode::kVtoken}, CheckConfig{16, true, Mode::kVtoken},
                      CheckConfig{16, false, Mode::kNaive}, CheckConfig{16, true, Mode::kNaive}),
    [](const ::testing::TestParamInfo<CheckConfig>& info) {
      return std::to_string(info.param.num_groups) + "g_" +
             (info.param.async ? "async_" : "sync_") + ModeName(info.param.mode);
    });

class HeadPolicyCheckTest : public ::testing::TestWithParam<BudgetAllocation> {};

TEST_P(HeadPolicyCheckTest, H2oPerHeadDrivesACleanCheck) {
  const BudgetAllocation allocation = GetParam();
  for (uint64_t seed : {21u, 22u}) {
    SCOPED_TRACE(std::string(BudgetAllocationName(allocation)) + " seed " + std::to_string(seed));
    const EvictorOptions eo{.budget_tokens = 32,
                            .seed = seed,
                            .granularity = Granularity::kHead,
                            .num_layers = 2,
                            .num_kv_heads = 2,
                            .allocation = allocation};
    StatusOr<std::unique_ptr<PolicyEvictor>> evictor = PolicyEvictor::Create("h2o", {}, eo);
    ASSERT_TRUE(evictor.ok()) << evictor.status().ToString();
    SyntheticSignalDriver driver(**evictor);
    CheckOptions o;
    o.seed = seed;
    o.steps = 3000;
    o.num_groups = 4;
    o.num_layers = 1;
    o.pool = {.num_blocks = 160, .block_size = 16, .headroom_blocks = 8};
    StatusOr<CheckReport> r = RunCheck(o, &driver);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->violations, 0) << (r->first_violations.empty() ? "" : r->first_violations[0]);
    EXPECT_TRUE(driver.status().ok()) << driver.status().ToString();
    EXPECT_GT(driver.victims(), 0);
    EXPECT_EQ(r->evictions, driver.victims());
    EXPECT_GT(r->tokens_moved, 0);
    EXPECT_GT(r->tokens_verified, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Allocations, HeadPolicyCheckTest,
                         ::testing::Values(BudgetAllocation::kUniform, BudgetAllocation::kPyramid,
                                           BudgetAllocation::kAdaptive),
                         [](const ::testing::TestParamInfo<BudgetAllocation>& info) {
                           return std::string(BudgetAllocationName(info.param));
                         });

// The memory target at small scale.
constexpr int32_t kGroups = 8;
constexpr int32_t kSeqs = 4;
constexpr int64_t kShortTokens = 512;  // 8 kept blocks per group: one open tail is 12.5%.
constexpr int64_t kLongTokens = 8192;  // 128 kept blocks per group: one open tail is 0.8%.
constexpr int32_t kBlockSize = 16;

uint64_t Tag(SeqId seq, int32_t group, TokenId token) {
  return (uint64_t{static_cast<uint32_t>(seq)} << 40) |
         (uint64_t{static_cast<uint32_t>(group)} << 20) | static_cast<uint64_t>(token);
}

struct PackResult {
  FragStats stats;
  int64_t bound = 0;  // Sum over groups: ceil(live outside the tail / bs) + tail held.
  int64_t tail_blocks = 0;
};

// Fills kSeqs sequences of kTokens tokens, evicts 75% of every group (a different random set per
// group, from `seed`), then in vtoken mode reclaims until nothing moves. Checks invariants and
// every live token's bytes.
PackResult EvictAndPack(Mode mode, uint64_t seed, int64_t kTokens) {
  const int64_t kKeep = kTokens / 4;  // 25%.
  const int32_t num_blocks = kSeqs * kGroups * (kTokens / kBlockSize) + 64;
  VirtualKvCache cache(
      {.mode = mode,
       .pool = {.num_blocks = num_blocks, .block_size = kBlockSize, .headroom_blocks = 32},
       .num_groups = kGroups});
  HostKvStore store(1, int64_t{num_blocks} * kBlockSize, sizeof(uint64_t));
  auto tag_at = [&](SlotIndex slot) {
    uint64_t v = 0;
    std::memcpy(&v, store.Token(0, slot).data(), sizeof(v));
    return v;
  };
  std::vector<SeqId> seqs;
  for (int32_t i = 0; i < kSeqs; ++i) {
    const SeqId seq = cache.AddSequence();
    seqs.push_back(seq);
    StatusOr<std::vector<SlotIndex>> slots = cache.SyncNewTokens(seq, kTokens);
    EXPECT_TRUE(slots.ok()) << slots.status().ToString();
    if (!slots.ok()) return {};
    for (int32_t g = 0; g < kGroups; ++g) {
      for (TokenId t = 0; t < kTokens; ++t) {
        const uint64_t v = Tag(seq, g, t);
        std::memcpy(store.Token(0, (*slots)[g * kTokens + t]).data(), &v, sizeof(v));
      }
    }
  }
  for (SeqId seq : seqs) {
    for (int32_t g = 0; g < kGroups; ++g) {
      std::vector<TokenId> ids(kTokens);
      std::iota(ids.begin(), ids.end(), 0);
      std::mt19937_64 rng(seed ^
                          (static_cast<uint64_t>(seq) * 1000003u + static_cast<uint64_t>(g)));
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int64_t i = 0; i < kTokens - kKeep; ++i) {
        const Status s = cache.EvictToken(seq, g, ids[i]);
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    }
  }
  const Status after_evict = cache.CheckInvariants();
  EXPECT_TRUE(after_evict.ok()) << after_evict.ToString();

  PackResult result;
  for (SeqId seq : seqs) {
    for (int32_t g = 0; g < kGroups; ++g) {
      const TokenTable& t = cache.table(seq, g);
      EXPECT_EQ(t.num_live(), kKeep);
      const bool tail = t.tail_block() != kNoBlock && t.holds(t.tail_block());
      const int64_t tail_live = tail ? t.live_in(t.tail_block()) : 0;
      result.bound += (t.num_live() - tail_live + kBlockSize - 1) / kBlockSize + (tail ? 1 : 0);
      result.tail_blocks += tail ? 1 : 0;
    }
  }

  if (mode == Mode::kVtoken) {
    SyncHostCopyEngine engine(store);
    Reclaimer reclaimer(
        cache, engine,
        {.trigger = ReclaimOptions::Trigger::kAlways, .max_moves_per_step = int64_t{1} << 20},
        sizeof(uint64_t));
    for (int round = 0; round < 100; ++round) {
      StatusOr<int64_t> moved = reclaimer.Step();
      EXPECT_TRUE(moved.ok()) << moved.status().ToString();
      const Status drained = reclaimer.Drain();
      EXPECT_TRUE(drained.ok()) << drained.ToString();
      const Status inv = cache.CheckInvariants();
      EXPECT_TRUE(inv.ok()) << inv.ToString();
      if (!moved.ok() || *moved == 0) break;
    }
    EXPECT_GT(reclaimer.stats().moves, 0);
  }
  for (SeqId seq : seqs) {
    for (int32_t g = 0; g < kGroups; ++g) {
      const std::vector<TokenId> live = cache.table(seq, g).LiveTokens();
      const std::vector<SlotIndex> slots = cache.LiveSlots(seq, g);
      for (size_t i = 0; i < live.size(); ++i) {
        EXPECT_EQ(tag_at(slots[i]), Tag(seq, g, live[i])) << "seq " << seq << " group " << g;
      }
    }
  }
  result.stats = cache.Stats();
  return result;
}

void ExpectPacked(int64_t tokens, bool strict) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(tokens) + " tokens");
  const PackResult vtoken = EvictAndPack(Mode::kVtoken, seed, tokens);
  const PackResult naive = EvictAndPack(Mode::kNaive, seed, tokens);
  const int64_t ideal = int64_t{kSeqs} * kGroups * (tokens / 4 / kBlockSize);
  ASSERT_EQ(vtoken.stats.ideal_blocks, ideal);
  ASSERT_EQ(naive.stats.ideal_blocks, ideal);
  const double vtoken_ratio =
      static_cast<double>(vtoken.stats.held_blocks) / static_cast<double>(ideal);
  const double naive_ratio =
      static_cast<double>(naive.stats.held_blocks) / static_cast<double>(ideal);
  std::printf(
      "%lld tokens: ideal %lld blocks; vtoken holds %lld (%.3fx ideal, bound %lld, %lld open "
      "tails); naive holds %lld (%.3fx ideal)\n",
      static_cast<long long>(tokens), static_cast<long long>(ideal),
      static_cast<long long>(vtoken.stats.held_blocks), vtoken_ratio,
      static_cast<long long>(vtoken.bound), static_cast<long long>(vtoken.tail_blocks),
      static_cast<long long>(naive.stats.held_blocks), naive_ratio);
  // Everything but the open tail blocks (never moved) is packed.
  EXPECT_LE(vtoken.stats.held_blocks, vtoken.bound);
  EXPECT_LE(static_cast<double>(vtoken.stats.held_blocks),
            std::ceil(1.05 * static_cast<double>(ideal)) + static_cast<double>(vtoken.tail_blocks));
  // The target, without allowance: at 128 kept blocks per group the tails fit in 5%.
  if (strict) EXPECT_LE(vtoken_ratio, 1.05);
  EXPECT_EQ(vtoken.stats.allocated_blocks, vtoken.stats.held_blocks);
  EXPECT_GT(naive.stats.held_blocks, 2 * ideal);
  EXPECT_GT(naive.stats.held_blocks, 2 * vtoken.stats.held_blocks);
}

TEST(KvGroupsMemoryTest, PerHeadEvictionToAQuarterPacksToTheIdealBlockCount) {
  ExpectPacked(kShortTokens, /*strict=*/false);
}

// The per-head H2O-at-25% target of the KV-groups issue: blocks held <= 1.05x the per-group ideal
// packed bound after an unbounded reclaim pass, naive far above.
TEST(KvGroupsMemoryTest, PerHeadEvictionAtLongContextsHoldsWithinFivePercentOfIdeal) {
  ExpectPacked(kLongTokens, /*strict=*/true);
}

}  // namespace
}  // namespace vtoken
