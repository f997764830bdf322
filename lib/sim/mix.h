// The counter-based hash behind every random draw of the sim backend (signals, sampled tokens),
// so draws depend only on their inputs, never on call order: splitmix64 (lib/core/mix.h) applied
// to one counter.
#pragma once

#include <cstdint>

#include "lib/core/mix.h"

namespace vtoken::sim {

inline uint64_t Mix(uint64_t x) { return SplitMix64Finalize(x + kSplitMix64Gamma); }

}  // namespace vtoken::sim
