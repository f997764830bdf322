#include "lib/engine/task_workload.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/engine/tasks.h"
#include "lib/engine/workload.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

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

// workload.answer_tokens: every request's generation limit, instead of the task's own.
TEST(TasksTest, AnswerTokensReplacesTheTasksOwnLimit) {
  const model::Tokenizer tok = ByteTokenizer();
  WorkloadOptions o = TaskWorkload();
  o.answer_tokens = 96;
  const std::vector<Request> requests = GenerateWorkload(o, &tok, 256).value();
  const std::vector<Request> own = GenerateWorkload(TaskWorkload(), &tok, 256).value();
  ASSERT_EQ(requests.size(), own.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i].max_tokens, 96);
    EXPECT_EQ(own[i].max_tokens, 24);
    EXPECT_EQ(requests[i].prompt_tokens, own[i].prompt_tokens);  // the instance is the same
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

}  // namespace
}  // namespace vtoken::engine
