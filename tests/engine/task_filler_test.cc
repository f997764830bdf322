#include "lib/engine/task_filler.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/engine/tasks.h"
#include "tests/engine/task_checks.h"
#include "tests/engine/workload_fixture.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;
using testing::CheckInstance;

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

}  // namespace
}  // namespace vtoken::engine
