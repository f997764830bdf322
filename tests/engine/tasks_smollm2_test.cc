// The task generator in SmolLM2-135M-Instruct's own tokens, at the lengths the quality sweep
// uses: lengths within 1% below the target, needles within 1% of their depth.
#include <gtest/gtest.h>

#include "lib/engine/tasks.h"
#include "lib/model/io/model_files.h"
#include "tests/engine/task_checks.h"
#include "tests/model/smollm2_path.h"

namespace vtoken::engine {
namespace {

TEST(TasksSmolLm2Test, EveryTaskAtEveryLengthInTheModelsTokens) {
  const StatusOr<std::string> path = model::testing::SmolLm2Path();
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  const StatusOr<model::Tokenizer> tok = model::LoadModelTokenizer(*path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  for (const std::string& task : TaskNames()) {
    for (int64_t length : {1024, 2048, 4096, 8000}) {
      for (double depth : {0.0, 0.5, 1.0}) {
        testing::CheckInstance(*tok, {.task = task, .context_tokens = length}, 2, length, depth);
      }
    }
  }
}

}  // namespace
}  // namespace vtoken::engine
