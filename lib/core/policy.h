// The policy SDK: everything a policy author needs, in one header. A policy scores the live
// tokens of one sequence (higher score = keep); the runtime (PolicyEvictor, policy_evictor.h)
// does the rest: budget, protection of sink and recent tokens, picking the victims, when to
// evict, per-token state storage and a seeded random source. See docs/WRITING_A_POLICY.md.
//
// A policy is one file policies/NAME.cc that defines a class derived from Policy and registers
// it with VTOKEN_REGISTER_POLICY; rebuilding makes `--policy NAME` available everywhere.
//
// Signals arrive for the live tokens in logical order (increasing position), aggregated over
// the KV group being scored: every layer and KV head at token granularity (cache.granularity),
// one layer's heads at layer granularity, one KV head's query heads at head granularity. A policy
// scores one group at a time and needs no change for any granularity:
//   position  logical token id = the RoPE position its KV was computed with;
//   age       steps since the token was written (0 for tokens written this step);
//   attn      attention mass the token received this step, averaged over the group's query
//             heads and the step's queries (prefill: the last obs_window queries; decode: the
//             new one); it sums to 1 over the group's live tokens;
//   attn_sum  attn accumulated over every step since the token was written;
//   key_norm  L2 norm of the token's key, averaged over the group's layers and KV heads;
//   state     state_size() floats owned by the policy, zero when the token is written. State is
//             stored by logical token id, so it follows its token through relocations.
//   token_signals
//             the token signals the policy names in token_signals() (value_norm, ...:
//             functions of the token's own K and V rows, one file each under signals/, see
//             lib/core/token_signal.h), in the order named, averaged over the group's rows as
//             key_norm is; a name NAME@layer gives one value per layer of the group instead,
//             NAME@head one per KV row (columns: PolicyContext::token_signal). Computed once
//             per token when the policy first sees it (relative ones: when it evicts).
//
// Policy objects are shared by every sequence and must keep no mutable members: whatever a
// policy remembers lives in `state` (per token) or comes from the context (per step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/core/mix.h"
#include "lib/core/policy_params.h"
#include "lib/core/status.h"
#include "lib/core/types.h"

namespace vtoken {

// A score above every signal-derived score: a policy's way to say "keep this token".
inline constexpr float kKeepScore = std::numeric_limits<float>::infinity();

// One live token as a policy sees it (see the file comment for each signal).
struct TokenView {
  TokenId position = 0;
  int64_t age = 0;
  float attn = 0;
  float attn_sum = 0;
  float key_norm = 0;
  std::span<float> state;  // Written by Observe only; Score reads it.
  // The values of the names in Policy::token_signals(), in order: one per plain name, more for
  // a view (PolicyContext::token_signal finds a name's).
  std::span<const float> token_signals;
};

// Deterministic random source of one sequence, seeded from the evictor's seed and the seq id,
// so a policy's choices depend on nothing but (seed, seq, signals).
class PolicyRng {
 public:
  explicit PolicyRng(uint64_t seed) : state_(seed) {}
  // Next 64 random bits (splitmix64).
  uint64_t Next() { return SplitMix64(state_); }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Per-sequence facts of the current step.
struct PolicyContext {
  int64_t step = 0;    // Steps this sequence has seen before this one (0: prefill).
  int64_t budget = 0;  // Live tokens the sequence (this group) keeps after an eviction.
  PolicyRng& rng;
  // The KV group being scored (0 at token granularity; the layer, or layer * num_kv_heads +
  // kv_head). Signals and state are that group's.
  int32_t group = 0;
  // Where each name of Policy::token_signals() starts in TokenView::token_signals, and one past
  // the last value: name j's values are [offsets[j], offsets[j + 1]). Empty when every name is
  // plain (then name j's one value is at j).
  std::span<const int32_t> token_signal_offsets = {};

  // Name j's values of token `t`: one for NAME; for NAME@layer one per layer of the group (at
  // token granularity every layer, else 1); for NAME@head one per (layer, KV head) row of the
  // group, layer-major.
  std::span<const float> token_signal(const TokenView& t, size_t j) const {
    if (token_signal_offsets.empty()) return t.token_signals.subspan(j, 1);
    const auto first = static_cast<size_t>(token_signal_offsets[j]);
    return t.token_signals.subspan(first, static_cast<size_t>(token_signal_offsets[j + 1]) - first);
  }
};

// The signals a policy reads, as bits of Policy::signals(): the model computes only those (each
// costs a pass over every live key in every layer). A signal the policy does not declare arrives
// as zero.
//
// They also say when the model computes them. attn_sum needs every step's attention, and so does
// a policy with state whose Observe reads a signal; the signals of any other policy are read only
// by Score, so the runtime asks the model for them only on the steps where an eviction is due
// (the prefill, then every evict_interval-th step) and computes nothing in between.
inline constexpr uint8_t kAttnSignal = 1;     // attn (this step's)
inline constexpr uint8_t kKeyNormSignal = 2;  // key_norm
inline constexpr uint8_t kAttnSumSignal = 4;  // attn_sum (every step's attn, accumulated)
inline constexpr uint8_t kAllSignals = kAttnSignal | kKeyNormSignal | kAttnSumSignal;

// The model's work for the policy signals `declared`: kAttnSignal (the attention mass, for attn
// or attn_sum) and kKeyNormSignal bits.
inline constexpr uint8_t ModelSignals(uint8_t declared) {
  return static_cast<uint8_t>(((declared & (kAttnSignal | kAttnSumSignal)) != 0 ? kAttnSignal : 0) |
                              (declared & kKeyNormSignal));
}

// True when a policy with these signals and state reads signals on every step, not only when it
// evicts (see above).
inline constexpr bool ReadsSignalsEveryStep(uint8_t declared, int32_t state_size) {
  return (declared & kAttnSumSignal) != 0 || (state_size > 0 && declared != 0);
}

class Policy {
 public:
  virtual ~Policy() = default;

  // The signals Observe and Score read (kAttnSignal | kKeyNormSignal | kAttnSumSignal bits). The
  // default, every signal, is always correct; declaring fewer saves the model their computation,
  // and a policy without attn_sum or state gets its signals only when it evicts. A test checks
  // every registered policy's declaration (scores are the same with undeclared signals zeroed).
  virtual uint8_t signals() const { return kAllSignals; }

  // The token signals (lib/core/token_signal.h) Observe and Score read, by registered name:
  // TokenView::token_signals holds their values in this order. Fixed for the policy's lifetime.
  // An unknown name makes the policy fail to start (NotFound naming it). Default: none.
  virtual std::vector<std::string> token_signals() const { return {}; }

  // Floats of per-token state this policy keeps. Fixed for the policy's lifetime.
  virtual int32_t state_size() const { return 0; }
  // Called once per step after the signals were updated, with every live token; may update
  // each token's state. The default does nothing. Called only for a policy with state
  // (state_size() > 0): state is all it may write.
  virtual void Observe(std::span<const TokenView> tokens, PolicyContext& ctx) const {
    (void)tokens;
    (void)ctx;
  }
  // Called when an eviction runs (after Observe of the same step): writes scores[i] for
  // tokens[i], higher = keep. Must not modify state. NaN scores count as lowest.
  virtual void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
                     std::span<float> scores) const = 0;

  // The first failure of an Observe or Score call, for a policy whose calls can fail (a Python
  // policy whose code raised, lib/pypolicy): the evictor checks it after each call and returns
  // it as its own Status, so a run ends with it as with any other error. Ok for C++ policies,
  // which cannot fail. Must be thread-safe.
  virtual Status failure() const { return Status::Ok(); }
};

// What the registry knows about a policy.
struct PolicyInfo {
  std::string name;
  std::string rule;  // One line: what the policy keeps.
  std::vector<ParamSpec> params;
  std::string source_file;  // __FILE__ of the registering file (for `vtoken-cli policies`).
  std::function<std::unique_ptr<Policy>(const PolicyParams&)> factory;

  // A PolicyInfo building `P` from its resolved params (P(const PolicyParams&)) or, for a
  // policy without parameters, from its default constructor.
  template <typename P>
  static PolicyInfo Of(std::string name, std::string rule, std::string source_file,
                       std::vector<ParamSpec> params) {
    PolicyInfo info{std::move(name), std::move(rule), std::move(params), std::move(source_file),
                    nullptr};
    info.factory = [](const PolicyParams& p) -> std::unique_ptr<Policy> {
      if constexpr (std::is_constructible_v<P, const PolicyParams&>) {
        return std::make_unique<P>(p);
      } else {
        (void)p;
        return std::make_unique<P>();
      }
    };
    return info;
  }
};

// Adds a policy to the process-wide registry (static initialization). Two policies with one
// name are a build error that cannot be reported as a value: the process exits with a message
// naming both files.
bool RegisterPolicy(PolicyInfo info);

}  // namespace vtoken

#define VTOKEN_POLICY_CONCAT_INNER(a, b) a##b
#define VTOKEN_POLICY_CONCAT(a, b) VTOKEN_POLICY_CONCAT_INNER(a, b)

// Registers class `Class` as policy `name` ("snake_case" string) with a one-line `rule`,
// followed by its ParamSpecs, e.g.
//   VTOKEN_REGISTER_POLICY(Tova, "tova", "keep the highest last-step attention");
//   VTOKEN_REGISTER_POLICY(Decayed, "decayed_attention", "keep ...",
//                          DoubleParam("decay", 0.9, "per-step decay", /*min=*/0, /*max=*/1));
#define VTOKEN_REGISTER_POLICY(Class, name, rule, ...)                                           \
  [[maybe_unused]] static const bool VTOKEN_POLICY_CONCAT(vtoken_policy_registered_, __LINE__) = \
      ::vtoken::RegisterPolicy(                                                                  \
          ::vtoken::PolicyInfo::Of<Class>(name, rule, __FILE__, {__VA_ARGS__}))
