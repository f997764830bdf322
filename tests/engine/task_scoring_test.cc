#include "lib/engine/task_scoring.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vtoken::engine {
namespace {

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

// Partial credit: the share of the answer's characters in place at the best alignment.
TEST(PartialTaskScoreTest, CountsTheAnswersCharactersInPlace) {
  const std::vector<std::string> one = {"71432"};
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "The pass key is 71432."), 1.0);
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "The pass key is 71482."), 0.8);
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "The pass key is 71423."), 0.6);
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "7143"), 0.8);     // one short
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "2071432"), 1.0);  // inside
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "432"), 0.6);      // its end
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, ""), 0.0);
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, "no digits here"), 0.0);
  const std::vector<std::string> two = {"QWERT", "ASDFG"};
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, two, "qwert"), 0.5);   // mean
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kPart, two, "qwert"), 1.0);  // best
  EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, {}, "anything"), 0.0);
  // Wherever ScoreTaskOutput finds every string, the partial score is 1 too.
  for (const char* out : {"x 71432 y", "71432", "The pass key is 71432."}) {
    EXPECT_EQ(ScoreTaskOutput(TaskScoring::kAll, one, out), 1.0);
    EXPECT_DOUBLE_EQ(PartialTaskScore(TaskScoring::kAll, one, out), 1.0);
  }
}

}  // namespace
}  // namespace vtoken::engine
