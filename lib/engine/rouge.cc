#include "lib/engine/rouge.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace vtoken::engine {
namespace {

bool IsAsciiAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

char AsciiLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Maps both lists to dense integer ids so the O(n*m) inner loop compares ints, not strings.
void Intern(const std::vector<std::string>& a, const std::vector<std::string>& b,
            std::vector<int32_t>& ia, std::vector<int32_t>& ib) {
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(a.size() + b.size());
  auto id_of = [&ids](std::string_view s) {
    return ids.emplace(s, static_cast<int32_t>(ids.size())).first->second;
  };
  ia.reserve(a.size());
  ib.reserve(b.size());
  for (const std::string& s : a) ia.push_back(id_of(s));
  for (const std::string& s : b) ib.push_back(id_of(s));
}

}  // namespace

std::vector<std::string> RougeTokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  auto flush = [&] {
    if (!current.empty()) tokens.push_back(std::move(current));
    current.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      const char c = AsciiLower(static_cast<char>(byte));
      if (IsAsciiAlnum(c)) {
        current.push_back(c);
      } else {
        flush();
      }
      continue;
    }
    // Python lowercases U+212A to 'k' (part of the word) and U+0130 to "i\u0307" (an 'i' ending
    // the word, since the combining dot is not alphanumeric).
    if (text.substr(i, 3) == "\xE2\x84\xAA") {
      current.push_back('k');
      i += 2;
    } else if (text.substr(i, 2) == "\xC4\xB0") {
      current.push_back('i');
      flush();
      i += 1;
    } else {
      flush();
    }
  }
  flush();
  return tokens;
}

int64_t LongestCommonSubsequence(const std::vector<std::string>& a,
                                 const std::vector<std::string>& b) {
  std::vector<int32_t> ia, ib;
  Intern(a, b, ia, ib);
  // The shorter list indexes the rows so memory is O(min(n, m)).
  const std::vector<int32_t>& outer = ia.size() >= ib.size() ? ia : ib;
  const std::vector<int32_t>& inner = ia.size() >= ib.size() ? ib : ia;
  std::vector<int32_t> prev(inner.size() + 1, 0), row(inner.size() + 1, 0);
  for (int32_t x : outer) {
    for (size_t j = 1; j <= inner.size(); ++j) {
      row[j] = (x == inner[j - 1]) ? prev[j - 1] + 1 : std::max(prev[j], row[j - 1]);
    }
    std::swap(prev, row);
  }
  return prev[inner.size()];
}

RougeLScore RougeL(std::string_view candidate, std::string_view reference) {
  const std::vector<std::string> cand = RougeTokenize(candidate);
  const std::vector<std::string> ref = RougeTokenize(reference);
  RougeLScore score;
  if (cand.empty() || ref.empty()) return score;
  const auto lcs = static_cast<double>(LongestCommonSubsequence(cand, ref));
  score.precision = lcs / static_cast<double>(cand.size());
  score.recall = lcs / static_cast<double>(ref.size());
  const double sum = score.precision + score.recall;
  score.f1 = sum > 0.0 ? 2.0 * score.precision * score.recall / sum : 0.0;
  return score;
}

double RougeLF1(std::string_view candidate, std::string_view reference) {
  return RougeL(candidate, reference).f1;
}

}  // namespace vtoken::engine
