#include "lib/engine/task_scoring.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace vtoken::engine {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

double ScoreTaskOutput(TaskScoring scoring, const std::vector<std::string>& expected,
                       std::string_view output) {
  if (expected.empty()) return 0.0;
  const std::string out = Lower(output);
  int64_t found = 0;
  for (const std::string& e : expected) {
    if (out.find(Lower(e)) != std::string::npos) ++found;
  }
  if (scoring == TaskScoring::kPart) return found > 0 ? 1.0 : 0.0;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

double PartialTaskScore(TaskScoring scoring, const std::vector<std::string>& expected,
                        std::string_view output) {
  if (expected.empty()) return 0.0;
  const std::string out = Lower(output);
  double sum = 0, best = 0;
  for (const std::string& raw : expected) {
    const std::string e = Lower(raw);
    // Alignments from e hanging off the output's start to hanging off its end.
    int64_t most = 0;
    const int64_t n = static_cast<int64_t>(out.size()), m = static_cast<int64_t>(e.size());
    for (int64_t shift = -m + 1; shift < n; ++shift) {
      int64_t same = 0;
      for (int64_t i = std::max<int64_t>(0, -shift); i < m && shift + i < n; ++i) {
        same += out[shift + i] == e[i];
      }
      most = std::max(most, same);
    }
    const double share = m == 0 ? 1.0 : static_cast<double>(most) / static_cast<double>(m);
    sum += share;
    best = std::max(best, share);
  }
  return scoring == TaskScoring::kPart ? best : sum / static_cast<double>(expected.size());
}

}  // namespace vtoken::engine
