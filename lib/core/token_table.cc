#include "lib/core/token_table.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <unordered_map>
#include <utility>

namespace vtoken {

static_assert(sizeof(TokenTable::Entry) == 4, "a token table entry must stay 4 bytes");

void TokenTable::AppendRun(SlotIndex first, int64_t count, BlockId block) {
  block_live_[held_.At(block)] += static_cast<int32_t>(count);
  if (pending_dead_ > 0) Compact();
  const size_t n = entries_.size(), add = static_cast<size_t>(count);
  assert(n + add < static_cast<size_t>(INT32_MAX));
  if (live_.size() + add > live_.capacity()) {  // Grows by a quarter: the list is table memory.
    live_.reserve(std::max(live_.size() + add, live_.size() + live_.size() / 4 + 4));
    live_slots_.reserve(live_.capacity());
  }
  const size_t at = live_.size();
  live_.resize(at + add);
  live_slots_.resize(at + add);
  entries_.resize(n + add);
  for (size_t i = 0; i < add; ++i) {
    const int32_t slot = static_cast<int32_t>(first + static_cast<SlotIndex>(i));
    live_[at + i] = static_cast<int32_t>(n + i);
    live_slots_[at + i] = slot;
    entries_[n + i] = Entry{.slot = slot, .live = true};
  }
  num_live_ += count;
}

void TokenTable::Compact() {
  if (pending_dead_ <= kFewDead) {  // Each dead id out by binary search and one tail move.
    for (int64_t d = 0; d < pending_dead_; ++d) {
      const auto at = std::lower_bound(live_.begin(), live_.end(), few_dead_[d]);
      live_slots_.erase(live_slots_.begin() + (at - live_.begin()));
      live_.erase(at);
    }
  } else {
    // Branch-free: every entry is written, the cursor advances past the live ones only.
    const Entry* entries = entries_.data();
    size_t out = 0;
    for (size_t i = 0; i < live_.size(); ++i) {
      const int32_t t = live_[i];
      live_[out] = t;
      live_slots_[out] = live_slots_[i];
      out += entries[t].live;
    }
    live_.resize(out);
    live_slots_.resize(out);
  }
  pending_dead_ = 0;
  const size_t size = live_.size();
  if (live_.capacity() > size + size / 2 + 4) {
    live_.shrink_to_fit();
    live_slots_.shrink_to_fit();
  }
}

void TokenTable::AppendDead() { entries_.push_back(Entry{}); }

int32_t TokenTable::MarkDead(TokenId token, BlockId block) {
  assert(entries_[token].live);
  entries_[token] = Entry{};  // Dead, no slot: one 4-byte store.
  --num_live_;
  // Amortized O(1): a compaction reads at most five ids per id it removes (the list stays within
  // 1.25x the live tokens).
  if (pending_dead_ < kFewDead) few_dead_[pending_dead_] = static_cast<int32_t>(token);
  if (4 * ++pending_dead_ > num_live_) Compact();
  return --block_live_[held_.At(block)];
}

int32_t TokenTable::Relocate(TokenId token, SlotIndex dst, BlockId src_block, BlockId dst_block) {
  Entry& e = entries_[token];
  assert(e.live);
  e.slot = dst;
  live_slots_[std::lower_bound(live_.begin(), live_.end(), static_cast<int32_t>(token)) -
              live_.begin()] = static_cast<int32_t>(dst);
  ++block_live_[held_.At(dst_block)];
  return --block_live_[held_.At(src_block)];
}

void TokenTable::AddBlock(BlockId block) {
  assert(!holds(block));
  held_.Insert(block, static_cast<int32_t>(blocks_.size()));
  blocks_.push_back(block);
  block_live_.push_back(0);
}

void TokenTable::RemoveBlock(BlockId block) {
  const int32_t index = held_.At(block);
  const BlockId last = blocks_.back();
  blocks_[index] = last;
  block_live_[index] = block_live_.back();
  held_.At(last) = index;
  blocks_.pop_back();
  block_live_.pop_back();
  held_.Erase(block);
  if (tail_block_ == block) SetTail(kNoBlock, 0);
}

std::vector<SlotIndex> TokenTable::LiveSlots() const {
  if (pending_dead_ == 0) return std::vector<SlotIndex>(live_slots_.begin(), live_slots_.end());
  std::vector<SlotIndex> slots;
  slots.reserve(static_cast<size_t>(num_live_));
  for (size_t i = 0; i < live_.size(); ++i) {
    if (entries_[live_[i]].live) slots.push_back(live_slots_[i]);
  }
  return slots;
}

std::vector<TokenId> TokenTable::LiveTokens() const {
  std::vector<TokenId> tokens;
  tokens.reserve(static_cast<size_t>(num_live_));
  for (const int32_t t : live_) {
    if (entries_[t].live) tokens.push_back(t);
  }
  return tokens;
}

void TokenTable::AppendLive(std::vector<SlotIndex>& slots, std::vector<TokenId>& tokens,
                            int64_t leave_out) const {
  assert(leave_out >= 0 && leave_out <= num_live_);
  const size_t live = static_cast<size_t>(num_live_ - leave_out);
  // Callers append one table per KV group to the same vectors; insert and resize grow them
  // geometrically (never an exact reserve per call, which would copy them once per group).
  const int32_t* ids = live_.data();
  const int32_t* at = live_slots_.data();
  if (pending_dead_ == 0) {  // Every listed token is live: two widening copies (no zero-fill).
    slots.insert(slots.end(), at, at + live);
    tokens.insert(tokens.end(), ids, ids + live);
  } else {
    // Branch-free: every listed token is written (all live ones and one spare element), the
    // cursors advance past the live ones, then the vectors are cut.
    const size_t slots_at = slots.size(), tokens_at = tokens.size();
    const size_t written = static_cast<size_t>(num_live_) + 1;
    slots.resize(slots_at + written);
    tokens.resize(tokens_at + written);
    SlotIndex* s = slots.data() + slots_at;
    TokenId* k = tokens.data() + tokens_at;
    const Entry* entries = entries_.data();
    for (size_t i = 0; i < live_.size(); ++i) {
      const bool is_live = entries[ids[i]].live;
      *s = at[i];
      *k = ids[i];
      s += is_live;
      k += is_live;
    }
    slots.resize(slots_at + live);
    tokens.resize(tokens_at + live);
  }
}

int64_t TokenTable::MemoryBytes() const {
  return static_cast<int64_t>(entries_.capacity() * sizeof(Entry) +
                              (live_.capacity() + live_slots_.capacity()) * sizeof(int32_t) +
                              blocks_.capacity() * sizeof(BlockId) +
                              block_live_.capacity() * sizeof(int32_t)) +
         held_.MemoryBytes();
}

Status TokenTable::CheckInvariants(int32_t block_size) const {
  std::unordered_map<BlockId, int32_t> live;
  int64_t num_live = 0;
  for (TokenId t = 0; t < num_tokens(); ++t) {
    const Entry& e = entries_[t];
    if (e.live != (e.slot != kNoSlot)) {
      return InternalError("token " + std::to_string(t) + " live bit disagrees with its slot");
    }
    if (!e.live) continue;
    ++num_live;
    const BlockId block = static_cast<BlockId>(e.slot / block_size);
    if (!holds(block)) {
      return InternalError("token " + std::to_string(t) + " lives in block " +
                           std::to_string(block) + " that its sequence does not hold");
    }
    ++live[block];
  }
  if (num_live != num_live_) return InternalError("table live count is stale");
  int64_t listed_live = 0, listed_dead = 0;
  for (size_t i = 0; i < live_.size(); ++i) {
    const int32_t t = live_[i];
    if (t < 0 || t >= num_tokens() || (i > 0 && t <= live_[i - 1])) {
      return InternalError("live list is not increasing token ids at index " + std::to_string(i));
    }
    ++(entries_[t].live ? listed_live : listed_dead);
    if (entries_[t].live && live_slots_[i] != entries_[t].slot) {
      return InternalError("live list has slot " + std::to_string(live_slots_[i]) + " for token " +
                           std::to_string(t) + " at slot " + std::to_string(entries_[t].slot));
    }
  }
  if (live_slots_.size() != live_.size()) return InternalError("live list sizes differ");
  if (listed_live != num_live_) {
    return InternalError("live list holds " + std::to_string(listed_live) + " of " +
                         std::to_string(num_live_) + " live tokens");
  }
  if (listed_dead != pending_dead_) {
    return InternalError("live list holds " + std::to_string(listed_dead) +
                         " dead tokens, expected " + std::to_string(pending_dead_));
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (held_.Find(blocks_[i]) != static_cast<int32_t>(i)) {
      return InternalError("held block index is stale");
    }
    const auto it = live.find(blocks_[i]);
    const int32_t counted = it == live.end() ? 0 : it->second;
    if (counted != block_live_[i]) {
      return InternalError("block " + std::to_string(blocks_[i]) + " live count " +
                           std::to_string(block_live_[i]) + " != " + std::to_string(counted));
    }
  }
  if (held_.size() != blocks_.size() || block_live_.size() != blocks_.size()) {
    return InternalError("held block map size is stale");
  }
  if (tail_block_ != kNoBlock && !holds(tail_block_)) {
    return InternalError("tail block is not held");
  }
  return Status::Ok();
}

}  // namespace vtoken
