#include "lib/engine/tasks.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/engine/task_checks.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

using testing::CheckInstance;

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

}  // namespace
}  // namespace vtoken::engine
