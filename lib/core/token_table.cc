#include "lib/core/token_table.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <utility>

namespace vtoken {

static_assert(sizeof(TokenTable::Entry) == 4, "a token table entry must stay 4 bytes");

void TokenTable::Append(SlotIndex slot, BlockId block) {
  auto it = held_.find(block);
  assert(it != held_.end());
  ++block_live_[it->second];
  entries_.push_back(Entry{.slot = static_cast<int32_t>(slot), .live = true});
  ++num_live_;
}

void TokenTable::AppendDead() { entries_.push_back(Entry{}); }

int32_t TokenTable::MarkDead(TokenId token, BlockId block) {
  assert(entries_[token].live);
  entries_[token] = Entry{};  // Dead, no slot: one 4-byte store.
  --num_live_;
  return --block_live_[held_.at(block)];
}

int32_t TokenTable::Relocate(TokenId token, SlotIndex dst, BlockId src_block, BlockId dst_block) {
  Entry& e = entries_[token];
  assert(e.live);
  e.slot = dst;
  ++block_live_[held_.at(dst_block)];
  return --block_live_[held_.at(src_block)];
}

void TokenTable::AddBlock(BlockId block) {
  assert(!holds(block));
  held_.emplace(block, static_cast<int32_t>(blocks_.size()));
  blocks_.push_back(block);
  block_live_.push_back(0);
}

void TokenTable::RemoveBlock(BlockId block) {
  auto it = held_.find(block);
  assert(it != held_.end());
  const int32_t index = it->second;
  const BlockId last = blocks_.back();
  blocks_[index] = last;
  block_live_[index] = block_live_.back();
  held_.at(last) = index;
  blocks_.pop_back();
  block_live_.pop_back();
  held_.erase(it);
  if (tail_block_ == block) SetTail(kNoBlock, 0);
}

std::vector<SlotIndex> TokenTable::LiveSlots() const {
  std::vector<SlotIndex> slots;
  slots.reserve(num_live_);
  for (const Entry& e : entries_) {
    if (e.live) slots.push_back(e.slot);
  }
  return slots;
}

std::vector<TokenId> TokenTable::LiveTokens() const {
  std::vector<TokenId> tokens;
  tokens.reserve(num_live_);
  for (TokenId t = 0; t < num_tokens(); ++t) {
    if (entries_[t].live) tokens.push_back(t);
  }
  return tokens;
}

void TokenTable::AppendLive(std::vector<SlotIndex>& slots, std::vector<TokenId>& tokens) const {
  const size_t live = static_cast<size_t>(num_live_);
  const size_t slots_at = slots.size(), tokens_at = tokens.size();
  // Callers append one table per KV group to the same vectors: growth stays geometric (an
  // exact reserve per call would copy the vectors once per group).
  for (auto* v : {&slots, &tokens}) {
    if (v->capacity() < v->size() + live + 1) v->reserve(std::max(v->size() + live + 1, 2 * v->capacity()));
  }
  // Branch-free: every entry is written, and the cursors advance past the live ones only (one
  // spare element for the write after the last live entry).
  slots.resize(slots_at + live + 1);
  tokens.resize(tokens_at + live + 1);
  SlotIndex* s = slots.data() + slots_at;
  TokenId* k = tokens.data() + tokens_at;
  const TokenId n = num_tokens();
  for (TokenId t = 0; t < n; ++t) {
    const Entry e = entries_[t];
    *s = e.slot;
    *k = t;
    s += e.live;
    k += e.live;
  }
  slots.resize(slots_at + live);
  tokens.resize(tokens_at + live);
}

int64_t TokenTable::MemoryBytes() const {
  // An unordered_map node holds the pair and a next pointer; the bucket array one pointer each.
  const int64_t node =
      static_cast<int64_t>(sizeof(std::pair<const BlockId, int32_t>) + sizeof(void*));
  return static_cast<int64_t>(entries_.capacity() * sizeof(Entry) +
                              blocks_.capacity() * sizeof(BlockId) +
                              block_live_.capacity() * sizeof(int32_t) +
                              held_.bucket_count() * sizeof(void*)) +
         static_cast<int64_t>(held_.size()) * node;
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
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (held_.at(blocks_[i]) != static_cast<int32_t>(i)) {
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
