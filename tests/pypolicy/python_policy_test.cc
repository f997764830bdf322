// Policies in Python (lib/pypolicy/python_policy.h): Python ports of h2o, vatp (a token signal)
// and decayed_attention (state written by observe) pick exactly the C++ policies' victims over
// many steps, at token and head granularity; the registration's errors name the problem.
#include "lib/pypolicy/python_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "tests/core/policy_test_util.h"

namespace vtoken {
namespace {

using testing_util::UnseenTokenValues;

const char kPolicies[] = R"PY(
import numpy as np


class PyH2O:
    name = "py_h2o"
    rule = "h2o in Python"
    signals = ["attn_sum"]
    params = {"recent_ratio": 0.5}

    def __init__(self, recent_ratio):
        self.recent_ratio = recent_ratio

    def score(self, tokens, ctx):
        s = tokens["attn_sum"].copy()
        recent = int(self.recent_ratio * ctx["budget"])
        if recent > 0:
            s[max(0, len(s) - recent):] = np.inf
        return s


class PyVatp(PyH2O):
    name = "py_vatp"
    signals = ["attn_sum", "value_l1_norm"]

    def score(self, tokens, ctx):
        s = tokens["attn_sum"] * tokens["value_l1_norm"]
        recent = int(self.recent_ratio * ctx["budget"])
        if recent > 0:
            s[max(0, len(s) - recent):] = np.inf
        return s


class PyDecayed:
    name = "py_decayed"
    signals = ["attn"]
    state_size = 1
    params = {"decay": 0.9}

    def __init__(self, decay):
        self.decay = np.float32(decay)

    def observe(self, tokens, ctx):
        st = tokens["state"]
        st[:, 0] = self.decay * st[:, 0] + tokens["attn"]

    def score(self, tokens, ctx):
        return tokens["state"][:, 0]


class WrongLength:
    name = "py_wrong_length"
    signals = []

    def score(self, tokens, ctx):
        return np.zeros(3)


class UnknownSignal:
    name = "py_unknown_signal"
    signals = ["no_such_signal"]

    def score(self, tokens, ctx):
        return tokens["position"]


class Raises:
    name = "py_raises"

    def score(self, tokens, ctx):
        raise ValueError("deliberately")


class RaisesLater:
    name = "py_raises_later"
    signals = ["attn"]

    def score(self, tokens, ctx):
        if ctx["step"] >= 2:
            raise RuntimeError("at step %d" % ctx["step"])
        return tokens["attn"]


class Taken:
    name = "h2o"

    def score(self, tokens, ctx):
        return tokens["position"]
)PY";

class PythonPolicyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("vtoken_pypolicy_" + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_);
    std::ofstream(*dir_ / "ports.py") << kPolicies;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (!PythonPoliciesAvailable()) GTEST_SKIP() << "this build has no Python";
  }
  static std::string Spec(const std::string& cls) {
    return (*dir_ / "ports.py").string() + ":" + cls;
  }
  static StatusOr<std::string> Register(const std::string& cls) {
    return RegisterPythonPolicy(Spec(cls));
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* PythonPolicyTest::dir_ = nullptr;

// Drives `a` and `b` through the same steps of random signals; their victims must be equal.
void ExpectSameVictims(const std::string& a, const std::string& b, const RawParams& params,
                       const EvictorOptions& options, uint64_t seed) {
  auto ea = PolicyEvictor::Create(a, params, options);
  auto eb = PolicyEvictor::Create(b, params, options);
  ASSERT_TRUE(ea.ok()) << ea.status().ToString();
  ASSERT_TRUE(eb.ok()) << eb.status().ToString();
  const int32_t groups = NumGroups(options);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<TokenId>> live(static_cast<size_t>(groups));
  TokenId next = 0;
  for (; next < 64; ++next) {
    for (auto& l : live) l.push_back(next);
  }
  int64_t evicted = 0;
  for (int64_t step = 0; step < 30; ++step) {
    for (int32_t g = 0; g < groups; ++g) {
      std::vector<float> attn(live[g].size()), norm(live[g].size());
      float total = 0;
      for (float& x : attn) total += x = uniform(rng);
      for (float& x : attn) x /= total;
      for (float& x : norm) x = 1 + 3 * uniform(rng);
      ASSERT_TRUE(
          (*ea)->Observe(1, g, live[g], attn, norm, UnseenTokenValues(**ea, 1, g, live[g])).ok());
      const Status s =
          (*eb)->Observe(1, g, live[g], attn, norm, UnseenTokenValues(**eb, 1, g, live[g]));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    auto va = (*ea)->GroupVictims(1);
    auto vb = (*eb)->GroupVictims(1);
    ASSERT_TRUE(va.ok() && vb.ok());
    ASSERT_EQ(*va, *vb) << "step " << step;
    for (int32_t g = 0; g < groups; ++g) {
      evicted += static_cast<int64_t>((*va)[g].size());
      std::erase_if(live[g], [&](TokenId t) {
        return std::binary_search((*va)[g].begin(), (*va)[g].end(), t);
      });
      live[g].push_back(next);
    }
    ++next;
  }
  EXPECT_GT(evicted, 0);
}

TEST_F(PythonPolicyTest, PortsPickTheVictimsOfTheCppPolicies) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const char* cls : {"PyH2O", "PyVatp", "PyDecayed"}) {
    StatusOr<std::string> name = Register(cls);
    ASSERT_TRUE(name.ok()) << name.status().ToString();
  }
  const std::vector<EvictorOptions> variants = {
      {.budget_tokens = 24, .num_sink = 2, .num_recent = 4},
      {.keep_ratio = 0.5, .num_sink = 1, .evict_interval = 3},
      {.keep_ratio = 0.4,
       .num_sink = 1,
       .num_recent = 2,
       .evict_interval = 2,
       .granularity = Granularity::kHead,
       .num_layers = 2,
       .num_kv_heads = 2,
       .allocation = BudgetAllocation::kAdaptive}};
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("variant " + std::to_string(v) + ", seed " + std::to_string(seed));
    ExpectSameVictims("h2o", "py_h2o", {}, variants[v], seed + v);
    ExpectSameVictims("h2o", "py_h2o", {{"recent_ratio", 0.25}}, variants[v], seed + v);
    ExpectSameVictims("vatp", "py_vatp", {}, variants[v], seed + v);
    ExpectSameVictims("decayed_attention", "py_decayed", {{"decay", 0.7}}, variants[v], seed + v);
  }
  // Registered like any policy: its file, its rule, its parameters with their types.
  StatusOr<const PolicyInfo*> info = FindPolicy("py_h2o");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ((*info)->rule, "h2o in Python");
  EXPECT_EQ(std::filesystem::path((*info)->source_file).filename(), "ports.py");
  ASSERT_EQ((*info)->params.size(), 1u);
  EXPECT_EQ((*info)->params[0].name, "recent_ratio");
  EXPECT_EQ(TypeOf((*info)->params[0].default_value), ParamType::kDouble);
  EXPECT_EQ(CreatePolicy("py_h2o", {{"recent_ratio", std::string("x")}}).status().code(),
            StatusCode::kInvalidArgument);
  auto vatp = CreatePolicy("py_vatp", {});
  ASSERT_TRUE(vatp.ok());
  EXPECT_EQ((*vatp)->signals(), kAttnSumSignal);
  EXPECT_EQ((*vatp)->token_signals(), std::vector<std::string>{"value_l1_norm"});
}

TEST_F(PythonPolicyTest, RegistrationErrorsNameTheProblem) {
  auto expect = [](const std::string& spec, StatusCode code, const std::string& text) {
    StatusOr<std::string> r = RegisterPythonPolicy(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().ToString();
  };
  expect("ports.py", StatusCode::kInvalidArgument, "expected FILE.py:CLASS");
  expect((*dir_ / "ports.txt").string() + ":X", StatusCode::kInvalidArgument, "is not a .py file");
  expect((*dir_ / "missing.py").string() + ":X", StatusCode::kNotFound, "no file");
  expect(Spec("NoSuchClass"), StatusCode::kNotFound, "ports.py has no class NoSuchClass");
  expect(Spec("WrongLength"), StatusCode::kInvalidArgument,
         "python policy py_wrong_length: score must return 8 numbers (one per token)");
  expect(Spec("UnknownSignal"), StatusCode::kInvalidArgument,
         "'no_such_signal' is neither attn, attn_sum, key_norm nor a token signal");
  expect(Spec("Raises"), StatusCode::kInvalidArgument,
         "python policy py_raises: score raised ValueError: deliberately");
  expect(Spec("Taken"), StatusCode::kFailedPrecondition, "the name 'h2o' is taken by");
  std::ofstream(*dir_ / "broken.py") << "def f(:\n";
  expect((*dir_ / "broken.py").string() + ":X", StatusCode::kInvalidArgument,
         "loading broken.py raised SyntaxError");
  EXPECT_FALSE(FindPolicy("py_raises").ok());  // Nothing half-registered.
}

// An exception during a run is the policy's failure(): the evictor returns it, before picking
// victims from the scores of the failed call.
TEST_F(PythonPolicyTest, AnExceptionDuringARunIsTheEvictorsError) {
  ASSERT_TRUE(Register("RaisesLater").ok());
  auto e = PolicyEvictor::Create("py_raises_later", {}, {.budget_tokens = 4});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<TokenId> live = {0, 1, 2, 3, 4, 5};
  for (int64_t step = 0; step < 2; ++step) {
    const std::vector<float> attn(live.size(), 1.0f / static_cast<float>(live.size()));
    ASSERT_TRUE((*e)->Observe(1, live, attn, attn).ok());
    auto victims = (*e)->Victims(1);
    ASSERT_TRUE(victims.ok()) << victims.status().ToString();
    std::erase_if(
        live, [&](TokenId t) { return std::binary_search(victims->begin(), victims->end(), t); });
    live.push_back(live.back() + 1);
    live.push_back(live.back() + 1);
  }
  const std::vector<float> attn(live.size(), 1.0f / static_cast<float>(live.size()));
  ASSERT_TRUE((*e)->Observe(1, live, attn, attn).ok());
  auto failed = (*e)->Victims(1);
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(failed.status().message(),
            "python policy py_raises_later: score raised RuntimeError: at step 2");
  EXPECT_EQ((*e)->Observe(1, live, attn, attn).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken
