// The relocation state machine of VirtualKvCache: BeginRelocation, ApplyMoves and
// CompleteRelocation, and the pending-slot queries readers fence on (virtual_kv_cache.h).
#include <cassert>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

int64_t Relocation::num_moves() const {
  int64_t n = 0;
  for (const SeqRelocation& s : seqs) n += static_cast<int64_t>(s.moves.size());
  return n;
}

std::vector<SlotCopy> Relocation::Copies() const {
  std::vector<SlotCopy> copies;
  copies.reserve(num_moves());
  for (const SeqRelocation& s : seqs) {
    for (const Move& m : s.moves) copies.push_back({m.src, m.dst});
  }
  return copies;
}

StatusOr<Relocation> VirtualKvCache::BeginRelocation(const ReclaimPlan& plan) {
  if (mode() != Mode::kVtoken) {
    return FailedPreconditionError(std::string("relocation is disabled in ") + ModeName(mode()) +
                                   " mode");
  }
  if (plan.snapshot_version != version_) {
    return FailedPreconditionError("stale plan: made from snapshot version " +
                                   std::to_string(plan.snapshot_version) +
                                   ", cache is at version " + std::to_string(version_));
  }
  if (plan.empty()) return Relocation{};
  // Validate everything before mutating anything.
  int64_t total_dst = 0;
  std::set<std::pair<SeqId, int32_t>> seen;
  for (const SeqPlan& sp : plan.seqs) {
    auto it = tables_.find(sp.seq);
    if (it == tables_.end()) return NotFoundError("plan names unknown " + SeqName(sp.seq));
    if (sp.group < 0 || sp.group >= num_groups()) {
      return NotFoundError("plan names unknown group " + std::to_string(sp.group) + " of " +
                           SeqName(sp.seq));
    }
    if (!seen.insert({sp.seq, sp.group}).second) {
      return InvalidArgumentError("plan names " + SeqName(sp.seq) + " group " +
                                  std::to_string(sp.group) + " twice");
    }
    const TokenTable& t = it->second[sp.group];
    int64_t live = 0;
    std::set<BlockId> distinct;
    for (BlockId b : sp.src_blocks) {
      if (!distinct.insert(b).second || b < 0 || b >= pool_.num_blocks() || !t.holds(b) ||
          pool_.refcount(b) != 1 || b == t.tail_block() || pool_.pinned(b)) {
        return FailedPreconditionError("plan for " + SeqName(sp.seq) + " names block " +
                                       std::to_string(b) +
                                       " which is not a private, settled block it holds");
      }
      live += t.live_in(b);
    }
    const int64_t dst = (live + block_size() - 1) / block_size();
    if (live != sp.num_moves || dst != sp.num_dst_blocks) {
      return FailedPreconditionError("plan for " + SeqName(sp.seq) + " does not match the cache");
    }
    if (dst >= static_cast<int64_t>(sp.src_blocks.size())) {
      return FailedPreconditionError("plan for " + SeqName(sp.seq) +
                                     " frees no block: " + std::to_string(sp.src_blocks.size()) +
                                     " sources, " + std::to_string(dst) + " destinations");
    }
    total_dst += dst;
  }
  if (total_dst > pool_.num_free_blocks()) {
    return ResourceExhaustedError("relocation needs " + std::to_string(total_dst) +
                                  " destination blocks, " +
                                  std::to_string(pool_.num_free_blocks()) + " free (headroom " +
                                  std::to_string(pool_.headroom_blocks()) + ")");
  }

  Relocation rel;
  rel.id = next_relocation_++;
  InFlight& flight = in_flight_[rel.id];
  for (const SeqPlan& sp : plan.seqs) {
    TokenTable& t = tables_.at(sp.seq)[sp.group];
    SeqRelocation sr{.seq = sp.seq,
                     .moves = {},
                     .src_blocks = sp.src_blocks,
                     .dst_blocks = {},
                     .group = sp.group};
    for (int32_t i = 0; i < sp.num_dst_blocks; ++i) {
      StatusOr<BlockId> block = pool_.Allocate(sp.seq, AllocClass::kReclaim);
      assert(block.ok());  // Checked above.
      t.AddBlock(*block);
      pool_.Pin(*block);
      sr.dst_blocks.push_back(*block);
      flight.pinned_blocks.push_back(*block);
    }
    std::unordered_set<BlockId> sources(sp.src_blocks.begin(), sp.src_blocks.end());
    for (BlockId b : sp.src_blocks) {
      pool_.Pin(b);
      flight.pinned_blocks.push_back(b);
    }
    int64_t next = 0;
    sr.moves.reserve(static_cast<size_t>(sp.num_moves));
    for (TokenId tok = 0; tok < t.num_tokens(); ++tok) {
      const TokenTable::Entry& e = t.entry(tok);
      if (!e.live || !sources.count(pool_.BlockOf(e.slot))) continue;
      const SlotIndex dst =
          pool_.FirstSlot(sr.dst_blocks[next / block_size()]) + next % block_size();
      ++next;
      sr.moves.push_back({tok, e.slot, dst});
      pending_slots_[dst] = PendingSlot{.seq = sp.seq, .group = sp.group, .relocation = rel.id};
      flight.dst_slots.push_back(dst);
    }
    rel.seqs.push_back(std::move(sr));
  }
  ++version_;
  return rel;
}

std::vector<Move> VirtualKvCache::LiveMoves(const SeqRelocation& rel) const {
  std::vector<Move> moves;
  if (!HasSequence(rel.seq) || rel.group < 0 || rel.group >= num_groups()) return moves;
  const TokenTable& t = table(rel.seq, rel.group);
  for (const Move& m : rel.moves) {
    if (m.token < t.num_tokens() && t.entry(m.token).live && t.entry(m.token).slot == m.src) {
      moves.push_back(m);
    }
  }
  return moves;
}

Status VirtualKvCache::ApplyMoves(SeqId seq, std::span<const Move> moves, int32_t group) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<TokenTable> * tables, MutableTables(seq));
  if (group < 0 || group >= num_groups()) {
    return NotFoundError("unknown group " + std::to_string(group) + " of " + SeqName(seq));
  }
  TokenTable* table = &(*tables)[group];
  std::unordered_set<SlotIndex> dsts;
  for (const Move& m : moves) {
    const std::string what = "move of token " + std::to_string(m.token) + " of " + SeqName(seq);
    if (m.token < 0 || m.token >= table->num_tokens()) {
      return NotFoundError(what + ": unknown token");
    }
    const TokenTable::Entry& e = table->entry(m.token);
    if (!e.live || e.slot != m.src) {
      return FailedPreconditionError(what + ": token is not live at slot " + std::to_string(m.src));
    }
    auto it = pending_slots_.find(m.dst);
    if (it == pending_slots_.end() || it->second.seq != seq || it->second.group != group) {
      return FailedPreconditionError(what + ": destination slot " + std::to_string(m.dst) +
                                     " is not reserved for this sequence");
    }
    if (pool_.slot_refs(m.dst) != 0 || !dsts.insert(m.dst).second) {
      return FailedPreconditionError(what + ": destination slot " + std::to_string(m.dst) +
                                     " is already occupied");
    }
    if (pool_.refcount(pool_.BlockOf(m.src)) != 1) {
      return FailedPreconditionError(what + ": source block is shared");
    }
  }
  for (const Move& m : moves) {
    const BlockId src_block = pool_.BlockOf(m.src);
    pool_.AddSlotRef(m.dst);
    pool_.DropSlotRef(m.src);
    if (table->Relocate(m.token, m.dst, src_block, pool_.BlockOf(m.dst)) == 0) {
      ReleaseBlock(*table, src_block);
    }
  }
  ++version_;
  return Status::Ok();
}

Status VirtualKvCache::CompleteRelocation(uint64_t id) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) {
    return NotFoundError("unknown relocation " + std::to_string(id));
  }
  for (SlotIndex slot : it->second.dst_slots) {
    auto p = pending_slots_.find(slot);
    // A destination its token never reached (evicted before ApplyMoves) leaves an empty block.
    if (p != pending_slots_.end()) {
      auto t = tables_.find(p->second.seq);
      const BlockId block = pool_.BlockOf(slot);
      if (t != tables_.end()) {
        TokenTable& table = t->second[p->second.group];
        if (table.holds(block) && table.live_in(block) == 0) ReleaseBlock(table, block);
      }
      pending_slots_.erase(p);
    }
  }
  for (BlockId block : it->second.pinned_blocks) pool_.Unpin(block);
  in_flight_.erase(it);
  ++version_;
  return Status::Ok();
}

bool VirtualKvCache::HasPendingReads(SeqId seq) const { return NewestPendingRead(seq) != 0; }

uint64_t VirtualKvCache::NewestPendingRead(SeqId seq) const {
  if (pending_slots_.empty()) return 0;
  const std::vector<TokenTable>& tables = tables_.at(seq);
  // Not only seq's own destinations: a fork may share a block whose copy is still in flight.
  uint64_t newest = 0;
  for (const auto& [slot, owner] : pending_slots_) {
    if (owner.relocation <= newest || pool_.slot_refs(slot) == 0) continue;
    if (tables[owner.group].holds(pool_.BlockOf(slot))) newest = owner.relocation;
  }
  return newest;
}

std::vector<uint64_t> VirtualKvCache::InFlightRelocations() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, flight] : in_flight_) ids.push_back(id);
  return ids;
}

}  // namespace vtoken
