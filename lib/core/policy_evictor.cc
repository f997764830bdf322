#include "lib/core/policy_evictor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/policy_registry.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

std::string SeqText(SeqId seq) { return "seq " + std::to_string(seq); }

uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

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
  return Status::Ok();
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
      options_(options) {}

std::vector<TokenView> PolicyEvictor::Views(SeqState& s) {
  std::vector<TokenView> views(s.live.size());
  for (size_t i = 0; i < s.live.size(); ++i) {
    const TokenId t = s.live[i];
    views[i] = TokenView{.position = t,
                         .age = s.step - s.written_step[t],
                         .attn = s.attn[t],
                         .attn_sum = s.attn_sum[t],
                         .key_norm = s.key_norm[t],
                         .state = std::span<float>(s.state.data() + t * state_size_,
                                                   static_cast<size_t>(state_size_))};
  }
  return views;
}

Status PolicyEvictor::CheckObservation(SeqId seq, const SeqState& s, std::span<const TokenId> live,
                                       std::span<const float> attn,
                                       std::span<const float> key_norm) const {
  if (attn.size() != live.size() || key_norm.size() != live.size()) {
    return InvalidArgumentError("observe " + SeqText(seq) + ": " + std::to_string(live.size()) +
                                " live tokens but " + std::to_string(attn.size()) + " attn and " +
                                std::to_string(key_norm.size()) + " key_norm");
  }
  const TokenId known = static_cast<TokenId>(s.alive.size());
  for (size_t i = 0; i < live.size(); ++i) {
    const TokenId t = live[i];
    if (t < 0 || (i > 0 && t <= live[i - 1])) {
      return InvalidArgumentError("observe " + SeqText(seq) +
                                  ": live token ids must be >= 0 and strictly increasing (token " +
                                  std::to_string(t) + " at index " + std::to_string(i) + ")");
    }
    if (t < known && !s.alive[t]) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": token " + std::to_string(t) +
                                  " was evicted and cannot be live again");
    }
    if (!std::isfinite(attn[i]) || !std::isfinite(key_norm[i])) {
      return InvalidArgumentError("observe " + SeqText(seq) + ": non-finite signal for token " +
                                  std::to_string(t));
    }
  }
  return Status::Ok();
}

Status PolicyEvictor::Observe(SeqId seq, std::span<const TokenId> live, std::span<const float> attn,
                              std::span<const float> key_norm) {
  auto [it, first] = seqs_.try_emplace(
      seq, options_.seed ^ Mix(static_cast<uint64_t>(seq) + 0x9e3779b97f4a7c15ULL));
  SeqState& s = it->second;
  Status valid = CheckObservation(seq, s, live, attn, key_norm);
  if (!valid.ok()) {
    if (first) seqs_.erase(it);
    return valid;
  }
  const TokenId known = static_cast<TokenId>(s.alive.size());
  ++s.step;
  if (!live.empty() && live.back() >= known) {
    const size_t n = static_cast<size_t>(live.back()) + 1;
    s.written_step.resize(n, s.step);
    s.alive.resize(n, 0);
    s.attn.resize(n, 0);
    s.attn_sum.resize(n, 0);
    s.key_norm.resize(n, 0);
    s.state.resize(n * state_size_, 0);
  }
  for (TokenId t : s.live) s.alive[t] = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    const TokenId t = live[i];
    s.alive[t] = 1;
    s.attn[t] = attn[i];
    s.attn_sum[t] += attn[i];
    s.key_norm[t] = key_norm[i];
  }
  s.live.assign(live.begin(), live.end());
  if (first) {
    const double prompt = static_cast<double>(live.size());
    s.budget = options_.budget_tokens > 0
                   ? options_.budget_tokens
                   : std::max<int64_t>(1, static_cast<int64_t>(options_.keep_ratio * prompt));
  }
  std::vector<TokenView> views = Views(s);
  PolicyContext ctx{.step = s.step, .budget = s.budget, .rng = s.rng};
  policy_->Observe(views, ctx);
  return Status::Ok();
}

StatusOr<std::vector<TokenId>> PolicyEvictor::Victims(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return NotFoundError("victims: " + SeqText(seq) + " was never observed");
  SeqState& s = it->second;
  const int64_t n = static_cast<int64_t>(s.live.size());
  if (s.step % options_.evict_interval != 0 || s.evicted_step == s.step || n <= s.budget) {
    return std::vector<TokenId>{};
  }
  s.evicted_step = s.step;
  std::vector<TokenView> views = Views(s);
  std::vector<float> scores(views.size(), 0.0f);
  PolicyContext ctx{.step = s.step, .budget = s.budget, .rng = s.rng};
  policy_->Score(views, ctx, scores);

  // Protection never takes more than the budget: sinks first, then the most recent tokens.
  const int64_t sinks = std::min(options_.num_sink, s.budget);
  const int64_t recent = std::min(options_.num_recent, s.budget - sinks);
  std::vector<int64_t> candidates;
  candidates.reserve(static_cast<size_t>(n - sinks - recent));
  for (int64_t i = sinks; i < n - recent; ++i) candidates.push_back(i);
  const auto key = [&](int64_t i) {
    const float score = scores[i];
    return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
  };
  const int64_t num_victims = n - s.budget;
  std::nth_element(candidates.begin(), candidates.begin() + (num_victims - 1), candidates.end(),
                   [&](int64_t a, int64_t b) {
                     const float ka = key(a), kb = key(b);
                     return ka < kb || (ka == kb && a < b);
                   });
  std::vector<TokenId> victims;
  victims.reserve(static_cast<size_t>(num_victims));
  for (int64_t j = 0; j < num_victims; ++j) victims.push_back(s.live[candidates[j]]);
  std::sort(victims.begin(), victims.end());

  std::vector<TokenId> kept;
  kept.reserve(static_cast<size_t>(s.budget));
  size_t v = 0;
  for (TokenId t : s.live) {
    if (v < victims.size() && victims[v] == t) {
      s.alive[t] = 0;
      ++v;
    } else {
      kept.push_back(t);
    }
  }
  s.live = std::move(kept);
  return victims;
}

void PolicyEvictor::Forget(SeqId seq) { seqs_.erase(seq); }

StatusOr<int64_t> PolicyEvictor::Budget(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return NotFoundError("budget: " + SeqText(seq) + " was never observed");
  return it->second.budget;
}

std::vector<TokenId> SyntheticSignalDriver::ChooseVictims(const VirtualKvCache& cache, SeqId seq,
                                                          uint64_t entropy) {
  if (!status_.ok()) return {};
  const std::vector<TokenId> live = cache.table(seq).LiveTokens();
  attn_.resize(live.size());
  key_norm_.resize(live.size());
  double total = 0;
  uint64_t noise = entropy;
  for (size_t i = 0; i < live.size(); ++i) {
    const uint64_t h = Mix((static_cast<uint64_t>(seq) << 40) ^ static_cast<uint64_t>(live[i]));
    const bool heavy = h % 8 == 0;
    const bool sink = live[i] == 0;
    double w = 0.5 + static_cast<double>(Mix(noise += 0x9e3779b97f4a7c15ULL) >> 11) * 0x1.0p-53;
    if (heavy) w *= 16;
    if (sink) w *= 8;
    if (i + 4 >= live.size()) w *= 4;
    attn_[i] = static_cast<float>(w);
    total += w;
    const float norm = 1.0f + static_cast<float>((h >> 8) % 1000) / 500.0f;
    key_norm_[i] = heavy || sink ? norm / 2 : norm;
  }
  for (float& a : attn_) a = static_cast<float>(a / total);

  ++policy_steps_;
  status_ = evictor_.Observe(seq, live, attn_, key_norm_);
  if (!status_.ok()) return {};
  StatusOr<std::vector<TokenId>> victims = evictor_.Victims(seq);
  if (!victims.ok()) {
    status_ = victims.status();
    return {};
  }
  const StatusOr<int64_t> budget = evictor_.Budget(seq);
  const int64_t left = static_cast<int64_t>(live.size() - victims->size());
  if (!victims->empty() && left != *budget) {
    status_ =
        InternalError("policy '" + evictor_.policy_name() + "' left " + std::to_string(left) +
                      " live tokens in " + SeqText(seq) + ", budget " + std::to_string(*budget));
  }
  for (size_t j = 0; j < victims->size(); ++j) {
    const TokenId t = (*victims)[j];
    if (!std::binary_search(live.begin(), live.end(), t) || (j > 0 && t <= (*victims)[j - 1])) {
      status_ =
          InternalError("policy '" + evictor_.policy_name() + "' chose token " + std::to_string(t) +
                        " of " + SeqText(seq) + ", which is not a distinct live token");
    }
  }
  if (!status_.ok()) return {};
  victims_ += static_cast<int64_t>(victims->size());
  return std::move(victims).value();
}

}  // namespace vtoken
