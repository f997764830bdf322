#include "lib/engine/workload.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

void ExpectSameRequests(const std::vector<Request>& a, const std::vector<Request>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id);
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    EXPECT_EQ(a[i].reference, b[i].reference);
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prefix_group, b[i].prefix_group);
    EXPECT_EQ(a[i].shared_prefix_tokens, b[i].shared_prefix_tokens);
  }
}

TEST_F(WorkloadTest, DeterministicPerSeed) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 16;
  o.arrival = "gamma";
  o.rate = 3;
  o.gamma_cv = 2;
  o.prefix_sharing_degree = 2;
  o.corpus_path = Corpus();
  for (const model::Tokenizer* t : {static_cast<const model::Tokenizer*>(nullptr), &tok}) {
    const auto a = MustGenerate(o, t, 1000);
    ExpectSameRequests(a, MustGenerate(o, t, 1000));
    WorkloadOptions other = o;
    other.seed = 2;
    const auto c = MustGenerate(other, t, 1000);
    ASSERT_EQ(c.size(), a.size());
    int same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i].prompt_tokens == c[i].prompt_tokens;
    EXPECT_LT(same, 2);
  }
}

TEST_F(WorkloadTest, FixedSeedGivesTheSameNumbersEverywhere) {
  // Pins the PRNG and transforms: these values must not change across platforms or releases.
  WorkloadOptions o = TinyRequests(3, 7);
  o.kind = "longbench_like";
  o.input_min = 10;
  o.input_max = 20;
  o.output_min = 1;
  o.output_max = 5;
  const auto r = MustGenerate(o, nullptr, 50);
  ASSERT_EQ(r.size(), 3u);
  std::vector<int64_t> lengths;
  for (const Request& q : r) {
    lengths.push_back(static_cast<int64_t>(q.prompt_tokens.size()));
    lengths.push_back(q.max_tokens);
  }
  EXPECT_EQ(lengths, (std::vector<int64_t>{12, 4, 14, 5, 11, 4}));
}

TEST_F(WorkloadTest, ChatWrapsEveryPromptBetweenTheTemplatesTokens) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 8;
  o.prefix_sharing_degree = 2;
  o.corpus_path = Corpus();
  const auto plain = MustGenerate(o, &tok, 0);
  o.chat = true;
  o.chat_prefix = "<user>\n";
  o.chat_suffix = "</user><bot>";
  const auto chat = MustGenerate(o, &tok, 0);
  ASSERT_EQ(chat.size(), plain.size());
  for (size_t i = 0; i < chat.size(); ++i) {
    // One token per byte: the content's tokens sit between 7 and 12 template tokens, unchanged.
    std::vector<int32_t> want = tok.Encode("<user>\n");
    want.insert(want.end(), plain[i].prompt_tokens.begin(), plain[i].prompt_tokens.end());
    const std::vector<int32_t> after = tok.Encode("</user><bot>");
    want.insert(want.end(), after.begin(), after.end());
    EXPECT_EQ(chat[i].prompt_tokens, want) << i;
    EXPECT_EQ(chat[i].prompt, "<user>\n" + plain[i].prompt + "</user><bot>");
    EXPECT_EQ(chat[i].max_tokens, plain[i].max_tokens);
    // The template's first tokens are shared too.
    EXPECT_EQ(chat[i].shared_prefix_tokens, plain[i].shared_prefix_tokens + 7) << i;
  }
  o.chat_prefix.clear();
  o.chat_suffix.clear();
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().code(), StatusCode::kInvalidArgument);
  o.chat_prefix = "x";
  EXPECT_EQ(GenerateWorkload(o, nullptr, 300).status().code(), StatusCode::kInvalidArgument);
}

TEST(WorkloadOptionsTest, VocabTooSmallForDistinctContinuations) {
  WorkloadOptions o;
  o.prefix_sharing_degree = 4;
  auto r = GenerateWorkload(o, nullptr, 3);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("vocab_size = 3: ", 0), 0u) << r.status().message();
  EXPECT_EQ(GenerateWorkload(WorkloadOptions{}, nullptr, 0).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken::engine
