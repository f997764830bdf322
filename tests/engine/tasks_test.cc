#include "lib/engine/tasks.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lib/engine/workload.h"
#include "lib/model/io/pretokenizer.h"
#include "tests/engine/task_checks.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;
using testing::CheckInstance;

// One token per byte: lengths and depths are byte counts.
model::Tokenizer ByteTokenizer() {
  model::TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.emplace_back(model::ByteToUnicode(b), b);
  return std::move(model::Tokenizer::Create(std::move(spec))).value();
}

model::Tokenizer VtTinyTokenizer() {
  const char* root = std::getenv("VTOKEN_SOURCE_DIR");
  const std::string dir = root != nullptr ? root : ".";
  auto t = model::Tokenizer::Load(dir + "/models/vt-tiny/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TEST(TasksTest, EveryTaskHasItsLengthDepthAndAnswerWithBytes) {
  const model::Tokenizer tok = ByteTokenizer();
  for (const std::string& task : TaskNames()) {
    for (double depth : {0.0, 0.3, 0.5, 1.0}) {
      CheckInstance(tok, {.task = task, .context_tokens = 4096}, /*seed=*/7, /*index=*/3, depth);
    }
  }
}

TEST(TasksTest, EveryTaskHasItsLengthDepthAndAnswerWithTheVtTinyTokenizer) {
  const model::Tokenizer tok = VtTinyTokenizer();
  for (const std::string& task : TaskNames()) {
    for (int64_t length : {400, 1024, 3000}) {
      for (double depth : {0.0, 0.25, 0.6, 1.0}) {
        CheckInstance(tok, {.task = task, .context_tokens = length}, /*seed=*/11, /*index=*/0,
                      depth);
      }
    }
  }
}

TEST(TasksTest, InstancesAreDeterministicAndDifferByIndexAndSeed) {
  const model::Tokenizer tok = ByteTokenizer();
  for (const std::string& task : TaskNames()) {
    SCOPED_TRACE(task);
    const TaskOptions o{.task = task, .context_tokens = 2048};
    const TaskInstance a = MakeTaskInstance(o, tok, 5, 0, 0.5).value();
    const TaskInstance b = MakeTaskInstance(o, tok, 5, 0, 0.5).value();
    const TaskInstance c = MakeTaskInstance(o, tok, 5, 1, 0.5).value();
    const TaskInstance d = MakeTaskInstance(o, tok, 6, 0, 0.5).value();
    EXPECT_EQ(a.context, b.context);
    EXPECT_EQ(a.question, b.question);
    EXPECT_EQ(a.expected, b.expected);
    EXPECT_NE(a.expected, c.expected);
    EXPECT_NE(a.expected, d.expected);
  }
}

TEST(TasksTest, CorpusFillerDropsVerseNumbersAndHeadings) {
  const fs::path corpus = fs::path(::testing::TempDir()) / "tasks_corpus.txt";
  {
    std::ofstream out(corpus);
    for (int chapter = 1; chapter <= 30; ++chapter) {
      out << "Genesis " << chapter << "\n\n";
      for (int verse = 1; verse <= 20; ++verse) {
        out << verse << " And the waters prevailed upon the earth, verse of chapter.\n";
      }
    }
  }
  const model::Tokenizer tok = ByteTokenizer();
  const TaskOptions o{.task = "niah_multikey",
                      .context_tokens = 4096,
                      .filler = "corpus",
                      .corpus_path = corpus.string()};
  CheckInstance(tok, o, 3, 0, 0.4);
  const TaskInstance t = MakeTaskInstance(o, tok, 3, 0, 0.4).value();
  EXPECT_NE(t.context.find("waters prevailed"), std::string::npos);
  EXPECT_EQ(t.context.find("Genesis"), std::string::npos);
  // The only digits are the needles' numbers (4 needles of 7 digits).
  int digits = 0;
  for (char c : t.context) digits += std::isdigit(static_cast<unsigned char>(c)) ? 1 : 0;
  EXPECT_EQ(digits, 4 * 7);
  fs::remove(corpus);
}

TEST(TasksTest, ScoresRightPartialAndWrongOutputs) {
  const std::vector<std::string> one = {"71432"};
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, one, "The pass key is 71432."), 1.0);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, one, "The pass key is 71423."), 0.0);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, one, ""), 0.0);
  const std::vector<std::string> four = {"1111111", "2222222", "3333333", "4444444"};
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, four, "2222222 and 4444444"), 0.5);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, four, "4444444, 3333333, 2222222, 1111111"), 1.0);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kPart, four, "only 3333333"), 1.0);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kPart, four, "none of them"), 0.0);
  // Case-insensitive, as RULER's scorer.
  const std::vector<std::string> vars = {"QWERT", "ASDFG"};
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, vars, "qwert, AsDfG"), 1.0);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, vars, "QWERT"), 0.5);
  EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, {}, "anything"), 0.0);
}

TEST(TasksTest, BadOptionsAreOneLineErrorsNamingTheKey) {
  const model::Tokenizer tok = ByteTokenizer();
  struct Case {
    TaskOptions options;
    double depth;
    std::string expect;
  };
  const Case cases[] = {
      {{.task = "needle"}, 0.5, "workload option task = \"needle\": unknown task (known: passkey,"},
      {{.filler = "lorem"}, 0.5, "workload option filler = \"lorem\""},
      {{.task = "niah_single", .filler = "corpus"}, 0.5, "needs workload.corpus"},
      {{.context_tokens = 100}, 0.5, "workload option context_tokens = 100: must be in [128,"},
      {{.task = "niah_multivalue", .context_tokens = 300}, 0.5, "too small for task"},
      {{}, 1.5, "workload option depths = 1.5"},
      {{.task = "niah_single", .filler = "corpus", .corpus_path = "/nonexistent/kjv.txt"},
       0.5,
       "/nonexistent/kjv.txt: cannot read"},
  };
  for (const Case& c : cases) {
    StatusOr<TaskInstance> t = MakeTaskInstance(c.options, tok, 1, 0, c.depth);
    ASSERT_FALSE(t.ok()) << c.expect;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  }
}

WorkloadOptions TaskWorkload() {
  WorkloadOptions o;
  o.kind = "task";
  o.task = "niah_single";
  o.context_tokens = 2048;
  o.num_requests = 6;
  o.depths = {0.0, 0.5, 1.0};
  return o;
}

TEST(TasksTest, TaskWorkloadCyclesDepthsAndCarriesTheAnswer) {
  const model::Tokenizer tok = ByteTokenizer();
  const std::vector<Request> requests = GenerateWorkload(TaskWorkload(), &tok, 256).value();
  ASSERT_EQ(requests.size(), 6u);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    ASSERT_TRUE(r.task.has_value());
    EXPECT_EQ(r.task->name, "niah_single");
    EXPECT_EQ(r.task->context_tokens, 2048);
    EXPECT_EQ(*r.task->depth, (std::vector<double>{0.0, 0.5, 1.0})[i % 3]);
    EXPECT_NEAR(*r.task->needle_depth, *r.task->depth, 0.01);
    EXPECT_EQ(r.max_tokens, 24);
    EXPECT_TRUE(r.question_tokens.empty());  // question_aware: the question ends the prompt
    EXPECT_NE(r.prompt.find(r.task->expected[0]), std::string::npos);
    EXPECT_FALSE(r.reference.has_value());
  }
}

TEST(TasksTest, QueryAgnosticMovesTheQuestionAndTheTemplateEndAfterTheContext) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o = TaskWorkload();
  o.chat = true;
  o.chat_prefix = "<user>";
  o.chat_suffix = "</user><assistant>";
  const std::vector<Request> aware = GenerateWorkload(o, &tok, 256).value();
  o.protocol = TaskProtocol::kQueryAgnostic;
  const std::vector<Request> agnostic = GenerateWorkload(o, &tok, 256).value();
  ASSERT_EQ(aware.size(), agnostic.size());
  for (size_t i = 0; i < aware.size(); ++i) {
    std::vector<int32_t> joined = agnostic[i].prompt_tokens;
    joined.insert(joined.end(), agnostic[i].question_tokens.begin(),
                  agnostic[i].question_tokens.end());
    EXPECT_EQ(joined, aware[i].prompt_tokens);  // the same ids in both protocols
    const std::string question(agnostic[i].question_tokens.begin(),
                               agnostic[i].question_tokens.end());
    EXPECT_EQ(question.rfind("What is the special magic number", 0), 0u) << question;
    EXPECT_EQ(question.substr(question.size() - 18), "</user><assistant>");
    EXPECT_EQ(std::string(agnostic[i].prompt_tokens.begin(), agnostic[i].prompt_tokens.begin() + 6),
              "<user>");
  }
}

TEST(TasksTest, TaskWorkloadErrors) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o = TaskWorkload();
  o.max_total_tokens = 2000;
  StatusOr<std::vector<Request>> r = GenerateWorkload(o, &tok, 256);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than max_total_tokens = 2000"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(GenerateWorkload(TaskWorkload(), nullptr, 256).ok());  // needs a tokenizer
  o = TaskWorkload();
  o.depths = {};
  EXPECT_NE(ValidateWorkloadOptions(o).message().find("workload option depths"), std::string::npos);
  o = TaskWorkload();
  o.prefix_sharing_degree = 2;
  EXPECT_NE(ValidateWorkloadOptions(o).message().find("must be 1 for kind task"),
            std::string::npos);
  WorkloadOptions other;
  other.protocol = TaskProtocol::kQueryAgnostic;
  EXPECT_NE(ValidateWorkloadOptions(other).message().find("is read only by kind task"),
            std::string::npos);
}

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
