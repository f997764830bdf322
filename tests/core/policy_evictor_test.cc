// PolicyEvictor: options, budget, protection, timing, tie-breaking, input validation, and state
// that follows its token through a relocation.
#include "lib/core/policy_evictor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/policy_registry.h"
#include "lib/core/reclaimer.h"
#include "lib/core/virtual_kv_cache.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

// Scores NaN for position 3 and the position otherwise (so older tokens go first).
class NanProbe final : public Policy {
 public:
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      scores[i] = tokens[i].position == 3 ? std::numeric_limits<float>::quiet_NaN()
                                          : static_cast<float>(tokens[i].position);
    }
  }
};
VTOKEN_REGISTER_POLICY(NanProbe, "test_nan", "test: NaN for position 3");

// Scores by position from a table of signed zeros, infinities, NaN and denormals.
class SignedScores final : public Policy {
 public:
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    const float inf = std::numeric_limits<float>::infinity();
    const float tiny = std::numeric_limits<float>::denorm_min();
    const float table[] = {0.0f,  -0.0f, -inf,  std::numeric_limits<float>::quiet_NaN(),
                           tiny,  -tiny, -1.0f, inf,
                           -0.0f, 2.0f};
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = table[tokens[i].position % 10];
  }
};
VTOKEN_REGISTER_POLICY(SignedScores, "test_signed_scores", "test: signed zeros, NaN, denormals");

// What StateProbe saw at its last Score: position -> state.
std::map<TokenId, std::vector<float>> g_seen_state;

// State: [0] a random tag drawn when the token is written, [1] its summed attention. Scores are
// random, so victims scatter over the blocks.
class StateProbe final : public Policy {
 public:
  int32_t state_size() const override { return 2; }
  void Observe(std::span<const TokenView> tokens, PolicyContext& ctx) const override {
    for (const TokenView& t : tokens) {
      if (t.age == 0) t.state[0] = static_cast<float>(ctx.rng.Next() % 1000000);
      t.state[1] += t.attn;
    }
  }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    g_seen_state.clear();
    for (size_t i = 0; i < tokens.size(); ++i) {
      g_seen_state[tokens[i].position].assign(tokens[i].state.begin(), tokens[i].state.end());
      scores[i] = static_cast<float>(ctx.rng.Uniform());
    }
  }
};
VTOKEN_REGISTER_POLICY(StateProbe, "test_state_probe", "test: records state");

// What ViewProbe saw at its last Score: position -> its view, state copied out.
struct SeenView {
  int64_t age;
  float attn, attn_sum, key_norm, observed;
};
std::map<TokenId, SeenView> g_seen_views;

// A token's score under ScatterProbe: a hash of its position, so victims scatter over the list.
float ScatterScore(TokenId position) {
  return static_cast<float>((static_cast<uint64_t>(position) * 0x9e3779b97f4a7c15ULL) >> 54);
}

// State: [0] how many steps observed the token. Records its views at Score; scores tokens by
// position (ViewProbe, the oldest go first) or by ScatterScore (ScatterProbe).
template <bool kScatter>
class RecordingProbe final : public Policy {
 public:
  int32_t state_size() const override { return 1; }
  void Observe(std::span<const TokenView> tokens, PolicyContext&) const override {
    for (const TokenView& t : tokens) t.state[0] += 1;
  }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    g_seen_views.clear();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const TokenView& t = tokens[i];
      g_seen_views[t.position] = {t.age, t.attn, t.attn_sum, t.key_norm, t.state[0]};
      scores[i] = kScatter ? ScatterScore(t.position) : static_cast<float>(t.position);
    }
  }
};
using ViewProbe = RecordingProbe<false>;
using ScatterProbe = RecordingProbe<true>;
VTOKEN_REGISTER_POLICY(ViewProbe, "test_view_probe", "test: records its views");
VTOKEN_REGISTER_POLICY(ScatterProbe, "test_scatter_probe",
                       "test: records its views, scattered scores");

// Observe calls of the two ObserveCounter policies below.
int g_observe_calls = 0;

// Counts Observe calls, with kState floats of state (none: Observe could write nothing).
template <int32_t kState>
class ObserveCounter final : public Policy {
 public:
  int32_t state_size() const override { return kState; }
  void Observe(std::span<const TokenView>, PolicyContext&) const override { ++g_observe_calls; }
  void Score(std::span<const TokenView> tokens, PolicyContext&,
             std::span<float> scores) const override {
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = static_cast<float>(tokens[i].position);
  }
};
using StatelessObserveCounter = ObserveCounter<0>;
using StatefulObserveCounter = ObserveCounter<1>;
VTOKEN_REGISTER_POLICY(StatelessObserveCounter, "test_observe_stateless",
                       "test: counts Observe calls, no state");
VTOKEN_REGISTER_POLICY(StatefulObserveCounter, "test_observe_stateful",
                       "test: counts Observe calls, one float of state");

using testing_util::GiveRelativeValues;
using testing_util::Make;
using testing_util::Range;
using testing_util::UnseenTokenValues;

std::vector<float> Uniform(size_t n) { return std::vector<float>(n, 1.0f / static_cast<float>(n)); }

// Observes `live` with uniform attention and unit key norms, returns the victims.
std::vector<TokenId> Step(PolicyEvictor& e, SeqId seq, const std::vector<TokenId>& live) {
  const std::vector<float> attn = Uniform(live.size());
  const std::vector<float> norm(live.size(), 1.0f);
  Status s = e.Observe(seq, live, attn, norm);
  EXPECT_TRUE(s.ok()) << s.ToString();
  StatusOr<std::vector<TokenId>> v = e.Victims(seq);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? *v : std::vector<TokenId>{};
}

void ExpectInvalidOptions(const EvictorOptions& o, const std::string& message) {
  Status s = ValidateEvictorOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), message);
}

// policy.h's promise: Observe runs once per step for a policy with state, and not at all for a
// policy without (state is all Observe may write); Score runs for both.
TEST(PolicyEvictorTest, ObserveRunsEveryStepForAPolicyWithStateOnly) {
  std::vector<std::vector<TokenId>> evicted;  // Per policy, every step's victims in turn.
  for (const auto& [policy, observes] :
       {std::pair{"test_observe_stateless", false}, std::pair{"test_observe_stateful", true}}) {
    SCOPED_TRACE(policy);
    g_observe_calls = 0;
    std::unique_ptr<PolicyEvictor> e = Make(policy, {.budget_tokens = 4});
    std::vector<TokenId> live = Range(0, 3), victims;
    for (TokenId next = 3; next < 8; ++next) {
      for (TokenId v : Step(*e, 1, live)) {
        victims.push_back(v);
        live.erase(std::find(live.begin(), live.end(), v));
      }
      live.push_back(next);
    }
    EXPECT_EQ(g_observe_calls, observes ? 5 : 0);
    evicted.push_back(victims);
  }
  EXPECT_EQ(evicted[0], (std::vector<TokenId>{0, 1, 2}));  // The oldest: the lowest scores.
  EXPECT_EQ(evicted[1], evicted[0]);
}

TEST(EvictorOptionsTest, ImpossibleValuesAreErrors) {
  EXPECT_TRUE(ValidateEvictorOptions({.budget_tokens = 8}).ok());
  EXPECT_TRUE(ValidateEvictorOptions({.keep_ratio = 1}).ok());
  ExpectInvalidOptions({},
                       "exactly one of budget_tokens and keep_ratio must be set "
                       "(budget_tokens 0, keep_ratio 0.000000)");
  ExpectInvalidOptions({.budget_tokens = 8, .keep_ratio = 0.5},
                       "exactly one of budget_tokens and keep_ratio must be set "
                       "(budget_tokens 8, keep_ratio 0.500000)");
  ExpectInvalidOptions({.budget_tokens = -1}, "budget_tokens must be >= 1, got -1");
  ExpectInvalidOptions({.keep_ratio = 1.5}, "keep_ratio must be in (0, 1], got 1.500000");
  ExpectInvalidOptions({.keep_ratio = -0.1}, "keep_ratio must be in (0, 1], got -0.100000");
  ExpectInvalidOptions({.keep_ratio = std::nan("")}, "keep_ratio must be in (0, 1], got nan");
  ExpectInvalidOptions({.budget_tokens = 8, .num_sink = -1}, "num_sink must be >= 0, got -1");
  ExpectInvalidOptions({.budget_tokens = 8, .num_recent = -2}, "num_recent must be >= 0, got -2");
  ExpectInvalidOptions({.budget_tokens = 8, .num_sink = 4, .num_recent = 5},
                       "num_sink + num_recent = 9 exceeds budget_tokens = 8");
  ExpectInvalidOptions({.budget_tokens = 8, .evict_interval = 0},
                       "evict_interval must be >= 1, got 0");
  StatusOr<std::unique_ptr<PolicyEvictor>> e =
      PolicyEvictor::Create("h2o", {}, {.budget_tokens = 0});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

// Every registered policy, random signals, budgets, protection and intervals: each eviction
// leaves exactly the budget and never touches a protected token.
TEST(PolicyEvictorTest, BudgetIsMetExactlyAndProtectedTokensSurviveForEveryPolicy) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (const PolicyInfo* info : RegisteredPolicies()) {
    for (int round = 0; round < 20; ++round) {
      SCOPED_TRACE(info->name + " round " + std::to_string(round) + " seed " +
                   std::to_string(seed));
      EvictorOptions o;
      o.budget_tokens = 1 + static_cast<int64_t>(rng() % 40);
      o.num_sink = static_cast<int64_t>(rng() % (o.budget_tokens + 1));
      o.num_recent = static_cast<int64_t>(rng() % (o.budget_tokens - o.num_sink + 1));
      o.evict_interval = 1 + static_cast<int64_t>(rng() % 3);
      o.seed = rng();
      std::unique_ptr<PolicyEvictor> e = Make(info->name, o);
      ASSERT_NE(e, nullptr);
      std::vector<TokenId> live = Range(0, 1 + static_cast<TokenId>(rng() % 80));
      TokenId next = static_cast<TokenId>(live.size());
      for (int64_t step = 0; step < 30; ++step) {
        std::vector<float> attn(live.size()), norm(live.size());
        float total = 0;
        for (size_t i = 0; i < live.size(); ++i) {
          attn[i] = static_cast<float>(rng() % 1000) + 1;
          total += attn[i];
          norm[i] = 0.5f + static_cast<float>(rng() % 100) / 40;
        }
        for (float& a : attn) a /= total;
        const bool scores = e->ScoresNext(7);
        ASSERT_TRUE(e->Observe(7, live, attn, norm, UnseenTokenValues(*e, 7, 0, live)).ok());
        ASSERT_TRUE(GiveRelativeValues(*e, 7, 0, live, scores, step).ok());
        StatusOr<std::vector<TokenId>> victims = e->Victims(7);
        ASSERT_TRUE(victims.ok());
        const auto n = static_cast<int64_t>(live.size());
        if (step % o.evict_interval == 0 && n > o.budget_tokens) {
          ASSERT_EQ(n - static_cast<int64_t>(victims->size()), o.budget_tokens);
        } else {
          ASSERT_TRUE(victims->empty());
        }
        ASSERT_TRUE(std::is_sorted(victims->begin(), victims->end()));
        std::set<TokenId> protected_tokens(live.begin(), live.begin() + std::min(n, o.num_sink));
        protected_tokens.insert(live.end() - std::min(n, o.num_recent), live.end());
        for (TokenId t : *victims) {
          ASSERT_TRUE(std::binary_search(live.begin(), live.end(), t)) << t;
          ASSERT_EQ(protected_tokens.count(t), 0u) << "protected token " << t << " evicted";
          live.erase(std::lower_bound(live.begin(), live.end(), t));
        }
        for (uint64_t k = rng() % 4; k > 0; --k) live.push_back(next++);
      }
    }
  }
}

TEST(PolicyEvictorTest, KeepRatioBudgetIsAFlooredFractionOfThePromptAndAtLeastOne) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.keep_ratio = 0.5});
  EXPECT_EQ(Step(*e, 1, Range(0, 25)).size(), 13u);
  EXPECT_EQ(*e->Budget(1), 12);
  EXPECT_EQ(Step(*e, 2, Range(0, 1)).size(), 0u);
  EXPECT_EQ(*e->Budget(2), 1);
  std::unique_ptr<PolicyEvictor> tiny = Make("tova", {.keep_ratio = 0.01});
  EXPECT_EQ(Step(*tiny, 1, Range(0, 50)).size(), 49u);
  EXPECT_EQ(*tiny->Budget(1), 1);
  StatusOr<int64_t> unknown = tiny->Budget(9);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), "budget: seq 9 was never observed");
}

TEST(PolicyEvictorTest, AKeepRatioBudgetBelowTheProtectedTokensWinsSinksFirst) {
  // Budget floor(0.3 * 10) = 3 < 2 sinks + 4 recent: keep both sinks, then the newest token.
  std::unique_ptr<PolicyEvictor> e =
      Make("tova", {.keep_ratio = 0.3, .num_sink = 2, .num_recent = 4});
  EXPECT_EQ(Step(*e, 1, Range(0, 10)), (std::vector<TokenId>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(PolicyEvictorTest, EqualScoresEvictTheOlderTokenFirst) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.budget_tokens = 4});
  EXPECT_EQ(Step(*e, 1, Range(0, 7)), (std::vector<TokenId>{0, 1, 2}));
}

TEST(PolicyEvictorTest, NanScoresCountAsLowest) {
  std::unique_ptr<PolicyEvictor> e = Make("test_nan", {.budget_tokens = 5});
  EXPECT_EQ(Step(*e, 1, Range(0, 7)), (std::vector<TokenId>{0, 3}));
}

// The order is (score, position) as floats compare: NaN with -inf (the older first), -0 equal
// to +0 (the older first), denormals between 0 and the normals. Ascending, positions 2 3 6 5
// 0 1 8 4 9 7: five victims end inside the zeros.
TEST(PolicyEvictorTest, SignedZerosTieAndNanTiesWithMinusInfinity) {
  std::unique_ptr<PolicyEvictor> e = Make("test_signed_scores", {.budget_tokens = 5});
  EXPECT_EQ(Step(*e, 1, Range(0, 10)), (std::vector<TokenId>{0, 2, 3, 5, 6}));
  e = Make("test_signed_scores", {.budget_tokens = 2});
  EXPECT_EQ(Step(*e, 1, Range(0, 10)), (std::vector<TokenId>{0, 1, 2, 3, 4, 5, 6, 8}));
}

TEST(PolicyEvictorTest, EvictsAfterPrefillThenEveryIntervalOncePerStep) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.budget_tokens = 4, .evict_interval = 3});
  std::vector<TokenId> live = Range(0, 6);
  std::vector<size_t> evicted;
  for (int step = 0; step < 7; ++step) {
    const std::vector<TokenId> v = Step(*e, 1, live);
    evicted.push_back(v.size());
    StatusOr<std::vector<TokenId>> again = e->Victims(1);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->empty()) << "second Victims call in step " << step;
    for (TokenId t : v) live.erase(std::find(live.begin(), live.end(), t));
    live.push_back(live.back() + 1);
  }
  EXPECT_EQ(evicted, (std::vector<size_t>{2, 0, 0, 3, 0, 0, 3}));
}

TEST(PolicyEvictorTest, ForgetStartsTheSequenceOver) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.keep_ratio = 0.5});
  EXPECT_EQ(Step(*e, 1, Range(0, 10)).size(), 5u);
  e->Forget(1);
  EXPECT_FALSE(e->HasSequence(1));
  EXPECT_EQ(Step(*e, 1, Range(0, 20)).size(), 10u);  // A new prefill with a new budget.
  e->Forget(42);                                     // Unknown: no-op.
}

void ExpectObserveError(PolicyEvictor& e, const std::vector<TokenId>& live,
                        const std::vector<float>& attn, const std::vector<float>& norm,
                        const std::string& message) {
  Status s = e.Observe(3, live, attn, norm);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), message);
}

TEST(PolicyEvictorTest, ObserveRejectsMalformedInput) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.budget_tokens = 2});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectObserveError(*e, {0, 1}, {0.5f}, {1, 1},
                     "observe seq 3: 2 live tokens but 1 attn and 2 key_norm");
  ExpectObserveError(*e, {0, 2, 2}, {0.3f, 0.3f, 0.4f}, {1, 1, 1},
                     "observe seq 3: live token ids must be >= 0 and strictly increasing "
                     "(token 2 at index 2)");
  ExpectObserveError(*e, {-1, 0}, {0.5f, 0.5f}, {1, 1},
                     "observe seq 3: live token ids must be >= 0 and strictly increasing "
                     "(token -1 at index 0)");
  ExpectObserveError(*e, {0, 1}, {nan, 0.5f}, {1, 1},
                     "observe seq 3: non-finite signal for token 0");
  EXPECT_FALSE(e->HasSequence(3)) << "a rejected first observation must not create the seq";
  EXPECT_EQ(Step(*e, 3, {0, 1, 2, 3}), (std::vector<TokenId>{0, 1}));
  ExpectObserveError(*e, {1, 2, 3, 4}, Uniform(4), {1, 1, 1, 1},
                     "observe seq 3: token 1 was evicted and cannot be live again");
  StatusOr<std::vector<TokenId>> unknown = e->Victims(99);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), "victims: seq 99 was never observed");
}

TEST(PolicyEvictorTest, TokensEvictedByTheCallerLeaveTheLiveSet) {
  std::unique_ptr<PolicyEvictor> e = Make("tova", {.budget_tokens = 3});
  EXPECT_TRUE(Step(*e, 1, {0, 1, 2}).empty());
  // Token 1 vanished (evicted elsewhere); two new tokens arrive; one victim brings it to 3.
  EXPECT_EQ(Step(*e, 1, {0, 2, 3, 4}), (std::vector<TokenId>{0}));
}

// Tokens the caller evicted leave, new ones join, and every surviving token keeps its age, summed
// attention and state through the changes; an evicted token cannot come back.
TEST(PolicyEvictorTest, SurvivorsKeepTheirSignalsAndStateAcrossCallerEvictions) {
  std::unique_ptr<PolicyEvictor> e =
      Make("test_view_probe", {.budget_tokens = 6, .evict_interval = 2});
  const std::vector<std::vector<TokenId>> steps = {
      {0, 1, 2, 3, 4, 5}, {0, 2, 3, 5, 6, 7}, {0, 2, 5, 6, 7, 8, 9}};
  std::map<TokenId, float> sum;
  std::map<TokenId, float> last;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<float> attn, norm;
    for (TokenId t : steps[k]) {
      attn.push_back(0.01f * static_cast<float>(t + 1) + 0.1f * static_cast<float>(k));
      norm.push_back(static_cast<float>(10 * k + t));
      sum[t] += attn.back();
      last[t] = norm.back();
    }
    ASSERT_TRUE(e->Observe(1, steps[k], attn, norm).ok()) << "step " << k;
    StatusOr<std::vector<TokenId>> victims = e->Victims(1);
    ASSERT_TRUE(victims.ok());
    EXPECT_EQ(*victims, k < 2 ? std::vector<TokenId>{} : std::vector<TokenId>{0}) << "step " << k;
  }
  ASSERT_EQ(g_seen_views.size(), 7u);
  // Written at step 0 (0 2 5), 1 (6 7) and 2 (8 9); observed 3, 2 and 1 times.
  const std::map<TokenId, std::pair<int64_t, float>> age_observed = {
      {0, {2, 3}}, {2, {2, 3}}, {5, {2, 3}}, {6, {1, 2}}, {7, {1, 2}}, {8, {0, 1}}, {9, {0, 1}}};
  for (const auto& [t, expected] : age_observed) {
    SCOPED_TRACE("token " + std::to_string(t));
    const SeenView& v = g_seen_views.at(t);
    EXPECT_EQ(v.age, expected.first);
    EXPECT_EQ(v.observed, expected.second);
    EXPECT_FLOAT_EQ(v.attn_sum, sum[t]);
    EXPECT_FLOAT_EQ(v.attn, 0.01f * static_cast<float>(t + 1) + 0.2f);
    EXPECT_EQ(v.key_norm, last[t]);
  }
  const std::vector<float> four(4, 0.25f), ones(4, 1.0f);
  Status back = e->Observe(1, std::vector<TokenId>{2, 3, 5, 10}, four, ones);
  EXPECT_EQ(back.message(), "observe seq 1: token 3 was evicted and cannot be live again");
  back = e->Observe(1, std::vector<TokenId>{0, 2, 5, 10}, four, ones);
  EXPECT_EQ(back.message(), "observe seq 1: token 0 was evicted and cannot be live again");
  // A rejected observation changed nothing: the next one sees the survivors as they were.
  EXPECT_TRUE(e->Observe(1, std::vector<TokenId>{2, 5, 6, 7, 8, 9}, std::vector<float>(6, 0.5f),
                         std::vector<float>(6, 1.0f))
                  .ok());
}

// The evictor drops its own victims' entries (one by one for a step's few, in one pass for more)
// and every survivor keeps its signals and state: each step appends 1-7 tokens to a budget of 8,
// so that many victims go, scattered over the live list; the next Score sees each survivor's sums,
// last signals and Observe count as a plain model of the steps has them.
TEST(PolicyEvictorTest, SurvivorsKeepTheirSignalsAndStateAcrossTheirOwnEvictions) {
  for (const uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::unique_ptr<PolicyEvictor> e = Make("test_scatter_probe", {.budget_tokens = 8});
    std::vector<TokenId> live;
    TokenId next = 0;
    std::map<TokenId, float> sum, last_attn, last_norm, observed;
    std::map<TokenId, int64_t> written;
    for (int64_t step = 0; step < 200; ++step) {
      for (int i = 1 + static_cast<int>(rng() % 7); i > 0; --i) {
        written[next] = step;
        live.push_back(next++);
      }
      std::vector<float> attn, norm;
      for (TokenId t : live) {
        attn.push_back(static_cast<float>(rng() % 1000) / 997.0f);
        norm.push_back(static_cast<float>(rng() % 1000) / 991.0f);
        sum[t] += attn.back();
        last_attn[t] = attn.back();
        last_norm[t] = norm.back();
        observed[t] += 1;
      }
      ASSERT_TRUE(e->Observe(1, live, attn, norm).ok()) << "step " << step;
      g_seen_views.clear();
      StatusOr<std::vector<TokenId>> victims = e->Victims(1);
      ASSERT_TRUE(victims.ok());
      // Over the budget, the step's Score saw every live token as the model has it.
      ASSERT_EQ(g_seen_views.size(), live.size() > 8 ? live.size() : 0) << "step " << step;
      for (TokenId t : live) {
        if (g_seen_views.empty()) break;
        const SeenView& v = g_seen_views.at(t);
        ASSERT_EQ(v.attn_sum, sum[t]) << "step " << step << " token " << t;
        ASSERT_EQ(v.attn, last_attn[t]) << "step " << step << " token " << t;
        ASSERT_EQ(v.key_norm, last_norm[t]) << "step " << step << " token " << t;
        ASSERT_EQ(v.observed, observed[t]) << "step " << step << " token " << t;
        ASSERT_EQ(v.age, step - written[t]) << "step " << step << " token " << t;
      }
      // The lowest (score, position) beyond the budget, in increasing order.
      std::vector<TokenId> order = live;
      std::stable_sort(order.begin(), order.end(),
                       [](TokenId a, TokenId b) { return ScatterScore(a) < ScatterScore(b); });
      std::vector<TokenId> expect(
          order.begin(),
          order.begin() + static_cast<ptrdiff_t>(live.size() - std::min<size_t>(8, live.size())));
      std::sort(expect.begin(), expect.end());
      ASSERT_EQ(*victims, expect) << "step " << step;
      for (TokenId t : expect) live.erase(std::find(live.begin(), live.end(), t));
    }
  }
}

// The policy's per-token state is keyed by logical id: a relocation that moves the tokens'
// slots leaves every surviving token with the state it had.
TEST(PolicyEvictorTest, StateFollowsTokensThroughRelocation) {
  VirtualKvCache cache(
      {.mode = Mode::kVtoken, .pool = {.num_blocks = 32, .block_size = 4, .headroom_blocks = 2}});
  HostKvStore store(1, 32 * 4, 8);
  SyncHostCopyEngine engine(store);
  Reclaimer reclaimer(cache, engine, {.trigger = ReclaimOptions::Trigger::kAlways}, 8);
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 40).ok());
  std::unique_ptr<PolicyEvictor> e = Make("test_state_probe", {.budget_tokens = 12, .seed = 5});

  const std::vector<TokenId> victims = Step(*e, seq, cache.table(seq).LiveTokens());
  ASSERT_EQ(victims.size(), 28u);
  const std::map<TokenId, std::vector<float>> before = g_seen_state;
  ASSERT_EQ(before.size(), 40u);
  for (TokenId t : victims) ASSERT_TRUE(cache.EvictToken(seq, t).ok());
  std::map<TokenId, SlotIndex> slot_before;
  for (TokenId t : cache.table(seq).LiveTokens()) slot_before[t] = cache.table(seq).entry(t).slot;

  StatusOr<int64_t> moved = reclaimer.Step();
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  ASSERT_TRUE(reclaimer.Drain().ok());
  ASSERT_TRUE(cache.CheckInvariants().ok());
  int relocated = 0;
  for (const auto& [t, slot] : slot_before) relocated += cache.table(seq).entry(t).slot != slot;
  ASSERT_GT(*moved, 0);
  ASSERT_GT(relocated, 0);

  ASSERT_TRUE(cache.SyncNewTokens(seq, 3).ok());
  const std::vector<TokenId> live = cache.table(seq).LiveTokens();
  ASSERT_EQ(live.size(), 15u);
  const std::vector<float> attn = Uniform(live.size());
  ASSERT_TRUE(e->Observe(seq, live, attn, std::vector<float>(live.size(), 1.0f)).ok());
  ASSERT_EQ(e->Victims(seq)->size(), 3u);
  for (const auto& [t, slot] : slot_before) {
    SCOPED_TRACE("token " + std::to_string(t));
    ASSERT_EQ(g_seen_state.count(t), 1u);
    EXPECT_EQ(g_seen_state[t][0], before.at(t)[0]);
    EXPECT_FLOAT_EQ(g_seen_state[t][1], before.at(t)[1] + attn[0]);
  }
  for (TokenId t : {TokenId{40}, TokenId{41}, TokenId{42}}) {
    EXPECT_FLOAT_EQ(g_seen_state.at(t)[1], attn[0]) << "new token " << t << " starts at zero";
  }
}

// LowestEntries (the victim rule's selection) against a full sort of (score, index), with ties,
// NaN, infinities and both zeros, for every k: the scan for k <= 4 and the partial sort above.
TEST(LowestEntriesTest, PicksTheSortsFirstKInIndexOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {nan, -inf, inf, 0.0f, -0.0f, 1.0f, 1.0f, -1.0f};
  for (const uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 200; ++round) {
      const int64_t n = static_cast<int64_t>(rng() % 24);
      std::vector<float> scores(static_cast<size_t>(n));
      for (float& x : scores) {
        x = rng() % 3 == 0 ? specials[rng() % specials.size()]
                           : static_cast<float>(rng() % 5) * 0.5f;  // Many ties.
      }
      const int64_t first = n == 0 ? 0 : static_cast<int64_t>(rng() % (n + 1));
      const int64_t last = first + static_cast<int64_t>(rng() % (n - first + 1));
      auto rank = [](float x) {
        return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x;
      };
      std::vector<int64_t> order(static_cast<size_t>(last - first));
      std::iota(order.begin(), order.end(), first);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return rank(scores[a]) < rank(scores[b]);  // -0 < +0 is false: equal, index order.
      });
      for (int64_t k = 0; k <= last - first; ++k) {
        std::vector<int64_t> expect(order.begin(), order.begin() + k);
        std::sort(expect.begin(), expect.end());
        ASSERT_EQ(LowestEntries(scores, first, last, k), expect)
            << "round " << round << " n " << n << " [" << first << ", " << last << ") k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace vtoken
