#include "lib/engine/task_scoring.h"

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

}  // namespace vtoken::engine
