#include "lib/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "lib/core/reclaimer.h"
#include "lib/core/virtual_kv_cache.h"
#include "lib/engine/task_team.h"

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

struct SeqState {
  const Request* request = nullptr;
  size_t index = 0;
  SeqId seq = kNoSeq;
  std::vector<int32_t> tokens;  // Prompt, then sampled outputs.
  int64_t num_computed = 0;     // Leading tokens whose KV is in the cache.
  bool observed = false;        // The policy saw this sequence's prefill.
  int64_t shared_tokens = 0;    // Leading tokens shared with its prefix group (BOS included).
  bool awaiting_fork = false;   // Admitted; will fork its group leader's shared prefix.
  int64_t prefix_request = -1;  // The leader's request id once forked (RunnerInput's field).
  // Request::question_tokens not yet appended to `tokens` (query-agnostic tasks); then the
  // question's end in `tokens`.
  bool question_pending = false;
  int64_t question_end = 0;
  int64_t admitted = 0;         // Admission order; preemption takes the newest.
  RequestResult result;
  double blocks_sum = 0;
  int64_t blocks_samples = 0;
};

// Compares per-token KV hashes around relocations (EngineOptions::verify).
class HashObserver final : public RelocationObserver {
 public:
  HashObserver(model::ModelRunner& runner, EngineResult& result)
      : runner_(runner), result_(result) {}
  // One batched hash call per relocation and side (a device runner hashes on the device).
  void BeforeCopy(const Relocation& rel) override {
    std::vector<SlotIndex> srcs, dsts;
    for (const SeqRelocation& s : rel.seqs) {
      for (const Move& m : s.moves) {
        srcs.push_back(m.src);
        dsts.push_back(m.dst);
      }
    }
    const std::vector<uint64_t> hashes = runner_.TokenKvHashes(srcs);
    if (!CountMatches(hashes, srcs)) return;
    for (size_t i = 0; i < dsts.size(); ++i) before_[dsts[i]] = hashes[i];
  }
  void AfterCopy(const Relocation& rel) override {
    std::vector<SlotIndex> dsts;
    for (const SeqRelocation& s : rel.seqs) {
      for (const Move& m : s.moves) dsts.push_back(m.dst);
    }
    const std::vector<uint64_t> after = runner_.TokenKvHashes(dsts);
    if (!CountMatches(after, dsts)) return;
    size_t next = 0;
    for (const SeqRelocation& s : rel.seqs) {
      for (const Move& m : s.moves) {
        ++result_.hash_checks;
        auto it = before_.find(m.dst);
        if (it == before_.end() || it->second != after[next++]) {
          ++result_.violations;
          if (result_.first_violations.size() < 10) {
            result_.first_violations.push_back(
                "hash mismatch: token " + std::to_string(m.token) + " of sequence " +
                std::to_string(s.seq) + " moved " + std::to_string(m.src) + " -> " +
                std::to_string(m.dst));
          }
        }
        if (it != before_.end()) before_.erase(it);
      }
    }
  }

 private:
  bool CountMatches(const std::vector<uint64_t>& hashes, const std::vector<SlotIndex>& slots) {
    if (hashes.size() == slots.size()) return true;
    ++result_.violations;
    if (result_.first_violations.size() < 10) {
      result_.first_violations.push_back("the runner returned " + std::to_string(hashes.size()) +
                                         " KV hashes for " + std::to_string(slots.size()) +
                                         " slots");
    }
    return false;
  }

  model::ModelRunner& runner_;
  EngineResult& result_;
  std::map<SlotIndex, uint64_t> before_;
};

class Engine {
 public:
  Engine(const EngineOptions& o, model::ModelRunner& runner, std::unique_ptr<PolicyEvictor> ev,
         const std::vector<Request>& requests)
      : o_(o),
        runner_(runner),
        evictor_(std::move(ev)),
        groups_(runner.num_kv_groups()),
        cache_(CacheOptions{.mode = o.mode, .pool = o.pool, .num_groups = groups_}),
        reclaimer_(cache_, runner.copy_engine(), o.reclaim,
                   runner.kv_bytes_per_token() / groups_),
        observer_(runner, result_),
        clock_(runner.clock() != nullptr ? *runner.clock() : wall_clock_) {
    reclaimer_.set_force_sync(o.force_sync);
    if (o.verify) reclaimer_.set_observer(&observer_);
    const int threads = o.policy_threads > 0
                            ? o.policy_threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (evictor_ != nullptr && threads > 1) team_ = std::make_unique<TaskTeam>(threads);
    seqs_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      seqs_[i].request = &requests[i];
      seqs_[i].index = i;
      // The model's BOS (if it has one) starts every sequence; it counts as a prompt token.
      if (runner.bos_token_id()) seqs_[i].tokens.push_back(*runner.bos_token_id());
      seqs_[i].tokens.insert(seqs_[i].tokens.end(), requests[i].prompt_tokens.begin(),
                             requests[i].prompt_tokens.end());
      seqs_[i].result.request_id = requests[i].id;
      seqs_[i].question_pending = !requests[i].question_tokens.empty();
      if (requests[i].prefix_group >= 0 && requests[i].shared_prefix_tokens > 0) {
        seqs_[i].shared_tokens =
            requests[i].shared_prefix_tokens + (runner.bos_token_id() ? 1 : 0);
      }
      seqs_[i].result.prompt_tokens = static_cast<int64_t>(requests[i].prompt_tokens.size() +
                                                           requests[i].question_tokens.size());
      seqs_[i].result.arrival_s = requests[i].arrival_s;
      arrival_order_.push_back(i);
    }
    std::stable_sort(arrival_order_.begin(), arrival_order_.end(), [&](size_t a, size_t b) {
      return requests[a].arrival_s < requests[b].arrival_s;
    });
  }

  StatusOr<EngineResult> Run(const StepCallback& on_step, const StopRequest& stop) {
    clock_.Start();
    while (finished_ < static_cast<int64_t>(seqs_.size())) {
      Arrivals();
      if (running_.empty() && waiting_.empty()) {
        clock_.WaitUntil(seqs_[arrival_order_[next_arrival_]].request->arrival_s);
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
    for (SeqState& s : seqs_) result_.requests.push_back(std::move(s.result));
    return std::move(result_);
  }

 private:
  void Arrivals() {
    const double now = clock_.Now();
    while (next_arrival_ < arrival_order_.size() &&
           seqs_[arrival_order_[next_arrival_]].request->arrival_s <= now) {
      waiting_.push_back(arrival_order_[next_arrival_++]);
    }
  }

  // Tokens of `s`'s query-agnostic question not yet in `tokens`.
  static int64_t PendingQuestion(const SeqState& s) {
    return s.question_pending ? static_cast<int64_t>(s.request->question_tokens.size()) : 0;
  }

  // Blocks `s` may still need: the rest of its prompt and, with kReserve, of its output.
  int64_t Growth(const SeqState& s) const {
    int64_t tokens = static_cast<int64_t>(s.tokens.size()) - s.num_computed;
    tokens += PendingQuestion(s);
    if (o_.admission == EngineOptions::Admission::kReserve) {
      tokens += s.request->max_tokens - static_cast<int64_t>(s.result.output_tokens.size());
    }
    if (s.seq == kNoSeq) return CeilDiv(tokens, o_.pool.block_size) * groups_;
    return cache_.BlocksNeededFor(s.seq, tokens);
  }

  void Admit() {
    int64_t reserved = 0;
    for (size_t index : running_) reserved += Growth(seqs_[index]);
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < o_.max_num_seqs) {
      SeqState& s = seqs_[waiting_.front()];
      const int64_t need = Growth(s);
      if (need + reserved > cache_.pool().num_allocatable_blocks()) break;  // FCFS.
      reserved += need;
      waiting_.pop_front();
      s.seq = cache_.AddSequence();
      cache_.ReserveTokens(s.seq, static_cast<int64_t>(s.tokens.size()) + PendingQuestion(s) +
                                      s.request->max_tokens -
                                      static_cast<int64_t>(s.result.output_tokens.size()));
      s.num_computed = 0;
      s.observed = false;
      s.admitted = next_admission_++;
      s.awaiting_fork = false;
      if (s.shared_tokens > 0) {
        const int32_t group = s.request->prefix_group;
        auto it = leaders_.find(group);
        if (it == leaders_.end() || !IsLeaderForkable(it->second, s.shared_tokens)) {
          leaders_[group] = s.index;
        } else {
          s.awaiting_fork = true;
        }
      }
      running_.push_back(s.index);
    }
    result_.peak_running = std::max(result_.peak_running, static_cast<int32_t>(running_.size()));
  }

  // Whether the sequence's tokens in the cache end inside its query-agnostic question (the
  // question's chunks were just computed, the first output not yet sampled).
  bool InQuestion(const SeqState& s) const {
    return s.question_end > 0 && s.result.output_tokens.empty() &&
           static_cast<int64_t>(s.tokens.size()) == s.question_end;
  }

  // True while `leader` runs and has not yet computed past (or evicted from) the shared prefix.
  bool IsLeaderForkable(size_t leader, int64_t shared_tokens) const {
    const SeqState& l = seqs_[leader];
    return l.seq != kNoSeq && !l.observed && !l.awaiting_fork && l.num_computed <= shared_tokens &&
           l.shared_tokens == shared_tokens;
  }

  // The leader of a group just computed its shared prefix: every member waiting for it takes the
  // prefix blocks by reference (ForkSequence) instead of recomputing them.
  Status ForkMembers(size_t leader) {
    const SeqState& l = seqs_[leader];
    for (size_t index : running_) {
      SeqState& m = seqs_[index];
      if (!m.awaiting_fork || m.request->prefix_group != l.request->prefix_group) continue;
      VTOKEN_RETURN_IF_ERROR(cache_.FreeSequence(m.seq));
      VTOKEN_ASSIGN_OR_RETURN(ForkResult fork, cache_.ForkSequence(l.seq, l.num_computed));
      if (!fork.copies.empty()) {
        CopyEngine& engine = runner_.copy_engine();
        engine.Wait(engine.Submit(fork.copies));
      }
      m.seq = fork.child;
      cache_.ReserveTokens(m.seq, static_cast<int64_t>(m.tokens.size()) + m.request->max_tokens);
      m.num_computed = l.num_computed;
      m.awaiting_fork = false;
      m.prefix_request = l.request->id;
      ++result_.forks;
    }
    return Status::Ok();
  }

  // Members stop waiting when their leader can no longer share (finished or preempted).
  void ReleaseMembers(size_t leader) {
    const SeqState& l = seqs_[leader];
    if (l.shared_tokens == 0) return;
    for (size_t index : running_) {
      if (seqs_[index].request->prefix_group == l.request->prefix_group) {
        seqs_[index].awaiting_fork = false;
      }
    }
    auto it = leaders_.find(l.request->prefix_group);
    if (it != leaders_.end() && it->second == leader) leaders_.erase(it);
  }

  // Drops a running sequence's KV; it goes back to the head of the waiting queue and will be
  // recomputed (prompt + outputs so far) when readmitted.
  void Preempt(size_t index) {
    SeqState& s = seqs_[index];
    ReleaseMembers(index);
    cache_.FreeSequence(s.seq).IgnoreError();
    if (evictor_) evictor_->Forget(s.seq);
    s.seq = kNoSeq;
    s.num_computed = 0;
    s.awaiting_fork = false;
    s.prefix_request = -1;  // A restart computes its prefix or forks it again.
    ++s.result.preemptions;
    ++result_.preemptions;
    running_.erase(std::find(running_.begin(), running_.end(), index));
    waiting_.push_front(index);
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
    ReleaseMembers(index);
    cache_.FreeSequence(s.seq).IgnoreError();
    if (evictor_) evictor_->Forget(s.seq);
    runner_.ForgetRequest(s.request->id);
    s.seq = kNoSeq;
    running_.erase(std::find(running_.begin(), running_.end(), index));
    ++finished_;
  }

  // The live context of a sequence before this step's tokens, group-major, as RunnerInput
  // takes it: slots, their logical ids, and per-group offsets (empty with one group).
  struct Context {
    std::vector<SlotIndex> slots;
    std::vector<int64_t> positions;
    std::vector<int64_t> offsets;
  };

  struct Planned {
    size_t index;
    int64_t n;
    std::vector<SlotIndex> slots;  // [G * n], group-major.
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

  // Registers this step's new tokens for every running sequence, preempting the newest
  // sequences when the pool runs out. Adds the time the reservations took to `sync_s`.
  StatusOr<std::vector<Planned>> Reserve(double& sync_s) {
    std::vector<Planned> planned;
    std::vector<size_t> order = running_;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return seqs_[a].admitted < seqs_[b].admitted; });
    int64_t budget = o_.max_batched_tokens > 0 ? o_.max_batched_tokens : INT64_MAX;
    if (o_.max_batched_tokens > 0) {  // Decodes first, then prefills, each in admission order.
      std::stable_partition(order.begin(), order.end(), [&](size_t index) {
        return static_cast<int64_t>(seqs_[index].tokens.size()) - seqs_[index].num_computed == 1;
      });
    }
    for (size_t index : order) {
      if (std::find(running_.begin(), running_.end(), index) == running_.end()) continue;
      SeqState& s = seqs_[index];
      if (s.awaiting_fork) continue;
      int64_t n = std::min({static_cast<int64_t>(s.tokens.size()) - s.num_computed,
                            o_.max_prefill_chunk, budget});
      if (n == 0) continue;  // No budget left this step.
      if (s.shared_tokens > 0 && s.num_computed < s.shared_tokens) {
        n = std::min(n, s.shared_tokens - s.num_computed);  // End a chunk at the shared prefix.
      }
      while (true) {
        const auto sync_start = Clock::now();
        StatusOr<std::vector<SlotIndex>> slots = cache_.SyncNewTokens(s.seq, n);
        sync_s += Since(sync_start);
        if (slots.ok()) {
          planned.push_back({index, n, std::move(*slots)});
          budget -= n;
          break;
        }
        if (slots.status().code() != StatusCode::kResourceExhausted) return slots.status();
        if (reclaimer_.num_in_flight() > 0) {  // Pinned copy sources come back when done.
          VTOKEN_RETURN_IF_ERROR(reclaimer_.Drain());
          continue;
        }
        if (o_.mode == Mode::kVtoken && !o_.indirection_only) {  // Reclaim before preempting.
          VTOKEN_ASSIGN_OR_RETURN(int64_t moved, reclaimer_.Step(/*force=*/true));
          VTOKEN_RETURN_IF_ERROR(reclaimer_.Drain());
          if (moved > 0) continue;
        }
        // Preempt the newest running sequence (possibly this one).
        size_t victim = running_.front();
        for (size_t r : running_) {
          if (seqs_[r].admitted > seqs_[victim].admitted) victim = r;
        }
        if (victim == index && running_.size() == 1) {
          return ResourceExhaustedError(
              "request " + std::to_string(s.request->id) + " cannot make progress: it alone " +
              "needs more than the pool's " + std::to_string(o_.pool.num_blocks) + " blocks");
        }
        Preempt(victim);
        for (const Planned& p : planned) {
          if (p.index == victim) budget += p.n;  // Its tokens are not computed this step.
        }
        planned.erase(std::remove_if(planned.begin(), planned.end(),
                                     [&](const Planned& p) { return p.index == victim; }),
                      planned.end());
        if (victim == index) break;
      }
    }
    return planned;
  }

  // Hands every group's live tokens, and its signals when the step asked for them, to the
  // policy. Group g's live tokens are its context (the input's context_positions range) then the
  // step's new tokens, which is also RunnerOutput's group-major layout of the signals.
  // A step without signals of a sequence the policy has seen (`observed`) lists only its new
  // tokens: the cache evicted nothing but the policy's victims since.
  Status Observe(SeqId seq, bool observed, const model::RunnerInput& in,
                 const model::RunnerOutput& out) {
    const bool signals = in.want_signals;
    if (!signals && observed) {
      for (int32_t g = 0; g < groups_; ++g) {
        VTOKEN_RETURN_IF_ERROR(evictor_->ObserveAppended(seq, g, in.positions));
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
        VTOKEN_RETURN_IF_ERROR(evictor_->Observe(seq, g, live, {}, {}));
        continue;
      }
      if (offset + live.size() > out.attn.size() || out.attn.size() != out.key_norm.size()) {
        return InternalError("the runner returned " + std::to_string(out.attn.size()) +
                             " signals for " + std::to_string(cache_.num_live(seq)) +
                             " live tokens in " + std::to_string(groups_) + " groups");
      }
      VTOKEN_RETURN_IF_ERROR(evictor_->Observe(
          seq, g, live, std::span<const float>(out.attn).subspan(offset, live.size()),
          std::span<const float>(out.key_norm).subspan(offset, live.size())));
      offset += live.size();
    }
    if (signals && offset != out.attn.size()) {
      return InternalError("the runner returned " + std::to_string(out.attn.size()) +
                           " signals for " + std::to_string(offset) + " live tokens");
    }
    return Status::Ok();
  }

  using GroupVictimLists = std::vector<std::vector<TokenId>>;
  // Context tokens (over all groups) of a step's observed sequences from which the policy's work
  // goes to the task team.
  static constexpr size_t kTeamMinTokens = size_t{1} << 12;

  // The policy's part of a step for every planned sequence whose tokens are now all in the cache:
  // observe its signals, pick its victims (per group); nullopt for the sequences it does not
  // observe (no policy, or a prefill chunk before the last). Independent across sequences, so on
  // the task team; the caller evicts the victims in the step's order, and nothing here touches
  // the cache, so the results do not depend on the thread count. The first error in the step's
  // order wins.
  StatusOr<std::vector<std::optional<GroupVictimLists>>> PolicyWork(
      const std::vector<Planned>& planned, const std::vector<model::RunnerInput>& inputs,
      const std::vector<model::RunnerOutput>& outputs) {
    std::vector<std::optional<GroupVictimLists>> victims(planned.size());
    if (!evictor_) return victims;
    std::vector<size_t> observed;  // Indices into planned.
    for (size_t i = 0; i < planned.size(); ++i) {
      const SeqState& s = seqs_[planned[i].index];
      if (s.num_computed + planned[i].n != static_cast<int64_t>(s.tokens.size())) continue;
      observed.push_back(i);
      evictor_->Track(s.seq);  // Known before the calls that may run concurrently.
    }
    std::vector<Status> status(observed.size());
    auto work = [&](int64_t k) {
      const size_t i = observed[k];
      const SeqState& s = seqs_[planned[i].index];
      const SeqId seq = s.seq;
      // A query-agnostic question is observed (every live token, its chunks included) and never
      // evicts: the next eviction comes at a decode step, when the policy's schedule says.
      if (InQuestion(s)) {
        status[k] = Observe(seq, /*observed=*/false, inputs[i], outputs[i]);
        return;
      }
      status[k] = Observe(seq, s.observed, inputs[i], outputs[i]);
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

  Status Step() {
    StepRecord step;
    step.step = static_cast<int64_t>(result_.steps.size());
    const int64_t moves_before = reclaimer_.stats().moves;
    const int64_t fences_before = reclaimer_.stats().fence_waits;
    Admit();
    double schedule_s = 0;  // The new tokens' slots, then every sequence's input.
    VTOKEN_ASSIGN_OR_RETURN(std::vector<Planned> planned, Reserve(schedule_s));

    std::vector<model::RunnerInput> inputs;
    inputs.reserve(planned.size());
    for (Planned& p : planned) {
      SeqState& s = seqs_[p.index];
      VTOKEN_RETURN_IF_ERROR(reclaimer_.FenceForRead(s.seq).status());
      const auto schedule_start = Clock::now();  // The fence's wait is fence_s, not this.
      model::RunnerInput in;
      in.request = s.request->id;
      in.prefix_request = s.prefix_request;
      in.tokens.assign(s.tokens.begin() + s.num_computed,
                       s.tokens.begin() + s.num_computed + p.n);
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
      if (evictor_ != nullptr) in.signals = ModelSignals(evictor_->signals());
      inputs.push_back(std::move(in));
      schedule_s += Since(schedule_start);
    }
    result_.schedule_s += schedule_s;
    clock_.HostWork(model::RunClock::HostPhase::kSchedule, schedule_s);
    const double forward_start = clock_.Now();
    VTOKEN_ASSIGN_OR_RETURN(std::vector<model::RunnerOutput> outputs, runner_.Forward(inputs));
    result_.forward_s += clock_.Now() - forward_start;

    const auto policy_start = Clock::now();
    VTOKEN_ASSIGN_OR_RETURN(const std::vector<std::optional<GroupVictimLists>> victims,
                            PolicyWork(planned, inputs, outputs));
    std::vector<size_t> done;
    for (size_t i = 0; i < planned.size(); ++i) {
      SeqState& s = seqs_[planned[i].index];
      s.num_computed += planned[i].n;
      if (s.shared_tokens > 0 && s.num_computed == s.shared_tokens) {
        auto it = leaders_.find(s.request->prefix_group);
        if (it != leaders_.end() && it->second == planned[i].index) {
          VTOKEN_RETURN_IF_ERROR(ForkMembers(planned[i].index));
        }
      }
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
    if (o_.verify) {
      ++result_.invariant_checks;
      Status s = cache_.CheckInvariants();
      if (!s.ok()) {
        ++result_.violations;
        if (result_.first_violations.size() < 10) result_.first_violations.push_back(s.ToString());
      }
    }
    for (size_t index : running_) {
      SeqState& s = seqs_[index];
      s.blocks_sum += cache_.num_blocks_held(s.seq);
      ++s.blocks_samples;
    }
    const FragStats fs = cache_.Stats();
    step.time_s = clock_.Now();
    step.num_running = static_cast<int32_t>(running_.size());
    step.num_waiting = static_cast<int32_t>(waiting_.size());
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
  std::unique_ptr<TaskTeam> team_;  // The policy's threads (EngineOptions::policy_threads).
  const int32_t groups_;  // KV groups of the runner's store (1: token granularity).
  VirtualKvCache cache_;
  Reclaimer reclaimer_;
  EngineResult result_;
  HashObserver observer_;
  std::vector<SeqState> seqs_;
  std::vector<size_t> arrival_order_;
  size_t next_arrival_ = 0;
  std::deque<size_t> waiting_;
  std::vector<size_t> running_;
  std::map<int32_t, size_t> leaders_;  // Prefix group -> the member computing its prefix.
  int64_t next_admission_ = 0;
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
    VTOKEN_RETURN_IF_ERROR(PolicyEvictor::Create(o.policy, o.policy_params, o.evictor).status());
    if (NumGroups(o.evictor) != groups) {
      return InvalidArgumentError(
          "the policy's KV groups (" + std::string(GranularityName(o.evictor.granularity)) +
          ": " + std::to_string(NumGroups(o.evictor)) + ") differ from the model's (" +
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
    if (r.prompt_tokens.empty()) return InvalidArgumentError("request " + std::to_string(r.id) + " is empty");
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
    if (!r.forced_tokens.empty() &&
        static_cast<int64_t>(r.forced_tokens.size()) != r.max_tokens) {
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
                                 const std::vector<Request>& requests,
                                 const StepCallback& on_step, const StopRequest& stop) {
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
