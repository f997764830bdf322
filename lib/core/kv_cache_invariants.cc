// VirtualKvCache::CheckInvariants: DESIGN.md §4's invariants over the pool and every table.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

Status VirtualKvCache::CheckInvariants() const {
  VTOKEN_RETURN_IF_ERROR(pool_.CheckInvariants());
  const int32_t bs = block_size();
  std::vector<int32_t> holders(pool_.num_blocks(), 0);
  // A block holds the slots of one group: the group of its first holder.
  std::vector<int32_t> block_group(pool_.num_blocks(), -1);
  struct Reader {
    int32_t count = 0;
    TokenId token = 0;  // Of the first reader.
  };
  std::unordered_map<SlotIndex, Reader> readers;
  for (const auto& [seq, tables] : tables_) {
    if (static_cast<int32_t>(tables.size()) != num_groups()) {
      return InternalError(SeqName(seq) + " has " + std::to_string(tables.size()) +
                           " token tables, the cache " + std::to_string(num_groups()) + " groups");
    }
    for (int32_t g = 0; g < num_groups(); ++g) {
      const TokenTable* table = &tables[g];
      if (table->num_tokens() != tables[0].num_tokens()) {
        return InternalError(SeqName(seq) + " group " + std::to_string(g) + " has " +
                             std::to_string(table->num_tokens()) + " tokens, group 0 " +
                             std::to_string(tables[0].num_tokens()));
      }
      VTOKEN_RETURN_IF_ERROR(table->CheckInvariants(bs));
      for (BlockId b : table->blocks()) {
        if (pool_.is_free(b)) {
          return InternalError(SeqName(seq) + " holds free block " + std::to_string(b));
        }
        if (block_group[b] >= 0 && block_group[b] != g) {
          return InternalError("block " + std::to_string(b) + " is held by groups " +
                               std::to_string(block_group[b]) + " and " + std::to_string(g));
        }
        block_group[b] = g;
        ++holders[b];
      }
      if (table->tail_used() < 0 || table->tail_used() > bs) {
        return InternalError(SeqName(seq) + " tail fill out of range");
      }
      std::unordered_set<SlotIndex> own;
      for (TokenId t = 0; t < table->num_tokens(); ++t) {
        const TokenTable::Entry& e = table->entry(t);
        if (!e.live) continue;
        if (!own.insert(e.slot).second) {
          return InternalError(SeqName(seq) + ": two live tokens share slot " +
                               std::to_string(e.slot));
        }
        auto [it, inserted] = readers.try_emplace(e.slot, Reader{.count = 0, .token = t});
        ++it->second.count;
        if (!inserted && it->second.token != t) {
          return InternalError("slot " + std::to_string(e.slot) +
                               " holds different tokens for different sequences");
        }
      }
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (holders[b] != pool_.refcount(b)) {
      return InternalError("block " + std::to_string(b) + " refcount " +
                           std::to_string(pool_.refcount(b)) + " != " + std::to_string(holders[b]) +
                           " holding sequences");
    }
  }
  for (const auto& [slot, reader] : readers) {
    if (reader.count != pool_.slot_refs(slot)) {
      return InternalError("slot " + std::to_string(slot) + " reader count is stale");
    }
    if (reader.count > 1 && pool_.refcount(pool_.BlockOf(slot)) < 2) {
      return InternalError("slot " + std::to_string(slot) + " read by several sequences " +
                           "in a private block");
    }
  }
  if (static_cast<int64_t>(readers.size()) != pool_.num_live_slots()) {
    return InternalError("pool counts live slots no sequence reads");
  }
  // Read-after-copy: pending destinations and copy sources stay pinned until the copy is done.
  std::unordered_set<BlockId> flight_blocks;
  for (const auto& [id, flight] : in_flight_) {
    for (BlockId b : flight.pinned_blocks) {
      if (!pool_.pinned(b))
        return InternalError("in-flight block " + std::to_string(b) + " is not pinned");
      flight_blocks.insert(b);
    }
  }
  for (const auto& [slot, seq] : pending_slots_) {
    if (!flight_blocks.count(pool_.BlockOf(slot))) {
      return InternalError("pending slot " + std::to_string(slot) + " outside any relocation");
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (pool_.pinned(b) && !flight_blocks.count(b)) {
      return InternalError("block " + std::to_string(b) + " pinned by no relocation");
    }
  }
  return Status::Ok();
}

}  // namespace vtoken
