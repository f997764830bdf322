// ROUGE-L between a generated text and a reference, with the definition of Google's rouge-score
// package (rouge_scorer.RougeScorer(["rougeL"]), no stemmer), so numbers are comparable with
// published ones.
//
// Tokenization: lowercase, every character outside [a-z0-9] becomes a separator, split. Non-ASCII
// text is handled as Python's str.lower() would: the only non-ASCII characters that lowercase
// into [a-z0-9] are U+212A KELVIN SIGN ("k") and U+0130 LATIN CAPITAL I WITH DOT ABOVE ("i" then
// a combining dot, i.e. a separator); every other non-ASCII character is a separator.
//
// Pure functions; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vtoken::engine {

struct RougeLScore {
  double precision = 0.0;  // lcs / number of candidate tokens
  double recall = 0.0;     // lcs / number of reference tokens
  double f1 = 0.0;         // 2PR / (P + R); 0 when P + R == 0
};

// Returns rouge-score's tokens of `text` (see above).
std::vector<std::string> RougeTokenize(std::string_view text);

// Returns the length of the longest common subsequence of two token lists. O(n*m) time,
// O(min(n, m)) memory.
int64_t LongestCommonSubsequence(const std::vector<std::string>& a,
                                 const std::vector<std::string>& b);

// Returns ROUGE-L of `candidate` (the generated text) against `reference`. All three figures are
// 0 when either text has no tokens or they share none.
RougeLScore RougeL(std::string_view candidate, std::string_view reference);

// Returns RougeL(candidate, reference).f1.
double RougeLF1(std::string_view candidate, std::string_view reference);

}  // namespace vtoken::engine
