// VirtualKvCache: the token-level virtualization layer over a paged KV cache. It owns the block
// pool and every sequence's token tables, and offers the paper's three calls:
//   EvictToken(seq, token)  logical eviction, no data movement;
//   SyncNewTokens(seq, n)   registers n new tokens and returns the slots to write their KV to;
//   ApplyMoves(seq, moves)  commits a relocation atomically.
// KV groups (CacheOptions::num_groups, see Granularity in types.h): a sequence has one token
// table per group (one liveness bit per token and group); a pool block holds slots of one group of
// one sequence (or of one group shared by forked sequences). Every group of a sequence receives
// every new token; eviction, relocation, statistics and invariants are per group. With one group
// (token granularity) everything below is the paper's model.
// Relocation runs in three steps so that copies can overlap compute:
//   BeginRelocation(plan)   validates the plan against the current version, allocates destination
//                           blocks (may use the headroom reserve), pins source blocks and marks
//                           destination slots pending; the table is unchanged;
//   ApplyMoves(seq, moves)  points the tokens at their destinations (right after the copies were
//                           submitted); source blocks leave the sequence but stay pinned;
//   CompleteRelocation(id)  after the copies finished: unpins sources (they return to the pool)
//                           and clears the pending marks, so the destinations may be read.
// Readers must not read a pending slot (IsSlotPending / HasPendingReads tell when to wait).
//
// Not thread-safe: called from the scheduler thread only. Copy engines touch KV bytes, never
// this object.
//
// Defined by concept: virtual_kv_cache.cc (sequence life cycle, eviction), kv_cache_relocation.cc
// (the relocation steps), kv_cache_stats.cc (Stats, snapshots), kv_cache_reclaim_scan.cc
// (PlanReclaim), kv_cache_invariants.cc (CheckInvariants).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/core/block_pool.h"
#include "lib/core/kv_cache_stats.h"
#include "lib/core/reclaim_plan.h"
#include "lib/core/reclaim_planner.h"
#include "lib/core/status.h"
#include "lib/core/token_table.h"
#include "lib/core/types.h"

namespace vtoken {

struct CacheOptions {
  Mode mode = Mode::kVtoken;
  BlockPoolOptions pool;  // Blocks of group slots, shared by every group.
  // KV groups per sequence, in [1, kMaxKvGroups]: 1 (token), L (layer) or L * H_kv (head).
  int32_t num_groups = 1;
};

inline constexpr int32_t kMaxKvGroups = 1 << 16;

Status ValidateCacheOptions(const CacheOptions& options);

// A relocation in flight, returned by BeginRelocation: one entry per (sequence, group).
struct SeqRelocation {
  SeqId seq = kNoSeq;
  std::vector<Move> moves;  // In logical token order.
  std::vector<BlockId> src_blocks;
  std::vector<BlockId> dst_blocks;
  int32_t group = 0;
};

struct Relocation {
  uint64_t id = 0;
  std::vector<SeqRelocation> seqs;
  int64_t num_moves() const;
  // Every move's slot copy, for a CopyEngine.
  std::vector<SlotCopy> Copies() const;
};

// Result of forking a sequence: the child shares the parent's full prefix blocks; prefix tokens
// in blocks it cannot share were given fresh slots, whose bytes the caller must copy.
struct ForkResult {
  SeqId child = kNoSeq;
  std::vector<SlotCopy> copies;
};

class VirtualKvCache {
 public:
  // REQUIRES: ValidateCacheOptions(options).ok().
  explicit VirtualKvCache(const CacheOptions& options);

  Mode mode() const { return options_.mode; }
  int32_t num_groups() const { return options_.num_groups; }
  const BlockPool& pool() const { return pool_; }
  int32_t block_size() const { return pool_.block_size(); }
  // Increases on every mutation; plans made from an older version are refused.
  uint64_t version() const { return version_; }

  // Creates an empty sequence.
  SeqId AddSequence();
  // Creates a sequence whose first `num_tokens` tokens are the parent's (same liveness, per
  // group). Blocks holding only parent tokens < num_tokens, other than the parent's open tail,
  // are shared (refcount + 1); the remaining prefix tokens get fresh slots, listed in
  // ForkResult::copies.
  // Returns NotFound for an unknown parent, InvalidArgument when num_tokens exceeds its length,
  // ResourceExhausted when no block is left for the copied tokens (then nothing changed).
  StatusOr<ForkResult> ForkSequence(SeqId parent, int64_t num_tokens);
  // Capacity hint: `seq` will hold up to n logical tokens; sizes every group's table once, so a
  // per-head table carries no growth slack (the engine calls it at admission). No-op for an
  // unknown seq or n below the current length.
  void ReserveTokens(SeqId seq, int64_t n);
  // Drops the sequence and its references to blocks. NotFound for an unknown seq.
  Status FreeSequence(SeqId seq);

  // Registers n new tokens (logical ids num_tokens(seq) ...) in every group and returns their
  // slots, group-major ([num_groups * n]: group g's at [g * n, (g + 1) * n)), appending into each
  // group's open tail block and allocating blocks as needed. ResourceExhausted when the pool
  // cannot supply enough blocks (then nothing changed).
  StatusOr<std::vector<SlotIndex>> SyncNewTokens(SeqId seq, int64_t n);
  // Marks a live token of one group dead. In naive and vtoken modes a block this sequence no
  // longer reads is released at once. FailedPrecondition in native mode or for a dead token;
  // NotFound for an unknown seq, group or token.
  Status EvictToken(SeqId seq, int32_t group, TokenId token);
  // Marks the token dead in every group where it is live (one group: the paper's call).
  // FailedPrecondition when it is live in none.
  Status EvictToken(SeqId seq, TokenId token);

  // Relocation, see the file comment. BeginRelocation returns FailedPrecondition for a stale plan
  // or a plan naming a block it may not move, ResourceExhausted when destination blocks cannot be
  // allocated (then nothing changed), and an empty relocation for an empty plan.
  StatusOr<Relocation> BeginRelocation(const ReclaimPlan& plan);
  // Commits moves of one sequence's group of a begun relocation, atomically: either every move is
  // valid (token live at src, dst reserved for this seq and group) and all apply, or none does.
  // Moves of tokens evicted since BeginRelocation must be left out (see LiveMoves).
  Status ApplyMoves(SeqId seq, std::span<const Move> moves, int32_t group = 0);
  // The moves of `rel` for its sequence and group whose tokens are still live at their source.
  std::vector<Move> LiveMoves(const SeqRelocation& rel) const;
  // Marks the copies of relocation `id` complete. NotFound for an unknown id.
  Status CompleteRelocation(uint64_t id);
  bool IsSlotPending(SlotIndex slot) const { return pending_slots_.count(slot) > 0; }
  // True when one of seq's live slots awaits a copy.
  bool HasPendingReads(SeqId seq) const;
  // The newest in-flight relocation (ids increase) whose pending destination `seq` reads (its own
  // moved tokens, or a forked block shared with the relocated sequence); 0 when none.
  uint64_t NewestPendingRead(SeqId seq) const;
  // Relocations begun and not completed, oldest first.
  std::vector<uint64_t> InFlightRelocations() const;

  bool HasSequence(SeqId seq) const { return tables_.count(seq) > 0; }
  // REQUIRES: HasSequence(seq), 0 <= group < num_groups().
  const TokenTable& table(SeqId seq, int32_t group = 0) const { return tables_.at(seq)[group]; }
  // Logical tokens (the same in every group).
  int64_t num_tokens(SeqId seq) const { return table(seq).num_tokens(); }
  // Live (token, group) entries, summed over groups.
  int64_t num_live(SeqId seq) const;
  // Blocks held, summed over groups.
  int32_t num_blocks_held(SeqId seq) const;
  // The per-group ideal packed bound: sum over groups of ceil(live / block_size).
  int64_t IdealBlocks(SeqId seq) const;
  // Live slots of one group in logical order (what attention reads). REQUIRES: HasSequence(seq).
  std::vector<SlotIndex> LiveSlots(SeqId seq, int32_t group = 0) const {
    return table(seq, group).LiveSlots();
  }
  std::vector<SeqId> Sequences() const;
  // Blocks a sequence needs allocated to append n tokens (in every group).
  int32_t BlocksNeededFor(SeqId seq, int64_t n) const;
  // Heap bytes of every token table (the indirection's memory cost).
  int64_t TableMemoryBytes() const;

  // Fragmentation statistics (kv_cache_stats.h).
  FragStats Stats() const;
  // The pool-level fields of Snapshot() only (seqs empty): O(1), enough for
  // ReclaimPlanner::Triggered.
  CacheSnapshot PoolSnapshot() const;
  CacheSnapshot Snapshot() const;
  // planner.Plan(Snapshot()), computed from the token tables without a snapshot: one pass over
  // the held blocks into per-(sequence, group) live-count histograms (a table with fewer than
  // block_size empty slots cannot free a block and is skipped), then block ids only for the
  // chosen ones. What the reclaimer runs on every planning step.
  ReclaimPlan PlanReclaim(const ReclaimPlanner& planner) const;

  // Checks DESIGN.md §4's invariants over the whole cache: conservation, unique mapping,
  // read-after-copy (pinned / pending state), pool consistency. Internal error on a breach.
  Status CheckInvariants() const;

 private:
  struct InFlight {
    std::vector<BlockId> pinned_blocks;  // Sources and destinations, pinned until complete.
    std::vector<SlotIndex> dst_slots;    // Pending until complete.
  };

  struct PendingSlot {
    SeqId seq = kNoSeq;
    int32_t group = 0;
    uint64_t relocation = 0;  // The in-flight relocation whose copy writes the slot.
  };

  // "sequence <seq>", as the cache's messages name a sequence.
  static std::string SeqName(SeqId seq);
  StatusOr<std::vector<TokenTable>*> MutableTables(SeqId seq);
  // Drops seq's hold on `block` (after its last live token there left).
  void ReleaseBlock(TokenTable& table, BlockId block);
  // The error EvictToken(seq, group, token) returns (native mode, unknown seq / group / token,
  // a dead token).
  Status EvictError(SeqId seq, int32_t group, TokenId token) const;
  // Kills a live token's entry in `table`, releasing its block when it was the last live one.
  void EvictLive(TokenTable& table, TokenId token);
  Status EvictOne(SeqId seq, int32_t group, TokenId token);
  int32_t BlocksNeeded(const std::vector<TokenTable>& tables, int64_t n) const;

  CacheOptions options_;
  BlockPool pool_;
  std::map<SeqId, std::vector<TokenTable>> tables_;  // One table per group.
  SeqId next_seq_ = 0;
  uint64_t version_ = 0;
  uint64_t next_relocation_ = 1;
  std::map<uint64_t, InFlight> in_flight_;
  std::unordered_map<SlotIndex, PendingSlot> pending_slots_;  // Destination -> reserving group.
};

}  // namespace vtoken
