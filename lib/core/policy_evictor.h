// PolicyEvictor: the runtime side of the policy SDK. It keeps, per sequence and by logical token
// id, the signals a policy sees (age, attn, attn_sum, key_norm) and the policy's per-token state;
// it decides when to evict, enforces the budget, protects sink and recent tokens, and turns the
// policy's scores into victims.
//
// Per sequence and step the caller (the engine, or SyntheticSignalDriver of synthetic_signals.h
// for `vtoken-cli check`) does:
//   Observe(seq, live tokens, attn, key_norm[, token signals of the new tokens])
//                                                the first call for a seq is its prefill;
//   Victims(seq)                                 tokens to evict now (often none);
//   VirtualKvCache::EvictToken for each victim;
// and Forget(seq) when the sequence ends. A step is one Observe call of that sequence (ages count
// them); a chunked prefill is observed once, after its last chunk. Because everything is keyed
// by logical token id, a relocation (which changes slots, never ids) is invisible here. Before
// the step, SignalsWanted(seq) says whether its signals are read: when not (a policy that reads
// them only when it evicts, between evictions) the caller observes the live tokens alone and the
// model computes no signals; the victims are the same either way.
//
// KV groups (EvictorOptions::granularity): with G > 1 groups the caller observes every group of
// a sequence each step (Observe(seq, group, ...)), then asks GroupVictims(seq) for each group's
// victims and evicts them with VirtualKvCache::EvictToken(seq, group, token). Each group has its
// own signals, policy state, step count and random stream; the policy scores one group at a time
// (PolicyContext::group). How many tokens each group keeps is the budget allocation
// (budget_allocation.h): uniform (every group the budget), pyramid (per layer) or adaptive
// (shared by a layer's heads).
//
// Token signals (token_signal.h): a policy that names some in Policy::token_signals() gets their
// values for every token. Absolute ones are given once per token: each Observe / ObserveAppended
// carries them for the tokens the group has not seen yet (ids >= UnseenFrom(seq, group), a suffix
// of the live list), and the evictor keeps them with the token until it is evicted. Relative ones
// are given for every live token on each eviction step (ScoresNext before the step says which):
// ObserveRelative after the group's Observe, before GroupVictims; they hold this step's values
// in Score (in a policy's Observe, which runs inside the evictor's, the last eviction's).
//
// Victim selection: when eviction is due (the prefill step, then every evict_interval-th decode
// step) and the sequence holds more live tokens than its budget, the first num_sink and last
// num_recent live tokens are protected and the lowest-scoring other tokens are evicted until
// exactly `budget` remain. Ties go to the older token: candidates are ordered by (score,
// position), NaN scores first, so equal scores evict the lower position first.
//
// Defined in policy_evictor.cc (options, signal bookkeeping: Observe, Track, Forget, Budget) and
// victim_selection.cc (LowestEntries, Victims, GroupVictims).
//
// Thread safety: calls for one sequence must not overlap. Calls for different sequences may run
// concurrently once each of them is known (Track, or an earlier Observe): each then touches only
// its own sequence's state, and a policy's methods are const (policy.h). Track of an unknown
// sequence, its first Observe without Track, and Forget change the set of sequences and must not
// overlap any other call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lib/core/budget_allocation.h"
#include "lib/core/policy.h"
#include "lib/core/status.h"
#include "lib/core/token_signal.h"

namespace vtoken {

// The victim rule's selection: the indices in [first, last) of the `k` lowest `scores`, ordered by
// (score, index) with NaN lowest and -0 equal to +0, returned in increasing order.
// REQUIRES: 0 <= first <= last <= scores.size(), 0 <= k <= last - first.
std::vector<int64_t> LowestEntries(std::span<const float> scores, int64_t first, int64_t last,
                                   int64_t k);

struct EvictorOptions {
  // Live tokens a sequence keeps after an eviction, >= 1. 0: use keep_ratio instead.
  int64_t budget_tokens = 0;
  // Budget as a fraction of the prompt (the live tokens at a sequence's first Observe), in
  // (0, 1]: budget = max(1, floor(keep_ratio * prompt)). 0: use budget_tokens. Exactly one of
  // budget_tokens and keep_ratio must be set.
  double keep_ratio = 0;
  // First and last live tokens that are never evicted. With budget_tokens their sum may not
  // exceed the budget; a keep_ratio budget smaller than their sum wins over them (sinks are kept
  // first, then the most recent tokens), so the budget always holds.
  int64_t num_sink = 0;
  int64_t num_recent = 0;
  // Eviction runs after prefill and then every evict_interval decode steps. Default 1.
  int64_t evict_interval = 1;
  // Seeds the PolicyRng of each sequence (together with its seq id and group).
  uint64_t seed = 0;
  // KV groups of the cache and their layout (NumKvGroups(granularity, num_layers, num_kv_heads)).
  Granularity granularity = Granularity::kToken;
  int32_t num_layers = 1;
  int32_t num_kv_heads = 1;
  // How the budget is split over groups. pyramid needs layer or head granularity, adaptive head.
  BudgetAllocation allocation = BudgetAllocation::kUniform;
  double pyramid_beta = 20;     // pyramid: the last layer keeps budget / beta; >= 1.
  double adaptive_floor = 0.2;  // adaptive: each head keeps >= floor * budget; in [0, 1].
};

int32_t NumGroups(const EvictorOptions& options);

// One line for run headers: the signals `policy` reads and the steps on which the model computes
// them with `evict_interval` (PolicyEvictor::SignalsWanted), e.g. "reads attn when it evicts:
// signals on the prefill and every 8th step", then its token signals, e.g. "; token signals
// value_l1_norm once per token".
std::string SignalSchedule(const Policy& policy, int64_t evict_interval);

// The registered token signals `policy` names (Policy::token_signals()), in its order: NotFound
// naming the policy and the first unknown name.
StatusOr<std::vector<const TokenSignalInfo*>> ResolveTokenSignals(const Policy& policy,
                                                                  std::string_view policy_name);

// InvalidArgument naming the field for impossible options (negative counts, neither or both of
// budget_tokens and keep_ratio, keep_ratio outside (0, 1], protection above budget_tokens, an
// allocation the granularity cannot express).
Status ValidateEvictorOptions(const EvictorOptions& options);

class PolicyEvictor {
 public:
  // Looks the policy up, resolves its parameters and token signals and validates the options:
  // NotFound for an unknown policy or token signal, InvalidArgument for bad parameters or options.
  static StatusOr<std::unique_ptr<PolicyEvictor>> Create(std::string_view policy,
                                                         const RawParams& params,
                                                         const EvictorOptions& options);
  // REQUIRES: ValidateEvictorOptions(options).ok(), policy != nullptr, and
  // ResolveTokenSignals(*policy, name).ok().
  PolicyEvictor(std::string name, std::unique_ptr<Policy> policy, const EvictorOptions& options);

  const std::string& policy_name() const { return name_; }
  // The signals the policy reads (Policy::signals()): the rest may be passed as zeros.
  uint8_t signals() const { return signals_; }
  // The token signals the policy reads (ResolveTokenSignals), in its order; then those of them
  // that are absolute (given once per token to Observe) and relative (ObserveRelative), each in
  // that order.
  std::span<const TokenSignalInfo* const> token_signals() const { return token_signals_; }
  std::span<const TokenSignalInfo* const> absolute_token_signals() const {
    return absolute_signals_;
  }
  std::span<const TokenSignalInfo* const> relative_token_signals() const {
    return relative_signals_;
  }
  // Values per token of the absolute and of the relative token signals in one group (a view
  // gives several, TokenSignalInfo::columns), and where each token signal's start in a token's
  // values (PolicyContext::token_signal_offsets).
  size_t absolute_width() const { return absolute_columns_.size(); }
  size_t relative_width() const { return relative_columns_.size(); }
  std::span<const int32_t> token_signal_offsets() const { return token_signal_offsets_; }
  // A token signal of the policy reads the query statistics (TokenSignalInfo::queries): the
  // runner must keep them for every step of every sequence (RunnerInput::keep_query_moments).
  bool reads_queries() const {
    for (const TokenSignalInfo* s : relative_signals_) {
      if (s->queries) return true;
    }
    return false;
  }
  // Whether the policy may score `seq` at its next step, which then needs ObserveRelative for a
  // policy with relative token signals: an eviction step (its first Observe, then every
  // evict_interval-th) and, given `live_counts` (each group's live tokens at that step, one per
  // group), a group above what it keeps (for a sequence never observed: any eviction step).
  bool ScoresNext(SeqId seq, std::span<const int64_t> live_counts = {}) const;
  // The first token id `group` of `seq` has not seen: Observe and ObserveAppended take the token
  // signals of the tokens from this id on (0 for a sequence never observed).
  TokenId UnseenFrom(SeqId seq, int32_t group) const;
  // Whether the next Observe of `seq` (every group's) reads its signals: on every step for a
  // policy that accumulates attention or keeps state from signals (ReadsSignalsEveryStep), else
  // only on the steps where an eviction is due (a sequence's first Observe, then every
  // evict_interval-th), and never for a policy that declares none. Without it the caller may
  // observe the live tokens with empty attn and key_norm (no signals computed).
  bool SignalsWanted(SeqId seq) const;
  const EvictorOptions& options() const { return options_; }

  // Records one step of `seq`: its live tokens in increasing logical order with the attention
  // mass each received this step and its key norm; then runs the policy's Observe. Tokens never
  // seen are new (age 0, zero state); a token seen before and missing now was evicted. Empty
  // attn and key_norm for a non-empty `live`: no signals this step (SignalsWanted false).
  // `token_values`: with absolute token signals, their values for the live tokens with ids >=
  // UnseenFrom(seq, group) before this call, token-major ([new tokens]
  // [absolute_width()]); else empty. InvalidArgument for mismatched lengths, missing
  // signals the policy reads this step, ids not strictly increasing, a non-finite signal, or a
  // token that was evicted and is listed as live again.
  Status Observe(SeqId seq, std::span<const TokenId> live, std::span<const float> attn,
                 std::span<const float> key_norm, std::span<const float> token_values = {}) {
    return Observe(seq, 0, live, attn, key_norm, token_values);
  }
  // The same for one group of a sequence (0 <= group < NumGroups(options), else InvalidArgument).
  // A failed first Observe of a sequence that Track did not make known leaves it unknown.
  Status Observe(SeqId seq, int32_t group, std::span<const TokenId> live,
                 std::span<const float> attn, std::span<const float> key_norm,
                 std::span<const float> token_values = {});
  // Records one step of a group in which no signals are read (SignalsWanted false) and whose
  // live tokens are those of its last step plus `appended` (new ids, increasing): the caller
  // evicted nothing but this evictor's victims since. Costs O(appended), where Observe costs
  // O(live). `token_values`: the appended tokens' token signals, as Observe takes them.
  // FailedPrecondition before the group's first Observe; InvalidArgument for a step whose
  // signals the policy reads, ids that are not new and increasing, or token values of the wrong
  // length or not finite.
  Status ObserveAppended(SeqId seq, int32_t group, std::span<const TokenId> appended,
                         std::span<const float> token_values = {});
  // Gives group `group`'s relative token signals for this step: the values of every live token
  // of its last Observe, token-major ([live][relative_width()]). Required on an
  // eviction step of a policy that reads relative token signals (GroupVictims is
  // FailedPrecondition without it). FailedPrecondition before the group's first Observe;
  // InvalidArgument for the wrong length or a non-finite value.
  Status ObserveRelative(SeqId seq, int32_t group, std::span<const float> values);
  // Returns the tokens to evict now, in increasing order (empty when eviction is not due this
  // step, already ran this step, or the sequence is within budget). The evictor treats them as
  // evicted at once; the caller must evict each from the cache. NotFound for a sequence never
  // observed; FailedPrecondition with more than one group (use GroupVictims).
  StatusOr<std::vector<TokenId>> Victims(SeqId seq);
  // Per group (result[g]), the tokens to evict now, as Victims does for one group. Every group
  // of the sequence must have been observed this step (FailedPrecondition otherwise).
  StatusOr<std::vector<std::vector<TokenId>>> GroupVictims(SeqId seq);
  // Makes `seq` known, as its first Observe would (no-op for a known sequence), so that calls
  // for it may run concurrently with calls for other known sequences.
  void Track(SeqId seq);
  // Drops everything kept for `seq` (no-op for an unknown seq).
  void Forget(SeqId seq);

  bool HasSequence(SeqId seq) const { return seqs_.count(seq) > 0; }
  // The budget of `seq`, fixed at its first Observe. NotFound for an unknown seq.
  StatusOr<int64_t> Budget(SeqId seq) const { return Budget(seq, 0); }
  // The tokens `group` keeps after an eviction: the budget under uniform, its layer's under
  // pyramid; under adaptive the mean (the layer's heads share num_kv_heads times it).
  StatusOr<int64_t> Budget(SeqId seq, int32_t group) const;

 private:
  struct SeqState {  // One group of one sequence.
    explicit SeqState(uint64_t seed) : rng(seed) {}
    int64_t step = -1;           // Observe calls so far minus one.
    int64_t evicted_step = -1;   // Step of the last eviction.
    int64_t relative_step = -1;  // Step of the last ObserveRelative.
    int64_t budget = 0;
    TokenId known = 0;          // One past the largest id ever observed.
    std::vector<TokenId> live;  // Live tokens, increasing.
    // Parallel to live (entry i is token live[i]), so that a step's pass over the tokens reads
    // and writes contiguous memory whatever the ids; an eviction compacts them.
    std::vector<int64_t> written_step;
    std::vector<float> attn;
    std::vector<float> attn_sum;
    std::vector<float> key_norm;
    std::vector<float> state;         // [live.size() * state_size]
    std::vector<float> token_values;  // [live.size() * width_]
    PolicyRng rng;
  };

  // "seq <seq>", as the evictor's messages name a sequence.
  static std::string SeqText(SeqId seq);
  // The first fault of an observation, as an InvalidArgument naming it. REQUIRES: it has one.
  Status ObservationError(SeqId seq, const SeqState& s, std::span<const TokenId> live,
                          std::span<const float> attn, std::span<const float> key_norm) const;
  // Brings s's entries to the tokens of `live` (a checked observation): entries of tokens no
  // longer listed go, tokens never seen get new ones (written this step, zero state). False,
  // leaving s unchanged, when `live` lists a token that was evicted.
  // `step` is the step being observed (new tokens are written at it).
  bool MatchLive(SeqState& s, std::span<const TokenId> live, int64_t step) const;
  // Appends entries for new tokens `ids` (written at `step`, zero signals and state) to s.
  void AppendNew(SeqState& s, std::span<const TokenId> ids, int64_t step) const;
  // Runs the policy's Observe on the step just recorded in `s` (a policy with state only).
  void EndObserve(SeqState& s, int32_t group);
  // Writes the absolute token signals `values` of the tokens appended last to s (their columns).
  void StoreAbsolute(SeqState& s, std::span<const float> values) const;
  // InvalidArgument unless `values` holds the absolute token signals of `count` new tokens
  // (finite).
  Status TokenValuesError(SeqId seq, size_t count, std::span<const float> values) const;
  // The state of `group` of `seq`: InvalidArgument for a bad group, FailedPrecondition naming
  // `what` when the group was never observed.
  StatusOr<SeqState*> ObservedGroup(SeqId seq, int32_t group, std::string_view what);
  // InvalidArgument when a token signal value of `values` is not finite, else Ok.
  static Status NonFiniteError(SeqId seq, std::span<const float> values);
  // InvalidArgument for a group outside [0, num_groups_), else Ok.
  Status GroupError(SeqId seq, int32_t group) const;
  // The InvalidArgument of an observation without the signals the policy reads at `step`.
  Status MissingSignalsError(SeqId seq, int64_t step) const;
  // s's live tokens as the policy sees them, in a buffer of the calling thread (valid until its
  // next call).
  std::span<const TokenView> Views(SeqState& s);
  // True when the policy reads the signals of a group's step `step` (0: its first Observe).
  bool ReadsSignals(int64_t step) const;
  // True when group state `s` evicts this step (due, not yet run, above `keep`).
  bool Due(const SeqState& s, int64_t keep) const;
  // True when GroupVictims scores group g of `groups` (one sequence's) this step: Due for its
  // budget, or under adaptive allocation its layer due and above the layer's shared budget.
  bool Scored(const std::vector<SeqState>& groups, int32_t g) const;
  // The policy's scores for s's live tokens (marks the step as evicted).
  std::vector<float> Score(SeqState& s, int32_t group);
  // Protected tokens at the front (sinks) and back (recent) of s.live for a group keeping `keep`.
  std::pair<int64_t, int64_t> Protected(int64_t keep) const;
  // Evicts the lowest-scoring unprotected tokens until `keep` remain; returns them, increasing.
  std::vector<TokenId> Pick(SeqState& s, const std::vector<float>& scores, int64_t keep) const;
  // adaptive: the victims of one layer's heads (groups [first, first + num_kv_heads)).
  void AdaptiveLayer(std::vector<SeqState>& groups, int32_t first,
                     std::vector<std::vector<TokenId>>& victims);

  std::string name_;
  std::unique_ptr<Policy> policy_;
  int32_t state_size_;
  uint8_t signals_;  // policy_->signals()
  std::vector<const TokenSignalInfo*> token_signals_;
  std::vector<const TokenSignalInfo*> absolute_signals_, relative_signals_;
  // Where each token signal's values start in a token's, then their sum (PolicyContext).
  std::vector<int32_t> token_signal_offsets_;
  size_t width_ = 0;  // Values per token: token_signal_offsets_.back().
  // The columns of the absolute and of the relative signals' values, each in order.
  std::vector<size_t> absolute_columns_, relative_columns_;
  bool every_step_;  // ReadsSignalsEveryStep(signals_, state_size_)
  EvictorOptions options_;
  int32_t num_groups_;
  std::unordered_map<SeqId, std::vector<SeqState>> seqs_;  // One state per group.
};

}  // namespace vtoken
