// Task words: what the tasks (tasks.h) draw their keys, values and word lists from, without a
// word list file: adjective-noun keys of English words, numbers of a given number of digits and
// pronounceable pseudo-words. Every draw comes from the Rng given, so an instance is a function of
// its seed.
//
// Not thread-safe: one Rng (and KeyDrawer) per thread.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/engine/rng.h"

namespace vtoken::engine {

// A random number with exactly `digits` digits (no leading zero). REQUIRES: 1 <= digits <= 18.
std::string RandomNumber(Rng& rng, int digits);

// A distinct adjective-noun key ("amber-anchor") per call. REQUIRES: fewer calls than the 4,096
// keys there are. `rng` must outlive the drawer.
class KeyDrawer {
 public:
  explicit KeyDrawer(Rng& rng) : rng_(rng) {}
  std::string Next();

 private:
  Rng& rng_;
  std::set<std::string> used_;
};

// `n` distinct pronounceable pseudo-words of 2 or 3 consonant-vowel syllables.
std::vector<std::string> PseudoWords(Rng& rng, int64_t n);

// Shuffles `v` in place (Fisher-Yates, from the back).
template <typename T>
void Shuffle(Rng& rng, std::vector<T>& v) {
  for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i) {
    std::swap(v[i], v[rng.UniformInt(0, i)]);
  }
}

}  // namespace vtoken::engine
