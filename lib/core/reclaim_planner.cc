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

bool Movable(const BlockSnapshot& b, int32_t block_size) {
  return b.refcount == 1 && !b.is_tail && !b.busy && b.live < block_size;
}

// A sparsest-first prefix of a (sequence, group)'s candidates: k blocks with `moves` live tokens;
// the k-th holds `threshold` live tokens, and `at_threshold` of the k hold that many.
struct Prefix {
  int64_t k = 0;
  int64_t moves = 0;
  int32_t threshold = 0;
  int64_t at_threshold = 0;
};

// The best sparsest-first prefix within `max_moves` moves and `max_dst` destinations, from the
// live-count histogram `counts` [block_size]: the k that frees the most blocks, fewest moves on
// ties; k = 0 when none frees a block. Adding a block (it holds < block_size tokens) raises the
// destinations ceil(live / block_size) by at most one, so the gain k - destinations never
// drops: the best prefix is the shortest one with the longest feasible prefix's gain.
// O(block_size + log blocks).
Prefix BestPrefix(const int32_t* counts, int32_t block_size, int64_t max_moves, int64_t max_dst) {
  const int64_t bs = block_size;
  const int64_t limit = std::min(max_moves, max_dst >= INT64_MAX / bs ? INT64_MAX : max_dst * bs);
  int64_t k = 0, live = 0;
  for (int32_t v = 0; v < block_size; ++v) {
    const int64_t n = counts[v];
    const int64_t take = v == 0 ? n : std::min(n, (limit - live) / v);
    k += take;
    live += take * v;
    if (take < n) break;
  }
  const int64_t best = k - (live + bs - 1) / bs;
  if (best <= 0) return {};
  int64_t k0 = 0, live0 = 0;
  for (int32_t v = 0; v < block_size; ++v) {
    const int64_t n = counts[v];
    if (n == 0) continue;
    const auto gain = [&](int64_t j) { return k0 + j - (live0 + j * v + bs - 1) / bs; };
    if (gain(n) >= best) {
      int64_t lo = 1, hi = n;  // The first j with gain(j) >= best.
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (gain(mid) >= best) {
          hi = mid;
        } else {
          lo = mid + 1;
        }
      }
      return {k0 + lo, live0 + lo * v, v, lo};
    }
    k0 += n;
    live0 += n * v;
  }
  assert(false && "the longest feasible prefix reaches the best gain");
  return {};
}

// Sorts (live, block) pairs with live <= max_live by live, then block: a stable counting sort
// over the live counts when the blocks come in id order (a snapshot's do), else a comparison sort.
void SortByLiveThenBlock(std::vector<std::pair<int32_t, BlockId>>& blocks, int32_t max_live,
                         std::vector<std::pair<int32_t, BlockId>>& scratch) {
  const auto by_block = [](const auto& a, const auto& b) { return a.second < b.second; };
  if (!std::is_sorted(blocks.begin(), blocks.end(), by_block)) {
    std::sort(blocks.begin(), blocks.end());
    return;
  }
  std::vector<size_t> starts(static_cast<size_t>(max_live) + 2, 0);
  for (const auto& b : blocks) ++starts[static_cast<size_t>(b.first) + 1];
  for (size_t v = 1; v < starts.size(); ++v) starts[v] += starts[v - 1];
  scratch.resize(blocks.size());
  for (const auto& b : blocks) scratch[starts[static_cast<size_t>(b.first)]++] = b;
  blocks.swap(scratch);
}

}  // namespace

ReclaimPlan ReclaimPlanner::Plan(const CacheSnapshot& snap) const {
  if (!Triggered(snap)) {
    ReclaimPlan none;
    none.snapshot_version = snap.version;
    return none;
  }
  const int32_t bs = snap.block_size;
  std::vector<GroupHistogram> histograms(snap.seqs.size());
  std::vector<int32_t> counts(snap.seqs.size() * static_cast<size_t>(bs), 0);
  for (size_t i = 0; i < snap.seqs.size(); ++i) {
    histograms[i] = {.seq = snap.seqs[i].seq, .group = snap.seqs[i].group, .offset = i * bs};
    for (const BlockSnapshot& b : snap.seqs[i].blocks) {
      if (Movable(b, bs)) ++counts[histograms[i].offset + b.live];
    }
  }
  return PlanFromHistograms(
      snap, histograms, counts,
      [&](size_t i, int32_t max_live, std::vector<std::pair<int32_t, BlockId>>& out) {
        for (const BlockSnapshot& b : snap.seqs[i].blocks) {
          if (Movable(b, bs) && b.live <= max_live) out.emplace_back(b.live, b.block);
        }
      });
}

ReclaimPlan ReclaimPlanner::PlanFromHistograms(const CacheSnapshot& pool,
                                               const std::vector<GroupHistogram>& histograms,
                                               const std::vector<int32_t>& counts,
                                               const CandidateLister& list) const {
  ReclaimPlan plan;
  plan.snapshot_version = pool.version;
  if (!Triggered(pool)) return plan;
  const int32_t bs = pool.block_size;
  // Rank (sequence, group)s by the waste their unbounded plan recovers.
  struct Candidate {
    const GroupHistogram* group;
    Prefix best;
    int64_t waste;  // Empty slots in the planned blocks: what repacking recovers.
  };
  std::vector<Candidate> ranked;
  for (const GroupHistogram& h : histograms) {
    const Prefix best = BestPrefix(&counts[h.offset], bs, INT64_MAX, INT64_MAX);
    if (best.k > 0) ranked.push_back({&h, best, int64_t{bs} * best.k - best.moves});
  }
  // Most waste first, then seq and group. A heap: the budget usually ends after a few of the
  // (sequence, group)s, so only those are ordered.
  const auto after = [](const Candidate& a, const Candidate& b) {
    if (a.waste != b.waste) return a.waste < b.waste;
    if (a.group->seq != b.group->seq) return a.group->seq > b.group->seq;
    return a.group->group > b.group->group;
  };
  std::make_heap(ranked.begin(), ranked.end(), after);
  int64_t moves_left = options_.max_moves_per_step;
  int64_t dst_left = pool.num_free_blocks;
  std::vector<std::pair<int32_t, BlockId>> blocks, sorted;
  for (auto heap_end = ranked.end(); heap_end != ranked.begin(); --heap_end) {
    if (moves_left <= 0 || dst_left <= 0) break;
    std::pop_heap(ranked.begin(), heap_end, after);
    const Candidate& c = *(heap_end - 1);
    Prefix p = c.best;
    if (p.moves > moves_left || (p.moves + bs - 1) / bs > dst_left) {
      p = BestPrefix(&counts[c.group->offset], bs, moves_left, dst_left);
      if (p.k == 0) continue;
    }
    const int64_t dst = (p.moves + bs - 1) / bs;
    // The k sparsest candidates, lowest block ids first among equally live ones.
    blocks.clear();
    list(static_cast<size_t>(c.group - histograms.data()), p.threshold, blocks);
    assert(static_cast<int64_t>(blocks.size()) >= p.k);
    SortByLiveThenBlock(blocks, p.threshold, sorted);
    SeqPlan sp{.seq = c.group->seq,
               .src_blocks = {},
               .num_moves = p.moves,
               .num_dst_blocks = static_cast<int32_t>(dst),
               .group = c.group->group};
    sp.src_blocks.reserve(static_cast<size_t>(p.k));
    for (int64_t i = 0; i < p.k; ++i) sp.src_blocks.push_back(blocks[i].second);
    moves_left -= p.moves;
    dst_left -= dst;
    plan.num_moves += p.moves;
    plan.num_src_blocks += static_cast<int32_t>(p.k);
    plan.num_dst_blocks += sp.num_dst_blocks;
    plan.seqs.push_back(std::move(sp));
  }
  std::sort(plan.seqs.begin(), plan.seqs.end(), [](const SeqPlan& a, const SeqPlan& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.group < b.group;
  });
  return plan;
}

}  // namespace vtoken
