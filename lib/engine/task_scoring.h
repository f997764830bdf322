// Task scoring: how a task's output is scored against its expected strings, as RULER scores
// (case-insensitive substring matches).
//
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vtoken::engine {

// How a task is scored from the expected strings (case-insensitive substring matches).
enum class TaskScoring {
  kAll,   // the share of the expected strings the output contains (RULER's string_match_all)
  kPart,  // 1 if the output contains any of them (RULER's string_match_part)
};

// The score in [0, 1] of `output` against `expected` under `scoring`; 0 when `expected` is empty.
double ScoreTaskOutput(TaskScoring scoring, const std::vector<std::string>& expected,
                       std::string_view output);

// Partial credit in [0, 1]: for each expected string, the share of its characters that the
// output has in place at the best alignment (case-insensitive; a passkey 71432 answered 71482
// scores 0.8, a digit dropped shifts the rest and scores less); the mean over the expected
// strings under kAll, the best under kPart. 1 wherever ScoreTaskOutput finds the string; 0 when
// `expected` is empty.
double PartialTaskScore(TaskScoring scoring, const std::vector<std::string>& expected,
                        std::string_view output);

}  // namespace vtoken::engine
