#include "lib/core/virtual_kv_cache.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <set>
#include <string>
#include <unordered_set>

namespace vtoken {
namespace {

std::string SeqName(SeqId seq) { return "sequence " + std::to_string(seq); }

// Sorts snapshot blocks by block id (ids are distinct and >= 0): insertion sort for short lists,
// an LSD radix sort on 8-bit digits up to the largest id otherwise (Snapshot runs on every planning
// step, over every held block).
void SortByBlock(std::vector<BlockSnapshot>& blocks, std::vector<BlockSnapshot>& scratch) {
  if (blocks.size() <= 64) {  // Insertion sort: linear on the usual, nearly sorted lists.
    for (size_t i = 1; i < blocks.size(); ++i) {
      const BlockSnapshot b = blocks[i];
      size_t j = i;
      for (; j > 0 && blocks[j - 1].block > b.block; --j) blocks[j] = blocks[j - 1];
      blocks[j] = b;
    }
    return;
  }
  uint32_t max_id = 0;
  for (const BlockSnapshot& b : blocks) max_id = std::max(max_id, static_cast<uint32_t>(b.block));
  scratch.resize(blocks.size());
  for (int shift = 0; shift < 32 && (max_id >> shift) != 0; shift += 8) {
    size_t counts[257] = {};
    auto digit = [shift](const BlockSnapshot& b) {
      return (static_cast<uint32_t>(b.block) >> shift) & 0xff;
    };
    for (const BlockSnapshot& b : blocks) ++counts[digit(b) + 1];
    for (size_t i = 1; i <= 256; ++i) counts[i] += counts[i - 1];
    for (const BlockSnapshot& b : blocks) {
      scratch[counts[digit(b)]++] = b;
    }
    blocks.swap(scratch);
  }
}

}  // namespace

Status ValidateCacheOptions(const CacheOptions& options) {
  if (options.num_groups < 1 || options.num_groups > kMaxKvGroups) {
    return InvalidArgumentError("num_groups must be in [1, " + std::to_string(kMaxKvGroups) +
                                "], got " + std::to_string(options.num_groups));
  }
  return ValidateBlockPoolOptions(options.pool);
}

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
                                SeqName(parent_id) + " which has " +
                                std::to_string(parent_tokens));
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
    return NotFoundError("unknown group " + std::to_string(group) + " of " + SeqName(seq) +
                         " (" + std::to_string(num_groups()) + " groups)");
  }
  const TokenTable& table = it->second[group];
  if (token < 0 || token >= table.num_tokens()) {
    return NotFoundError("unknown token " + std::to_string(token) + " of " + SeqName(seq) +
                         " (" + std::to_string(table.num_tokens()) + " tokens)");
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
      return FailedPreconditionError("plan for " + SeqName(sp.seq) + " frees no block: " +
                                     std::to_string(sp.src_blocks.size()) + " sources, " +
                                     std::to_string(dst) + " destinations");
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
      return FailedPreconditionError(what + ": token is not live at slot " +
                                     std::to_string(m.src));
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

FragStats VirtualKvCache::Stats() const {
  FragStats s;
  s.block_size = block_size();
  s.num_groups = num_groups();
  s.allocated_blocks = pool_.num_allocated_blocks();
  s.live_slots = pool_.num_live_slots();
  s.waste_ratio = s.allocated_blocks == 0
                      ? 0.0
                      : 1.0 - static_cast<double>(s.live_slots) /
                                  (static_cast<double>(s.allocated_blocks) * block_size());
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (pool_.is_free(b)) continue;
    const int bin = std::min(3, pool_.live_count(b) * 4 / block_size());
    ++s.utilization_hist[bin];
  }
  for (const auto& [seq, tables] : tables_) {
    for (const TokenTable& table : tables) {
      s.ideal_blocks += (table.num_live() + block_size() - 1) / block_size();
      s.held_blocks += table.num_blocks();
    }
  }
  s.num_seqs = static_cast<int32_t>(tables_.size());
  return s;
}

CacheSnapshot VirtualKvCache::PoolSnapshot() const {
  CacheSnapshot snap;
  snap.version = version_;
  snap.block_size = block_size();
  snap.num_blocks = pool_.num_blocks();
  snap.num_free_blocks = pool_.num_free_blocks();
  snap.headroom_blocks = pool_.headroom_blocks();
  snap.allocated_blocks = pool_.num_allocated_blocks();
  snap.live_slots = pool_.num_live_slots();
  return snap;
}

CacheSnapshot VirtualKvCache::Snapshot() const {
  CacheSnapshot snap = PoolSnapshot();
  std::vector<BlockSnapshot> scratch;
  snap.seqs.reserve(tables_.size() * static_cast<size_t>(num_groups()));
  for (const auto& [seq, tables] : tables_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const TokenTable& table = tables[g];
      SeqSnapshot ss{.seq = seq, .num_live = table.num_live(), .blocks = {}, .group = g};
      ss.blocks.reserve(table.num_blocks());
      const std::vector<BlockId>& blocks = table.blocks();
      for (size_t i = 0; i < blocks.size(); ++i) {
        const BlockId b = blocks[i];
        ss.blocks.push_back(BlockSnapshot{.block = b,
                                          .live = table.live_at(i),
                                          .refcount = pool_.refcount(b),
                                          .is_tail = b == table.tail_block(),
                                          .busy = pool_.pinned(b)});
      }
      SortByBlock(ss.blocks, scratch);
      snap.seqs.push_back(std::move(ss));
    }
  }
  return snap;
}

ReclaimPlan VirtualKvCache::PlanReclaim(const ReclaimPlanner& planner) const {
  const CacheSnapshot pool = PoolSnapshot();
  if (!planner.Triggered(pool)) {
    ReclaimPlan none;
    none.snapshot_version = pool.version;
    return none;
  }
  const int32_t bs = block_size();
  // A candidate as the planner defines it: private, settled, not the open tail, not full. The
  // pool is asked only when it has shared or pinned blocks at all (a lookup per block is most of
  // the cost of this pass).
  const bool look_up = pool_.num_shared_blocks() > 0 || pool_.num_pinned_blocks() > 0;
  const auto movable = [&](const TokenTable& t, size_t i) {
    const BlockId b = t.blocks()[i];
    return t.live_at(i) < bs && b != t.tail_block() &&
           (!look_up || (pool_.refcount(b) == 1 && !pool_.pinned(b)));
  };
  std::vector<ReclaimPlanner::GroupHistogram> histograms;
  std::vector<const TokenTable*> tables;
  std::vector<int32_t> counts;
  for (const auto& [seq, group_tables] : tables_) {
    for (int32_t g = 0; g < num_groups(); ++g) {
      const TokenTable& t = group_tables[g];
#if defined(__GNUC__)
      // With many small tables (per-head groups) the pass waits on memory for each table's
      // arrays: ask for the ones two tables ahead meanwhile.
      if (g + 2 < num_groups()) {
        __builtin_prefetch(group_tables[g + 2].blocks().data());
        __builtin_prefetch(group_tables[g + 2].block_live().data());
      }
#endif
      if (int64_t{t.num_blocks()} * bs - t.num_live() < bs) continue;
      const size_t offset = counts.size();
      counts.resize(offset + static_cast<size_t>(bs), 0);
      for (size_t i = 0; i < t.blocks().size(); ++i) {
        if (movable(t, i)) ++counts[offset + t.live_at(i)];
      }
      histograms.push_back({.seq = seq, .group = g, .offset = offset});
      tables.push_back(&t);
    }
  }
  return planner.PlanFromHistograms(
      pool, histograms, counts,
      [&](size_t index, int32_t max_live, std::vector<std::pair<int32_t, BlockId>>& out) {
        const TokenTable& t = *tables[index];
        for (size_t i = 0; i < t.blocks().size(); ++i) {
          if (movable(t, i) && t.live_at(i) <= max_live) out.emplace_back(t.live_at(i), t.blocks()[i]);
        }
      });
}

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
                           std::to_string(pool_.refcount(b)) + " != " +
                           std::to_string(holders[b]) + " holding sequences");
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
      if (!pool_.pinned(b)) return InternalError("in-flight block " + std::to_string(b) +
                                                 " is not pinned");
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
