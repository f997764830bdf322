// The scheduler's decisions (admission, preemption, the step's token budget) seen through
// RunEngine with the scripted runner of fake_runner.h.
#include "lib/engine/scheduler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/engine/fake_runner.h"

namespace vtoken::engine {
namespace {

// Counts the new tokens of every forward and whether decodes ran in it.
class BatchSpy final : public model::ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    int64_t tokens = 0, prefill_before_decode = 0;
    bool saw_prefill = false;
    for (const model::RunnerInput& in : inputs) {
      tokens += static_cast<int64_t>(in.tokens.size());
      const bool decode = in.tokens.size() == 1 && !in.context_slots.empty();
      if (!decode) saw_prefill = true;
      if (decode && saw_prefill) ++prefill_before_decode;
    }
    step_tokens.push_back(tokens);
    misordered += prefill_before_decode;
    return inner_.Forward(inputs);
  }
  std::vector<int64_t> step_tokens;
  int64_t misordered = 0;
};

TEST(SchedulerTest, MaxBatchedTokensBoundsEveryStepAndKeepsOutputs) {
  const std::vector<Request> reqs = Requests(6, 200, 40, 5);
  EngineOptions o = Opts(Mode::kVtoken, 400);
  o.max_prefill_chunk = 100;
  StatusOr<EngineResult> free_run = RunWith(o, reqs);
  ASSERT_TRUE(free_run.ok());
  o.max_batched_tokens = 128;
  FakeRunner fake(int64_t{o.pool.num_blocks} * o.pool.block_size, false);
  BatchSpy spy(fake);
  StatusOr<EngineResult> bounded = RunEngine(o, spy, reqs);
  ASSERT_TRUE(bounded.ok()) << bounded.status().ToString();
  int64_t full_steps = 0;
  for (int64_t t : spy.step_tokens) {
    EXPECT_LE(t, 128);
    full_steps += t == 128;
  }
  EXPECT_GT(full_steps, 0);  // Prefills were cut to the budget.
  EXPECT_EQ(spy.misordered, 0);
  EXPECT_GT(bounded->steps.size(), free_run->steps.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(bounded->requests[i].output_tokens, free_run->requests[i].output_tokens) << i;
  }
  o.max_batched_tokens = 3;  // Below max_num_seqs (16): a decode could be starved.
  FakeRunner again(int64_t{o.pool.num_blocks} * o.pool.block_size, false);
  EXPECT_EQ(RunEngine(o, again, reqs).status().code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, NativeRecomputePreemptionKeepsOutputs) {
  const std::vector<Request> reqs = Requests(4, 200, 60, 3);
  EngineOptions roomy = Opts(Mode::kNative, 400);
  EngineOptions tight = Opts(Mode::kNative, 44);
  tight.admission = EngineOptions::Admission::kGreedy;
  StatusOr<EngineResult> a = RunWith(roomy, reqs);
  StatusOr<EngineResult> b = RunWith(tight, reqs);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
  EXPECT_EQ(a->preemptions, 0);
  EXPECT_GT(b->preemptions, 0);
  EXPECT_LT(b->peak_running, 4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(a->requests[i].output_tokens, b->requests[i].output_tokens) << i;
  }
}

TEST(SchedulerTest, ReserveAdmissionNeverPreempts) {
  const std::vector<Request> reqs = Requests(8, 200, 60, 4);
  for (Mode mode : {Mode::kNative, Mode::kNaive, Mode::kVtoken}) {
    EngineOptions o = Opts(mode, 64);
    ASSERT_EQ(o.admission, EngineOptions::Admission::kReserve);
    StatusOr<EngineResult> r = RunWith(o, reqs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->preemptions, 0) << ModeName(mode);
    for (const RequestResult& q : r->requests) EXPECT_EQ(q.output_tokens.size(), 60u);
  }
}

TEST(SchedulerTest, VtokenAdmitsMoreUnderTheSameBudget) {
  const std::vector<Request> reqs = Requests(12, 200, 120, 9);
  EngineOptions naive = Opts(Mode::kNaive, 96);
  EngineOptions vtoken = Opts(Mode::kVtoken, 96);
  naive.verify = vtoken.verify = false;
  StatusOr<EngineResult> n = RunWith(naive, reqs);
  StatusOr<EngineResult> v = RunWith(vtoken, reqs);
  ASSERT_TRUE(n.ok() && v.ok());
  EXPECT_GT(v->peak_running, n->peak_running);
}

}  // namespace
}  // namespace vtoken::engine
