#include "lib/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "lib/core/reclaimer.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/policy_step.h"
#include "lib/engine/run_verifier.h"
#include "lib/engine/scheduler.h"
#include "lib/engine/sequence_state.h"

namespace vtoken::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The run clock of real runners: wall time since Start; idle waits sleep.
class WallClock final : public model::RunClock {
 public:
  void Start() override { start_ = Clock::now(); }
  double Now() override { return Since(start_); }
  void WaitUntil(double t) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(t - Now()));
  }
  void HostWork(HostPhase, double) override {}  // Already on the wall clock.

 private:
  Clock::time_point start_;
};

bool EvictionOn(const EngineOptions& o) { return o.mode != Mode::kNative && !o.indirection_only; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Engine {
 public:
  Engine(const EngineOptions& o, model::ModelRunner& runner, std::unique_ptr<PolicyEvictor> ev,
         const std::vector<Request>& requests)
      : o_(o),
        runner_(runner),
        evictor_(std::move(ev)),
        groups_(runner.num_kv_groups()),
        cache_(CacheOptions{.mode = o.mode, .pool = o.pool, .num_groups = groups_}),
        reclaimer_(cache_, runner.copy_engine(), o.reclaim, runner.kv_bytes_per_token() / groups_),
        verifier_(runner, result_),
        seqs_(SequencesOf(requests, runner)),
        scheduler_(o, seqs_, cache_, reclaimer_, runner.copy_engine(), evictor_.get(), groups_),
        policy_(evictor_.get(), o.policy_threads, runner_, cache_, groups_, seqs_),
        clock_(runner.clock() != nullptr ? *runner.clock() : wall_clock_) {
    reclaimer_.set_force_sync(o.force_sync);
    if (o.verify) reclaimer_.set_observer(&verifier_);
  }

  StatusOr<EngineResult> Run(const StepCallback& on_step, const StopRequest& stop) {
    clock_.Start();
    while (finished_ < static_cast<int64_t>(seqs_.size())) {
      scheduler_.Arrivals(clock_.Now());
      if (scheduler_.idle()) {
        clock_.WaitUntil(scheduler_.next_arrival_s());
        continue;
      }
      VTOKEN_RETURN_IF_ERROR(Step());
      if (on_step) on_step(result_.steps.back(), finished_, static_cast<int64_t>(seqs_.size()));
      if (stop && stop()) {
        VTOKEN_RETURN_IF_ERROR(reclaimer_.Drain());
        return FailedPreconditionError("stopped after step " +
                                       std::to_string(result_.steps.back().step));
      }
    }
    VTOKEN_RETURN_IF_ERROR(reclaimer_.Drain());
    result_.wall_s = clock_.Now();
    result_.kv_groups = groups_;
    const ReclaimStats& rs = reclaimer_.stats();
    result_.plans = rs.plans;
    result_.moves = rs.moves;
    result_.bytes_moved = rs.bytes;
    result_.blocks_reclaimed = rs.blocks_freed;
    result_.fence_waits = rs.fence_waits;
    result_.planner_s = rs.planner_seconds;
    result_.fence_s = rs.fence_seconds;
    result_.preemptions = scheduler_.num_preemptions();
    result_.peak_running = scheduler_.peak_running();
    result_.forks = scheduler_.num_forks();
    for (SeqState& s : seqs_) result_.requests.push_back(std::move(s.result));
    return std::move(result_);
  }

 private:
  // The sequences of `requests`, in their order: the model's BOS (if it has one) then the prompt.
  static std::vector<SeqState> SequencesOf(const std::vector<Request>& requests,
                                           const model::ModelRunner& runner) {
    std::vector<SeqState> seqs(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      SeqState& s = seqs[i];
      s.request = &requests[i];
      s.index = i;
      // The BOS counts as a prompt token.
      if (runner.bos_token_id()) s.tokens.push_back(*runner.bos_token_id());
      s.tokens.insert(s.tokens.end(), requests[i].prompt_tokens.begin(),
                      requests[i].prompt_tokens.end());
      s.result.request_id = requests[i].id;
      s.question_pending = !requests[i].question_tokens.empty();
      if (requests[i].prefix_group >= 0 && requests[i].shared_prefix_tokens > 0) {
        s.shared_tokens = requests[i].shared_prefix_tokens + (runner.bos_token_id() ? 1 : 0);
      }
      s.result.prompt_tokens = static_cast<int64_t>(requests[i].prompt_tokens.size() +
                                                    requests[i].question_tokens.size());
      s.result.arrival_s = requests[i].arrival_s;
    }
    return seqs;
  }

  void Finish(size_t index) {
    SeqState& s = seqs_[index];
    RequestResult& r = s.result;
    r.finish_s = clock_.Now();
    r.e2e_s = r.finish_s - r.arrival_s;
    r.ttft_s = r.first_token_s - r.arrival_s;
    const int64_t n = static_cast<int64_t>(r.output_tokens.size());
    r.tpot_s = n > 1 ? (r.finish_s - r.first_token_s) / static_cast<double>(n - 1) : 0.0;
    r.blocks_final = cache_.num_blocks_held(s.seq);
    r.live_final = cache_.num_live(s.seq);
    r.ideal_blocks_final = static_cast<int32_t>(cache_.IdealBlocks(s.seq));
    if (groups_ > 1) {  // Group g = layer * (groups per layer) + KV head (KvGroupOf).
      const int32_t layers = std::max(1, o_.evictor.num_layers);
      const int32_t per_layer = groups_ % layers == 0 ? groups_ / layers : groups_;
      r.live_per_group.assign(groups_ / per_layer, std::vector<int64_t>(per_layer));
      for (int32_t g = 0; g < groups_; ++g) {
        r.live_per_group[g / per_layer][g % per_layer] = cache_.table(s.seq, g).num_live();
      }
    }
    r.blocks_mean = s.blocks_samples > 0 ? s.blocks_sum / static_cast<double>(s.blocks_samples)
                                         : r.blocks_final;
    scheduler_.Finish(index);
    runner_.ForgetRequest(s.request->id);
    ++finished_;
  }

  // The live context of a sequence before this step's tokens, group-major, as RunnerInput
  // takes it: slots, their logical ids, and per-group offsets (empty with one group).
  struct Context {
    std::vector<SlotIndex> slots;
    std::vector<int64_t> positions;
    std::vector<int64_t> offsets;
  };

  // The context of a step that registered its `n` new tokens (the last n live entries of every
  // group, left out): every group's live list. Taken once every sequence of the step has its
  // tokens, so the relocations a failed reservation forced have already moved the slots it lists.
  Context LiveContext(SeqId seq, int64_t n) const {
    Context c;
    size_t live = 1;  // AppendLive's spare element (when the list holds dead ids).
    for (int32_t g = 0; g < groups_; ++g) {
      live += static_cast<size_t>(cache_.table(seq, g).num_live() - n);
    }
    c.slots.reserve(live);
    c.positions.reserve(live);
    if (groups_ > 1) c.offsets.reserve(static_cast<size_t>(groups_) + 1);
    if (groups_ > 1) c.offsets.push_back(0);
    for (int32_t g = 0; g < groups_; ++g) {
      cache_.table(seq, g).AppendLive(c.slots, c.positions, /*leave_out=*/n);
      if (groups_ > 1) c.offsets.push_back(static_cast<int64_t>(c.slots.size()));
    }
    return c;
  }

  Status Step() {
    StepRecord step;
    step.step = static_cast<int64_t>(result_.steps.size());
    const int64_t moves_before = reclaimer_.stats().moves;
    const int64_t fences_before = reclaimer_.stats().fence_waits;
    scheduler_.Admit();
    double schedule_s = 0;  // The new tokens' slots, then every sequence's input.
    VTOKEN_ASSIGN_OR_RETURN(std::vector<Planned> planned, scheduler_.Reserve(schedule_s));

    std::vector<model::RunnerInput> inputs;
    inputs.reserve(planned.size());
    for (Planned& p : planned) {
      SeqState& s = seqs_[p.index];
      VTOKEN_RETURN_IF_ERROR(reclaimer_.FenceForRead(s.seq).status());
      const auto schedule_start = Clock::now();  // The fence's wait is fence_s, not this.
      model::RunnerInput in;
      in.request = s.request->id;
      in.prefix_request = s.prefix_request;
      in.tokens.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + p.n);
      for (int64_t i = 0; i < p.n; ++i) in.positions.push_back(s.num_computed + i);
      in.write_slots = std::move(p.slots);
      Context context = LiveContext(s.seq, p.n);
      in.context_slots = std::move(context.slots);
      in.context_positions = std::move(context.positions);
      in.context_offsets = std::move(context.offsets);
      in.sample = s.num_computed + p.n == static_cast<int64_t>(s.tokens.size());
      const std::vector<int32_t>& forced = s.request->forced_tokens;
      if (in.sample && !s.question_pending && s.result.output_tokens.size() < forced.size()) {
        in.score_token = forced[s.result.output_tokens.size()];
      }
      in.sampling = o_.sampling;
      in.sampling.seed = o_.sampling.seed ^ (static_cast<uint64_t>(s.request->id) * 0x9e3779b9);
      in.obs_window = o_.obs_window;
      // The policy observes a sequence once its prompt is in the cache (then every step); the
      // model computes signals for the steps whose signals it reads.
      in.want_signals = evictor_ != nullptr && in.sample && evictor_->SignalsWanted(s.seq);
      if (evictor_ != nullptr) {
        in.signals = ModelSignals(evictor_->signals());
        in.keep_query_moments = evictor_->reads_queries();
      }
      inputs.push_back(std::move(in));
      schedule_s += Since(schedule_start);
    }
    result_.schedule_s += schedule_s;
    clock_.HostWork(model::RunClock::HostPhase::kSchedule, schedule_s);
    const double forward_start = clock_.Now();
    VTOKEN_ASSIGN_OR_RETURN(std::vector<model::RunnerOutput> outputs, runner_.Forward(inputs));
    result_.forward_s += clock_.Now() - forward_start;

    const auto policy_start = Clock::now();
    VTOKEN_ASSIGN_OR_RETURN(const std::vector<std::optional<PolicyStep::GroupVictimLists>> victims,
                            policy_.Run(planned, inputs, outputs));
    std::vector<size_t> done;
    for (size_t i = 0; i < planned.size(); ++i) {
      SeqState& s = seqs_[planned[i].index];
      s.num_computed += planned[i].n;
      VTOKEN_RETURN_IF_ERROR(scheduler_.Computed(planned[i].index));
      if (victims[i].has_value()) {
        s.observed = true;
        for (int32_t g = 0; g < groups_; ++g) {
          const std::vector<TokenId>& group = (*victims[i])[g];
          for (TokenId t : group) VTOKEN_RETURN_IF_ERROR(cache_.EvictToken(s.seq, g, t));
          result_.evictions += static_cast<int64_t>(group.size());
        }
      }
      if (inputs[i].sample && s.question_pending) {
        // The context is in the cache and evicted: append the question instead of a token.
        const std::vector<int32_t>& q = s.request->question_tokens;
        s.question_pending = false;
        s.tokens.insert(s.tokens.end(), q.begin(), q.end());
        s.question_end = static_cast<int64_t>(s.tokens.size());
      } else if (inputs[i].sample) {
        RequestResult& r = s.result;
        const bool forced = inputs[i].score_token >= 0;
        const int32_t token = forced ? inputs[i].score_token : outputs[i].next_token;
        if (forced) r.token_logprobs.push_back(outputs[i].score_logprob);
        if (r.output_tokens.empty()) r.first_token_s = clock_.Now();
        r.output_tokens.push_back(token);
        s.tokens.push_back(token);
        const auto& eos = runner_.eos_token_ids();
        const bool is_eos = std::find(eos.begin(), eos.end(), token) != eos.end();
        if (static_cast<int64_t>(r.output_tokens.size()) >= s.request->max_tokens ||
            (o_.stop_at_eos && is_eos && !forced)) {
          done.push_back(planned[i].index);
        }
      }
    }
    const double policy_s = Since(policy_start);
    result_.policy_s += policy_s;
    clock_.HostWork(model::RunClock::HostPhase::kPolicy, policy_s);
    for (size_t index : done) Finish(index);
    if (o_.mode == Mode::kVtoken && !o_.indirection_only) {
      const double planner_before = reclaimer_.stats().planner_seconds;
      VTOKEN_RETURN_IF_ERROR(reclaimer_.Step().status());
      clock_.HostWork(model::RunClock::HostPhase::kPlanner,
                      reclaimer_.stats().planner_seconds - planner_before);
    }
    VTOKEN_RETURN_IF_ERROR(reclaimer_.Poll());
    if (o_.verify) verifier_.CheckCache(cache_);
    for (size_t index : scheduler_.running()) {
      SeqState& s = seqs_[index];
      s.blocks_sum += cache_.num_blocks_held(s.seq);
      ++s.blocks_samples;
    }
    const FragStats fs = cache_.Stats();
    step.time_s = clock_.Now();
    step.num_running = static_cast<int32_t>(scheduler_.running().size());
    step.num_waiting = scheduler_.num_waiting();
    step.free_blocks = cache_.pool().num_free_blocks();
    step.allocated_blocks = static_cast<int32_t>(fs.allocated_blocks);
    step.live_slots = fs.live_slots;
    step.held_blocks = static_cast<int32_t>(fs.held_blocks);
    step.ideal_blocks = static_cast<int32_t>(fs.ideal_blocks);
    step.waste_ratio = fs.waste_ratio;
    for (int i = 0; i < 4; ++i) step.hist[i] = static_cast<int32_t>(fs.utilization_hist[i]);
    step.moves = reclaimer_.stats().moves - moves_before;
    step.fence_waits = reclaimer_.stats().fence_waits - fences_before;
    result_.steps.push_back(step);
    return Status::Ok();
  }

  const EngineOptions& o_;
  model::ModelRunner& runner_;
  std::unique_ptr<PolicyEvictor> evictor_;
  const int32_t groups_;  // KV groups of the runner's store (1: token granularity).
  VirtualKvCache cache_;
  Reclaimer reclaimer_;
  EngineResult result_;
  RunVerifier verifier_;
  std::vector<SeqState> seqs_;
  Scheduler scheduler_;
  PolicyStep policy_;
  int64_t finished_ = 0;
  WallClock wall_clock_;
  model::RunClock& clock_;
};

}  // namespace

Status ValidateEngineOptions(const EngineOptions& o, const model::ModelRunner& runner,
                             const std::vector<Request>& requests) {
  VTOKEN_RETURN_IF_ERROR(ValidateBlockPoolOptions(o.pool));
  VTOKEN_RETURN_IF_ERROR(ValidateReclaimOptions(o.reclaim));
  if (o.max_num_seqs < 1) return InvalidArgumentError("max_num_seqs must be >= 1");
  if (o.max_prefill_chunk < 1) return InvalidArgumentError("max_prefill_chunk must be >= 1");
  if (o.max_batched_tokens != 0 && o.max_batched_tokens < o.max_num_seqs) {
    return InvalidArgumentError("max_batched_tokens must be 0 or >= max_num_seqs (" +
                                std::to_string(o.max_num_seqs) + ")");
  }
  if (o.obs_window < 1) return InvalidArgumentError("obs_window must be >= 1");
  if (o.policy_threads < 0) {
    return InvalidArgumentError("policy_threads must be >= 0, got " +
                                std::to_string(o.policy_threads));
  }
  if (o.indirection_only && o.mode != Mode::kVtoken) {
    return InvalidArgumentError("indirection_only needs mode vtoken");
  }
  const int32_t groups = runner.num_kv_groups();
  if (EvictionOn(o)) {  // Unknown policy, bad parameters, impossible budget.
    VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<PolicyEvictor> evictor,
                            PolicyEvictor::Create(o.policy, o.policy_params, o.evictor));
    if (!evictor->token_signals().empty()) {  // A runner without K/V rows cannot give them.
      std::vector<float> none;
      const Status can = runner.TokenSignals({}, evictor->token_signals(), {}, none);
      if (!can.ok()) {
        return FailedPreconditionError("policy " + o.policy + " reads token signal " +
                                       evictor->token_signals()[0]->name + ": " + can.message());
      }
      // A view has a column per layer or row of a group: the evictor's count must be the model's.
      const KvGroupRows want = runner.kv_group_rows();
      const KvGroupRows have =
          KvGroupRowsOf(o.evictor.granularity, o.evictor.num_layers, o.evictor.num_kv_heads);
      for (const TokenSignalInfo* info : evictor->token_signals()) {
        if (info->columns(have.layers, have.heads) == info->columns(want.layers, want.heads)) {
          continue;
        }
        return InvalidArgumentError(
            "policy " + o.policy + " reads token signal " + info->name + ": the evictor's KV " +
            "groups span " + std::to_string(have.layers) + " layer(s) of " +
            std::to_string(have.heads) + " KV head(s), the model's " + std::to_string(want.layers) +
            " of " + std::to_string(want.heads) + " (evictor num_layers / num_kv_heads)");
      }
    }
    if (NumGroups(o.evictor) != groups) {
      return InvalidArgumentError(
          "the policy's KV groups (" + std::string(GranularityName(o.evictor.granularity)) + ": " +
          std::to_string(NumGroups(o.evictor)) + ") differ from the model's (" +
          GranularityName(runner.granularity()) + ": " + std::to_string(groups) + ")");
    }
  }
  const int64_t slots = int64_t{o.pool.num_blocks} * o.pool.block_size;
  if (slots != runner.num_slots()) {
    return InvalidArgumentError("the model's KV store has " + std::to_string(runner.num_slots()) +
                                " slots, the pool " + std::to_string(slots));
  }
  const int64_t usable = o.pool.num_blocks - o.pool.headroom_blocks;
  for (const Request& r : requests) {
    const int64_t prompt =
        static_cast<int64_t>(r.prompt_tokens.size()) + (runner.bos_token_id() ? 1 : 0);
    if (r.prompt_tokens.empty())
      return InvalidArgumentError("request " + std::to_string(r.id) + " is empty");
    if (r.max_tokens < 1) {
      return InvalidArgumentError("request " + std::to_string(r.id) + " has max_tokens < 1");
    }
    const int64_t question = static_cast<int64_t>(r.question_tokens.size());
    if (question > 0 && o.admission != EngineOptions::Admission::kReserve) {
      return InvalidArgumentError(
          "request " + std::to_string(r.id) +
          " appends its question after eviction (query_agnostic): it needs admission reserve, "
          "as a preempted request would be prefilled again with its question");
    }
    if (prompt + question + r.max_tokens > runner.max_context()) {
      return InvalidArgumentError("request " + std::to_string(r.id) + " needs " +
                                  std::to_string(prompt + question + r.max_tokens) +
                                  " positions, the model's context is " +
                                  std::to_string(runner.max_context()));
    }
    for (int32_t t : r.prompt_tokens) {
      if (t < 0 || t >= runner.vocab_size()) {
        return InvalidArgumentError("request " + std::to_string(r.id) + " has token id " +
                                    std::to_string(t) + " outside the vocabulary");
      }
    }
    if (!r.forced_tokens.empty() && static_cast<int64_t>(r.forced_tokens.size()) != r.max_tokens) {
      return InvalidArgumentError("request " + std::to_string(r.id) + " forces " +
                                  std::to_string(r.forced_tokens.size()) +
                                  " tokens but has max_tokens " + std::to_string(r.max_tokens));
    }
    for (int32_t t : r.forced_tokens) {
      if (t < 0 || t >= runner.vocab_size()) {
        return InvalidArgumentError("request " + std::to_string(r.id) + " forces token id " +
                                    std::to_string(t) + " outside the vocabulary");
      }
    }
    for (int32_t t : r.question_tokens) {
      if (t < 0 || t >= runner.vocab_size()) {
        return InvalidArgumentError("request " + std::to_string(r.id) + " has token id " +
                                    std::to_string(t) + " outside the vocabulary");
      }
    }
    const int64_t tokens =
        o.mode == Mode::kNative ? prompt + question + r.max_tokens : prompt + question;
    const int64_t need = (CeilDiv(tokens, o.pool.block_size) + 1) * groups;
    if (need > usable) {
      return ResourceExhaustedError(
          "pool too small: request " + std::to_string(r.id) + " needs " + std::to_string(need) +
          " blocks of " + std::to_string(o.pool.block_size) + " tokens, the pool offers " +
          std::to_string(usable) + " (" + std::to_string(o.pool.num_blocks) + " minus " +
          std::to_string(o.pool.headroom_blocks) + " headroom)");
    }
  }
  return Status::Ok();
}

StatusOr<EngineResult> RunEngine(const EngineOptions& options, model::ModelRunner& runner,
                                 const std::vector<Request>& requests, const StepCallback& on_step,
                                 const StopRequest& stop) {
  VTOKEN_RETURN_IF_ERROR(ValidateEngineOptions(options, runner, requests));
  std::unique_ptr<PolicyEvictor> evictor;
  if (EvictionOn(options)) {
    EvictorOptions eo = options.evictor;
    eo.seed = options.seed;
    VTOKEN_ASSIGN_OR_RETURN(evictor,
                            PolicyEvictor::Create(options.policy, options.policy_params, eo));
  }
  Engine engine(options, runner, std::move(evictor), requests);
  return engine.Run(on_step, stop);
}

}  // namespace vtoken::engine
