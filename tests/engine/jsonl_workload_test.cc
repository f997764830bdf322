#include "lib/engine/jsonl_workload.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

TEST_F(WorkloadTest, JsonlPlainAndShareGptFormats) {
  const model::Tokenizer tok = ByteTokenizer();
  const std::string path = Write(
      "w.jsonl",
      "{\"prompt\": \"Hello there\", \"max_tokens\": 7, \"reference\": \"General Kenobi\"}\n"
      "\n"
      "{\"prompt\": \"No limit given\"}\n"
      "{\"conversations\": [{\"from\": \"system\", \"value\": \"be nice\"}, "
      "{\"from\": \"human\", \"value\": \"Why?\"}, {\"from\": \"gpt\", \"value\": \"Because.\"}, "
      "{\"from\": \"human\", \"value\": \"ok\"}]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"Last one\"}]}\n"
      "{\"prompt\": \"never read: num_requests is 4\"}\n");
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = path;
  o.num_requests = 4;
  o.jsonl_default_max_tokens = 33;
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].prompt, "Hello there");
  EXPECT_EQ(r[0].prompt_tokens, tok.Encode("Hello there"));
  EXPECT_EQ(r[0].max_tokens, 7);
  EXPECT_EQ(r[0].reference, "General Kenobi");
  EXPECT_EQ(r[1].prompt, "No limit given");
  EXPECT_EQ(r[1].max_tokens, 33);
  EXPECT_EQ(r[1].reference, std::nullopt);
  EXPECT_EQ(r[2].prompt, "Why?");
  EXPECT_EQ(r[2].reference, "Because.");
  EXPECT_EQ(r[2].max_tokens, 8);  // "Because." is 8 byte tokens
  EXPECT_EQ(r[3].prompt, "Last one");
  EXPECT_EQ(r[3].reference, std::nullopt);
  EXPECT_EQ(r[3].max_tokens, 33);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].id, static_cast<int64_t>(i));
    EXPECT_EQ(r[i].prefix_group, -1);
  }
  o.num_requests = 0;  // the whole file
  EXPECT_EQ(MustGenerate(o, &tok, 0).size(), 5u);
}

TEST_F(WorkloadTest, JsonlClampCutsThePrompt) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write("w.jsonl", "{\"prompt\": \"0123456789\", \"max_tokens\": 10}\n");
  o.max_total_tokens = 10;
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].prompt, "01234");  // floor(10 * 10 / 20) = 5 tokens
  EXPECT_EQ(r[0].prompt_tokens.size(), 5u);
  EXPECT_EQ(r[0].max_tokens, 5);
}

constexpr const char* kNeedsPrompt =
    "needs a string \"prompt\" (or ShareGPT \"conversations\", or LongBench \"context\" and "
    "\"input\")";

// ShareGPT as released (ShareGPT_V3_unfiltered_cleaned_split.json): one JSON array of objects.
TEST_F(WorkloadTest, JsonlReadsAShareGptJsonArray) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.num_requests = 0;
  o.jsonl_path = Write(
      "sharegpt.json",
      "  [\n {\"id\": \"a1\", \"conversations\": [{\"from\": \"human\", \"value\": \"Hi?\"}, "
      "{\"from\": \"gpt\", \"value\": \"Hello.\"}]},\n"
      " {\"id\": \"b2\", \"conversations\": [{\"from\": \"user\", \"value\": \"Two\"}]}\n]\n");
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Hi?");
  EXPECT_EQ(r[0].reference, "Hello.");
  EXPECT_EQ(r[0].max_tokens, static_cast<int64_t>(tok.Encode("Hello.").size()));
  EXPECT_EQ(r[1].prompt, "Two");
  EXPECT_EQ(r[1].reference, std::nullopt);
  EXPECT_EQ(r[1].id, 1);
  o.jsonl_path = Write("bad.json", "[{\"id\": 1}, 3]");
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().message(),
            o.jsonl_path + ": element 0: " + kNeedsPrompt);
  o.jsonl_path = Write("broken.json", "[{\"conversations\": []");
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().message(),
            o.jsonl_path + ": not a valid JSON array");
}

// LongBench's released JSONL lines: the prompt template filled with context and input, the
// first answer as the reference.
TEST_F(WorkloadTest, JsonlReadsLongBenchLines) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write(
      "longbench.jsonl",
      "{\"input\": \"Who?\", \"context\": \"Ann met Bob.\", \"answers\": [\"Ann\", \"Bob\"], "
      "\"length\": 3, \"dataset\": \"narrativeqa\", \"language\": \"en\", \"all_classes\": null, "
      "\"_id\": \"x\"}\n"
      "{\"input\": \"\", \"context\": \"Only context.\", \"answers\": []}\n");
  auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Ann met Bob.\n\nQuestion: Who?\nAnswer:");
  EXPECT_EQ(r[0].reference, "Ann");
  EXPECT_EQ(r[1].prompt, "Only context.\n\nQuestion: \nAnswer:");
  EXPECT_EQ(r[1].reference, std::nullopt);
  o.prompt_template = "Story: {context}\nQ: {input}\nA:";
  r = MustGenerate(o, &tok, 0);
  EXPECT_EQ(r[0].prompt, "Story: Ann met Bob.\nQ: Who?\nA:");
}

TEST_F(WorkloadTest, JsonlTruncateMiddleKeepsBothEnds) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = Write("w.jsonl",
                       "{\"prompt\": \"0123456789\", \"max_tokens\": 10}\n"
                       "{\"prompt\": \"ab\", \"max_tokens\": 2}\n");
  o.max_total_tokens = 10;
  o.truncate = "middle";
  const auto r = MustGenerate(o, &tok, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "01789");  // 5 tokens: the first 2 and the last 3
  EXPECT_EQ(r[0].truncated_from, 10);
  EXPECT_EQ(r[1].prompt, "ab");
  EXPECT_EQ(r[1].truncated_from, 0);
  o.truncate = "start";
  EXPECT_EQ(ValidateWorkloadOptions(o).message(),
            "workload option truncate = start: expected end or middle");
}

TEST_F(WorkloadTest, JsonlMalformedLinesNameFileAndLine) {
  const model::Tokenizer tok = ByteTokenizer();
  const std::string good = "{\"prompt\": \"fine\"}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"unterminated}", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"text\": \"x\"}", kNeedsPrompt},
      {"{\"prompt\": 5}", kNeedsPrompt},
      {"{\"context\": \"c\"}", "a LongBench line needs string \"context\" and \"input\""},
      {"{\"context\": \"c\", \"input\": \"q\", \"answers\": \"a\"}",
       "\"answers\" must be an array of strings"},
      {"{\"prompt\": \"x\", \"max_tokens\": \"ten\"}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 0}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 9223372036854775807}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"max_tokens\": 18446744073709551615}",
       "\"max_tokens\" must be an integer in [1, 2147483647]"},
      {"{\"prompt\": \"x\", \"reference\": 3}", "\"reference\" must be a string"},
      {"{\"prompt\": \"\"}", "the prompt encodes to no tokens"},
      {"{\"conversations\": {}}", "\"conversations\" is not an array"},
      {"{\"conversations\": [{\"from\": \"human\"}]}",
       "each conversation turn needs string \"from\" and \"value\""},
      {"{\"conversations\": [{\"from\": \"gpt\", \"value\": \"hi\"}]}",
       "conversation has no human turn"},
  };
  for (const auto& [line, why] : cases) {
    WorkloadOptions o;
    o.kind = "jsonl";
    o.jsonl_path = Write("bad.jsonl", good + "\n" + line + "\n" + good);
    auto r = GenerateWorkload(o, &tok, 0);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << line;
    EXPECT_EQ(r.status().message(), o.jsonl_path + ":3: " + why) << line;
  }
}

TEST_F(WorkloadTest, JsonlFileErrors) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o;
  o.kind = "jsonl";
  o.jsonl_path = (dir_ / "missing.jsonl").string();
  EXPECT_EQ(GenerateWorkload(o, &tok, 0).status().code(), StatusCode::kNotFound);
  o.jsonl_path = Write("empty.jsonl", "\n\n");
  auto r = GenerateWorkload(o, &tok, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(), "workload " + o.jsonl_path + " holds no requests");
  r = GenerateWorkload(o, nullptr, 100);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("needs a tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace vtoken::engine
