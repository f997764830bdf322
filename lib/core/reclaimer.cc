#include "lib/core/reclaimer.h"

#include <chrono>
#include <string>

namespace vtoken {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Reclaimer::Reclaimer(VirtualKvCache& cache, CopyEngine& engine, const ReclaimOptions& options,
                     int64_t bytes_per_slot)
    : cache_(cache),
      engine_(engine),
      planner_(options),
      forced_planner_([&] {
        ReclaimOptions o = options;
        o.trigger = ReclaimOptions::Trigger::kAlways;
        return o;
      }()),
      bytes_per_slot_(bytes_per_slot) {}

StatusOr<int64_t> Reclaimer::Step(bool force) {
  const auto start = std::chrono::steady_clock::now();
  const ReclaimPlanner& planner = force ? forced_planner_ : planner_;
  // Runs every engine step: decide the trigger from O(1) pool figures before reading the
  // token tables.
  if (!planner.Triggered(cache_.PoolSnapshot())) {
    stats_.planner_seconds += SecondsSince(start);
    return int64_t{0};
  }
  const ReclaimPlan plan = cache_.PlanReclaim(planner);
  stats_.planner_seconds += SecondsSince(start);
  if (plan.empty()) return int64_t{0};
  VTOKEN_ASSIGN_OR_RETURN(Relocation relocation, cache_.BeginRelocation(plan));
  if (observer_ != nullptr) observer_->BeforeCopy(relocation);
  const CopyTicket ticket = engine_.Submit(relocation.Copies());
  for (const SeqRelocation& s : relocation.seqs) {
    VTOKEN_RETURN_IF_ERROR(cache_.ApplyMoves(s.seq, s.moves, s.group));
  }
  const int64_t moves = relocation.num_moves();
  ++stats_.plans;
  stats_.moves += moves;
  stats_.bytes += moves * bytes_per_slot_;
  stats_.blocks_freed += plan.blocks_freed();
  in_flight_.push_back({std::move(relocation), ticket});
  if (force_sync_) VTOKEN_RETURN_IF_ERROR(Drain());
  return moves;
}

Status Reclaimer::RetireFront() {
  InFlight& front = in_flight_.front();
  if (observer_ != nullptr) observer_->AfterCopy(front.relocation);
  Status status = cache_.CompleteRelocation(front.relocation.id);
  in_flight_.pop_front();
  return status;
}

Status Reclaimer::Poll() {
  while (!in_flight_.empty() && engine_.Poll(in_flight_.front().ticket)) {
    VTOKEN_RETURN_IF_ERROR(RetireFront());
  }
  return Status::Ok();
}

StatusOr<bool> Reclaimer::FenceForRead(SeqId seq) {
  VTOKEN_RETURN_IF_ERROR(Poll());
  // Tickets complete in order: fencing on the newest relocation whose destinations seq reads (its
  // own moved tokens, or a block shared by a fork) covers every earlier one.
  const uint64_t relocation = cache_.HasSequence(seq) ? cache_.NewestPendingRead(seq) : 0;
  if (relocation == 0) return false;
  CopyTicket ticket = 0;
  for (const InFlight& f : in_flight_) {
    if (f.relocation.id == relocation) ticket = f.ticket;
  }
  if (ticket == 0) {
    return InternalError("sequence " + std::to_string(seq) + " reads pending slots of relocation " +
                         std::to_string(relocation) + ", which is not in flight");
  }
  ++stats_.fence_waits;
  if (ticket <= device_fenced_through_) {  // The consumer already waits for it on the device.
    ++stats_.device_fences;
    return true;
  }
  const auto start = std::chrono::steady_clock::now();
  if (engine_.FenceConsumer(ticket)) {
    device_fenced_through_ = ticket;
    ++stats_.device_fences;
  } else {
    while (!in_flight_.empty() && in_flight_.front().ticket <= ticket) {
      VTOKEN_RETURN_IF_ERROR(RetireFront());
    }
    ++stats_.host_fence_waits;
  }
  stats_.fence_seconds += SecondsSince(start);
  return true;
}

Status Reclaimer::Drain() {
  const auto start = std::chrono::steady_clock::now();
  while (!in_flight_.empty()) {
    engine_.Wait(in_flight_.front().ticket);
    VTOKEN_RETURN_IF_ERROR(RetireFront());
  }
  stats_.fence_seconds += SecondsSince(start);
  return Status::Ok();
}

}  // namespace vtoken
