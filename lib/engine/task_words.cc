#include "lib/engine/task_words.h"

#include <iterator>

namespace vtoken::engine {
namespace {

constexpr const char* kAdjectives[] = {
    "amber",  "ancient", "bitter",  "bold",   "brave",  "bright",  "broken", "calm",
    "clever", "cold",    "curious", "dark",   "deep",   "distant", "dry",    "eager",
    "early",  "empty",   "fancy",   "fast",   "fierce", "gentle",  "giant",  "golden",
    "green",  "hidden",  "hollow",  "humble", "icy",    "jolly",   "kind",   "lazy",
    "little", "lonely",  "loud",    "lucky",  "mighty", "misty",   "narrow", "noble",
    "odd",    "old",     "pale",    "plain",  "proud",  "quick",   "quiet",  "rapid",
    "rough",  "round",   "rusty",   "sharp",  "shiny",  "silent",  "silver", "slow",
    "small",  "smooth",  "soft",    "steep",  "sweet",  "tall",    "tiny",   "wild"};
constexpr const char* kNouns[] = {
    "anchor", "apple",    "arrow",   "badger",   "banner",  "barrel",  "basket", "beacon",
    "bridge", "bucket",   "button",  "candle",   "canyon",  "castle",  "cellar", "chimney",
    "cloud",  "comet",    "compass", "cottage",  "crystal", "desert",  "dragon", "engine",
    "falcon", "feather",  "forest",  "fountain", "garden",  "glacier", "hammer", "harbor",
    "helmet", "island",   "jacket",  "kettle",   "ladder",  "lantern", "meadow", "mirror",
    "monkey", "mountain", "needle",  "orchard",  "otter",   "paddle",  "parrot", "pebble",
    "pepper", "pillow",   "planet",  "pocket",   "rabbit",  "river",   "saddle", "shadow",
    "signal", "spider",   "tunnel",  "turtle",   "valley",  "violin",  "wagon",  "window"};

}  // namespace

std::string RandomNumber(Rng& rng, int digits) {
  int64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(rng.UniformInt(lo, lo * 10 - 1));
}

std::string KeyDrawer::Next() {
  constexpr int64_t kA = std::size(kAdjectives), kN = std::size(kNouns);
  while (true) {
    const std::string key = std::string(kAdjectives[rng_.UniformInt(0, kA - 1)]) + "-" +
                            kNouns[rng_.UniformInt(0, kN - 1)];
    if (used_.insert(key).second) return key;
  }
}

std::vector<std::string> PseudoWords(Rng& rng, int64_t n) {
  static constexpr char kC[] = "bdfgklmnprstvz";
  static constexpr char kV[] = "aeiou";
  std::set<std::string> seen;
  std::vector<std::string> words;
  while (static_cast<int64_t>(words.size()) < n) {
    std::string w;
    const int64_t syllables = rng.UniformInt(2, 3);
    for (int64_t s = 0; s < syllables; ++s) {
      w += kC[rng.UniformInt(0, std::size(kC) - 2)];
      w += kV[rng.UniformInt(0, std::size(kV) - 2)];
    }
    if (seen.insert(w).second) words.push_back(std::move(w));
  }
  return words;
}

}  // namespace vtoken::engine
