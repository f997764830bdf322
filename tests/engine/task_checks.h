// Checks every task instance must pass with any tokenizer (tasks_test with a byte-level and the
// vt-tiny tokenizer, tasks_smollm2_test with SmolLM2's): the length and the needle's depth in
// that tokenizer's tokens, and the answer readable back from the text.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lib/engine/tasks.h"

namespace vtoken::engine::testing {

// How often each whitespace-separated word (trailing '.' and ',' dropped) occurs in `text`.
inline std::map<std::string, int> WordCounts(const std::string& text) {
  std::map<std::string, int> counts;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    while (!w.empty() && (w.back() == '.' || w.back() == ',')) w.pop_back();
    ++counts[w];
  }
  return counts;
}

// The answer of `t`, read back from its context as a reader would find it.
inline void ExpectAnswerInContext(const TaskInstance& t) {
  ASSERT_FALSE(t.expected.empty());
  if (t.task == "common_words" || t.task == "frequent_words") {
    // The list: after the instruction's paragraph.
    const std::map<std::string, int> counts =
        WordCounts(t.context.substr(t.context.find("\n\n") + 2));
    int least_expected = 1 << 30;
    for (const std::string& e : t.expected) {
      ASSERT_TRUE(counts.count(e)) << e;
      least_expected = std::min(least_expected, counts.at(e));
    }
    // Every expected word is strictly more frequent than every other listed word.
    for (const auto& [word, n] : counts) {
      if (std::find(t.expected.begin(), t.expected.end(), word) != t.expected.end()) continue;
      const bool is_word =
          std::all_of(word.begin(), word.end(), [](char c) { return c >= 'a' && c <= 'z'; });
      if (is_word) EXPECT_LT(n, least_expected) << word;
    }
    return;
  }
  for (const std::string& e : t.expected) {
    EXPECT_NE(t.context.find(e), std::string::npos) << e;
  }
  if (t.task == "passkey") {
    EXPECT_NE(t.context.find("The pass key is " + t.expected[0] + "."), std::string::npos);
  }
  if (t.task.rfind("niah_", 0) == 0) {
    const std::string key = t.question.substr(
        t.question.find(" for ") + 5, t.question.find(" mentioned") - t.question.find(" for ") - 5);
    for (const std::string& e : t.expected) {
      EXPECT_NE(t.context.find("special magic numbers for " + key + " is: " + e + "."),
                std::string::npos)
          << key << " " << e;
    }
  }
}

// Length at most MaxShortfall below the target (1% from 1,600 tokens on) and never above, depth
// within 1% (as much as that shortfall below 1,600), answer in the text, and the ids those of
// the texts.
inline void CheckInstance(const model::Tokenizer& tok, const TaskOptions& o, uint64_t seed,
                          int64_t index, double depth) {
  SCOPED_TRACE(o.task + " at " + std::to_string(o.context_tokens) + " tokens, depth " +
               std::to_string(depth) + ", seed " + std::to_string(seed) + ", index " +
               std::to_string(index));
  StatusOr<TaskInstance> made = MakeTaskInstance(o, tok, seed, index, depth);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const TaskInstance& t = *made;
  EXPECT_EQ(t.context_ids, tok.Encode(t.context));
  EXPECT_EQ(t.question_ids, tok.Encode(t.question));
  const int64_t n = static_cast<int64_t>(t.context_ids.size() + t.question_ids.size());
  EXPECT_LE(n, o.context_tokens);
  EXPECT_GE(n, o.context_tokens - MaxShortfall(o.context_tokens));
  if (o.context_tokens >= 1600) {
    EXPECT_GE(static_cast<double>(n), 0.99 * static_cast<double>(o.context_tokens));
  }
  EXPECT_GT(t.max_tokens, 0);
  if (TaskHasDepth(o.task)) {
    ASSERT_TRUE(t.depth.has_value());
    ASSERT_TRUE(t.needle_depth.has_value());
    EXPECT_EQ(*t.depth, depth);
    // 1% of the haystack, or the same 16 tokens the length may miss by in a short context.
    const double tolerance =
        static_cast<double>(MaxShortfall(o.context_tokens)) / static_cast<double>(o.context_tokens);
    EXPECT_NEAR(*t.needle_depth, depth, std::max(0.01, tolerance));
  } else {
    EXPECT_FALSE(t.depth.has_value());
  }
  ExpectAnswerInContext(t);
  // Its own answer scores 1; the context without its answer scores below 1.
  std::string answer;
  for (const std::string& e : t.expected) answer += e + ", ";
  EXPECT_EQ(ScoreTaskOutput(t.scoring, t.expected, answer), 1.0);
  EXPECT_LT(ScoreTaskOutput(t.scoring, t.expected, t.question), 1.0);
}

}  // namespace vtoken::engine::testing
