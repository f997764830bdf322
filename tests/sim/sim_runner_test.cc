// SimRunner through the real engine: tag verification, the virtual clock (stage-aware vs
// force-sync), determinism, parametric signals and the trace format.
#include "lib/sim/sim_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "lib/engine/engine.h"
#include "lib/sim/parametric_signals.h"
#include "lib/sim/signal_trace.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::sim {
namespace {

model::ModelConfig SmallConfig() {
  model::ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  c.bos_token_ids = {1};
  return c;
}

engine::EngineOptions Options(Mode mode) {
  engine::EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = 160, .block_size = 16, .headroom_blocks = 8};
  o.max_num_seqs = 8;
  o.max_prefill_chunk = 256;
  o.policy = "h2o";
  o.evictor = {.keep_ratio = 0.25, .num_sink = 4, .num_recent = 16};
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.reclaim.frag_threshold = 0.1;
  o.verify = true;
  return o;
}

std::vector<engine::Request> Requests(int n, uint64_t seed = 7) {
  engine::WorkloadOptions w;
  w.kind = "longbench_like";
  w.num_requests = n;
  w.seed = seed;
  w.input_min = 200;
  w.input_max = 500;
  w.output_min = 20;
  w.output_max = 60;
  return *engine::GenerateWorkload(w, nullptr, 1000);
}

std::unique_ptr<SimRunner> MakeRunner(const engine::EngineOptions& o, SimOptions so = {},
                                      std::unique_ptr<SignalSource> signals = nullptr) {
  so.config = SmallConfig();
  if (so.hardware.name.empty()) so.hardware = *HardwarePreset("h100-sxm-80g");
  so.num_slots = int64_t{o.pool.num_blocks} * o.pool.block_size;
  so.force_sync = o.force_sync;
  if (signals == nullptr) signals = std::make_unique<ParametricSignals>(VtTinyFit());
  StatusOr<std::unique_ptr<SimRunner>> r = SimRunner::Create(so, std::move(signals));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(*r);
}

TEST(SimRunnerTest, VtokenRunVerifiesEveryMoveByTag) {
  const engine::EngineOptions o = Options(Mode::kVtoken);
  std::unique_ptr<SimRunner> runner = MakeRunner(o);
  StatusOr<engine::EngineResult> r = engine::RunEngine(o, *runner, Requests(12));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->moves, 100);
  EXPECT_EQ(r->hash_checks, r->moves);
  EXPECT_EQ(r->violations, 0) << (r->first_violations.empty() ? "" : r->first_violations[0]);
  EXPECT_GT(r->invariant_checks, 0);
}

// Prefix forks read the slots their group leader wrote: the engine names the leader
// (RunnerInput::prefix_request) and every forward's tag check accepts them, in every mode and at
// head granularity; without the name the first fork's read fails the run.
TEST(SimRunnerTest, PrefixForksReadTheirLeadersSlots) {
  std::vector<engine::Request> reqs = Requests(6);
  for (engine::Request& r : reqs) {
    std::copy(reqs[0].prompt_tokens.begin(), reqs[0].prompt_tokens.begin() + 150,
              r.prompt_tokens.begin());
    r.prefix_group = 0;
    r.shared_prefix_tokens = 150;
  }
  for (Mode mode : {Mode::kNative, Mode::kNaive, Mode::kVtoken}) {
    for (Granularity g : {Granularity::kToken, Granularity::kHead}) {
      SCOPED_TRACE(std::string(ModeName(mode)) + (g == Granularity::kHead ? " head" : " token"));
      engine::EngineOptions o = Options(mode);
      SimOptions so;
      so.granularity = g;
      if (g == Granularity::kHead) {
        const model::ModelConfig c = SmallConfig();
        o.evictor.granularity = g;
        o.evictor.num_layers = static_cast<int32_t>(c.num_hidden_layers);
        o.evictor.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
        const int32_t groups = NumKvGroups(g, c.num_hidden_layers, c.num_key_value_heads);
        o.pool.num_blocks *= groups;
        o.pool.headroom_blocks *= groups;
      }
      std::unique_ptr<SimRunner> runner = MakeRunner(o, so);
      StatusOr<engine::EngineResult> r = engine::RunEngine(o, *runner, reqs);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->forks, 5);
      EXPECT_EQ(r->violations, 0);
    }
  }
}

TEST(SimRunnerTest, PlantedWrongCopyIsCaught) {
  const engine::EngineOptions o = Options(Mode::kVtoken);
  SimOptions so;
  so.corrupt_every_nth_copy = 50;
  std::unique_ptr<SimRunner> runner = MakeRunner(o, so);
  StatusOr<engine::EngineResult> r = engine::RunEngine(o, *runner, Requests(12));
  // Either the hash check after the copy or the next forward's context check sees it.
  if (r.ok()) {
    EXPECT_GT(r->violations, 0);
    ASSERT_FALSE(r->first_violations.empty());
    EXPECT_NE(r->first_violations[0].find("hash mismatch"), std::string::npos);
  } else {
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("which holds token"), std::string::npos)
        << r.status().message();
  }
}

TEST(SimRunnerTest, ForwardRefusesAContextSlotHoldingAnotherToken) {
  const engine::EngineOptions o = Options(Mode::kNaive);
  std::unique_ptr<SimRunner> runner = MakeRunner(o);
  model::RunnerInput in;
  in.request = 3;
  in.tokens = {5, 6};
  in.positions = {0, 1};
  in.write_slots = {10, 11};
  ASSERT_TRUE(runner->Forward({in}).ok());
  model::RunnerInput next;
  next.request = 3;
  next.tokens = {7};
  next.positions = {2};
  next.write_slots = {12};
  next.context_slots = {10, 11};
  next.context_positions = {0, 1};
  EXPECT_TRUE(runner->Forward({next}).ok());
  next.context_positions = {1, 0};
  const auto bad = runner->Forward({next});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reads token 1 at slot 10, which holds token 0"),
            std::string::npos)
      << bad.status().message();
  next.context_slots = {10, 40};
  next.context_positions = {0, 1};
  EXPECT_NE(runner->Forward({next}).status().message().find("which holds nothing"),
            std::string::npos);
  // Request 4 at the same positions reads request 3's slots: refused, unless the engine names 3
  // as the request whose prefix 4 forked.
  next.request = 4;
  next.context_slots = {10, 11};
  next.write_slots = {13};
  const auto other = runner->Forward({next});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find(
                "request 4 reads token 0 at slot 10, which holds token 0 of request 3"),
            std::string::npos)
      << other.status().message();
  next.prefix_request = 3;
  EXPECT_TRUE(runner->Forward({next}).ok());
  next.prefix_request = 5;
  EXPECT_FALSE(runner->Forward({next}).ok());
}

TEST(SimRunnerTest, SameConfigAndSeedGiveIdenticalResults) {
  const engine::EngineOptions o = Options(Mode::kVtoken);
  std::vector<engine::Request> reqs = Requests(10);
  for (engine::Request& r : reqs) r.arrival_s = 0.05 * static_cast<double>(r.id);
  std::unique_ptr<SimRunner> a = MakeRunner(o), b = MakeRunner(o);
  StatusOr<engine::EngineResult> ra = engine::RunEngine(o, *a, reqs);
  StatusOr<engine::EngineResult> rb = engine::RunEngine(o, *b, reqs);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->steps.size(), rb->steps.size());
  for (size_t i = 0; i < ra->steps.size(); ++i) {
    EXPECT_EQ(ra->steps[i].time_s, rb->steps[i].time_s) << "step " << i;
    EXPECT_EQ(ra->steps[i].allocated_blocks, rb->steps[i].allocated_blocks) << "step " << i;
    EXPECT_EQ(ra->steps[i].moves, rb->steps[i].moves) << "step " << i;
  }
  for (size_t i = 0; i < ra->requests.size(); ++i) {
    EXPECT_EQ(ra->requests[i].e2e_s, rb->requests[i].e2e_s);
    EXPECT_EQ(ra->requests[i].output_tokens, rb->requests[i].output_tokens);
  }
  EXPECT_EQ(ra->wall_s, rb->wall_s);
  EXPECT_GT(ra->wall_s, 0);
  // The same runner serves a second run identically (the clock restarts).
  StatusOr<engine::EngineResult> again = engine::RunEngine(o, *a, reqs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->wall_s, ra->wall_s);
}

// EngineOptions::policy_threads: the policy's work runs on a team of threads between steps, and
// the run is the same run whatever their number: per head (8 groups), every allocation, naive and
// vtoken, 1 thread against 3 (more than this machine's cores: the scheduling varies).
TEST(SimRunnerTest, PolicyThreadsDoNotChangeTheRun) {
  for (BudgetAllocation allocation :
       {BudgetAllocation::kUniform, BudgetAllocation::kPyramid, BudgetAllocation::kAdaptive}) {
    for (Mode mode : {Mode::kNaive, Mode::kVtoken}) {
      SCOPED_TRACE(std::string(BudgetAllocationName(allocation)) + " " + ModeName(mode));
      engine::EngineOptions o = Options(mode);
      const model::ModelConfig c = SmallConfig();
      o.evictor.granularity = Granularity::kHead;
      o.evictor.num_layers = static_cast<int32_t>(c.num_hidden_layers);
      o.evictor.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
      o.evictor.allocation = allocation;
      o.evictor.pyramid_beta = 4;
      const int32_t groups =
          NumKvGroups(Granularity::kHead, c.num_hidden_layers, c.num_key_value_heads);
      o.pool.num_blocks *= groups;
      o.pool.headroom_blocks *= groups;
      const std::vector<engine::Request> reqs = Requests(10);
      std::vector<engine::EngineResult> results;
      for (int32_t threads : {1, 3}) {
        o.policy_threads = threads;
        SimOptions so;
        so.granularity = Granularity::kHead;
        std::unique_ptr<SimRunner> runner = MakeRunner(o, so);
        StatusOr<engine::EngineResult> r = engine::RunEngine(o, *runner, reqs);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(r->violations, 0);
        results.push_back(*std::move(r));
      }
      const engine::EngineResult& a = results[0];
      const engine::EngineResult& b = results[1];
      EXPECT_GT(a.evictions, 1000);
      EXPECT_EQ(a.evictions, b.evictions);
      EXPECT_EQ(a.moves, b.moves);
      ASSERT_EQ(a.steps.size(), b.steps.size());
      for (size_t i = 0; i < a.steps.size(); ++i) {
        EXPECT_EQ(a.steps[i].time_s, b.steps[i].time_s) << "step " << i;
        EXPECT_EQ(a.steps[i].live_slots, b.steps[i].live_slots) << "step " << i;
        EXPECT_EQ(a.steps[i].allocated_blocks, b.steps[i].allocated_blocks) << "step " << i;
      }
      ASSERT_EQ(a.requests.size(), b.requests.size());
      for (size_t i = 0; i < a.requests.size(); ++i) {
        EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens) << "request " << i;
      }
    }
  }
}

TEST(SimRunnerTest, ClockChargesForwardHostAndCopies) {
  engine::EngineOptions o = Options(Mode::kVtoken);
  std::unique_ptr<SimRunner> runner = MakeRunner(o);
  model::RunClock& clock = *runner->clock();
  const HardwareSpec& hw = runner->options().hardware;
  clock.Start();
  model::RunnerInput in;
  in.request = 0;
  in.tokens = std::vector<int32_t>(64, 3);
  for (int i = 0; i < 64; ++i) {
    in.positions.push_back(i);
    in.write_slots.push_back(i);
  }
  ASSERT_TRUE(runner->Forward({in}).ok());
  const double fwd = ForwardCost(runner->shape(), hw, {{0, 64, true}}).forward_s;
  EXPECT_DOUBLE_EQ(clock.Now(), fwd + hw.host_overhead_s);
  // A copy submitted after the forward runs during the host phase: waiting costs only what
  // exceeds it.
  std::vector<SlotCopy> copies;
  for (int i = 0; i < 64; ++i) copies.push_back({i, 1000 + i});
  const double copy = CopySeconds(runner->shape(), hw, 64);
  ASSERT_LT(copy, hw.host_overhead_s);
  runner->copy_engine().Wait(runner->copy_engine().Submit(copies));
  EXPECT_DOUBLE_EQ(clock.Now(), fwd + hw.host_overhead_s);
  EXPECT_EQ(runner->TokenKvHash(1005), runner->TokenKvHash(5));
  EXPECT_EQ(runner->copy_engine().bytes_copied(), 64 * runner->shape().kv_bytes_per_token);

  // Force-sync: the host waits for the copy before its own phase.
  o.force_sync = true;
  std::unique_ptr<SimRunner> sync = MakeRunner(o);
  sync->clock()->Start();
  ASSERT_TRUE(sync->Forward({in}).ok());
  sync->copy_engine().Wait(sync->copy_engine().Submit(copies));
  EXPECT_DOUBLE_EQ(sync->clock()->Now(), fwd + copy + hw.host_overhead_s);

  // Idle until an arrival.
  sync->clock()->WaitUntil(5.0);
  EXPECT_DOUBLE_EQ(sync->clock()->Now(), 5.0);
}

// sim.planner_time / sim.policy_time / sim.schedule_time = "measured": the engine reports each
// phase's real time, and the clock adds the phases asked for to the host phase, nothing else.
TEST(SimRunnerTest, MeasuredHostTimeAddsThePhasesAskedFor) {
  using Phase = model::RunClock::HostPhase;
  for (int mask = 0; mask < 8; ++mask) {
    const bool planner = (mask & 1) != 0, policy = (mask & 2) != 0, schedule = (mask & 4) != 0;
    SimOptions so;
    so.measured_planner_time = planner;
    so.measured_policy_time = policy;
    so.measured_schedule_time = schedule;
    std::unique_ptr<SimRunner> runner = MakeRunner(Options(Mode::kVtoken), so);
    model::RunClock& clock = *runner->clock();
    clock.Start();
    clock.HostWork(Phase::kPolicy, 0.25);
    clock.HostWork(Phase::kPlanner, 0.5);
    clock.HostWork(Phase::kSchedule, 2.0);
    EXPECT_DOUBLE_EQ(clock.Now(),
                     (policy ? 0.25 : 0.0) + (planner ? 0.5 : 0.0) + (schedule ? 2.0 : 0.0))
        << "planner " << planner << ", policy " << policy << ", schedule " << schedule;
  }
  // Through the engine: a naive run (no copies to overlap) with every request there at 0 makes
  // the same steps either way, so measuring the policy lengthens the run by exactly its policy
  // time.
  const engine::EngineOptions o = Options(Mode::kNaive);
  const std::vector<engine::Request> reqs = Requests(10);
  SimOptions measured;
  measured.measured_policy_time = true;
  std::unique_ptr<SimRunner> a = MakeRunner(o), b = MakeRunner(o, measured);
  StatusOr<engine::EngineResult> none = engine::RunEngine(o, *a, reqs);
  StatusOr<engine::EngineResult> with = engine::RunEngine(o, *b, reqs);
  ASSERT_TRUE(none.ok() && with.ok());
  ASSERT_EQ(none->steps.size(), with->steps.size());
  EXPECT_GT(with->evictions, 1000);
  EXPECT_GT(with->policy_s, 0.0);
  EXPECT_NEAR(with->wall_s, none->wall_s + with->policy_s, 1e-9 * with->wall_s);
  // The same for the scheduling time: the steps' inputs were built, and cost what was measured.
  SimOptions scheduled;
  scheduled.measured_schedule_time = true;
  std::unique_ptr<SimRunner> c = MakeRunner(o, scheduled);
  StatusOr<engine::EngineResult> sched = engine::RunEngine(o, *c, reqs);
  ASSERT_TRUE(sched.ok());
  ASSERT_EQ(none->steps.size(), sched->steps.size());
  EXPECT_GT(sched->schedule_s, 0.0);
  EXPECT_NEAR(sched->wall_s, none->wall_s + sched->schedule_s, 1e-9 * sched->wall_s);
}

TEST(SimRunnerTest, AsyncCopyIsInvisibleUntilItCompletes) {
  const engine::EngineOptions o = Options(Mode::kVtoken);
  SimOptions so;
  so.hardware = *HardwarePreset("h100-sxm-80g");
  so.hardware.copy_bandwidth = 1e9;  // 2000 tokens x 2 KiB: 4 ms, longer than the host phase.
  std::unique_ptr<SimRunner> runner = MakeRunner(o, so);
  runner->clock()->Start();
  model::RunnerInput in;
  in.request = 0;
  in.tokens = {1};
  in.positions = {0};
  in.write_slots = {0};
  ASSERT_TRUE(runner->Forward({in}).ok());
  // The copy starts when the forward ended and outlasts the host phase: still in flight.
  std::vector<SlotCopy> big;
  for (int i = 0; i < 2000; ++i) big.push_back({0, 100 + i});
  const CopyTicket t = runner->copy_engine().Submit(big);
  EXPECT_FALSE(runner->copy_engine().Poll(t));
  EXPECT_NE(runner->TokenKvHash(100), runner->TokenKvHash(0));
  runner->copy_engine().Wait(t);
  EXPECT_TRUE(runner->copy_engine().Poll(t));
  EXPECT_EQ(runner->TokenKvHash(100), runner->TokenKvHash(0));
  EXPECT_GT(runner->totals().copy_stall_s, 0);
}

TEST(ParametricSignalsTest, MassSumsToOneAndFollowsTheModel) {
  ParametricParams p;
  p.num_sinks = 1;
  p.sink_weight = 100;
  p.recency_weight = 20;
  p.recency_exponent = 1.5;
  p.importance_sigma = 1.0;
  p.noise_sigma = 0.2;
  p.key_norm_median = 5;
  p.key_norm_rho = 0.5;
  p.key_norm_sigma = 0.05;
  ParametricSignals s(p);
  std::vector<int64_t> pos(2000);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> attn(pos.size()), kn(pos.size());
  ASSERT_TRUE(s.Fill({.request = 1, .positions = pos, .num_new = 1}, attn, kn).ok());
  EXPECT_NEAR(std::accumulate(attn.begin(), attn.end(), 0.0), 1.0, 1e-4);
  // The sink and the newest tokens take the most; the middle follows importance.
  const double uniform = 1.0 / 2000;
  EXPECT_GT(attn[0], 30 * uniform);
  EXPECT_GT(attn[1999], 5 * uniform);
  // Key norm anti-correlated with importance.
  double cov = 0, mw = 0, mk = 0;
  const int n = 1000;
  for (int i = 100; i < 100 + n; ++i) {
    mw += std::log(s.Importance(1, i)) / n;
    mk += std::log(kn[i]) / n;
  }
  for (int i = 100; i < 100 + n; ++i) {
    cov += (std::log(s.Importance(1, i)) - mw) * (std::log(kn[i]) - mk);
  }
  EXPECT_LT(cov, 0);
  // Deterministic: the same query gives the same signals.
  std::vector<float> again(pos.size()), kn2(pos.size());
  ASSERT_TRUE(s.Fill({.request = 1, .positions = pos, .num_new = 1}, again, kn2).ok());
  EXPECT_EQ(attn, again);
  EXPECT_EQ(kn, kn2);
  p.noise_sigma = -1;
  EXPECT_EQ(p.Validate().code(), StatusCode::kInvalidArgument);
}

// The draws behind every simulated figure in the docs (docs/PAPER.md, RESULTS §9): a change to
// the hash chain or the noise tables changes them all, so it must be deliberate (new constants
// here, the docs' runs made again). Per-head groups draw the group factor too.
TEST(ParametricSignalsTest, DrawsArePinned) {
  ParametricSignals s(VtTinyFit());
  const std::vector<int64_t> pos = {0, 5, 17, 300, 301};
  std::vector<float> attn(pos.size()), kn(pos.size());
  ASSERT_TRUE(
      s.Fill({.request = 7, .positions = pos, .num_new = 1, .group = 3, .num_groups = 8}, attn, kn)
          .ok());
  const std::vector<float> want_attn = {0.000146086633f, 0.00025822781f, 0.00109966507f, 0.2056171f,
                                        0.792878926f};
  const std::vector<float> want_kn = {11.3699484f, 9.42815495f, 7.08748007f, 8.97889709f,
                                      9.00221539f};
  for (size_t i = 0; i < pos.size(); ++i) {
    EXPECT_FLOAT_EQ(attn[i], want_attn[i]) << "position " << pos[i];
    EXPECT_FLOAT_EQ(kn[i], want_kn[i]) << "position " << pos[i];
  }
}

TEST(SignalTraceTest, RoundTripReplayAndErrors) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "vtoken_sim_trace_test.trace").string();
  {
    auto w = SignalTraceWriter::Create(path, "sim:test");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(
        (*w)->Append({"naive", 4, 2, 77, {0, 1, 2, 3}, {.1f, .2f, .3f, .4f}, {1, 2, 3, 4}}).ok());
    ASSERT_TRUE(
        (*w)->Append({"naive", 4, 1, 78, {0, 2, 3, 4}, {.25f, .25f, .25f, .25f}, {1, 3, 4, 5}})
            .ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  StatusOr<SignalTrace> t = ReadSignalTrace(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->model, "sim:test");
  ASSERT_EQ(t->records.size(), 2u);
  EXPECT_EQ(t->records[1].positions, (std::vector<int32_t>{0, 2, 3, 4}));
  TraceSignals replay(*t, path);
  replay.BeginRun("vtoken");  // No vtoken records: replays naive's.
  std::vector<int64_t> first = {0, 1, 2, 3};
  std::vector<float> attn(4), kn(4);
  StatusOr<int32_t> tok = replay.Fill({.request = 4, .positions = first, .num_new = 2}, attn, kn);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(*tok, 77);
  EXPECT_EQ(attn, (std::vector<float>{.1f, .2f, .3f, .4f}));
  // A subset of the recorded positions is answered; an unrecorded one is not.
  std::vector<int64_t> subset = {0, 3, 4};
  std::vector<float> a3(3), k3(3);
  tok = replay.Fill({.request = 4, .positions = subset, .num_new = 1}, a3, k3);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(k3, (std::vector<float>{1, 4, 5}));
  replay.BeginRun("naive");
  std::vector<int64_t> unknown = {0, 5};
  std::vector<float> a2(2), k2(2);
  EXPECT_NE(replay.Fill({.request = 4, .positions = unknown, .num_new = 1}, a2, k2)
                .status()
                .message()
                .find("position 5 is live here but not in the trace"),
            std::string::npos);
  EXPECT_EQ(replay.Fill({.request = 9, .positions = unknown, .num_new = 1}, a2, k2).status().code(),
            StatusCode::kFailedPrecondition);
  // Truncated and foreign files.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  EXPECT_EQ(ReadSignalTrace(path).status().code(), StatusCode::kDataLoss);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "not a trace at all";
  }
  EXPECT_NE(ReadSignalTrace(path).status().message().find("bad magic"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadSignalTrace(path).status().code(), StatusCode::kNotFound);
}

TEST(SimSpecTest, NamesConfigsAndErrors) {
  EXPECT_TRUE(IsSimSpec("sim:llama-3.1-8b"));
  EXPECT_FALSE(IsSimSpec("synthetic:llama-3.1-8b"));
  StatusOr<model::ModelConfig> c = SimModelConfig("sim:qwen2.5-14b");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_hidden_layers, 48);
  EXPECT_EQ(SimModelConfig("sim:gpt-5").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SimModelConfig("sim:/nonexistent/config.json").status().code(), StatusCode::kNotFound);
  SimConfig sim = DefaultSimConfig();
  sim.attention = "trace:/nonexistent.trace";
  EXPECT_EQ(MakeSimRunner("sim:llama-3.1-8b", sim, 1024, false).status().code(),
            StatusCode::kNotFound);
  sim.attention = "oracle";
  EXPECT_EQ(MakeSimRunner("sim:llama-3.1-8b", sim, 1024, false).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vtoken::sim
