#include "lib/core/reclaim_planner.h"

#include <algorithm>
#include <cassert>

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
  std::vector<const BlockSnapshot*> blocks;  // Movable blocks, sparsest first.
  SeqPlan plan;                              // Best plan without budget limits.
  int64_t waste = 0;  // Empty slots in the planned blocks: what repacking recovers.
};

// Movable blocks of `seq` ordered by live count, then block id (snapshot blocks are sorted by id,
// and a counting sort over live counts keeps that order): O(blocks + block_size).
std::vector<const BlockSnapshot*> SortedCandidates(const SeqSnapshot& seq, int32_t block_size,
                                                   std::vector<int32_t>& counts) {
  counts.assign(block_size + 1, 0);
  int32_t total = 0;
  for (const BlockSnapshot& b : seq.blocks) {
    if (b.refcount == 1 && !b.is_tail && !b.busy && b.live < block_size) {
      ++counts[b.live + 1];
      ++total;
    }
  }
  for (int32_t i = 1; i <= block_size; ++i) counts[i] += counts[i - 1];
  std::vector<const BlockSnapshot*> sorted(total);
  for (const BlockSnapshot& b : seq.blocks) {
    if (b.refcount == 1 && !b.is_tail && !b.busy && b.live < block_size) {
      sorted[counts[b.live]++] = &b;
    }
  }
  return sorted;
}

// Best plan over the sparsest-first prefix within `max_moves` moves and `max_dst` destinations.
SeqPlan BestPrefix(const SeqSnapshot& seq, const std::vector<const BlockSnapshot*>& blocks,
                   int32_t block_size, int64_t max_moves, int64_t max_dst) {
  int64_t live = 0;
  int64_t best_gain = 0;
  size_t best_k = 0;
  for (size_t k = 1; k <= blocks.size(); ++k) {
    live += blocks[k - 1]->live;
    if (live > max_moves) break;
    const int64_t dst = (live + block_size - 1) / block_size;
    if (dst > max_dst) break;
    const int64_t gain = static_cast<int64_t>(k) - dst;
    if (gain > best_gain) {
      best_gain = gain;
      best_k = k;
    }
  }
  SeqPlan plan{
      .seq = seq.seq, .src_blocks = {}, .num_moves = 0, .num_dst_blocks = 0, .group = seq.group};
  if (best_gain <= 0) return plan;
  plan.src_blocks.reserve(best_k);
  for (size_t i = 0; i < best_k; ++i) {
    plan.src_blocks.push_back(blocks[i]->block);
    plan.num_moves += blocks[i]->live;
  }
  plan.num_dst_blocks = static_cast<int32_t>((plan.num_moves + block_size - 1) / block_size);
  return plan;
}

}  // namespace

ReclaimPlan ReclaimPlanner::Plan(const CacheSnapshot& snap) const {
  ReclaimPlan plan;
  plan.snapshot_version = snap.version;
  if (!Triggered(snap)) return plan;
  const int32_t bs = snap.block_size;
  // Rank sequences by the waste their unbounded plan recovers.
  std::vector<Candidate> ranked;
  std::vector<int32_t> counts;
  for (const SeqSnapshot& seq : snap.seqs) {
    Candidate c;
    c.seq = &seq;
    c.blocks = SortedCandidates(seq, bs, counts);
    c.plan = BestPrefix(seq, c.blocks, bs, INT64_MAX, INT64_MAX);
    if (c.plan.src_blocks.empty()) continue;
    c.waste = int64_t{bs} * static_cast<int64_t>(c.plan.src_blocks.size()) - c.plan.num_moves;
    ranked.push_back(std::move(c));
  }
  std::sort(ranked.begin(), ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.waste != b.waste) return a.waste > b.waste;
    return a.plan.seq != b.plan.seq ? a.plan.seq < b.plan.seq : a.plan.group < b.plan.group;
  });
  int64_t moves_left = options_.max_moves_per_step;
  int64_t dst_left = snap.num_free_blocks;
  for (Candidate& c : ranked) {
    if (moves_left <= 0 || dst_left <= 0) break;
    SeqPlan p = std::move(c.plan);
    if (p.num_moves > moves_left || p.num_dst_blocks > dst_left) {
      p = BestPrefix(*c.seq, c.blocks, bs, moves_left, dst_left);
      if (p.src_blocks.empty()) continue;
    }
    moves_left -= p.num_moves;
    dst_left -= p.num_dst_blocks;
    plan.num_moves += p.num_moves;
    plan.num_src_blocks += static_cast<int32_t>(p.src_blocks.size());
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
