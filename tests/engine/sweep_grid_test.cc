// Sweep grid expansion, shards and the progress line of `vtoken-cli sweep`
// (apps/vtoken-cli/config/sweep_grid.h, header-only).
#include "apps/vtoken-cli/config/sweep_grid.h"

#include <gtest/gtest.h>

#include <set>

namespace vtoken::cli {
namespace {

std::vector<std::vector<std::string>> Overrides(const std::vector<SweepPoint>& points) {
  std::vector<std::vector<std::string>> out;
  for (size_t i = 0; i < points.size(); ++i) {
    EXPECT_EQ(points[i].index, static_cast<int64_t>(i));
    out.push_back(points[i].overrides);
  }
  return out;
}

TEST(ExpandGridTest, KeysSortedValuesInOrderLastKeyFastest) {
  const std::vector<SweepPoint> points = ExpandGrid({
      {.key = "policy.name", .values = {"'tova'", "'h2o'"}},
      {.key = "engine.num_blocks", .values = {"64", "48"}},
      {.key = "modes", .values = {"[ 'naive' ]"}},
  });
  const std::vector<std::vector<std::string>> expected = {
      {"engine.num_blocks=64", "modes=[ 'naive' ]", "policy.name='tova'"},
      {"engine.num_blocks=64", "modes=[ 'naive' ]", "policy.name='h2o'"},
      {"engine.num_blocks=48", "modes=[ 'naive' ]", "policy.name='tova'"},
      {"engine.num_blocks=48", "modes=[ 'naive' ]", "policy.name='h2o'"},
  };
  EXPECT_EQ(Overrides(points), expected);
}

TEST(ExpandGridTest, AnAxisSetsItsOtherKeysToTheSameValue) {
  // [sweep] seeds = [1, 2]: seed and workload.seed move together.
  const std::vector<SweepPoint> points =
      ExpandGrid({{.key = "seed", .values = {"1", "2"}, .also = {"workload.seed"}},
                  {.key = "policy.name", .values = {"'h2o'"}, .also = {}}});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].overrides,
            (std::vector<std::string>{"policy.name='h2o'", "seed=1", "workload.seed=1"}));
  EXPECT_EQ(points[1].overrides,
            (std::vector<std::string>{"policy.name='h2o'", "seed=2", "workload.seed=2"}));
}

TEST(ExpandGridTest, NoAxesIsOnePointWithoutOverrides) {
  const std::vector<SweepPoint> points = ExpandGrid({});
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].index, 0);
  EXPECT_TRUE(points[0].overrides.empty());
}

TEST(ExpandGridTest, AnAxisWithoutValuesHasNoPoints) {
  EXPECT_TRUE(ExpandGrid({{.key = "a", .values = {"1", "2"}}, {.key = "b", .values = {}}}).empty());
}

TEST(ExpandGridTest, SizeIsTheProductOfAxisSizes) {
  const std::vector<SweepPoint> points = ExpandGrid({{.key = "a", .values = {"1", "2", "3"}},
                                                     {.key = "b", .values = {"1", "2"}},
                                                     {.key = "c", .values = {"1", "2", "3", "4"}}});
  EXPECT_EQ(points.size(), 24u);
  std::set<std::vector<std::string>> distinct;
  for (const SweepPoint& p : points) distinct.insert(p.overrides);
  EXPECT_EQ(distinct.size(), 24u);
}

// [[sweep.exclude]] drops the product points that match an entry (every key of it); [[sweep.add]]
// appends its points after the product's, repeated over the seeds axis; indexes follow.
TEST(ExpandSweepTest, ExcludesMatchingPointsAndAppendsAddedOnesPerSeed) {
  const std::vector<SweepAxis> axes = {
      {.key = "cache.granularity", .values = {"'token'", "'head'"}},
      {.key = "policy.budget_allocation", .values = {"'uniform'", "'pyramid'"}},
      {.key = "seed", .values = {"1", "2"}, .also = {"workload.seed"}}};
  const std::vector<SweepPoint> points =
      ExpandSweep(axes, {{"cache.granularity='token'", "policy.budget_allocation='pyramid'"}},
                  {{"cache.granularity='layer'"}});
  const std::vector<std::vector<std::string>> expected = {
      {"cache.granularity='token'", "policy.budget_allocation='uniform'", "seed=1",
       "workload.seed=1"},
      {"cache.granularity='token'", "policy.budget_allocation='uniform'", "seed=2",
       "workload.seed=2"},
      {"cache.granularity='head'", "policy.budget_allocation='uniform'", "seed=1",
       "workload.seed=1"},
      {"cache.granularity='head'", "policy.budget_allocation='uniform'", "seed=2",
       "workload.seed=2"},
      {"cache.granularity='head'", "policy.budget_allocation='pyramid'", "seed=1",
       "workload.seed=1"},
      {"cache.granularity='head'", "policy.budget_allocation='pyramid'", "seed=2",
       "workload.seed=2"},
      {"cache.granularity='layer'", "seed=1", "workload.seed=1"},
      {"cache.granularity='layer'", "seed=2", "workload.seed=2"},
  };
  EXPECT_EQ(Overrides(points), expected);
}

TEST(ExpandSweepTest, WithoutExclusionsOrAdditionsIsTheGrid) {
  const std::vector<SweepAxis> axes = {{.key = "a", .values = {"1", "2"}},
                                       {.key = "b", .values = {"3", "4"}}};
  EXPECT_EQ(Overrides(ExpandSweep(axes, {}, {})), Overrides(ExpandGrid(axes)));
  // An exclusion of one key drops every point with that value; an added point without axes is
  // one point.
  EXPECT_EQ(
      Overrides(ExpandSweep(axes, {{"b=3"}}, {{"a=9", "b=9"}})),
      (std::vector<std::vector<std::string>>{{"a=1", "b=4"}, {"a=2", "b=4"}, {"a=9", "b=9"}}));
}

TEST(ShardTest, ParsesIndexAndCount) {
  StatusOr<Shard> s = ParseShard("1/3");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->index, 1);
  EXPECT_EQ(s->num_shards, 3);
  EXPECT_FALSE(s->Contains(0));
  EXPECT_TRUE(s->Contains(1));
  EXPECT_TRUE(s->Contains(4));
}

TEST(ShardTest, RejectsMalformedAndOutOfRange) {
  const std::pair<const char*, const char*> cases[] = {
      {"2/2", "--shard '2/2': need 0 <= I < N"},
      {"0/0", "--shard '0/0': need 0 <= I < N"},
      {"1", "--shard '1': expected I/N, e.g. 0/2"},
      {"-1/2", "--shard '-1/2': expected I/N, e.g. 0/2"},
      {"a/2", "--shard 'a/2': expected I/N, e.g. 0/2"},
      {"1/", "--shard '1/': expected I/N, e.g. 0/2"},
      {"", "--shard '': expected I/N, e.g. 0/2"},
  };
  for (const auto& [text, message] : cases) {
    StatusOr<Shard> s = ParseShard(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(s.status().message(), message);
  }
}

TEST(ShardTest, ShardsPartitionTheGrid) {
  for (int64_t n = 1; n <= 5; ++n) {
    std::vector<int> owners(17, 0);
    for (int64_t i = 0; i < n; ++i) {
      const Shard shard{.index = i, .num_shards = n};
      for (int64_t p = 0; p < 17; ++p) owners[p] += shard.Contains(p) ? 1 : 0;
    }
    for (int64_t p = 0; p < 17; ++p) EXPECT_EQ(owners[p], 1) << "point " << p << " of " << n;
  }
}

TEST(ProgressTest, FormatDuration) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(65), "1m05s");
  EXPECT_EQ(FormatDuration(3725), "1h02m");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(ProgressTest, EstimateFromFinishedPoints) {
  // Nothing finished: unknown.
  EXPECT_LT(EstimateRemaining({.total = 4}, 10, 1), 0);
  // 2 of 4 done in 20 s, one at a time: 10 s each, 2 left.
  EXPECT_DOUBLE_EQ(EstimateRemaining({.total = 4, .done = 2}, 20, 1), 20);
  // Skipped points cost nothing: 1 done in 10 s, 1 skipped, 2 left.
  EXPECT_DOUBLE_EQ(EstimateRemaining({.total = 4, .done = 1, .skipped = 1}, 10, 1), 20);
  // 4 jobs, 4 finished (1 failed) in 10 s: 10 s per point, 4 left run 4 at a time.
  EXPECT_DOUBLE_EQ(EstimateRemaining({.total = 8, .done = 3, .failed = 1}, 10, 4), 10);
  EXPECT_DOUBLE_EQ(EstimateRemaining({.total = 2, .done = 1, .skipped = 1}, 10, 1), 0);
}

TEST(ProgressTest, Line) {
  const SweepProgress p{.total = 8, .done = 2, .skipped = 2, .failed = 0, .running = 1};
  EXPECT_EQ(FormatProgress(p, 20, 1, 10),
            "[#####.....] 4/8  done 2  skipped 2  failed 0  running 1  20s elapsed  ETA 40s");
  EXPECT_EQ(FormatProgress({.total = 3}, 0, 2, 6),
            "[......] 0/3  done 0  skipped 0  failed 0  running 0  0s elapsed  ETA ?");
}

}  // namespace
}  // namespace vtoken::cli
