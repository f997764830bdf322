#include "lib/core/reclaim_planner.h"

#include <algorithm>
#include <cassert>
#include <tuple>
#include <utility>
#include <vector>

namespace vtoken {

Status ValidateReclaimOptions(const ReclaimOptions& o) {
  if (!(o.frag_threshold >= 0.0 && o.frag_threshold < 1.0)) {
    return InvalidArgumentError("frag_threshold must be in [0, 1), got " +
                                std::to_string(o.frag_threshold));
  }
  if (!(o.low_watermark > 0.0 && o.low_watermark <= 1.0)) {
    return InvalidArgumentError("low_watermark must be in (0, 1], got " +
                                std::to_string(o.low_watermark));
  }
  if (o.max_moves_per_step < 1) {
    return InvalidArgumentError("max_moves_per_step must be >= 1, got " +
                                std::to_string(o.max_moves_per_step));
  }
  return Status::Ok();
}

StatusOr<ReclaimOptions::Trigger> ParseTrigger(const std::string& name) {
  if (name == "pressure") return ReclaimOptions::Trigger::kPressure;
  if (name == "always") return ReclaimOptions::Trigger::kAlways;
  return InvalidArgumentError("unknown trigger '" + name + "' (expected pressure or always)");
}

ReclaimPlanner::ReclaimPlanner(const ReclaimOptions& options) : options_(options) {
  assert(ValidateReclaimOptions(options).ok());
}

bool ReclaimPlanner::Triggered(const CacheSnapshot& snap) const {
  if (options_.trigger == ReclaimOptions::Trigger::kAlways) return true;
  if (snap.allocated_blocks == 0 || snap.num_blocks == 0) return false;
  const double waste = 1.0 - static_cast<double>(snap.live_slots) /
                                 (static_cast<double>(snap.allocated_blocks) * snap.block_size);
  const double free_fraction = static_cast<double>(snap.num_free_blocks) / snap.num_blocks;
  return waste > options_.frag_threshold && free_fraction < options_.low_watermark;
}

namespace {

struct Candidate {
  const SeqSnapshot* seq = nullptr;
  size_t begin = 0, end = 0;  // Its movable blocks in the flat array, sparsest first.
  size_t k = 0;               // Best prefix without budget limits: k blocks, `moves` tokens.
  int64_t moves = 0;
  int64_t waste = 0;  // Empty slots in the planned blocks: what repacking recovers.
};

bool Movable(const BlockSnapshot& b, int32_t block_size) {
  return b.refcount == 1 && !b.is_tail && !b.busy && b.live < block_size;
}

// Appends the movable blocks of `seq` to `flat`, ordered by live count, then block id (snapshot
// blocks are sorted by id, and a counting sort over live counts keeps that order):
// O(blocks + block_size).
void SortCandidates(const SeqSnapshot& seq, int32_t block_size, std::vector<int32_t>& counts,
                    std::vector<const BlockSnapshot*>& flat) {
  counts.assign(block_size + 1, 0);
  int32_t total = 0;
  for (const BlockSnapshot& b : seq.blocks) {
    if (Movable(b, block_size)) {
      ++counts[b.live + 1];
      ++total;
    }
  }
  for (int32_t i = 1; i <= block_size; ++i) counts[i] += counts[i - 1];
  const size_t base = flat.size();
  flat.resize(base + static_cast<size_t>(total));
  for (const BlockSnapshot& b : seq.blocks) {
    if (Movable(b, block_size)) flat[base + counts[b.live]++] = &b;
  }
}

// The best sparsest-first prefix [begin, begin + k) within `max_moves` moves and `max_dst`
// destinations: the k that frees the most blocks (fewest moves on ties); k = 0 when none frees
// a block.
std::pair<size_t, int64_t> BestPrefix(const std::vector<const BlockSnapshot*>& flat, size_t begin,
                                      size_t end, int32_t block_size, int64_t max_moves,
                                      int64_t max_dst) {
  int64_t live = 0, best_gain = 0, best_moves = 0;
  int64_t dst = 0, room = 0;  // dst = ceil(live / block_size), kept without a division.
  size_t best_k = 0;
  for (size_t k = 1; begin + k <= end; ++k) {
    live += flat[begin + k - 1]->live;
    if (live > max_moves) break;
    while (live > room) {
      ++dst;
      room += block_size;
    }
    if (dst > max_dst) break;
    const int64_t gain = static_cast<int64_t>(k) - dst;
    if (gain > best_gain) {
      best_gain = gain;
      best_k = k;
      best_moves = live;
    }
  }
  return {best_k, best_moves};
}

}  // namespace

ReclaimPlan ReclaimPlanner::Plan(const CacheSnapshot& snap) const {
  ReclaimPlan plan;
  plan.snapshot_version = snap.version;
  if (!Triggered(snap)) return plan;
  const int32_t bs = snap.block_size;
  // Rank (sequence, group)s by the waste their unbounded plan recovers.
  std::vector<const BlockSnapshot*> flat;
  flat.reserve(static_cast<size_t>(snap.allocated_blocks));
  std::vector<Candidate> ranked;
  std::vector<int32_t> counts;
  for (const SeqSnapshot& seq : snap.seqs) {
    Candidate c;
    c.seq = &seq;
    c.begin = flat.size();
    SortCandidates(seq, bs, counts, flat);
    c.end = flat.size();
    std::tie(c.k, c.moves) = BestPrefix(flat, c.begin, c.end, bs, INT64_MAX, INT64_MAX);
    if (c.k == 0) {
      flat.resize(c.begin);
      continue;
    }
    c.waste = int64_t{bs} * static_cast<int64_t>(c.k) - c.moves;
    ranked.push_back(c);
  }
  // Most waste first, then seq and group. A heap: the budget usually ends after a few of the
  // (sequence, group)s, so only those are ordered.
  const auto after = [](const Candidate& a, const Candidate& b) {
    if (a.waste != b.waste) return a.waste < b.waste;
    if (a.seq->seq != b.seq->seq) return a.seq->seq > b.seq->seq;
    return a.seq->group > b.seq->group;
  };
  std::make_heap(ranked.begin(), ranked.end(), after);
  int64_t moves_left = options_.max_moves_per_step;
  int64_t dst_left = snap.num_free_blocks;
  for (auto heap_end = ranked.end(); heap_end != ranked.begin(); --heap_end) {
    if (moves_left <= 0 || dst_left <= 0) break;
    std::pop_heap(ranked.begin(), heap_end, after);
    const Candidate& c = *(heap_end - 1);
    size_t k = c.k;
    int64_t moves = c.moves;
    int64_t dst = (moves + bs - 1) / bs;
    if (moves > moves_left || dst > dst_left) {
      std::tie(k, moves) = BestPrefix(flat, c.begin, c.end, bs, moves_left, dst_left);
      if (k == 0) continue;
      dst = (moves + bs - 1) / bs;
    }
    SeqPlan p{.seq = c.seq->seq,
              .src_blocks = {},
              .num_moves = moves,
              .num_dst_blocks = static_cast<int32_t>(dst),
              .group = c.seq->group};
    p.src_blocks.reserve(k);
    for (size_t i = 0; i < k; ++i) p.src_blocks.push_back(flat[c.begin + i]->block);
    moves_left -= moves;
    dst_left -= dst;
    plan.num_moves += moves;
    plan.num_src_blocks += static_cast<int32_t>(k);
    plan.num_dst_blocks += p.num_dst_blocks;
    plan.seqs.push_back(std::move(p));
  }
  std::sort(plan.seqs.begin(), plan.seqs.end(),
            [](const SeqPlan& a, const SeqPlan& b) {
              return a.seq != b.seq ? a.seq < b.seq : a.group < b.group;
            });
  return plan;
}

}  // namespace vtoken
