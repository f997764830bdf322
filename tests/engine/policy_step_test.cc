// The policy's part of a step seen through RunEngine with the scripted runner of fake_runner.h.
#include "lib/engine/policy_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/engine/fake_runner.h"

namespace vtoken::engine {
namespace {

// Counts, per request, the sampled steps and those whose signals the engine asked for, and
// returns NaN signals for the others (the engine must not hand them to the policy).
class SignalSpy final : public model::ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    VTOKEN_ASSIGN_OR_RETURN(std::vector<model::RunnerOutput> out, inner_.Forward(inputs));
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].sample) continue;
      ++sampled[inputs[i].request];
      if (inputs[i].want_signals) {
        ++wanted[inputs[i].request];
      } else {
        std::fill(out[i].attn.begin(), out[i].attn.end(), std::nanf(""));
      }
    }
    return out;
  }
  std::map<int64_t, int64_t> sampled, wanted;
};

// The engine asks the model for signals only on the steps whose signals the policy reads: every
// step for H2O (attn_sum), the eviction steps for TOVA (evict_interval 4: steps 0, 4, 8, ...),
// none for StreamingLLM. The outputs of TOVA with an interval are its own: a run with the same
// victims at every step would match them, which the evictor's tests check (policy_signals_test).
TEST(PolicyStepTest, AsksForSignalsOnlyOnTheStepsThePolicyReads) {
  const std::vector<Request> reqs = Requests(4, 150, 30, 3);
  for (const char* policy : {"h2o", "tova", "streaming_llm"}) {
    SCOPED_TRACE(policy);
    EngineOptions o = Opts(Mode::kVtoken, 400);
    o.policy = policy;
    o.evictor.evict_interval = 4;
    FakeRunner fake(int64_t{o.pool.num_blocks} * o.pool.block_size, false);
    SignalSpy spy(fake);
    StatusOr<EngineResult> r = RunEngine(o, spy, reqs);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->preemptions, 0);
    EXPECT_GT(r->evictions, 0);
    for (const Request& q : reqs) {
      EXPECT_EQ(spy.sampled[q.id], 30);
      const int64_t expected = std::string(policy) == "h2o"    ? 30
                               : std::string(policy) == "tova" ? 8
                                                               : 0;
      EXPECT_EQ(spy.wanted[q.id], expected) << "request " << q.id;
    }
  }
}

}  // namespace
}  // namespace vtoken::engine
