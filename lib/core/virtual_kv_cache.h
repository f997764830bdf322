// VirtualKvCache: the token-level virtualization layer over a paged KV cache. It owns the block
// pool and every sequence's token table, and offers the paper's three calls:
//   EvictToken(seq, token)  logical eviction, no data movement;
//   SyncNewTokens(seq, n)   registers n new tokens and returns the slots to write their KV to;
//   ApplyMoves(seq, moves)  commits a relocation atomically.
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
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "lib/core/block_pool.h"
#include "lib/core/reclaim_plan.h"
#include "lib/core/status.h"
#include "lib/core/token_table.h"
#include "lib/core/types.h"

namespace vtoken {

struct CacheOptions {
  Mode mode = Mode::kVtoken;
  BlockPoolOptions pool;
};

Status ValidateCacheOptions(const CacheOptions& options);

// Fragmentation statistics (docs/METRICS.md).
struct FragStats {
  int32_t block_size = 0;
  int64_t allocated_blocks = 0;  // Blocks not free (held or pinned by a copy).
  int64_t live_slots = 0;        // Slots read by at least one live token.
  double waste_ratio = 0;        // F = 1 - live_slots / (allocated_blocks * block_size).
  // Allocated blocks by utilization: [0,25), [25,50), [50,75), [75,100] percent.
  std::array<int64_t, 4> utilization_hist{};
  int64_t ideal_blocks = 0;      // Sum over sequences of ceil(live / block_size).
  int64_t held_blocks = 0;       // Sum over sequences of blocks held (shared counted per holder).
  int32_t num_seqs = 0;
};

// A relocation in flight, returned by BeginRelocation.
struct SeqRelocation {
  SeqId seq = kNoSeq;
  std::vector<Move> moves;          // In logical token order.
  std::vector<BlockId> src_blocks;
  std::vector<BlockId> dst_blocks;
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
  const BlockPool& pool() const { return pool_; }
  int32_t block_size() const { return pool_.block_size(); }
  // Increases on every mutation; plans made from an older version are refused.
  uint64_t version() const { return version_; }

  // Creates an empty sequence.
  SeqId AddSequence();
  // Creates a sequence whose first `num_tokens` tokens are the parent's (same liveness). Blocks
  // holding only parent tokens < num_tokens, other than the parent's open tail, are shared
  // (refcount + 1); the remaining prefix tokens get fresh slots, listed in ForkResult::copies.
  // Returns NotFound for an unknown parent, InvalidArgument when num_tokens exceeds its length,
  // ResourceExhausted when no block is left for the copied tokens (then nothing changed).
  StatusOr<ForkResult> ForkSequence(SeqId parent, int64_t num_tokens);
  // Drops the sequence and its references to blocks. NotFound for an unknown seq.
  Status FreeSequence(SeqId seq);

  // Registers n new tokens (logical ids num_tokens(seq) ...) and returns their slots, appending
  // into the open tail block and allocating blocks as needed. ResourceExhausted when the pool
  // cannot supply enough blocks (then nothing changed).
  StatusOr<std::vector<SlotIndex>> SyncNewTokens(SeqId seq, int64_t n);
  // Marks a live token dead. In naive and vtoken modes a block this sequence no longer reads is
  // released at once. FailedPrecondition in native mode or for a dead token; NotFound for an
  // unknown seq or token.
  Status EvictToken(SeqId seq, TokenId token);

  // Relocation, see the file comment. BeginRelocation returns FailedPrecondition for a stale plan
  // or a plan naming a block it may not move, ResourceExhausted when destination blocks cannot be
  // allocated (then nothing changed), and an empty relocation for an empty plan.
  StatusOr<Relocation> BeginRelocation(const ReclaimPlan& plan);
  // Commits moves of one sequence of a begun relocation, atomically: either every move is valid
  // (token live at src, dst reserved for this seq) and all apply, or none does. Moves of tokens
  // evicted since BeginRelocation must be left out (see LiveMoves).
  Status ApplyMoves(SeqId seq, std::span<const Move> moves);
  // The moves of `rel` for `seq` whose tokens are still live at their source.
  std::vector<Move> LiveMoves(const SeqRelocation& rel) const;
  // Marks the copies of relocation `id` complete. NotFound for an unknown id.
  Status CompleteRelocation(uint64_t id);
  bool IsSlotPending(SlotIndex slot) const { return pending_slots_.count(slot) > 0; }
  // True when one of seq's live slots awaits a copy.
  bool HasPendingReads(SeqId seq) const;
  // Relocations begun and not completed, oldest first.
  std::vector<uint64_t> InFlightRelocations() const;

  bool HasSequence(SeqId seq) const { return tables_.count(seq) > 0; }
  // REQUIRES: HasSequence(seq).
  const TokenTable& table(SeqId seq) const { return *tables_.at(seq); }
  int64_t num_tokens(SeqId seq) const { return table(seq).num_tokens(); }
  int64_t num_live(SeqId seq) const { return table(seq).num_live(); }
  int32_t num_blocks_held(SeqId seq) const { return table(seq).num_blocks(); }
  // Live slots in logical order (what attention reads). REQUIRES: HasSequence(seq).
  std::vector<SlotIndex> LiveSlots(SeqId seq) const { return table(seq).LiveSlots(); }
  std::vector<SeqId> Sequences() const;
  // Blocks a sequence needs allocated to append n tokens.
  int32_t BlocksNeededFor(SeqId seq, int64_t n) const;

  FragStats Stats() const;
  // The pool-level fields of Snapshot() only (seqs empty): O(1), enough for
  // ReclaimPlanner::Triggered.
  CacheSnapshot PoolSnapshot() const;
  CacheSnapshot Snapshot() const;

  // Checks DESIGN.md §4's invariants over the whole cache: conservation, unique mapping,
  // read-after-copy (pinned / pending state), pool consistency. Internal error on a breach.
  Status CheckInvariants() const;

 private:
  struct InFlight {
    std::vector<BlockId> pinned_blocks;  // Sources and destinations, pinned until complete.
    std::vector<SlotIndex> dst_slots;    // Pending until complete.
  };

  StatusOr<TokenTable*> MutableTable(SeqId seq);
  // Drops seq's hold on `block` (after its last live token there left).
  void ReleaseBlock(TokenTable& table, BlockId block);

  CacheOptions options_;
  BlockPool pool_;
  std::map<SeqId, std::unique_ptr<TokenTable>> tables_;
  SeqId next_seq_ = 0;
  uint64_t version_ = 0;
  uint64_t next_relocation_ = 1;
  std::map<uint64_t, InFlight> in_flight_;
  std::unordered_map<SlotIndex, SeqId> pending_slots_;  // Destination slot -> reserving seq.
};

}  // namespace vtoken
