#include "lib/engine/task_filler.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

namespace vtoken::engine {
namespace {

// Filler of the passkey task (as in the Landmark Attention and RULER passkey tests): sentences
// that carry no information, repeated.
constexpr const char* kRepeatSentences[] = {" The grass is green.", " The sky is blue.",
                                            " The sun is yellow.", " Here we go.",
                                            " There and back again."};

}  // namespace

std::string RepeatFiller::Unit(int64_t i) const {
  return kRepeatSentences[i % static_cast<int64_t>(std::size(kRepeatSentences))];
}

StatusOr<std::unique_ptr<CorpusFiller>> CorpusFiller::Read(const std::string& path, Rng& rng) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("workload.corpus " + path + ": cannot read the file");
  std::vector<std::vector<std::string>> lines;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> kept;
    std::string w;
    while (words >> w) {
      if (kept.empty() && std::all_of(w.begin(), w.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c)) || c == ':';
          })) {
        continue;
      }
      kept.push_back(" " + w);
    }
    if (kept.size() >= 3) lines.push_back(std::move(kept));
  }
  if (lines.empty()) {
    return DataLossError("workload.corpus " + path + ": no line of 3 or more words");
  }
  auto filler = std::make_unique<CorpusFiller>();
  const int64_t start = rng.UniformInt(0, static_cast<int64_t>(lines.size()) - 1);
  for (int64_t k = 0; k < static_cast<int64_t>(lines.size()); ++k) {
    const auto& l = lines[(start + k) % lines.size()];
    filler->words_.insert(filler->words_.end(), l.begin(), l.end());
  }
  return filler;
}

std::string CorpusFiller::Unit(int64_t i) const {
  return words_[static_cast<size_t>(i) % words_.size()];
}

}  // namespace vtoken::engine
