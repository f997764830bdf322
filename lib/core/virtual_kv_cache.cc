#include "lib/core/virtual_kv_cache.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace vtoken {

std::string VirtualKvCache::SeqName(SeqId seq) { return "sequence " + std::to_string(seq); }

Status ValidateCacheOptions(const CacheOptions& options) {
  if (options.num_groups < 1 || options.num_groups > kMaxKvGroups) {
    return InvalidArgumentError("num_groups must be in [1, " + std::to_string(kMaxKvGroups) +
                                "], got " + std::to_string(options.num_groups));
  }
  return ValidateBlockPoolOptions(options.pool);
}

VirtualKvCache::VirtualKvCache(const CacheOptions& options)
    : options_(options), pool_(options.pool) {}

StatusOr<std::vector<TokenTable>*> VirtualKvCache::MutableTables(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return NotFoundError("unknown " + SeqName(seq));
  return &it->second;
}

SeqId VirtualKvCache::AddSequence() {
  const SeqId seq = next_seq_++;
  tables_.emplace(seq, std::vector<TokenTable>(static_cast<size_t>(options_.num_groups)));
  ++version_;
  return seq;
}

void VirtualKvCache::ReserveTokens(SeqId seq, int64_t n) {
  auto it = tables_.find(seq);
  if (it == tables_.end() || n <= it->second[0].num_tokens()) return;
  for (TokenTable& t : it->second) t.ReserveTokens(n);
}

int64_t VirtualKvCache::num_live(SeqId seq) const {
  int64_t n = 0;
  for (const TokenTable& t : tables_.at(seq)) n += t.num_live();
  return n;
}

int32_t VirtualKvCache::num_blocks_held(SeqId seq) const {
  int32_t n = 0;
  for (const TokenTable& t : tables_.at(seq)) n += t.num_blocks();
  return n;
}

int64_t VirtualKvCache::IdealBlocks(SeqId seq) const {
  int64_t n = 0;
  for (const TokenTable& t : tables_.at(seq)) {
    n += (t.num_live() + block_size() - 1) / block_size();
  }
  return n;
}

int64_t VirtualKvCache::TableMemoryBytes() const {
  int64_t bytes = 0;
  for (const auto& [seq, groups] : tables_) {
    bytes += static_cast<int64_t>(groups.capacity() * sizeof(TokenTable));
    for (const TokenTable& t : groups) bytes += t.MemoryBytes();
  }
  return bytes;
}

std::vector<SeqId> VirtualKvCache::Sequences() const {
  std::vector<SeqId> seqs;
  seqs.reserve(tables_.size());
  for (const auto& [seq, table] : tables_) seqs.push_back(seq);
  return seqs;
}

void VirtualKvCache::ReleaseBlock(TokenTable& table, BlockId block) {
  table.RemoveBlock(block);
  pool_.Release(block);
}

StatusOr<ForkResult> VirtualKvCache::ForkSequence(SeqId parent_id, int64_t num_tokens) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<TokenTable> * parents, MutableTables(parent_id));
  const int64_t parent_tokens = (*parents)[0].num_tokens();
  if (num_tokens < 0 || num_tokens > parent_tokens) {
    return InvalidArgumentError("cannot fork " + std::to_string(num_tokens) + " tokens of " +
                                SeqName(parent_id) + " which has " + std::to_string(parent_tokens));
  }
  const int32_t bs = block_size();
  const int32_t groups = num_groups();
  // A block is shareable when every live parent token in it precedes the fork point and the
  // parent will not append into it again.
  std::vector<std::unordered_map<BlockId, TokenId>> max_token(static_cast<size_t>(groups));
  int64_t blocks_needed = 0;
  for (int32_t g = 0; g < groups; ++g) {
    const TokenTable& parent = (*parents)[g];
    for (TokenId t = 0; t < parent.num_tokens(); ++t) {
      const TokenTable::Entry& e = parent.entry(t);
      if (e.live) max_token[g][pool_.BlockOf(e.slot)] = t;
    }
  }
  auto shareable = [&](int32_t g, BlockId block) {
    const TokenTable& parent = (*parents)[g];
    if (max_token[g].at(block) >= num_tokens) return false;
    return block != parent.tail_block() || parent.tail_used() == bs;
  };
  for (int32_t g = 0; g < groups; ++g) {
    int64_t num_fresh = 0;
    for (TokenId t = 0; t < num_tokens; ++t) {
      const TokenTable::Entry& e = (*parents)[g].entry(t);
      if (e.live && !shareable(g, pool_.BlockOf(e.slot))) ++num_fresh;
    }
    blocks_needed += (num_fresh + bs - 1) / bs;
  }
  if (blocks_needed > pool_.num_allocatable_blocks()) {
    return ResourceExhaustedError("fork of " + SeqName(parent_id) + " needs " +
                                  std::to_string(blocks_needed) + " blocks, " +
                                  std::to_string(pool_.num_allocatable_blocks()) + " available");
  }

  const SeqId child_id = AddSequence();
  ForkResult result{.child = child_id, .copies = {}};
  for (int32_t g = 0; g < groups; ++g) {
    const TokenTable& parent = (*parents)[g];  // Map nodes stay put when the child is added.
    TokenTable& child = tables_.at(child_id)[g];
    for (TokenId t = 0; t < num_tokens; ++t) {
      const TokenTable::Entry& e = parent.entry(t);
      if (!e.live) {
        child.AppendDead();
        continue;
      }
      const BlockId block = pool_.BlockOf(e.slot);
      if (shareable(g, block)) {
        if (!child.holds(block)) {
          child.AddBlock(block);
          pool_.AddRef(block);
        }
        child.Append(e.slot, block);
        pool_.AddSlotRef(e.slot);
        continue;
      }
      if (child.tail_block() == kNoBlock || child.tail_used() == bs) {
        StatusOr<BlockId> fresh = pool_.Allocate(child_id, AllocClass::kNormal);
        assert(fresh.ok());  // Checked above.
        child.AddBlock(*fresh);
        child.SetTail(*fresh, 0);
      }
      const SlotIndex slot = pool_.FirstSlot(child.tail_block()) + child.tail_used();
      child.Append(slot, child.tail_block());
      child.SetTail(child.tail_block(), child.tail_used() + 1);
      pool_.AddSlotRef(slot);
      result.copies.push_back({e.slot, slot});
    }
  }
  ++version_;
  return result;
}

Status VirtualKvCache::FreeSequence(SeqId seq) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<TokenTable> * tables, MutableTables(seq));
  for (const TokenTable& table : *tables) {
    for (TokenId t = 0; t < table.num_tokens(); ++t) {
      const TokenTable::Entry& e = table.entry(t);
      if (e.live) pool_.DropSlotRef(e.slot);
    }
    for (BlockId block : table.blocks()) pool_.Release(block);
  }
  tables_.erase(seq);
  ++version_;
  return Status::Ok();
}

int32_t VirtualKvCache::BlocksNeeded(const std::vector<TokenTable>& tables, int64_t n) const {
  int64_t needed = 0;
  for (const TokenTable& t : tables) {
    const int64_t room = t.tail_block() == kNoBlock ? 0 : block_size() - t.tail_used();
    if (n > room) needed += (n - room + block_size() - 1) / block_size();
  }
  return static_cast<int32_t>(std::min<int64_t>(needed, INT32_MAX));
}

int32_t VirtualKvCache::BlocksNeededFor(SeqId seq, int64_t n) const {
  return BlocksNeeded(tables_.at(seq), n);
}

StatusOr<std::vector<SlotIndex>> VirtualKvCache::SyncNewTokens(SeqId seq, int64_t n) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<TokenTable> * tables, MutableTables(seq));
  if (n < 0) return InvalidArgumentError("cannot sync a negative number of tokens");
  const int32_t needed = BlocksNeeded(*tables, n);
  if (needed > pool_.num_allocatable_blocks()) {
    return ResourceExhaustedError(SeqName(seq) + " needs " + std::to_string(needed) +
                                  " more blocks, " +
                                  std::to_string(pool_.num_allocatable_blocks()) + " available");
  }
  std::vector<SlotIndex> slots;
  slots.reserve(static_cast<size_t>(n) * tables->size());
  for (TokenTable& table : *tables) {
    // One run per block: the tail's free slots, then fresh blocks.
    for (int64_t done = 0; done < n;) {
      if (table.tail_block() == kNoBlock || table.tail_used() == block_size()) {
        StatusOr<BlockId> block = pool_.Allocate(seq, AllocClass::kNormal);
        assert(block.ok());  // Checked above.
        table.AddBlock(*block);
        table.SetTail(*block, 0);
      }
      const int64_t run = std::min<int64_t>(n - done, block_size() - table.tail_used());
      const SlotIndex first = pool_.FirstSlot(table.tail_block()) + table.tail_used();
      table.AppendRun(first, run, table.tail_block());
      table.SetTail(table.tail_block(), table.tail_used() + static_cast<int32_t>(run));
      pool_.AddSlotRefs(first, run);
      for (int64_t i = 0; i < run; ++i) slots.push_back(first + i);
      done += run;
    }
  }
  ++version_;
  return slots;
}

Status VirtualKvCache::EvictError(SeqId seq, int32_t group, TokenId token) const {
  if (mode() == Mode::kNative) {
    return FailedPreconditionError("eviction is disabled in native mode");
  }
  auto it = tables_.find(seq);
  if (it == tables_.end()) return NotFoundError("unknown " + SeqName(seq));
  if (group < 0 || group >= num_groups()) {
    return NotFoundError("unknown group " + std::to_string(group) + " of " + SeqName(seq) + " (" +
                         std::to_string(num_groups()) + " groups)");
  }
  const TokenTable& table = it->second[group];
  if (token < 0 || token >= table.num_tokens()) {
    return NotFoundError("unknown token " + std::to_string(token) + " of " + SeqName(seq) + " (" +
                         std::to_string(table.num_tokens()) + " tokens)");
  }
  return FailedPreconditionError(
      "token " + std::to_string(token) + " of " + SeqName(seq) +
      (num_groups() > 1 ? " group " + std::to_string(group) : std::string()) +
      " is already evicted");
}

void VirtualKvCache::EvictLive(TokenTable& table, TokenId token) {
  const SlotIndex slot = table.entry(token).slot;
  const BlockId block = pool_.BlockOf(slot);
  pool_.DropSlotRef(slot);
  if (table.MarkDead(token, block) == 0) ReleaseBlock(table, block);
}

// The hot path of every eviction, inlined into both EvictToken overloads: checks first, messages
// only on an error (EvictError).
__attribute__((always_inline)) inline Status VirtualKvCache::EvictOne(SeqId seq, int32_t group,
                                                                      TokenId token) {
  auto it = tables_.find(seq);
  if (mode() == Mode::kNative || it == tables_.end() || group < 0 || group >= num_groups()) {
    return EvictError(seq, group, token);
  }
  TokenTable& table = it->second[group];
  if (token < 0 || token >= table.num_tokens() || !table.entry(token).live) {
    return EvictError(seq, group, token);
  }
  EvictLive(table, token);
  ++version_;
  return Status::Ok();
}

Status VirtualKvCache::EvictToken(SeqId seq, int32_t group, TokenId token) {
  return EvictOne(seq, group, token);
}

Status VirtualKvCache::EvictToken(SeqId seq, TokenId token) {
  if (num_groups() == 1) return EvictOne(seq, 0, token);
  if (mode() == Mode::kNative) {
    return FailedPreconditionError("eviction is disabled in native mode");
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<TokenTable> * tables, MutableTables(seq));
  if (token < 0 || token >= (*tables)[0].num_tokens()) return EvictError(seq, 0, token);
  bool any = false;
  for (TokenTable& t : *tables) {
    if (!t.entry(token).live) continue;
    EvictLive(t, token);
    any = true;
  }
  if (!any) {
    return FailedPreconditionError("token " + std::to_string(token) + " of " + SeqName(seq) +
                                   " is already evicted in every group");
  }
  ++version_;
  return Status::Ok();
}

}  // namespace vtoken
