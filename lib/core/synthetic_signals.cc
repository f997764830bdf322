#include "lib/core/synthetic_signals.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/mix.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {

std::vector<std::vector<TokenId>> SyntheticSignalDriver::ChooseVictims(const VirtualKvCache& cache,
                                                                       SeqId seq,
                                                                       uint64_t entropy) {
  const int32_t groups = cache.num_groups();
  if (!status_.ok()) return std::vector<std::vector<TokenId>>(static_cast<size_t>(groups));
  std::vector<std::vector<TokenId>> live(static_cast<size_t>(groups));
  uint64_t noise = entropy;
  ++policy_steps_;
  const bool relative = !evictor_.relative_token_signals().empty() && evictor_.ScoresNext(seq);
  for (int32_t g = 0; g < groups; ++g) {
    live[g] = cache.table(seq, g).LiveTokens();
    attn_.resize(live[g].size());
    key_norm_.resize(live[g].size());
    double total = 0;
    const uint64_t salt = KvGroupSalt(g);
    for (size_t i = 0; i < live[g].size(); ++i) {
      const uint64_t h = SplitMix64Finalize(
          ((static_cast<uint64_t>(seq) << 40) ^ static_cast<uint64_t>(live[g][i])) ^ salt);
      const bool heavy = h % 8 == 0;
      const bool sink = live[g][i] == 0;
      double w = 0.5 + static_cast<double>(SplitMix64(noise) >> 11) * 0x1.0p-53;
      if (heavy) w *= 16;
      if (sink) w *= 8;
      if (i + 4 >= live[g].size()) w *= 4;
      attn_[i] = static_cast<float>(w);
      total += w;
      const float norm = 1.0f + static_cast<float>((h >> 8) % 1000) / 500.0f;
      key_norm_[i] = heavy || sink ? norm / 2 : norm;
    }
    for (float& a : attn_) a = static_cast<float>(a / total);
    // Absolute token signals of the tokens the group has not seen: in [1, 3) by hash of the token,
    // group and signal, the same whenever the token is first observed.
    const size_t nv = evictor_.absolute_width();
    const TokenId unseen = evictor_.UnseenFrom(seq, g);
    token_values_.clear();
    for (size_t i = 0; nv > 0 && i < live[g].size(); ++i) {
      if (live[g][i] < unseen) continue;
      for (size_t j = 0; j < nv; ++j) {
        const uint64_t h = SplitMix64Finalize(
            ((static_cast<uint64_t>(seq) << 40) ^ static_cast<uint64_t>(live[g][i])) ^ salt ^
            (static_cast<uint64_t>(j + 1) << 32));
        token_values_.push_back(1.0f + static_cast<float>(h % 1000) / 500.0f);
      }
    }
    status_ = evictor_.Observe(seq, g, live[g], attn_, key_norm_, token_values_);
    if (!status_.ok()) return std::vector<std::vector<TokenId>>(static_cast<size_t>(groups));
    if (!relative) continue;
    // Relative token signals of every live token on an eviction step: in [-1, 1) by hash of the
    // token, group, signal and step (they move with the live set, as an anchor does).
    const size_t nr = evictor_.relative_width();
    token_values_.clear();
    for (size_t i = 0; i < live[g].size(); ++i) {
      for (size_t j = 0; j < nr; ++j) {
        const uint64_t h = SplitMix64Finalize(
            ((static_cast<uint64_t>(seq) << 40) ^ static_cast<uint64_t>(live[g][i])) ^ salt ^
            (static_cast<uint64_t>(j + 1) << 32) ^ (policy_steps_ << 48));
        token_values_.push_back(static_cast<float>(h % 2000) / 1000.0f - 1.0f);
      }
    }
    status_ = evictor_.ObserveRelative(seq, g, token_values_);
    if (!status_.ok()) return std::vector<std::vector<TokenId>>(static_cast<size_t>(groups));
  }
  StatusOr<std::vector<std::vector<TokenId>>> victims = evictor_.GroupVictims(seq);
  if (!victims.ok()) {
    status_ = victims.status();
    return std::vector<std::vector<TokenId>>(static_cast<size_t>(groups));
  }
  const EvictorOptions& o = evictor_.options();
  const bool adaptive = o.allocation == BudgetAllocation::kAdaptive;
  const int32_t span = adaptive ? o.num_kv_heads : 1;  // Groups sharing one budget.
  for (int32_t first = 0; first < groups && status_.ok(); first += span) {
    int64_t left = 0, budget = 0;
    bool evicted = false;
    for (int32_t g = first; g < first + span; ++g) {
      left += static_cast<int64_t>(live[g].size() - (*victims)[g].size());
      const StatusOr<int64_t> b = evictor_.Budget(seq, g);
      budget += b.ok() ? *b : -1;
      evicted = evicted || !(*victims)[g].empty();
    }
    if (evicted && left != budget) {
      status_ =
          InternalError("policy '" + evictor_.policy_name() + "' left " + std::to_string(left) +
                        " live tokens in seq " + std::to_string(seq) + " group " +
                        std::to_string(first) + ", budget " + std::to_string(budget));
    }
  }
  for (int32_t g = 0; g < groups && status_.ok(); ++g) {
    const std::vector<TokenId>& v = (*victims)[g];
    for (size_t j = 0; j < v.size(); ++j) {
      const TokenId t = v[j];
      if (!std::binary_search(live[g].begin(), live[g].end(), t) || (j > 0 && t <= v[j - 1])) {
        status_ = InternalError("policy '" + evictor_.policy_name() + "' chose token " +
                                std::to_string(t) + " of seq " + std::to_string(seq) + " group " +
                                std::to_string(g) + ", which is not a distinct live token");
        break;
      }
    }
    victims_ += static_cast<int64_t>(v.size());
  }
  if (!status_.ok()) return std::vector<std::vector<TokenId>>(static_cast<size_t>(groups));
  return std::move(victims).value();
}

}  // namespace vtoken
