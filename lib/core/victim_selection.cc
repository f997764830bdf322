// PolicyEvictor's victim selection (policy_evictor.h, "Victim selection"): when a group is due,
// the policy scores its live tokens and the lowest-scoring unprotected ones leave until the budget
// remains; under adaptive allocation a layer's heads share one budget.
#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/budget_allocation.h"
#include "lib/core/policy_evictor.h"

namespace vtoken {

bool PolicyEvictor::Due(const SeqState& s, int64_t keep) const {
  return s.step % options_.evict_interval == 0 && s.evicted_step != s.step &&
         static_cast<int64_t>(s.live.size()) > keep;
}

bool PolicyEvictor::Scored(const std::vector<SeqState>& groups, int32_t g) const {
  if (options_.allocation != BudgetAllocation::kAdaptive) return Due(groups[g], groups[g].budget);
  const int32_t first = g - g % options_.num_kv_heads;
  int64_t live = 0;
  for (int32_t h = first; h < first + options_.num_kv_heads; ++h) {
    const SeqState& s = groups[h];
    if (s.step % options_.evict_interval != 0 || s.evicted_step == s.step) return false;
    live += static_cast<int64_t>(s.live.size());
  }
  return live > groups[first].budget * options_.num_kv_heads;
}

std::vector<float> PolicyEvictor::Score(SeqState& s, int32_t group) {
  s.evicted_step = s.step;
  const std::span<const TokenView> views = Views(s);
  std::vector<float> scores(views.size(), 0.0f);
  PolicyContext ctx{.step = s.step,
                    .budget = s.budget,
                    .rng = s.rng,
                    .group = group,
                    .token_signal_offsets = token_signal_offsets_};
  policy_->Score(views, ctx, scores);
  return scores;
}

std::pair<int64_t, int64_t> PolicyEvictor::Protected(int64_t keep) const {
  // Protection never takes more than the budget: sinks first, then the most recent tokens.
  const int64_t sinks = std::min(options_.num_sink, keep);
  return {sinks, std::min(options_.num_recent, keep - sinks)};
}

std::vector<int64_t> LowestEntries(std::span<const float> scores, int64_t first, int64_t last,
                                   int64_t k) {
  assert(0 <= first && first <= last && last <= static_cast<int64_t>(scores.size()));
  assert(0 <= k && k <= last - first);
  // Each candidate as one integer ordered as the rule orders them: the score's bits mapped to an
  // unsigned order (NaN as -inf, -0 as +0), then the index (older first).
  const auto key = [&](int64_t i) {
    float score = scores[static_cast<size_t>(i)];
    if (std::isnan(score)) score = -std::numeric_limits<float>::infinity();
    if (score == 0) score = 0;  // -0 == +0: the index decides.
    const uint32_t bits = std::bit_cast<uint32_t>(score);
    const uint32_t order = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
    return uint64_t{order} << 32 | static_cast<uint64_t>(i);
  };
  std::vector<int64_t> lowest;
  lowest.reserve(static_cast<size_t>(k));
  constexpr int64_t kFew = 4;  // A decode step's usual victims: one scan, no candidate array.
  if (k == 0) return lowest;
  if (k <= kFew) {
    uint64_t best[kFew];
    int64_t held = 0;
    for (int64_t i = first; i < last; ++i) {
      const uint64_t c = key(i);
      if (held == k && c >= best[k - 1]) continue;
      int64_t j = held < k ? held++ : k - 1;
      for (; j > 0 && best[j - 1] > c; --j) best[j] = best[j - 1];
      best[j] = c;
    }
    for (int64_t j = 0; j < k; ++j) lowest.push_back(static_cast<int64_t>(best[j] & 0xffffffffu));
    std::sort(lowest.begin(), lowest.end());
    return lowest;
  }
  std::vector<uint64_t> candidates;
  candidates.reserve(static_cast<size_t>(last - first));
  for (int64_t i = first; i < last; ++i) candidates.push_back(key(i));
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end());
  // Mark the chosen, then list them in increasing order: O(n), where sorting them is O(k log k)
  // (the prefill's eviction chooses most of the prompt).
  thread_local std::vector<uint8_t> chosen;
  chosen.assign(static_cast<size_t>(last - first), 0);
  for (int64_t j = 0; j < k; ++j) {
    chosen[(candidates[static_cast<size_t>(j)] & 0xffffffffu) - static_cast<uint64_t>(first)] = 1;
  }
  for (int64_t i = first; i < last; ++i) {
    if (chosen[static_cast<size_t>(i - first)] != 0) lowest.push_back(i);
  }
  return lowest;
}

std::vector<TokenId> PolicyEvictor::Pick(SeqState& s, const std::vector<float>& scores,
                                         int64_t keep) const {
  const int64_t n = static_cast<int64_t>(s.live.size());
  if (n <= keep) return {};
  const auto [sinks, recent] = Protected(keep);
  const std::vector<int64_t> doomed = LowestEntries(scores, sinks, n - recent, n - keep);
  std::vector<TokenId> victims;
  victims.reserve(doomed.size());
  for (const int64_t i : doomed) victims.push_back(s.live[static_cast<size_t>(i)]);
  // Drop the victims' entries, keeping the others in order: a decode step's few by moving each
  // array's tail, more in one compacting pass.
  constexpr size_t kFewVictims = 4;
  const size_t ss = static_cast<size_t>(state_size_), nv = width_;
  if (doomed.size() <= kFewVictims) {
    for (auto it = doomed.rbegin(); it != doomed.rend(); ++it) {
      const auto at = static_cast<std::ptrdiff_t>(*it);
      s.live.erase(s.live.begin() + at);
      s.written_step.erase(s.written_step.begin() + at);
      s.attn.erase(s.attn.begin() + at);
      s.attn_sum.erase(s.attn_sum.begin() + at);
      s.key_norm.erase(s.key_norm.begin() + at);
      s.state.erase(s.state.begin() + at * static_cast<std::ptrdiff_t>(ss),
                    s.state.begin() + (at + 1) * static_cast<std::ptrdiff_t>(ss));
      s.token_values.erase(s.token_values.begin() + at * static_cast<std::ptrdiff_t>(nv),
                           s.token_values.begin() + (at + 1) * static_cast<std::ptrdiff_t>(nv));
    }
    return victims;
  }
  int64_t kept = 0;
  size_t next = 0;  // The next victim in `doomed`.
  for (int64_t i = 0; i < n; ++i) {
    if (next < doomed.size() && doomed[next] == i) {
      ++next;
      continue;
    }
    if (kept != i) {
      s.live[kept] = s.live[i];
      s.written_step[kept] = s.written_step[i];
      s.attn[kept] = s.attn[i];
      s.attn_sum[kept] = s.attn_sum[i];
      s.key_norm[kept] = s.key_norm[i];
      std::copy_n(s.state.begin() + static_cast<std::ptrdiff_t>(i * ss), ss,
                  s.state.begin() + static_cast<std::ptrdiff_t>(kept * ss));
      std::copy_n(s.token_values.begin() + static_cast<std::ptrdiff_t>(i * nv), nv,
                  s.token_values.begin() + static_cast<std::ptrdiff_t>(kept * nv));
    }
    ++kept;
  }
  s.live.resize(kept);
  s.written_step.resize(kept);
  s.attn.resize(kept);
  s.attn_sum.resize(kept);
  s.key_norm.resize(kept);
  s.state.resize(kept * ss);
  s.token_values.resize(kept * nv);
  return victims;
}

void PolicyEvictor::AdaptiveLayer(std::vector<SeqState>& groups, int32_t first,
                                  std::vector<std::vector<TokenId>>& victims) {
  const int32_t heads = options_.num_kv_heads;
  const int64_t budget = groups[first].budget;
  int64_t live = 0;
  for (int32_t h = 0; h < heads; ++h) {
    const SeqState& s = groups[first + h];
    if (s.step % options_.evict_interval != 0 || s.evicted_step == s.step) return;
    live += static_cast<int64_t>(s.live.size());
  }
  if (live <= budget * heads) return;
  const auto [sinks, recent] = Protected(budget);
  const int64_t floor = static_cast<int64_t>(options_.adaptive_floor * static_cast<double>(budget));
  std::vector<std::vector<float>> scores(static_cast<size_t>(heads));
  std::vector<HeadCandidates> candidates(static_cast<size_t>(heads));
  for (int32_t h = 0; h < heads; ++h) {
    scores[h] = Score(groups[first + h], first + h);
    const int64_t n = static_cast<int64_t>(scores[h].size());
    const int64_t front = std::min(sinks, n), back = std::min(recent, n - front);
    candidates[h] =
        HeadCandidates{.scores = std::span<const float>(scores[h]).subspan(front, n - front - back),
                       .kept = front + back,
                       .min_keep = std::max<int64_t>(0, floor - front - back)};
  }
  const std::vector<int64_t> keep = AdaptiveKeepCounts(candidates, budget * heads);
  for (int32_t h = 0; h < heads; ++h) {
    victims[first + h] = Pick(groups[first + h], scores[h], candidates[h].kept + keep[h]);
  }
}

StatusOr<std::vector<TokenId>> PolicyEvictor::Victims(SeqId seq) {
  if (num_groups_ > 1) {
    return FailedPreconditionError("victims: the evictor has " + std::to_string(num_groups_) +
                                   " KV groups; use GroupVictims");
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<std::vector<TokenId>> victims, GroupVictims(seq));
  return std::move(victims[0]);
}

StatusOr<std::vector<std::vector<TokenId>>> PolicyEvictor::GroupVictims(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return NotFoundError("victims: " + SeqText(seq) + " was never observed");
  std::vector<SeqState>& groups = it->second;
  for (int32_t g = 1; g < num_groups_; ++g) {
    if (groups[g].step != groups[0].step) {
      return FailedPreconditionError("victims: " + SeqText(seq) + " group " + std::to_string(g) +
                                     " was observed " + std::to_string(groups[g].step + 1) +
                                     " times, group 0 " + std::to_string(groups[0].step + 1));
    }
  }
  for (int32_t g = 0; g < num_groups_ && !relative_columns_.empty(); ++g) {
    if (Scored(groups, g) && groups[g].relative_step != groups[g].step) {
      return FailedPreconditionError("victims: " + SeqText(seq) + " group " + std::to_string(g) +
                                     ": policy " + name_ + " reads relative token signal " +
                                     relative_signals_[0]->name +
                                     " and none were given this eviction step (ObserveRelative)");
    }
  }
  std::vector<std::vector<TokenId>> victims(static_cast<size_t>(num_groups_));
  if (options_.allocation == BudgetAllocation::kAdaptive) {
    for (int32_t first = 0; first < num_groups_; first += options_.num_kv_heads) {
      AdaptiveLayer(groups, first, victims);
    }
    VTOKEN_RETURN_IF_ERROR(policy_->failure());
    return victims;
  }
  for (int32_t g = 0; g < num_groups_; ++g) {
    SeqState& s = groups[g];
    if (!Due(s, s.budget)) continue;
    const std::vector<float> scores = Score(s, g);
    VTOKEN_RETURN_IF_ERROR(policy_->failure());  // Before any victim is picked.
    victims[g] = Pick(s, scores, s.budget);
  }
  return victims;
}

}  // namespace vtoken
