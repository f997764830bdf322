// splitmix64's finaliser: the counter-based hash behind every random draw of the sim backend
// (signals, sampled tokens), so draws depend only on their inputs, never on call order.
#pragma once

#include <cstdint>

namespace vtoken::sim {

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace vtoken::sim
