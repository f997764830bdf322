// Engine tests with a scripted runner: a HostKvStore stands in for the KV tensors, every token's
// bytes encode (token id, position), and each forward checks that the context it is given is in
// increasing position order. The next token is a hash of the live (token, position) pairs, so
// outputs depend on what was evicted and on the KV content read, not on where tokens sit.
#include "lib/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "lib/core/host_kv_store.h"

namespace vtoken::engine {
namespace {

class FakeRunner final : public model::ModelRunner {
 public:
  FakeRunner(int64_t num_slots, bool async)
      : store_(1, num_slots, 16),
        engine_(async ? std::unique_ptr<CopyEngine>(new AsyncHostCopyEngine(store_, 50))
                      : std::unique_ptr<CopyEngine>(new SyncHostCopyEngine(store_))) {}

  int64_t vocab_size() const override { return 100; }
  int64_t max_context() const override { return 1 << 20; }
  std::optional<int32_t> bos_token_id() const override { return std::nullopt; }
  const std::vector<int64_t>& eos_token_ids() const override { return eos_; }
  int64_t kv_bytes_per_token() const override { return 16; }
  int64_t num_slots() const override { return store_.num_slots(); }
  CopyEngine& copy_engine() override { return *engine_; }
  uint64_t TokenKvHash(SlotIndex slot) override { return vtoken::TokenKvHash(store_, slot); }
  void ForgetRequest(int64_t) override {}

  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    std::vector<model::RunnerOutput> outs;
    for (const model::RunnerInput& in : inputs) {
      for (size_t i = 0; i < in.tokens.size(); ++i) {
        Write(in.write_slots[i], in.tokens[i], in.positions[i]);
      }
      std::vector<int64_t> positions, tokens;
      for (SlotIndex slot : in.context_slots) {
        auto [token, position] = Read(slot);
        if (!positions.empty() && position <= positions.back()) {
          return InternalError("context out of logical order");
        }
        positions.push_back(position);
        tokens.push_back(token);
      }
      if (!positions.empty() && positions.back() >= in.positions.front()) {
        return InternalError("context reaches past the new tokens");
      }
      positions.insert(positions.end(), in.positions.begin(), in.positions.end());
      tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
      model::RunnerOutput out;
      uint64_t h = 0;
      for (size_t k = 0; k < positions.size(); ++k) {
        const int64_t p = positions[k];
        h ^= (static_cast<uint64_t>(p + 1) * 0x9e3779b97f4a7c15ULL) ^
             (static_cast<uint64_t>(tokens[k] + 7) * 0xc2b2ae3d27d4eb4fULL);
        // Heavy hitters at every 7th position; otherwise decaying with position.
        out.attn.push_back(p % 7 == 0 ? 1.0f : 1.0f / static_cast<float>(2 + p % 5));
        out.key_norm.push_back(1.0f + static_cast<float>(p % 3));
      }
      out.next_token = in.sample ? static_cast<int32_t>(h % 100) : -1;
      outs.push_back(std::move(out));
    }
    return outs;
  }

 private:
  void Write(SlotIndex slot, int64_t token, int64_t position) {
    std::span<std::byte> b = store_.Token(0, slot);
    std::memcpy(b.data(), &token, 8);
    std::memcpy(b.data() + 8, &position, 8);
  }
  std::pair<int64_t, int64_t> Read(SlotIndex slot) const {
    std::span<const std::byte> b = store_.Token(0, slot);
    int64_t token, position;
    std::memcpy(&token, b.data(), 8);
    std::memcpy(&position, b.data() + 8, 8);
    return {token, position};
  }

  HostKvStore store_;
  std::unique_ptr<CopyEngine> engine_;
  std::vector<int64_t> eos_;
};

std::vector<Request> Requests(int n, int64_t prompt, int64_t max_tokens, uint64_t seed) {
  std::vector<Request> out;
  uint64_t state = seed;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    for (int64_t t = 0; t < prompt + i * 7; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      r.prompt_tokens.push_back(static_cast<int32_t>((state >> 33) % 100));
    }
    r.max_tokens = max_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

EngineOptions Opts(Mode mode, int32_t num_blocks) {
  EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = num_blocks, .block_size = 16, .headroom_blocks = 4};
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.25, .num_sink = 4, .num_recent = 16};
  o.max_prefill_chunk = 64;
  o.verify = true;
  return o;
}

StatusOr<EngineResult> RunWith(const EngineOptions& o, const std::vector<Request>& reqs,
                           bool async = false) {
  FakeRunner runner(int64_t{o.pool.num_blocks} * o.pool.block_size, async);
  return RunEngine(o, runner, reqs);
}

double MeanBlocks(const EngineResult& r) {
  double sum = 0;
  for (const RequestResult& q : r.requests) sum += q.blocks_mean;
  return sum / static_cast<double>(r.requests.size());
}

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

TEST(EngineTest, MaxBatchedTokensBoundsEveryStepAndKeepsOutputs) {
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

TEST(EngineTest, NativeRecomputePreemptionKeepsOutputs) {
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

TEST(EngineTest, ReserveAdmissionNeverPreempts) {
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

// Four requests share a 150-token prefix: members fork the leader's prefix blocks instead of
// recomputing them, outputs equal those of unshared requests, and fewer blocks are held.
TEST(EngineTest, PrefixGroupsShareBlocksAndKeepOutputs) {
  std::vector<Request> plain = Requests(4, 200, 40, 21);
  for (Request& r : plain) {
    std::copy(plain[0].prompt_tokens.begin(), plain[0].prompt_tokens.begin() + 150,
              r.prompt_tokens.begin());
  }
  std::vector<Request> grouped = plain;
  for (Request& r : grouped) {
    r.prefix_group = 0;
    r.shared_prefix_tokens = 150;
  }
  for (Mode mode : {Mode::kNative, Mode::kVtoken}) {
    StatusOr<EngineResult> a = RunWith(Opts(mode, 400), plain);
    StatusOr<EngineResult> b = RunWith(Opts(mode, 400), grouped);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().ToString();
    EXPECT_EQ(a->forks, 0);
    EXPECT_EQ(b->forks, 3);
    EXPECT_EQ(b->violations, 0);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(a->requests[i].output_tokens, b->requests[i].output_tokens) << i;
    }
    int32_t peak_a = 0, peak_b = 0;
    for (const StepRecord& s : a->steps) peak_a = std::max(peak_a, s.allocated_blocks);
    for (const StepRecord& s : b->steps) peak_b = std::max(peak_b, s.allocated_blocks);
    EXPECT_LT(peak_b, peak_a) << ModeName(mode);
  }
}

TEST(EngineTest, VtokenAdmitsMoreUnderTheSameBudget) {
  const std::vector<Request> reqs = Requests(12, 200, 120, 9);
  EngineOptions naive = Opts(Mode::kNaive, 96);
  EngineOptions vtoken = Opts(Mode::kVtoken, 96);
  naive.verify = vtoken.verify = false;
  StatusOr<EngineResult> n = RunWith(naive, reqs);
  StatusOr<EngineResult> v = RunWith(vtoken, reqs);
  ASSERT_TRUE(n.ok() && v.ok());
  EXPECT_GT(v->peak_running, n->peak_running);
}

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
TEST(EngineTest, AsksForSignalsOnlyOnTheStepsThePolicyReads) {
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
    aware[i].prompt_tokens.insert(aware[i].prompt_tokens.end(),
                                  agnostic[i].question_tokens.begin(),
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
