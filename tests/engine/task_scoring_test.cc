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

}  // namespace
}  // namespace vtoken::engine
