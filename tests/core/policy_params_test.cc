// Policy parameters, the registry and line counting, including the 50-line limit on every file in
// policies/.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_registry.h"

namespace vtoken {
namespace {

// A policy with one parameter of each type, registered only in this test binary.
class TypedProbe final : public Policy {
 public:
  explicit TypedProbe(const PolicyParams& p)
      : count_(p.Int("count")),
        ratio_(p.Double("ratio")),
        flag_(p.Bool("flag")),
        mode_(p.String("mode")) {}
  void Score(std::span<const TokenView>, PolicyContext&, std::span<float> scores) const override {
    for (float& s : scores) s = static_cast<float>(count_ + ratio_ + (flag_ ? 1 : 0));
  }
  int64_t count_;
  double ratio_;
  bool flag_;
  std::string mode_;
};

VTOKEN_REGISTER_POLICY(TypedProbe, "test_typed", "test: one parameter of each type",
                       IntParam("count", 3, "an int", /*min=*/0, /*max=*/10),
                       DoubleParam("ratio", 0.25, "a double", /*min=*/0, /*max=*/1),
                       BoolParam("flag", false, "a bool"),
                       StringParam("mode", "a", "a string", {"a", "b"}));

std::vector<ParamSpec> Specs() { return (*FindPolicy("test_typed"))->params; }

TEST(PolicyParamsTest, DefaultsFillEveryDeclaredParameter) {
  StatusOr<PolicyParams> p = ResolveParams("test_typed", Specs(), {});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->Int("count"), 3);
  EXPECT_EQ(p->Double("ratio"), 0.25);
  EXPECT_FALSE(p->Bool("flag"));
  EXPECT_EQ(p->String("mode"), "a");
}

TEST(PolicyParamsTest, RawValuesOverrideDefaultsAndIntsWidenToDouble) {
  RawParams raw{
      {"count", int64_t{7}}, {"ratio", int64_t{1}}, {"flag", true}, {"mode", std::string("b")}};
  StatusOr<PolicyParams> p = ResolveParams("test_typed", Specs(), raw);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->Int("count"), 7);
  EXPECT_EQ(p->Double("ratio"), 1.0);
  EXPECT_TRUE(p->Bool("flag"));
  EXPECT_EQ(p->String("mode"), "b");
}

void ExpectInvalid(const RawParams& raw, const std::string& message) {
  StatusOr<PolicyParams> p = ResolveParams("test_typed", Specs(), raw);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(), message);
}

TEST(PolicyParamsTest, BadRawValuesNameThePolicyAndTheKey) {
  ExpectInvalid({{"bogus", int64_t{1}}},
                "policy 'test_typed' has no parameter 'bogus' (known: count ratio flag mode)");
  ExpectInvalid({{"count", 2.5}},
                "policy 'test_typed': parameter 'count' expects int, got double '2.5'");
  ExpectInvalid({{"ratio", std::string("x")}},
                "policy 'test_typed': parameter 'ratio' expects double, got string 'x'");
  ExpectInvalid({{"flag", int64_t{1}}},
                "policy 'test_typed': parameter 'flag' expects bool, got int '1'");
  ExpectInvalid({{"mode", true}},
                "policy 'test_typed': parameter 'mode' expects string, got bool 'true'");
  ExpectInvalid({{"count", int64_t{11}}},
                "policy 'test_typed': parameter 'count' = 11 is outside [0, 10]");
  ExpectInvalid({{"ratio", -0.5}},
                "policy 'test_typed': parameter 'ratio' = -0.5 is outside [0, 1]");
  ExpectInvalid({{"mode", std::string("c")}},
                "policy 'test_typed': parameter 'mode' = 'c' is not one of a, b");
}

TEST(PolicyParamsTest, AssignmentsParseByDeclaredType) {
  const std::vector<std::string> flags = {"count=9", "ratio=0.75", "flag=true", "mode=b"};
  StatusOr<RawParams> raw = ParseParamAssignments("test_typed", Specs(), flags);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(std::get<int64_t>(raw->at("count")), 9);
  EXPECT_EQ(std::get<double>(raw->at("ratio")), 0.75);
  EXPECT_EQ(std::get<bool>(raw->at("flag")), true);
  EXPECT_EQ(std::get<std::string>(raw->at("mode")), "b");
  const std::vector<std::string> numeric_bool = {"flag=0", "ratio=1"};
  raw = ParseParamAssignments("test_typed", Specs(), numeric_bool);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(std::get<bool>(raw->at("flag")), false);
  EXPECT_EQ(std::get<double>(raw->at("ratio")), 1.0);
}

TEST(PolicyParamsTest, BadAssignmentsNameThePolicyAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"count", "policy 'test_typed': parameter 'count' is not key=value"},
      {"=3", "policy 'test_typed': parameter '=3' is not key=value"},
      {"size=3", "policy 'test_typed' has no parameter 'size' (known: count ratio flag mode)"},
      {"count=3x", "policy 'test_typed': parameter 'count' expects int, got '3x'"},
      {"count=", "policy 'test_typed': parameter 'count' expects int, got ''"},
      {"ratio=half", "policy 'test_typed': parameter 'ratio' expects double, got 'half'"},
      {"ratio=inf", "policy 'test_typed': parameter 'ratio' expects double, got 'inf'"},
      {"flag=yes", "policy 'test_typed': parameter 'flag' expects bool, got 'yes'"},
  };
  for (const auto& [flag, message] : cases) {
    const std::vector<std::string> flags = {flag};
    StatusOr<RawParams> raw = ParseParamAssignments("test_typed", Specs(), flags);
    ASSERT_FALSE(raw.ok()) << flag;
    EXPECT_EQ(raw.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(raw.status().message(), message);
  }
  const std::vector<std::string> twice = {"count=1", "count=2"};
  StatusOr<RawParams> raw = ParseParamAssignments("test_typed", Specs(), twice);
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().message(), "policy 'test_typed': parameter 'count' is given twice");
}

TEST(PolicyRegistryTest, CreatePolicyResolvesParameters) {
  StatusOr<std::unique_ptr<Policy>> policy =
      CreatePolicy("test_typed", {{"count", int64_t{5}}, {"flag", true}});
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  const auto* probe = dynamic_cast<const TypedProbe*>(policy->get());
  ASSERT_NE(probe, nullptr);
  EXPECT_EQ(probe->count_, 5);
  EXPECT_EQ(probe->ratio_, 0.25);
  EXPECT_TRUE(probe->flag_);
  EXPECT_EQ(probe->mode_, "a");
}

TEST(PolicyRegistryTest, UnknownPolicyIsNotFoundAndListsTheRegisteredOnes) {
  StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy("no_such_policy", {});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), StatusCode::kNotFound);
  // The list comes from the registry, so adding a policy file does not break this test.
  std::string registered;
  for (const PolicyInfo* info : RegisteredPolicies()) {
    registered += (registered.empty() ? "" : ", ") + info->name;
  }
  EXPECT_EQ(policy.status().message(),
            "unknown policy 'no_such_policy' (registered: " + registered + ")");
  EXPECT_NE(registered.find("h2o, "), std::string::npos) << registered;
  EXPECT_NE(registered.find("test_typed"), std::string::npos) << registered;
}

TEST(PolicyRegistryTest, BadParameterOfARealPolicyNamesPolicyAndKey) {
  StatusOr<std::unique_ptr<Policy>> policy = CreatePolicy("h2o", {{"recent", 0.5}});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(policy.status().message(),
            "policy 'h2o' has no parameter 'recent' (known: recent_ratio)");
  policy = CreatePolicy("h2o", {{"recent_ratio", 1.5}});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().message(),
            "policy 'h2o': parameter 'recent_ratio' = 1.5 is outside [0, 1]");
  policy = CreatePolicy("tova", {{"window", int64_t{3}}});
  ASSERT_FALSE(policy.ok());
  EXPECT_EQ(policy.status().message(), "policy 'tova' has no parameter 'window' (it has none)");
}

TEST(PolicyRegistryTest, EveryPolicyHasARuleAndASourceFile) {
  for (const PolicyInfo* info : RegisteredPolicies()) {
    SCOPED_TRACE(info->name);
    EXPECT_FALSE(info->rule.empty());
    EXPECT_EQ(info->rule.find('\n'), std::string::npos);
    EXPECT_TRUE(std::filesystem::exists(info->source_file)) << info->source_file;
    EXPECT_TRUE(CreatePolicy(info->name, {}).ok());
  }
}

std::filesystem::path TempFile(const std::string& name, const std::string& text) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(CountCodeLinesTest, SkipsBlankAndCommentLinesButNotCodeInsideLiterals) {
  const std::string text =
      "// header comment\n"
      "\n"
      "#include <x>\n"
      "   \t  \n"
      "/* block\n"
      "   still comment */\n"
      "int a = 1;  // trailing comment\n"
      "/* inline */ int b;\n"
      "const char* s = \"// not a comment\";\n"
      "const char* t = \"/* nor this\";\n"
      "char c = '\\'';  /* a comment\n"
      "*/\n"
      "int d;";  // No final newline.
  const std::filesystem::path path = TempFile("vtoken_count_lines_test.cc", text);
  StatusOr<int64_t> lines = CountCodeLines(path.string());
  ASSERT_TRUE(lines.ok()) << lines.status().ToString();
  EXPECT_EQ(*lines, 7);
  std::filesystem::remove(path);

  StatusOr<int64_t> missing = CountCodeLines("/nonexistent/vtoken/policy.cc");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "cannot read policy source '/nonexistent/vtoken/policy.cc'");
}

// The SDK's promise: a policy is one file under 50 lines of code.
TEST(PolicyLinesTest, EveryFileInPoliciesHasAtMost50CodeLines) {
  std::filesystem::path dir;
  if (const char* source = std::getenv("VTOKEN_SOURCE_DIR")) {
    dir = std::filesystem::path(source) / "policies";
  } else {
    dir = std::filesystem::path((*FindPolicy("h2o"))->source_file).parent_path();
  }
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cc") continue;
    ++files;
    StatusOr<int64_t> lines = CountCodeLines(entry.path().string());
    ASSERT_TRUE(lines.ok()) << lines.status().ToString();
    EXPECT_LE(*lines, 50) << entry.path();
  }
  EXPECT_GE(files, 8) << dir;
  for (const char* name : {"h2o", "scissorhands", "random", "streaming_llm", "tova", "snapkv",
                           "knorm", "decayed_attention"}) {
    StatusOr<const PolicyInfo*> info = FindPolicy(name);
    ASSERT_TRUE(info.ok()) << name;
    EXPECT_TRUE(
        std::filesystem::equivalent(std::filesystem::path((*info)->source_file).parent_path(), dir))
        << name;
  }
}

}  // namespace
}  // namespace vtoken
