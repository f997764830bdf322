#include "lib/engine/policy_step.h"

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <utility>

namespace vtoken::engine {

PolicyStep::PolicyStep(PolicyEvictor* evictor, int32_t threads, const model::ModelRunner& runner,
                       const VirtualKvCache& cache, int32_t groups,
                       const std::vector<SeqState>& seqs)
    : evictor_(evictor), runner_(runner), cache_(cache), groups_(groups), seqs_(seqs) {
  if (evictor_ != nullptr) {
    absolute_ = evictor_->absolute_token_signals();
    relative_ = evictor_->relative_token_signals();
  }
  const int n =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (evictor_ != nullptr && n > 1) team_ = std::make_unique<TaskTeam>(n);
}

bool PolicyStep::InQuestion(const SeqState& s) {
  return s.question_end > 0 && s.result.output_tokens.empty() &&
         static_cast<int64_t>(s.tokens.size()) == s.question_end;
}

StatusOr<std::vector<std::vector<float>>> PolicyStep::TokenValues(SeqId seq,
                                                                  const model::RunnerInput& in) {
  if (absolute_.empty()) return std::vector<std::vector<float>>();  // Observe's convention.
  return GroupValues(in, absolute_, [&](int32_t g) { return evictor_->UnseenFrom(seq, g); });
}

StatusOr<std::vector<std::vector<float>>> PolicyStep::RelativeValues(const model::RunnerInput& in) {
  return GroupValues(in, relative_, [](int32_t) { return TokenId{0}; });
}

StatusOr<std::vector<std::vector<float>>> PolicyStep::GroupValues(
    const model::RunnerInput& in, std::span<const TokenSignalInfo* const> signals,
    const std::function<TokenId(int32_t group)>& from) {
  std::vector<std::vector<float>> values(static_cast<size_t>(groups_));
  const size_t n = in.positions.size();
  std::vector<SlotIndex> slots;
  std::vector<int64_t> positions;
  for (int32_t g = 0; g < groups_; ++g) {
    const auto [begin, end] = model::ContextRange(in, g);
    const TokenId first = from(g);
    const auto ctx_first = in.context_positions.begin() + begin;
    const auto ctx_last = in.context_positions.begin() + end;
    const auto from_ctx = std::lower_bound(ctx_first, ctx_last, first) - ctx_first;
    const auto from_new =
        std::lower_bound(in.positions.begin(), in.positions.end(), first) - in.positions.begin();
    slots.assign(in.context_slots.begin() + begin + from_ctx, in.context_slots.begin() + end);
    const auto new_slots = in.write_slots.begin() + static_cast<std::ptrdiff_t>(g * n);
    slots.insert(slots.end(), new_slots + from_new, new_slots + static_cast<std::ptrdiff_t>(n));
    positions.assign(ctx_first + from_ctx, ctx_last);
    positions.insert(positions.end(), in.positions.begin() + from_new, in.positions.end());
    const TokenSignalScope scope{.request = in.request, .group = g, .positions = positions};
    VTOKEN_RETURN_IF_ERROR(runner_.TokenSignals(slots, signals, scope, values[g]));
  }
  return values;
}

Status PolicyStep::Observe(SeqId seq, bool observed, const model::RunnerInput& in,
                           const model::RunnerOutput& out,
                           const std::vector<std::vector<float>>& token_values) {
  auto values = [&](int32_t g) {
    return token_values.empty() ? std::span<const float>()
                                : std::span<const float>(token_values[g]);
  };
  const bool signals = in.want_signals;
  if (!signals && observed) {
    for (int32_t g = 0; g < groups_; ++g) {
      VTOKEN_RETURN_IF_ERROR(evictor_->ObserveAppended(seq, g, in.positions, values(g)));
    }
    return Status::Ok();
  }
  size_t offset = 0;
  std::vector<TokenId> live;
  for (int32_t g = 0; g < groups_; ++g) {
    const auto [begin, end] = model::ContextRange(in, g);
    live.assign(in.context_positions.begin() + begin, in.context_positions.begin() + end);
    live.insert(live.end(), in.positions.begin(), in.positions.end());
    if (!signals) {
      VTOKEN_RETURN_IF_ERROR(evictor_->Observe(seq, g, live, {}, {}, values(g)));
      continue;
    }
    if (offset + live.size() > out.attn.size() || out.attn.size() != out.key_norm.size()) {
      return InternalError("the runner returned " + std::to_string(out.attn.size()) +
                           " signals for " + std::to_string(cache_.num_live(seq)) +
                           " live tokens in " + std::to_string(groups_) + " groups");
    }
    VTOKEN_RETURN_IF_ERROR(evictor_->Observe(
        seq, g, live, std::span<const float>(out.attn).subspan(offset, live.size()),
        std::span<const float>(out.key_norm).subspan(offset, live.size()), values(g)));
    offset += live.size();
  }
  if (signals && offset != out.attn.size()) {
    return InternalError("the runner returned " + std::to_string(out.attn.size()) +
                         " signals for " + std::to_string(offset) + " live tokens");
  }
  return Status::Ok();
}

StatusOr<std::vector<std::optional<PolicyStep::GroupVictimLists>>> PolicyStep::Run(
    const std::vector<Planned>& planned, const std::vector<model::RunnerInput>& inputs,
    const std::vector<model::RunnerOutput>& outputs) {
  std::vector<std::optional<GroupVictimLists>> victims(planned.size());
  if (!evictor_) return victims;
  std::vector<size_t> observed;  // Indices into planned.
  // Per observed sequence and group, its token signals (the runner's, on this thread).
  std::vector<std::vector<std::vector<float>>> token_values, relative_values;
  std::vector<int64_t> live_counts;  // Per group, of the sequence at hand.
  for (size_t i = 0; i < planned.size(); ++i) {
    const SeqState& s = seqs_[planned[i].index];
    if (s.num_computed + planned[i].n != static_cast<int64_t>(s.tokens.size())) continue;
    observed.push_back(i);
    // Relative signals only when the policy will score (an eviction step with a group above its
    // budget; a query-agnostic question never evicts).
    bool relative = !relative_.empty() && !InQuestion(s);
    if (relative) {
      live_counts.resize(static_cast<size_t>(groups_));
      for (int32_t g = 0; g < groups_; ++g) {
        const auto [begin, end] = model::ContextRange(inputs[i], g);
        live_counts[g] = static_cast<int64_t>(end - begin + inputs[i].positions.size());
      }
      relative = evictor_->ScoresNext(s.seq, live_counts);
    }
    evictor_->Track(s.seq);  // Known before the calls that may run concurrently.
    VTOKEN_ASSIGN_OR_RETURN(std::vector<std::vector<float>> values, TokenValues(s.seq, inputs[i]));
    token_values.push_back(std::move(values));
    relative_values.emplace_back();
    if (relative) {
      VTOKEN_ASSIGN_OR_RETURN(relative_values.back(), RelativeValues(inputs[i]));
    }
  }
  std::vector<Status> status(observed.size());
  auto work = [&](int64_t k) {
    const size_t i = observed[k];
    const SeqState& s = seqs_[planned[i].index];
    const SeqId seq = s.seq;
    // A query-agnostic question is observed (every live token, its chunks included) and never
    // evicts: the next eviction comes at a decode step, when the policy's schedule says.
    if (InQuestion(s)) {
      status[k] = Observe(seq, /*observed=*/false, inputs[i], outputs[i], token_values[k]);
      return;
    }
    status[k] = Observe(seq, s.observed, inputs[i], outputs[i], token_values[k]);
    for (size_t g = 0; g < relative_values[k].size() && status[k].ok(); ++g) {
      status[k] = evictor_->ObserveRelative(seq, static_cast<int32_t>(g), relative_values[k][g]);
    }
    if (!status[k].ok()) return;
    StatusOr<GroupVictimLists> v = evictor_->GroupVictims(seq);
    if (!v.ok()) {
      status[k] = v.status();
      return;
    }
    victims[i] = *std::move(v);
  };
  const int64_t n = static_cast<int64_t>(observed.size());
  // Small steps stay on this thread: waking the team costs more than their work.
  size_t tokens = 0;
  for (size_t i : observed) {  // A step without signals of an observed sequence is O(new).
    if (inputs[i].want_signals || !seqs_[planned[i].index].observed) {
      tokens += inputs[i].context_slots.size();
    }
  }
  if (team_ != nullptr && tokens >= kTeamMinTokens) {
    team_->ParallelFor(n, work);
  } else {
    for (int64_t k = 0; k < n; ++k) work(k);
  }
  for (const Status& s : status) VTOKEN_RETURN_IF_ERROR(s);
  return victims;
}

}  // namespace vtoken::engine
