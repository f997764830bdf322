#include "lib/engine/perplexity_workload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

TEST(PerplexityWorkloadTest, OnePromptTokenThenTheSegmentForced) {
  const fs::path corpus = fs::path(::testing::TempDir()) / "perplexity_corpus.txt";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 50; ++i)
      out << "Line " << i << " of a text that is scored token by token.\n";
  }
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "perplexity";
  o.context_tokens = 300;
  o.num_requests = 3;
  o.corpus_path = corpus.string();
  const std::vector<Request> a = GenerateWorkload(o, &tok, 256).value();
  const std::vector<Request> b = GenerateWorkload(o, &tok, 256).value();
  ASSERT_EQ(a.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_tokens.size(), 1u);
    EXPECT_EQ(a[i].forced_tokens.size(), 299u);
    EXPECT_EQ(a[i].max_tokens, 299);
    EXPECT_EQ(a[i].forced_tokens, b[i].forced_tokens);  // deterministic by seed
    // The segment is the corpus text: prompt and forced tokens spell a run of its bytes.
    std::string text(1, static_cast<char>(a[i].prompt_tokens[0]));
    for (int32_t t : a[i].forced_tokens) text += static_cast<char>(t);
    EXPECT_NE(text.find(" of a text that is scored token by token.\nLine "), std::string::npos);
  }
  EXPECT_NE(a[0].forced_tokens, a[1].forced_tokens);  // segments start at random lines
  WorkloadOptions bad = o;
  bad.context_tokens = 1;
  EXPECT_NE(ValidateWorkloadOptions(bad).message().find("context_tokens = 1: must be in [2,"),
            std::string::npos);
  bad = o;
  bad.chat = true;
  EXPECT_NE(ValidateWorkloadOptions(bad).message().find("does not apply to kind perplexity"),
            std::string::npos);
  bad = o;
  bad.corpus_path = "";
  StatusOr<std::vector<Request>> none = GenerateWorkload(bad, &tok, 256);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("required by kind perplexity"), std::string::npos);
  fs::remove(corpus);
}

}  // namespace
}  // namespace vtoken::engine
