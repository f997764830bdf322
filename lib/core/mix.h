// splitmix64 (Steele, Lea & Flood; the constants of Vigna's reference code): the one mixing
// function behind every seeded draw of the project. The policies' random sources, the check
// harness's contents, the engine's xoshiro seeding and the simulator's counter-based draws all
// use it, so a seed means the same draws in each of them, on every platform.
#pragma once

#include <cstdint>

namespace vtoken {

// splitmix64's increment: the state of a stream advances by it before every output.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function, a bijection of 64-bit words whose every output bit depends on
// every input bit: a counter-based hash when applied to (counter + kSplitMix64Gamma).
inline constexpr uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The next word of the splitmix64 stream whose state is `state`, which it advances.
inline constexpr uint64_t SplitMix64(uint64_t& state) {
  return SplitMix64Finalize(state += kSplitMix64Gamma);
}

// Distinguishes the random streams of a sequence's KV groups (group 0: none, as with one group):
// the policy evictor's per-group PolicyRng seeds and the synthetic signals' per-group draws.
inline constexpr uint64_t KvGroupSalt(int32_t group) {
  return group == 0 ? 0 : SplitMix64Finalize(static_cast<uint64_t>(group) * 0x632be59bd9b4e019ULL);
}

}  // namespace vtoken
