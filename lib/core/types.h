// Vocabulary types shared by every core component. See DESIGN.md's glossary: a block holds
// block_size token slots; slot index = block * block_size + offset; a sequence's logical token
// ids are stable forever and equal the RoPE position the token's KV was computed with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "lib/core/status.h"

namespace vtoken {

using SeqId = int32_t;
using TokenId = int64_t;   // Logical token id within its sequence.
using BlockId = int32_t;
using SlotIndex = int64_t;

inline constexpr SlotIndex kNoSlot = -1;
inline constexpr BlockId kNoBlock = -1;
inline constexpr SeqId kNoSeq = -1;

// How the cache treats evicted tokens.
enum class Mode {
  kNative,  // No eviction at all; EvictToken is refused.
  kNaive,   // Eviction is logical; a block returns to the pool only when none of its tokens live.
  kVtoken,  // Naive, plus the reclaimer repacks live tokens of sparse blocks into dense ones.
};

const char* ModeName(Mode mode);
StatusOr<Mode> ParseMode(std::string_view name);

// One relocated token: its KV moves from slot `src` to slot `dst` in every layer.
struct Move {
  TokenId token = 0;
  SlotIndex src = kNoSlot;
  SlotIndex dst = kNoSlot;
  bool operator==(const Move&) const = default;
};

// One slot-to-slot copy of a token's KV bytes in every layer (what a copy engine executes).
struct SlotCopy {
  SlotIndex src = kNoSlot;
  SlotIndex dst = kNoSlot;
  bool operator==(const SlotCopy&) const = default;
};

}  // namespace vtoken
