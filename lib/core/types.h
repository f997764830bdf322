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
using TokenId = int64_t;  // Logical token id within its sequence.
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

// What one liveness bit covers (docs/ARCHITECTURE.md, "KV groups"). A KV group is a set of a
// token's KV rows that live and die together: the whole token (every layer and KV head), one
// layer's rows, or one layer's one KV head. Each group of a sequence has its own token table; a
// pool block holds block_size slots of one group; a slot holds one group's K and V rows.
enum class Granularity {
  kToken,  // 1 group: every layer and KV head (the paper's model).
  kLayer,  // num_layers groups: group = layer.
  kHead,   // num_layers * num_kv_heads groups: group = layer * num_kv_heads + kv_head.
};

const char* GranularityName(Granularity granularity);
StatusOr<Granularity> ParseGranularity(std::string_view name);
// Groups of a model with `num_layers` layers of `num_kv_heads` KV heads (1, L or L * H_kv).
int32_t NumKvGroups(Granularity granularity, int64_t num_layers, int64_t num_kv_heads);
// The group that the KV rows of (layer, kv_head) belong to.
int32_t KvGroupOf(Granularity granularity, int64_t layer, int64_t kv_head, int64_t num_kv_heads);

// One relocated token: its KV moves from slot `src` to slot `dst` (a slot holds the rows of one
// KV group: at token granularity every layer's).
struct Move {
  TokenId token = 0;
  SlotIndex src = kNoSlot;
  SlotIndex dst = kNoSlot;
  bool operator==(const Move&) const = default;
};

// One slot-to-slot copy of a slot's KV bytes, K and V of every row the slot holds (what a copy
// engine executes).
struct SlotCopy {
  SlotIndex src = kNoSlot;
  SlotIndex dst = kNoSlot;
  bool operator==(const SlotCopy&) const = default;
};

}  // namespace vtoken
