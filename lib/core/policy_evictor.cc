#include "lib/core/policy_evictor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/mix.h"
#include "lib/core/policy_registry.h"

namespace vtoken {

std::string PolicyEvictor::SeqText(SeqId seq) { return "seq " + std::to_string(seq); }

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

namespace {

// The attention-pass part of SignalSchedule.
std::string AttentionSchedule(const Policy& policy, int64_t evict_interval) {
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

}  // namespace

std::string SignalSchedule(const Policy& policy, int64_t evict_interval) {
  std::string line = AttentionSchedule(policy, evict_interval);
  const std::vector<std::string> token = policy.token_signals();
  if (token.empty()) return line;
  std::string absolute, relative;
  for (const std::string& name : token) {
    const StatusOr<const TokenSignalInfo*> info = FindTokenSignal(name);
    std::string& names = info.ok() && (*info)->relative() ? relative : absolute;
    names += (names.empty() ? "" : ", ") + name;
  }
  if (policy.signals() == 0) line = "reads no attention signals";
  if (!absolute.empty()) line += "; token signals " + absolute + " once per token";
  if (!relative.empty()) {
    line += "; relative token signals " + relative + " over the live tokens when it evicts";
  }
  return line;
}

StatusOr<std::vector<const TokenSignalInfo*>> ResolveTokenSignals(const Policy& policy,
                                                                  std::string_view policy_name) {
  std::vector<const TokenSignalInfo*> infos;
  for (const std::string& name : policy.token_signals()) {
    StatusOr<const TokenSignalInfo*> info = FindTokenSignal(name);
    if (!info.ok()) {
      return NotFoundError("policy " + std::string(policy_name) + " reads " +
                           info.status().message());
    }
    infos.push_back(*info);
  }
  return infos;
}

int32_t NumGroups(const EvictorOptions& o) {
  return NumKvGroups(o.granularity, o.num_layers, o.num_kv_heads);
}

StatusOr<std::unique_ptr<PolicyEvictor>> PolicyEvictor::Create(std::string_view policy,
                                                               const RawParams& params,
                                                               const EvictorOptions& options) {
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<Policy> p, CreatePolicy(policy, params));
  VTOKEN_RETURN_IF_ERROR(ResolveTokenSignals(*p, policy).status());
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
      num_groups_(NumGroups(options)) {
  StatusOr<std::vector<const TokenSignalInfo*>> infos = ResolveTokenSignals(*policy_, name_);
  if (infos.ok()) token_signals_ = *std::move(infos);
  const KvGroupRows rows =
      KvGroupRowsOf(options_.granularity, options_.num_layers, options_.num_kv_heads);
  token_signal_offsets_.push_back(0);
  for (const TokenSignalInfo* info : token_signals_) {
    const auto first = static_cast<size_t>(token_signal_offsets_.back());
    const auto columns = static_cast<size_t>(info->columns(rows.layers, rows.heads));
    for (size_t c = first; c < first + columns; ++c) {
      (info->relative() ? relative_columns_ : absolute_columns_).push_back(c);
    }
    token_signal_offsets_.push_back(static_cast<int32_t>(first + columns));
  }
  width_ = static_cast<size_t>(token_signal_offsets_.back());
  absolute_signals_ = TokenSignalsOfKind(token_signals_, /*relative=*/false);
  relative_signals_ = TokenSignalsOfKind(token_signals_, /*relative=*/true);
}

bool PolicyEvictor::ScoresNext(SeqId seq, std::span<const int64_t> live_counts) const {
  auto it = seqs_.find(seq);
  const bool known = it != seqs_.end() && it->second[0].step >= 0;
  const int64_t step = known ? it->second[0].step + 1 : 0;
  if (step % options_.evict_interval != 0) return false;
  if (!known || live_counts.size() != static_cast<size_t>(num_groups_)) return true;
  const std::vector<SeqState>& groups = it->second;
  const bool adaptive = options_.allocation == BudgetAllocation::kAdaptive;
  const int32_t span = adaptive ? options_.num_kv_heads : 1;  // Groups sharing one budget.
  for (int32_t first = 0; first < num_groups_; first += span) {
    int64_t live = 0, keep = 0;
    for (int32_t g = first; g < first + span; ++g) {
      live += live_counts[static_cast<size_t>(g)];
      keep += groups[g].budget;
    }
    if (live > keep) return true;
  }
  return false;
}

StatusOr<PolicyEvictor::SeqState*> PolicyEvictor::ObservedGroup(SeqId seq, int32_t group,
                                                                std::string_view what) {
  VTOKEN_RETURN_IF_ERROR(GroupError(seq, group));
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second[group].step < 0) {
    return FailedPreconditionError("observe " + SeqText(seq) + ": " + std::string(what) +
                                   " before its first Observe");
  }
  return &it->second[group];
}

Status PolicyEvictor::ObserveRelative(SeqId seq, int32_t group, std::span<const float> values) {
  VTOKEN_ASSIGN_OR_RETURN(SeqState * state, ObservedGroup(seq, group, "relative token signals"));
  SeqState& s = *state;
  const size_t nr = relative_columns_.size(), nv = width_;
  if (values.size() != s.live.size() * nr) {
    return InvalidArgumentError("observe " + SeqText(seq) + ": policy " + name_ + " reads " +
                                std::to_string(relative_signals_.size()) +
                                " relative token signal(s): " + std::to_string(s.live.size() * nr) +
                                " values expected for " + std::to_string(s.live.size()) +
                                " live tokens, got " + std::to_string(values.size()));
  }
  VTOKEN_RETURN_IF_ERROR(NonFiniteError(seq, values));
  for (size_t i = 0; i < s.live.size(); ++i) {
    for (size_t r = 0; r < nr; ++r)
      s.token_values[i * nv + relative_columns_[r]] = values[i * nr + r];
  }
  s.relative_step = s.step;
  return Status::Ok();
}

void PolicyEvictor::StoreAbsolute(SeqState& s, std::span<const float> values) const {
  const size_t na = absolute_columns_.size(), nv = width_;
  if (na == 0) return;
  const size_t count = values.size() / na;
  float* row = s.token_values.data() + s.token_values.size() - count * nv;
  if (na == nv) {  // Only absolute signals: the layouts agree.
    std::copy(values.begin(), values.end(), row);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t a = 0; a < na; ++a) row[i * nv + absolute_columns_[a]] = values[i * na + a];
  }
}

TokenId PolicyEvictor::UnseenFrom(SeqId seq, int32_t group) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || group < 0 || group >= num_groups_) return 0;
  return it->second[group].known;
}

Status PolicyEvictor::TokenValuesError(SeqId seq, size_t count,
                                       std::span<const float> values) const {
  const size_t want = count * absolute_columns_.size();
  if (values.size() != want) {
    std::string names;
    for (const TokenSignalInfo* info : absolute_signals_) {
      names += (names.empty() ? "" : ", ") + info->name;
    }
    return InvalidArgumentError(
        "observe " + SeqText(seq) + ": policy " + name_ + " reads " +
        std::to_string(absolute_signals_.size()) + " absolute token signal(s)" +
        (names.empty() ? "" : " (" + names + ")") + ": " + std::to_string(want) +
        " values expected for " + std::to_string(count) + " new tokens, got " +
        std::to_string(values.size()));
  }
  return NonFiniteError(seq, values);
}

Status PolicyEvictor::NonFiniteError(SeqId seq, std::span<const float> values) {
  for (const float v : values) {
    if (!std::isfinite(v)) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": non-finite token signal value");
    }
  }
  return Status::Ok();
}

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
  const size_t nv = width_;
  const float* values = s.token_values.data();
  for (size_t i = 0; i < n; ++i) {
    views[i] = TokenView{.position = s.live[i],
                         .age = s.step - s.written_step[i],
                         .attn = s.attn[i],
                         .attn_sum = s.attn_sum[i],
                         .key_norm = s.key_norm[i],
                         .state = std::span<float>(state + i * ss, ss),
                         .token_signals = std::span<const float>(values + i * nv, nv)};
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
  s.token_values.resize(n * width_, 0);
}

void PolicyEvictor::EndObserve(SeqState& s, int32_t group) {
  // Observe writes nothing but state: a policy without state has nothing to observe.
  if (state_size_ == 0) return;
  PolicyContext ctx{.step = s.step,
                    .budget = s.budget,
                    .rng = s.rng,
                    .group = group,
                    .token_signal_offsets = token_signal_offsets_};
  policy_->Observe(Views(s), ctx);
}

Status PolicyEvictor::ObserveAppended(SeqId seq, int32_t group, std::span<const TokenId> appended,
                                      std::span<const float> token_values) {
  VTOKEN_ASSIGN_OR_RETURN(SeqState * state, ObservedGroup(seq, group, "appended tokens"));
  SeqState& s = *state;
  if (ReadsSignals(s.step + 1)) return MissingSignalsError(seq, s.step + 1);
  for (size_t i = 0; i < appended.size(); ++i) {
    if (appended[i] < (i == 0 ? s.known : appended[i - 1] + 1)) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": appended token " +
                                  std::to_string(appended[i]) + " is not new or not increasing");
    }
  }
  VTOKEN_RETURN_IF_ERROR(TokenValuesError(seq, appended.size(), token_values));
  ++s.step;
  AppendNew(s, appended, s.step);
  StoreAbsolute(s, token_values);
  if (!appended.empty()) s.known = appended.back() + 1;
  EndObserve(s, group);
  return policy_->failure();
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
  const size_t nv = width_;
  std::vector<int64_t> written(n, step);
  std::vector<float> attn_sum(n, 0), state(n * ss, 0), values(n * nv, 0);
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const TokenId t = live[i];
    while (j < m && s.live[j] < t) ++j;
    if (j < m && s.live[j] == t) {
      written[i] = s.written_step[j];
      attn_sum[i] = s.attn_sum[j];
      std::copy_n(s.state.begin() + static_cast<std::ptrdiff_t>(j * ss), ss,
                  state.begin() + static_cast<std::ptrdiff_t>(i * ss));
      std::copy_n(s.token_values.begin() + static_cast<std::ptrdiff_t>(j * nv), nv,
                  values.begin() + static_cast<std::ptrdiff_t>(i * nv));
    } else if (t < s.known) {
      return false;  // Seen before and not live: evicted.
    }
  }
  s.live.assign(live.begin(), live.end());
  s.written_step = std::move(written);
  s.attn_sum = std::move(attn_sum);
  s.state = std::move(state);
  s.token_values = std::move(values);
  s.attn.resize(n);  // The caller writes this step's values.
  s.key_norm.resize(n);
  return true;
}

Status PolicyEvictor::Observe(SeqId seq, int32_t group, std::span<const TokenId> live,
                              std::span<const float> attn, std::span<const float> key_norm,
                              std::span<const float> token_values) {
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
  // The tokens new to the group: the suffix of `live` from the first id not seen before.
  const size_t unseen =
      n - static_cast<size_t>(std::lower_bound(live.begin(), live.end(), s.known) - live.begin());
  if (ok) {
    if (Status error = TokenValuesError(seq, unseen, token_values); !error.ok()) {
      if (created) seqs_.erase(it);
      return error;
    }
  }
  if (!ok || !MatchLive(s, live, s.step + 1)) {
    Status error = ObservationError(seq, s, live, attn, key_norm);
    if (created) seqs_.erase(it);
    return error;
  }
  StoreAbsolute(s, token_values);
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
  return policy_->failure();
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
