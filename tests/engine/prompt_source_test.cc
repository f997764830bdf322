#include "lib/engine/prompt_source.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

// Checks the prefix-group contract on any workload.
void ExpectPrefixGroups(const std::vector<Request>& r, int32_t degree, double fraction) {
  for (size_t first = 0; first < r.size(); first += degree) {
    const size_t last = std::min(first + degree, r.size());
    size_t shortest = SIZE_MAX;
    for (size_t i = first; i < last; ++i) shortest = std::min(shortest, r[i].prompt_tokens.size());
    const auto shared = static_cast<int64_t>(std::floor(fraction * static_cast<double>(shortest)));
    for (size_t i = first; i < last; ++i) {
      EXPECT_EQ(r[i].prefix_group, static_cast<int32_t>(first / degree)) << "request " << i;
      EXPECT_EQ(r[i].shared_prefix_tokens, shared) << "request " << i;
      ASSERT_GT(r[i].prompt_tokens.size(), static_cast<size_t>(shared)) << "request " << i;
      for (size_t j = first; j < i; ++j) {
        EXPECT_TRUE(std::equal(r[i].prompt_tokens.begin(), r[i].prompt_tokens.begin() + shared,
                               r[j].prompt_tokens.begin()))
            << "requests " << j << " and " << i << " differ inside the prefix";
        EXPECT_NE(r[i].prompt_tokens[shared], r[j].prompt_tokens[shared])
            << "requests " << j << " and " << i << " agree right after the prefix";
      }
    }
  }
}

TEST_F(WorkloadTest, PrefixGroupsShareExactlyTheirPrefix) {
  for (int32_t degree : {2, 4, 8}) {
    SCOPED_TRACE("degree " + std::to_string(degree));
    WorkloadOptions o;
    o.num_requests = 30;  // the last group is partial
    o.prefix_sharing_degree = degree;
    o.shared_prefix_fraction = 0.75;
    // An 8-token vocabulary makes accidental agreement after the prefix likely, so the
    // "differ" guarantee is really exercised.
    const auto r = MustGenerate(o, nullptr, 8);
    ExpectPrefixGroups(r, degree, 0.75);
  }
  WorkloadOptions none;
  for (const Request& q : MustGenerate(none, nullptr, 8)) {
    EXPECT_EQ(q.prefix_group, -1);
    EXPECT_EQ(q.shared_prefix_tokens, 0);
  }
}

TEST_F(WorkloadTest, PrefixGroupsFromCorpus) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 12;
  o.prefix_sharing_degree = 4;
  o.shared_prefix_fraction = 0.5;
  o.corpus_path = Corpus();
  const auto r = MustGenerate(o, &tok, 0);
  ExpectPrefixGroups(r, 4, 0.5);
  for (const Request& q : r) EXPECT_EQ(q.prompt, tok.Decode(q.prompt_tokens));
}

TEST_F(WorkloadTest, CorpusPromptsStartAtALineAndHaveTheSampledLength) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.num_requests = 40;
  o.corpus_path = Corpus();
  const auto with_corpus = MustGenerate(o, &tok, 0);
  const auto ids_only = MustGenerate(o, nullptr, 256);  // same seed, same lengths
  ASSERT_EQ(with_corpus.size(), 40u);
  const std::string doubled = corpus_text_ + corpus_text_ + corpus_text_;
  for (size_t i = 0; i < with_corpus.size(); ++i) {
    const Request& q = with_corpus[i];
    EXPECT_EQ(q.prompt_tokens.size(), ids_only[i].prompt_tokens.size());
    EXPECT_EQ(q.max_tokens, ids_only[i].max_tokens);
    EXPECT_EQ(q.prompt.size(), q.prompt_tokens.size());  // one byte per token
    const size_t at = doubled.find(q.prompt);
    ASSERT_NE(at, std::string::npos) << q.prompt;
    EXPECT_TRUE(at == 0 || doubled[at - 1] == '\n') << q.prompt;
    EXPECT_NE(q.prompt.front(), '\n');  // blank lines are never a start
  }
}

TEST_F(WorkloadTest, CorpusErrors) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  auto r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("corpus_path"), std::string::npos);
  o.corpus_path = (dir_ / "missing.txt").string();
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "corpus " + o.corpus_path + ": cannot be read");
  o.corpus_path = Write("blank.txt", "\n  \n\n");
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "corpus " + o.corpus_path + " has no text");
  o.corpus_path = Write("binary.bin", std::string("ELF\x7f\n\x01\x00\x00 data\n", 14));
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "corpus " + o.corpus_path + " is not UTF-8 text (byte 0x00 at offset 6)");
  o.corpus_path = Write("latin1.txt", "caf\xe9 au lait\n");
  r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().message(),
            "corpus " + o.corpus_path + " is not UTF-8 text (byte 0xe9 at offset 3)");
  o.corpus_path = Write("utf8.txt", "caf\xc3\xa9 au lait, \xe2\x80\x9cquoted\xe2\x80\x9d\n");
  EXPECT_TRUE(GenerateWorkload(o, &tok, 0).ok());
}

}  // namespace
}  // namespace vtoken::engine
