// The policy's part of an engine step (step 5 of engine.h): for every sequence of the step whose
// tokens are now all in the cache, hand its live tokens and the runner's signals to the policy
// (PolicyEvictor::Observe) and take the victims it picks, per KV group. The sequences are
// independent, so a large step runs on a task team (EngineOptions::policy_threads); nothing here
// touches the cache, and the caller evicts the victims in the step's order, so the results do not
// depend on the thread count. Not thread-safe (one step at a time).
//
// Token signals (lib/core/token_signal.h): for a policy that reads some, the runner computes them
// (ModelRunner::TokenSignals) on this thread before the sequences go to the team: absolute ones
// for each group's tokens the policy has not seen yet (Observe hands them over with the live
// tokens), relative ones for every live token of each group on an eviction step
// (PolicyEvictor::ObserveRelative after Observe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "lib/core/policy_evictor.h"
#include "lib/core/status.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/sequence_state.h"
#include "lib/engine/task_team.h"
#include "lib/runner/model_runner.h"

namespace vtoken::engine {

class PolicyStep {
 public:
  // Victims of one sequence: one token list per KV group.
  using GroupVictimLists = std::vector<std::vector<TokenId>>;

  // `evictor`: null without a policy (native mode, indirection_only). `threads`: as
  // EngineOptions::policy_threads (0 = this machine's hardware threads). `runner`, `cache`,
  // `seqs` and the evictor must outlive this object.
  PolicyStep(PolicyEvictor* evictor, int32_t threads, const model::ModelRunner& runner,
             const VirtualKvCache& cache, int32_t groups, const std::vector<SeqState>& seqs);

  // The policy's work of a step whose forward ran: per planned sequence (REQUIRES: its
  // num_computed not yet advanced), its victims, or nullopt when the policy does not observe it
  // (no policy, or a prefill chunk before the last). `inputs` and `outputs` are the forward's, in
  // `planned`'s order. The first error in the step's order wins: the policy's, or Internal when
  // the runner returned too few or too many signals.
  StatusOr<std::vector<std::optional<GroupVictimLists>>> Run(
      const std::vector<Planned>& planned, const std::vector<model::RunnerInput>& inputs,
      const std::vector<model::RunnerOutput>& outputs);

  // Context tokens (over all groups) of a step's observed sequences from which the work goes to
  // the task team: below it, waking the team costs more than the work.
  static constexpr size_t kTeamMinTokens = size_t{1} << 12;

 private:
  // Whether the sequence's tokens in the cache end inside its query-agnostic question (the
  // question's chunks were just computed, the first output not yet sampled).
  static bool InQuestion(const SeqState& s);

  // Hands every group's live tokens, and its signals when the step asked for them, to the
  // policy. Group g's live tokens are its context (the input's context_positions range) then the
  // step's new tokens, which is also RunnerOutput's group-major layout of the signals.
  // A step without signals of a sequence the policy has seen (`observed`) lists only its new
  // tokens: the cache evicted nothing but the policy's victims since. `token_values[g]`: group
  // g's token signals of the tokens it has not seen (TokenValues); empty when the policy reads
  // none.
  Status Observe(SeqId seq, bool observed, const model::RunnerInput& in,
                 const model::RunnerOutput& out,
                 const std::vector<std::vector<float>>& token_values);
  // Per group, the token signals of the live tokens the policy has not seen yet (the suffix of
  // context then new tokens from PolicyEvictor::UnseenFrom); no lists at all when it reads none
  // (the step's hot path at 256 groups allocates nothing for them).
  StatusOr<std::vector<std::vector<float>>> TokenValues(SeqId seq, const model::RunnerInput& in);
  // Per group, the relative token signals of every live token (context then new tokens), for an
  // eviction step; no lists when the policy reads none.
  StatusOr<std::vector<std::vector<float>>> RelativeValues(const model::RunnerInput& in);
  // Per group g, `signals` of its live tokens with ids >= from(g) (a suffix of context then new
  // tokens), from the runner.
  StatusOr<std::vector<std::vector<float>>> GroupValues(
      const model::RunnerInput& in, std::span<const TokenSignalInfo* const> signals,
      const std::function<TokenId(int32_t group)>& from);

  PolicyEvictor* evictor_;
  const model::ModelRunner& runner_;
  // The evictor's absolute and relative token signals (none without a policy).
  std::span<const TokenSignalInfo*const> absolute_, relative_;
  std::unique_ptr<TaskTeam> team_;  // Null with one thread or without a policy.
  const VirtualKvCache& cache_;
  const int32_t groups_;
  const std::vector<SeqState>& seqs_;
};

}  // namespace vtoken::engine
