#include "lib/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <string>

namespace vtoken::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Scheduler::Scheduler(const EngineOptions& options, std::vector<SeqState>& seqs,
                     VirtualKvCache& cache, Reclaimer& reclaimer, CopyEngine& copies,
                     PolicyEvictor* evictor, int32_t groups)
    : o_(options),
      seqs_(seqs),
      cache_(cache),
      reclaimer_(reclaimer),
      evictor_(evictor),
      groups_(groups),
      forks_(seqs, running_, cache, copies) {
  for (size_t i = 0; i < seqs_.size(); ++i) arrival_order_.push_back(i);
  std::stable_sort(arrival_order_.begin(), arrival_order_.end(), [&](size_t a, size_t b) {
    return seqs_[a].request->arrival_s < seqs_[b].request->arrival_s;
  });
}

double Scheduler::next_arrival_s() const {
  return seqs_[arrival_order_[next_arrival_]].request->arrival_s;
}

void Scheduler::Arrivals(double now) {
  while (next_arrival_ < arrival_order_.size() &&
         seqs_[arrival_order_[next_arrival_]].request->arrival_s <= now) {
    waiting_.push_back(arrival_order_[next_arrival_++]);
  }
}

int64_t Scheduler::PendingQuestion(const SeqState& s) {
  return s.question_pending ? static_cast<int64_t>(s.request->question_tokens.size()) : 0;
}

int64_t Scheduler::Growth(const SeqState& s) const {
  int64_t tokens = static_cast<int64_t>(s.tokens.size()) - s.num_computed;
  tokens += PendingQuestion(s);
  if (o_.admission == EngineOptions::Admission::kReserve) {
    tokens += s.request->max_tokens - static_cast<int64_t>(s.result.output_tokens.size());
  }
  if (s.seq == kNoSeq) return CeilDiv(tokens, o_.pool.block_size) * groups_;
  return cache_.BlocksNeededFor(s.seq, tokens);
}

void Scheduler::Admit() {
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
    forks_.Admitted(s.index);
    running_.push_back(s.index);
  }
  peak_running_ = std::max(peak_running_, static_cast<int32_t>(running_.size()));
}

StatusOr<std::vector<Planned>> Scheduler::Reserve(double& sync_s) {
  using Clock = std::chrono::steady_clock;
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
    int64_t n = std::min(
        {static_cast<int64_t>(s.tokens.size()) - s.num_computed, o_.max_prefill_chunk, budget});
    if (n == 0) continue;  // No budget left this step.
    if (s.shared_tokens > 0 && s.num_computed < s.shared_tokens) {
      n = std::min(n, s.shared_tokens - s.num_computed);  // End a chunk at the shared prefix.
    }
    while (true) {
      const auto sync_start = Clock::now();
      StatusOr<std::vector<SlotIndex>> slots = cache_.SyncNewTokens(s.seq, n);
      sync_s += std::chrono::duration<double>(Clock::now() - sync_start).count();
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

void Scheduler::Finish(size_t index) { Drop(index); }

void Scheduler::Preempt(size_t index) {
  Drop(index);
  SeqState& s = seqs_[index];
  s.num_computed = 0;
  s.awaiting_fork = false;
  s.prefix_request = -1;  // A restart computes its prefix or forks it again.
  ++s.result.preemptions;
  ++num_preemptions_;
  waiting_.push_front(index);
}

void Scheduler::Drop(size_t index) {
  SeqState& s = seqs_[index];
  forks_.Leaving(index);
  cache_.FreeSequence(s.seq).IgnoreError();
  if (evictor_ != nullptr) evictor_->Forget(s.seq);
  s.seq = kNoSeq;
  running_.erase(std::find(running_.begin(), running_.end(), index));
}

}  // namespace vtoken::engine
