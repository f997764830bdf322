#include "lib/sim/sim_runner.h"

#include <xxhash.h>

#include <algorithm>

#include "lib/sim/mix.h"

namespace vtoken::sim {
namespace {

// Positions below 2^28, groups below 2^16 (kMaxKvGroups), requests below 2^20 - 1.
uint64_t Tag(int64_t request, int32_t group, int64_t position) {
  return (static_cast<uint64_t>(request + 1) << 44) | (static_cast<uint64_t>(group) << 28) |
         (static_cast<uint64_t>(position) & 0xfffffffULL);
}
int64_t TagPosition(uint64_t tag) { return static_cast<int64_t>(tag & 0xfffffffULL); }
int32_t TagGroup(uint64_t tag) { return static_cast<int32_t>((tag >> 28) & 0xffffULL); }
int64_t TagRequest(uint64_t tag) { return static_cast<int64_t>(tag >> 44) - 1; }

}  // namespace

// The virtual clock and the copy stream. Host time is charged lazily: after a forward, the host
// phase (host_overhead_s) is pending; Now() includes it, but copies submitted in that phase start
// when the forward ended, which is what lets them overlap it.
class SimRunner::Timeline final : public model::RunClock {
 public:
  explicit Timeline(const SimOptions& o) : o_(o) {}

  void Start() override {
    now_ = pending_host_ = stream_free_ = 0;
    totals_ = {};
  }
  double Now() override { return now_ + pending_host_; }
  void WaitUntil(double t) override {
    Charge();
    now_ = std::max(now_, t);
  }
  void HostWork(HostPhase phase, double measured_s) override {
    const bool measured = phase == HostPhase::kPlanner  ? o_.measured_planner_time
                          : phase == HostPhase::kPolicy ? o_.measured_policy_time
                                                        : o_.measured_schedule_time;
    if (measured) pending_host_ += measured_s;
  }

  void Charge() {
    now_ += pending_host_;
    pending_host_ = 0;
  }
  void Forward(double seconds) {
    Charge();
    now_ += seconds;
    pending_host_ = o_.hardware.host_overhead_s;
    ++totals_.forwards;
    totals_.forward_s += seconds;
  }
  // A copy of `seconds` enters the stream now; returns when it completes.
  double SubmitCopy(double seconds) {
    const double start = std::max(stream_free_, now_);
    stream_free_ = start + seconds;
    totals_.copy_s += seconds;
    if (o_.force_sync) WaitFor(stream_free_);
    return stream_free_;
  }
  void WaitFor(double t) {
    if (t > now_) {
      totals_.copy_stall_s += t - now_;
      now_ = t;
    }
  }
  const Totals& totals() const { return totals_; }

 private:
  const SimOptions& o_;
  double now_ = 0, pending_host_ = 0, stream_free_ = 0;
  Totals totals_;
};

// Moves tags between slots when a copy completes on the virtual clock.
class SimRunner::TagCopyEngine final : public CopyEngine {
 public:
  TagCopyEngine(SimRunner& r) : r_(r) {}

  CopyTicket Submit(std::vector<SlotCopy> copies) override {
    const CopyTicket t = next_++;
    // A group slot holds 1 / groups of a token's KV bytes.
    const double seconds =
        CopySeconds(r_.shape_, r_.o_.hardware, static_cast<int64_t>(copies.size())) /
        static_cast<double>(r_.groups_);
    pending_.push_back({t, r_.timeline_->SubmitCopy(seconds), std::move(copies)});
    if (r_.o_.force_sync) Complete(r_.timeline_->Now());
    return t;
  }
  void Wait(CopyTicket ticket) override {
    r_.timeline_->Charge();
    while (!pending_.empty() && pending_.front().ticket <= ticket) {
      r_.timeline_->WaitFor(pending_.front().done);
      Complete(r_.timeline_->Now());
    }
  }
  bool Poll(CopyTicket ticket) override {
    Complete(r_.timeline_->Now());
    return pending_.empty() || pending_.front().ticket > ticket;
  }
  int64_t bytes_copied() const override { return bytes_; }

 private:
  struct Pending {
    CopyTicket ticket;
    double done;
    std::vector<SlotCopy> copies;
  };
  void Complete(double now) {
    while (!pending_.empty() && pending_.front().done <= now) {
      for (const SlotCopy& c : pending_.front().copies) {
        uint64_t tag = r_.tags_[c.src];
        ++copied_;
        if (r_.o_.corrupt_every_nth_copy > 0 && copied_ % r_.o_.corrupt_every_nth_copy == 0) {
          tag ^= 1;  // The planted fault: the neighbouring position's token.
        }
        r_.tags_[c.dst] = tag;
      }
      bytes_ += static_cast<int64_t>(pending_.front().copies.size()) *
                r_.shape_.kv_bytes_per_token / r_.groups_;
      pending_.pop_front();
    }
  }

  SimRunner& r_;
  std::deque<Pending> pending_;
  CopyTicket next_ = 1;
  int64_t bytes_ = 0;
  int64_t copied_ = 0;
};

StatusOr<std::unique_ptr<SimRunner>> SimRunner::Create(const SimOptions& options,
                                                       std::unique_ptr<SignalSource> signals) {
  VTOKEN_RETURN_IF_ERROR(model::ValidateConfig(options.config));
  VTOKEN_RETURN_IF_ERROR(ValidateHardware(options.hardware));
  if (options.num_slots < 1) return InvalidArgumentError("sim: num_slots must be >= 1");
  if (options.dtype_bytes != 2 && options.dtype_bytes != 4) {
    return InvalidArgumentError("sim: dtype must be 2 (bf16/fp16) or 4 (fp32) bytes");
  }
  if (signals == nullptr) return InvalidArgumentError("sim: a signal source is required");
  const int64_t groups = NumKvGroups(options.granularity, options.config.num_hidden_layers,
                                     options.config.num_key_value_heads);
  if (groups > (int64_t{1} << 16)) {
    return InvalidArgumentError("sim: " + std::to_string(groups) + " KV groups, at most 65536");
  }
  return std::unique_ptr<SimRunner>(new SimRunner(options, std::move(signals)));
}

SimRunner::SimRunner(const SimOptions& options, std::unique_ptr<SignalSource> signals)
    : o_(options),
      shape_(ShapeOf(options.config, options.dtype_bytes)),
      signals_(std::move(signals)),
      groups_(NumKvGroups(options.granularity, options.config.num_hidden_layers,
                          options.config.num_key_value_heads)),
      tags_(static_cast<size_t>(options.num_slots), 0),
      timeline_(std::make_unique<Timeline>(o_)),
      copies_(std::make_unique<TagCopyEngine>(*this)) {}

SimRunner::~SimRunner() = default;

std::optional<int32_t> SimRunner::bos_token_id() const {
  if (o_.config.bos_token_ids.empty()) return std::nullopt;
  return static_cast<int32_t>(o_.config.bos_token_ids.front());
}

CopyEngine& SimRunner::copy_engine() { return *copies_; }
model::RunClock* SimRunner::clock() { return timeline_.get(); }
const SimRunner::Totals& SimRunner::totals() const { return timeline_->totals(); }

uint64_t SimRunner::TokenKvHash(SlotIndex slot) {
  const uint64_t tag = slot >= 0 && slot < o_.num_slots ? tags_[slot] : 0;
  return XXH64(&tag, sizeof(tag), 0);
}

StatusOr<std::vector<model::RunnerOutput>> SimRunner::Forward(
    const std::vector<model::RunnerInput>& inputs) {
  std::vector<model::RunnerOutput> outputs(inputs.size());
  std::vector<SeqWork> work;
  work.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const model::RunnerInput& in = inputs[i];
    // Built only on an error path: Forward runs every step.
    auto who = [&] { return "sim: request " + std::to_string(in.request); };
    const size_t n = in.tokens.size();
    const size_t groups = static_cast<size_t>(groups_);
    if (in.tokens.empty() || in.positions.size() != n || in.write_slots.size() != groups * n ||
        in.context_positions.size() != in.context_slots.size() ||
        !model::ValidContextOffsets(in, groups_)) {
      return InvalidArgumentError(who() +
                                  ": malformed input (token, position, slot and group "
                                  "offset counts)");
    }
    for (size_t g = 0; g < groups; ++g) {
      const auto [begin, end] = model::ContextRange(in, static_cast<int32_t>(g));
      for (int64_t j = begin; j < end; ++j) {
        const SlotIndex s = in.context_slots[j];
        if (s < 0 || s >= o_.num_slots) return InvalidArgumentError(who() + ": slot out of range");
        const uint64_t tag = tags_[s];
        if (tag == 0 || TagPosition(tag) != in.context_positions[j] ||
            TagGroup(tag) != static_cast<int32_t>(g) ||
            (TagRequest(tag) != in.request && TagRequest(tag) != in.prefix_request)) {
          return FailedPreconditionError(
              who() + " reads token " + std::to_string(in.context_positions[j]) +
              (groups > 1 ? " of group " + std::to_string(g) : std::string()) + " at slot " +
              std::to_string(s) + ", which holds " +
              (tag == 0 ? std::string("nothing")
                        : "token " + std::to_string(TagPosition(tag)) +
                              (groups > 1 ? " of group " + std::to_string(TagGroup(tag))
                                          : std::string()) +
                              " of request " + std::to_string(TagRequest(tag))));
        }
      }
      for (size_t j = 0; j < n; ++j) {
        const SlotIndex s = in.write_slots[g * n + j];
        if (s < 0 || s >= o_.num_slots) return InvalidArgumentError(who() + ": slot out of range");
        tags_[s] = Tag(in.request, static_cast<int32_t>(g), in.positions[j]);
      }
    }
    int32_t recorded = -1;
    if (in.want_signals) {
      outputs[i].attn.resize(in.context_slots.size() + groups * n);
      outputs[i].key_norm.resize(outputs[i].attn.size());
      size_t offset = 0;
      for (size_t g = 0; g < groups; ++g) {
        const auto [begin, end] = model::ContextRange(in, static_cast<int32_t>(g));
        positions_.assign(in.context_positions.begin() + begin, in.context_positions.begin() + end);
        positions_.insert(positions_.end(), in.positions.begin(), in.positions.end());
        VTOKEN_ASSIGN_OR_RETURN(
            recorded,
            signals_->Fill(
                {.request = in.request,
                 .positions = positions_,
                 .num_new = static_cast<int64_t>(n),
                 .obs_window = in.obs_window,
                 .group = static_cast<int32_t>(g),
                 .num_groups = groups_},
                std::span<float>(outputs[i].attn).subspan(offset, positions_.size()),
                std::span<float>(outputs[i].key_norm).subspan(offset, positions_.size())));
        offset += positions_.size();
      }
    } else if (in.sample) {  // A trace still knows the step's token.
      VTOKEN_ASSIGN_OR_RETURN(recorded, signals_->Token(in.request, in.positions.back()));
    }
    if (in.sample) {
      outputs[i].next_token =
          recorded >= 0 ? recorded
                        : static_cast<int32_t>(
                              Mix(o_.seed ^ Mix(static_cast<uint64_t>(in.request) ^
                                                Mix(static_cast<uint64_t>(in.positions.back())))) %
                              static_cast<uint64_t>(o_.config.vocab_size));
    }
    // KV bytes read: every group's live slots, each 1 / groups of a token's bytes.
    const int64_t context_tokens =
        (static_cast<int64_t>(in.context_slots.size()) + groups_ / 2) / groups_;
    work.push_back({.context_tokens = context_tokens,
                    .new_tokens = static_cast<int64_t>(in.tokens.size()),
                    .sampled = in.sample});
  }
  timeline_->Forward(ForwardCost(shape_, o_.hardware, work).forward_s);
  return outputs;
}

}  // namespace vtoken::sim
