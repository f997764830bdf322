// Engine tests through RunEngine with the scripted runner of fake_runner.h: modes, copies,
// verification, query-agnostic questions, option validation. The scheduler's, the prefix forks'
// and the policy step's own tests are in scheduler_test, prefix_forks_test and policy_step_test.
#include "lib/engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/engine/fake_runner.h"

namespace vtoken::engine {
namespace {

TEST(EngineTest, NaiveAndVtokenGiveIdenticalOutputsAndVtokenHoldsFewerBlocks) {
  const std::vector<Request> reqs = Requests(6, 200, 80, 11);
  StatusOr<EngineResult> naive = RunWith(Opts(Mode::kNaive, 400), reqs);
  StatusOr<EngineResult> vtoken = RunWith(Opts(Mode::kVtoken, 400), reqs);
  ASSERT_TRUE(naive.ok()) << naive.status().ToString();
  ASSERT_TRUE(vtoken.ok()) << vtoken.status().ToString();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(naive->requests[i].output_tokens.size(), 80u);
    EXPECT_EQ(naive->requests[i].output_tokens, vtoken->requests[i].output_tokens) << i;
    EXPECT_EQ(naive->requests[i].live_final, vtoken->requests[i].live_final);
  }
  EXPECT_GT(naive->evictions, 0);
  EXPECT_EQ(naive->evictions, vtoken->evictions);
  EXPECT_EQ(naive->moves, 0);
  EXPECT_GT(vtoken->moves, 0);
  EXPECT_EQ(vtoken->violations, 0) << vtoken->first_violations[0];
  EXPECT_EQ(vtoken->hash_checks, vtoken->moves);
  EXPECT_LT(MeanBlocks(*vtoken), 0.75 * MeanBlocks(*naive));
  for (const RequestResult& r : vtoken->requests) {
    EXPECT_LE(r.blocks_final, r.ideal_blocks_final + 1);
  }
}

TEST(EngineTest, AsyncCopiesGiveTheSameOutputs) {
  const std::vector<Request> reqs = Requests(4, 150, 40, 5);
  StatusOr<EngineResult> sync = RunWith(Opts(Mode::kVtoken, 300), reqs, false);
  StatusOr<EngineResult> async = RunWith(Opts(Mode::kVtoken, 300), reqs, true);
  ASSERT_TRUE(sync.ok() && async.ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(sync->requests[i].output_tokens, async->requests[i].output_tokens);
  }
  EXPECT_EQ(async->violations, 0);
  EXPECT_GT(async->hash_checks, 0);
}

// Records every forward of every request: its new tokens, its context's size, whether it sampled.
class ForwardLog final : public model::ForwardingRunner {
 public:
  using ForwardingRunner::ForwardingRunner;
  struct Entry {
    std::vector<int32_t> tokens;
    size_t context = 0;
    bool sample = false;
  };
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    for (const model::RunnerInput& in : inputs) {
      log[in.request].push_back({in.tokens, in.context_slots.size(), in.sample});
    }
    return inner_.Forward(inputs);
  }
  std::map<int64_t, std::vector<Entry>> log;
};

// Query-agnostic requests (Request::question_tokens): the context is prefilled and evicted to
// the budget first; the question follows in its own chunk, on the evicted context, and evicts
// nothing; decoding then runs the policy. Without eviction the outputs are those of the same
// tokens given as one prompt.
TEST(EngineTest, QueryAgnosticQuestionComesAfterTheContextsEviction) {
  std::vector<Request> aware = Requests(3, 150, 10, 9);
  std::vector<Request> agnostic = aware;
  for (size_t i = 0; i < aware.size(); ++i) {
    for (int32_t t = 0; t < 20; ++t) agnostic[i].question_tokens.push_back((t * 13 + 5) % 100);
    aware[i].prompt_tokens.insert(aware[i].prompt_tokens.end(), agnostic[i].question_tokens.begin(),
                                  agnostic[i].question_tokens.end());
  }
  {  // No eviction: the same outputs as one prompt.
    StatusOr<EngineResult> a = RunWith(Opts(Mode::kNative, 400), aware);
    StatusOr<EngineResult> q = RunWith(Opts(Mode::kNative, 400), agnostic);
    ASSERT_TRUE(a.ok() && q.ok()) << q.status().ToString();
    for (size_t i = 0; i < aware.size(); ++i) {
      EXPECT_EQ(q->requests[i].output_tokens, a->requests[i].output_tokens);
      EXPECT_EQ(q->requests[i].prompt_tokens, a->requests[i].prompt_tokens);
    }
  }
  for (const char* policy : {"h2o", "snapkv", "streaming_llm"}) {
    SCOPED_TRACE(policy);
    EngineOptions o = Opts(Mode::kVtoken, 400);
    o.policy = policy;
    FakeRunner fake(int64_t{o.pool.num_blocks} * o.pool.block_size, false);
    ForwardLog spy(fake);
    StatusOr<EngineResult> r = RunEngine(o, spy, agnostic);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const Request& q : agnostic) {
      SCOPED_TRACE(q.id);
      EXPECT_EQ(r->requests[q.id].output_tokens.size(), 10u);
      const std::vector<ForwardLog::Entry>& log = spy.log[q.id];
      const int64_t context = static_cast<int64_t>(q.prompt_tokens.size());
      const size_t budget = static_cast<size_t>(0.25 * static_cast<double>(context));
      // Prefill chunks of 64, 64, 22 (the last samples a token the engine drops), the question,
      // then one forward per output after the first.
      ASSERT_EQ(log.size(), 3u + 1u + 9u);
      EXPECT_TRUE(log[2].sample);
      EXPECT_EQ(log[3].tokens, q.question_tokens);
      EXPECT_EQ(log[3].context, budget);  // the context, evicted before the question
      EXPECT_TRUE(log[3].sample);
      EXPECT_EQ(log[4].tokens.size(), 1u);
      EXPECT_EQ(log[4].tokens[0], r->requests[q.id].output_tokens[0]);
      EXPECT_EQ(log[4].context, budget + 20);  // the question's step evicted nothing
    }
  }
  EngineOptions greedy = Opts(Mode::kVtoken, 400);
  greedy.admission = EngineOptions::Admission::kGreedy;
  StatusOr<EngineResult> r = RunWith(greedy, agnostic);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs admission reserve"), std::string::npos)
      << r.status().message();
}

TEST(EngineTest, RejectsImpossibleConfigurations) {
  const std::vector<Request> reqs = Requests(2, 200, 10, 1);
  StatusOr<EngineResult> small = RunWith(Opts(Mode::kNaive, 12), reqs);
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(small.status().message().find("pool too small"), std::string::npos);
  EngineOptions bad_policy = Opts(Mode::kNaive, 100);
  bad_policy.policy = "no_such_policy";
  EXPECT_EQ(RunWith(bad_policy, reqs).status().code(), StatusCode::kNotFound);
  EngineOptions bad_ratio = Opts(Mode::kNaive, 100);
  bad_ratio.evictor.keep_ratio = 1.5;
  EXPECT_EQ(RunWith(bad_ratio, reqs).status().code(), StatusCode::kInvalidArgument);
  EngineOptions o = Opts(Mode::kNaive, 100);
  FakeRunner wrong_size(50 * 16, false);
  EXPECT_EQ(RunEngine(o, wrong_size, reqs).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken::engine
