#include "lib/core/policy_evictor.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

#include "lib/core/mix.h"
#include "lib/core/policy_registry.h"

namespace vtoken {
namespace {

std::string SeqText(SeqId seq) { return "seq " + std::to_string(seq); }

}  // namespace

Status ValidateEvictorOptions(const EvictorOptions& o) {
  if (o.budget_tokens < 0) {
    return InvalidArgumentError("budget_tokens must be >= 1, got " +
                                std::to_string(o.budget_tokens));
  }
  if (!(o.keep_ratio >= 0 && o.keep_ratio <= 1)) {
    return InvalidArgumentError("keep_ratio must be in (0, 1], got " +
                                std::to_string(o.keep_ratio));
  }
  if ((o.budget_tokens > 0) == (o.keep_ratio > 0)) {
    return InvalidArgumentError(
        "exactly one of budget_tokens and keep_ratio must be set (budget_tokens " +
        std::to_string(o.budget_tokens) + ", keep_ratio " + std::to_string(o.keep_ratio) + ")");
  }
  if (o.num_sink < 0) {
    return InvalidArgumentError("num_sink must be >= 0, got " + std::to_string(o.num_sink));
  }
  if (o.num_recent < 0) {
    return InvalidArgumentError("num_recent must be >= 0, got " + std::to_string(o.num_recent));
  }
  if (o.budget_tokens > 0 && o.num_sink + o.num_recent > o.budget_tokens) {
    return InvalidArgumentError(
        "num_sink + num_recent = " + std::to_string(o.num_sink + o.num_recent) +
        " exceeds budget_tokens = " + std::to_string(o.budget_tokens));
  }
  if (o.evict_interval < 1) {
    return InvalidArgumentError("evict_interval must be >= 1, got " +
                                std::to_string(o.evict_interval));
  }
  if (o.num_layers < 1 || o.num_kv_heads < 1) {
    return InvalidArgumentError("num_layers and num_kv_heads must be >= 1");
  }
  if (Status fits = CheckAllocationFits(o.allocation, o.granularity); !fits.ok()) {
    return InvalidArgumentError("budget_allocation " + fits.message());
  }
  if (!(o.pyramid_beta >= 1)) {
    return InvalidArgumentError("pyramid_beta must be >= 1, got " + std::to_string(o.pyramid_beta));
  }
  if (!(o.adaptive_floor >= 0 && o.adaptive_floor <= 1)) {
    return InvalidArgumentError("adaptive_floor must be in [0, 1], got " +
                                std::to_string(o.adaptive_floor));
  }
  return Status::Ok();
}

std::string SignalSchedule(const Policy& policy, int64_t evict_interval) {
  const uint8_t signals = policy.signals();
  if (signals == 0) return "reads no signals: the model computes none";
  std::string names;
  for (const auto& [bit, name] :
       {std::pair{kAttnSignal, "attn"}, std::pair{kAttnSumSignal, "attn_sum"},
        std::pair{kKeyNormSignal, "key_norm"}}) {
    if ((signals & bit) == 0) continue;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  if (ReadsSignalsEveryStep(signals, policy.state_size())) {
    return "reads " + names +
           ((signals & kAttnSumSignal) != 0 ? " (accumulated)" : " (into its state)") +
           ": signals on every step";
  }
  if (evict_interval == 1) return "reads " + names + " when it evicts: signals on every step";
  return "reads " + names + " when it evicts: signals on the prefill and every " +
         std::to_string(evict_interval) + "th step";
}

int32_t NumGroups(const EvictorOptions& o) {
  return NumKvGroups(o.granularity, o.num_layers, o.num_kv_heads);
}

StatusOr<std::unique_ptr<PolicyEvictor>> PolicyEvictor::Create(std::string_view policy,
                                                               const RawParams& params,
                                                               const EvictorOptions& options) {
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<Policy> p, CreatePolicy(policy, params));
  VTOKEN_RETURN_IF_ERROR(ValidateEvictorOptions(options));
  return std::make_unique<PolicyEvictor>(std::string(policy), std::move(p), options);
}

PolicyEvictor::PolicyEvictor(std::string name, std::unique_ptr<Policy> policy,
                             const EvictorOptions& options)
    : name_(std::move(name)),
      policy_(std::move(policy)),
      state_size_(policy_->state_size()),
      signals_(policy_->signals()),
      every_step_(ReadsSignalsEveryStep(signals_, state_size_)),
      options_(options),
      num_groups_(NumGroups(options)) {}

Status PolicyEvictor::GroupError(SeqId seq, int32_t group) const {
  if (group >= 0 && group < num_groups_) return Status::Ok();
  return InvalidArgumentError("observe " + SeqText(seq) + ": group " + std::to_string(group) +
                              " outside [0, " + std::to_string(num_groups_) + ")");
}

Status PolicyEvictor::MissingSignalsError(SeqId seq, int64_t step) const {
  return InvalidArgumentError("observe " + SeqText(seq) + ": policy " + name_ +
                              " reads this step's signals (step " + std::to_string(step) +
                              ") but none were given");
}

bool PolicyEvictor::ReadsSignals(int64_t step) const {
  return signals_ != 0 && (every_step_ || step % options_.evict_interval == 0);
}

bool PolicyEvictor::SignalsWanted(SeqId seq) const {
  auto it = seqs_.find(seq);
  return ReadsSignals(it == seqs_.end() ? 0 : it->second[0].step + 1);
}

std::span<const TokenView> PolicyEvictor::Views(SeqState& s) {
  thread_local std::vector<TokenView> views;  // One allocation per thread, not one per call.
  const size_t n = s.live.size();
  views.resize(n);
  const size_t ss = static_cast<size_t>(state_size_);
  float* state = s.state.data();
  for (size_t i = 0; i < n; ++i) {
    views[i] = TokenView{.position = s.live[i],
                         .age = s.step - s.written_step[i],
                         .attn = s.attn[i],
                         .attn_sum = s.attn_sum[i],
                         .key_norm = s.key_norm[i],
                         .state = std::span<float>(state + i * ss, ss)};
  }
  return views;
}

Status PolicyEvictor::ObservationError(SeqId seq, const SeqState& s, std::span<const TokenId> live,
                                       std::span<const float> attn,
                                       std::span<const float> key_norm) const {
  const bool no_signals = !live.empty() && attn.empty() && key_norm.empty();
  if (no_signals && ReadsSignals(s.step + 1)) return MissingSignalsError(seq, s.step + 1);
  if (!no_signals && (attn.size() != live.size() || key_norm.size() != live.size())) {
    return InvalidArgumentError("observe " + SeqText(seq) + ": " + std::to_string(live.size()) +
                                " live tokens but " + std::to_string(attn.size()) + " attn and " +
                                std::to_string(key_norm.size()) + " key_norm");
  }
  for (size_t i = 0; i < live.size(); ++i) {
    const TokenId t = live[i];
    if (t < 0 || (i > 0 && t <= live[i - 1])) {
      return InvalidArgumentError("observe " + SeqText(seq) +
                                  ": live token ids must be >= 0 and strictly increasing (token " +
                                  std::to_string(t) + " at index " + std::to_string(i) + ")");
    }
    if (t < s.known && !std::binary_search(s.live.begin(), s.live.end(), t)) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": token " + std::to_string(t) +
                                  " was evicted and cannot be live again");
    }
    if (!no_signals && (!std::isfinite(attn[i]) || !std::isfinite(key_norm[i]))) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": non-finite signal for token " +
                                  std::to_string(t));
    }
  }
  return InternalError("observe " + SeqText(seq) + ": rejected without a fault");
}

void PolicyEvictor::AppendNew(SeqState& s, std::span<const TokenId> ids, int64_t step) const {
  const size_t n = s.live.size() + ids.size();
  s.live.insert(s.live.end(), ids.begin(), ids.end());
  s.written_step.resize(n, step);
  s.attn.resize(n, 0);
  s.attn_sum.resize(n, 0);
  s.key_norm.resize(n, 0);
  s.state.resize(n * static_cast<size_t>(state_size_), 0);
}

void PolicyEvictor::EndObserve(SeqState& s, int32_t group) {
  // Observe writes nothing but state: a policy without state has nothing to observe.
  if (state_size_ == 0) return;
  PolicyContext ctx{.step = s.step, .budget = s.budget, .rng = s.rng, .group = group};
  policy_->Observe(Views(s), ctx);
}

Status PolicyEvictor::ObserveAppended(SeqId seq, int32_t group, std::span<const TokenId> appended) {
  VTOKEN_RETURN_IF_ERROR(GroupError(seq, group));
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second[group].step < 0) {
    return FailedPreconditionError("observe " + SeqText(seq) +
                                   ": appended tokens before its first Observe");
  }
  SeqState& s = it->second[group];
  if (ReadsSignals(s.step + 1)) return MissingSignalsError(seq, s.step + 1);
  for (size_t i = 0; i < appended.size(); ++i) {
    if (appended[i] < (i == 0 ? s.known : appended[i - 1] + 1)) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": appended token " +
                                  std::to_string(appended[i]) + " is not new or not increasing");
    }
  }
  ++s.step;
  AppendNew(s, appended, s.step);
  if (!appended.empty()) s.known = appended.back() + 1;
  EndObserve(s, group);
  return Status::Ok();
}

bool PolicyEvictor::MatchLive(SeqState& s, std::span<const TokenId> live, int64_t step) const {
  const size_t m = s.live.size(), n = live.size(), ss = static_cast<size_t>(state_size_);
  // A step's usual change: the same tokens, then new ones (ids increase, so all past `known`).
  if (n >= m && std::equal(s.live.begin(), s.live.end(), live.begin()) &&
      (n == m || live[m] >= s.known)) {
    AppendNew(s, live.subspan(m), step);
    return true;
  }
  // Else merge the two increasing lists: listed tokens keep their entries, the others go.
  std::vector<int64_t> written(n, step);
  std::vector<float> attn_sum(n, 0), state(n * ss, 0);
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const TokenId t = live[i];
    while (j < m && s.live[j] < t) ++j;
    if (j < m && s.live[j] == t) {
      written[i] = s.written_step[j];
      attn_sum[i] = s.attn_sum[j];
      std::copy_n(s.state.begin() + static_cast<std::ptrdiff_t>(j * ss), ss,
                  state.begin() + static_cast<std::ptrdiff_t>(i * ss));
    } else if (t < s.known) {
      return false;  // Seen before and not live: evicted.
    }
  }
  s.live.assign(live.begin(), live.end());
  s.written_step = std::move(written);
  s.attn_sum = std::move(attn_sum);
  s.state = std::move(state);
  s.attn.resize(n);  // The caller writes this step's values.
  s.key_norm.resize(n);
  return true;
}

Status PolicyEvictor::Observe(SeqId seq, int32_t group, std::span<const TokenId> live,
                              std::span<const float> attn, std::span<const float> key_norm) {
  VTOKEN_RETURN_IF_ERROR(GroupError(seq, group));
  auto it = seqs_.find(seq);
  const bool created = it == seqs_.end();
  if (created) {
    Track(seq);
    it = seqs_.find(seq);
  }
  SeqState& s = it->second[group];
  // The checks in one branch-free pass (finite: |x| <= max is false for NaN and infinities); the
  // error path looks for the fault.
  const size_t n = live.size();
  // Empty signal spans for a non-empty step: no signals this step (allowed when not read).
  const bool no_signals = n > 0 && attn.empty() && key_norm.empty();
  bool ok = no_signals ? !ReadsSignals(s.step + 1) : attn.size() == n && key_norm.size() == n;
  if (ok) {
    constexpr float kMax = std::numeric_limits<float>::max();
    uint32_t bad = n > 0 && live[0] < 0;
    for (size_t i = 1; i < n; ++i) bad |= live[i] <= live[i - 1];
    for (size_t i = 0; !no_signals && i < n; ++i) {
      bad |= static_cast<uint32_t>(!(std::abs(attn[i]) <= kMax)) |
             static_cast<uint32_t>(!(std::abs(key_norm[i]) <= kMax));
    }
    ok = bad == 0;
  }
  if (!ok || !MatchLive(s, live, s.step + 1)) {
    Status error = ObservationError(seq, s, live, attn, key_norm);
    if (created) seqs_.erase(it);
    return error;
  }
  const bool first = s.step < 0;
  ++s.step;
  if (n > 0) s.known = std::max(s.known, live.back() + 1);
  // Without signals, attn and key_norm keep the last given values: a policy that reads them was
  // given this step's (ReadsSignals). attn_sum accumulates only for a policy that declares it
  // (undeclared, it stays zero).
  if (!no_signals) {
    std::copy_n(attn.data(), n, s.attn.data());
    std::copy_n(key_norm.data(), n, s.key_norm.data());
    if ((signals_ & kAttnSumSignal) != 0) {
      float* sum = s.attn_sum.data();
      for (size_t i = 0; i < n; ++i) sum[i] += attn[i];
    }
  }
  if (first) {
    const double prompt = static_cast<double>(n);
    const int64_t budget =
        options_.budget_tokens > 0
            ? options_.budget_tokens
            : std::max<int64_t>(1, static_cast<int64_t>(options_.keep_ratio * prompt));
    s.budget = budget;
    if (options_.allocation == BudgetAllocation::kPyramid) {
      const int32_t layer =
          options_.granularity == Granularity::kHead ? group / options_.num_kv_heads : group;
      s.budget = PyramidBudgets(budget, options_.num_layers, options_.pyramid_beta)[layer];
    }
  }
  EndObserve(s, group);
  return Status::Ok();
}

bool PolicyEvictor::Due(const SeqState& s, int64_t keep) const {
  return s.step % options_.evict_interval == 0 && s.evicted_step != s.step &&
         static_cast<int64_t>(s.live.size()) > keep;
}

std::vector<float> PolicyEvictor::Score(SeqState& s, int32_t group) {
  s.evicted_step = s.step;
  const std::span<const TokenView> views = Views(s);
  std::vector<float> scores(views.size(), 0.0f);
  PolicyContext ctx{.step = s.step, .budget = s.budget, .rng = s.rng, .group = group};
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
  const size_t ss = static_cast<size_t>(state_size_);
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
    }
    ++kept;
  }
  s.live.resize(kept);
  s.written_step.resize(kept);
  s.attn.resize(kept);
  s.attn_sum.resize(kept);
  s.key_norm.resize(kept);
  s.state.resize(kept * ss);
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
  std::vector<std::vector<TokenId>> victims(static_cast<size_t>(num_groups_));
  if (options_.allocation == BudgetAllocation::kAdaptive) {
    for (int32_t first = 0; first < num_groups_; first += options_.num_kv_heads) {
      AdaptiveLayer(groups, first, victims);
    }
    return victims;
  }
  for (int32_t g = 0; g < num_groups_; ++g) {
    SeqState& s = groups[g];
    if (!Due(s, s.budget)) continue;
    const std::vector<float> scores = Score(s, g);
    victims[g] = Pick(s, scores, s.budget);
  }
  return victims;
}

void PolicyEvictor::Track(SeqId seq) {
  if (seqs_.contains(seq)) return;
  std::vector<SeqState> states;
  states.reserve(static_cast<size_t>(num_groups_));
  const uint64_t base =
      options_.seed ^ SplitMix64Finalize(static_cast<uint64_t>(seq) + kSplitMix64Gamma);
  for (int32_t g = 0; g < num_groups_; ++g) states.emplace_back(base ^ KvGroupSalt(g));
  seqs_.emplace(seq, std::move(states));
}

void PolicyEvictor::Forget(SeqId seq) { seqs_.erase(seq); }

StatusOr<int64_t> PolicyEvictor::Budget(SeqId seq, int32_t group) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || group < 0 || group >= num_groups_ || it->second[group].step < 0) {
    return NotFoundError("budget: " + SeqText(seq) +
                         (num_groups_ > 1 ? " group " + std::to_string(group) : std::string()) +
                         " was never observed");
  }
  return it->second[group].budget;
}

}  // namespace vtoken
