// Trace replay is exact: a vt-tiny run recorded with RecordingRunner and replayed by SimRunner
// (same workload and engine options, signals from the trace) makes the same eviction decisions
// and every block figure of every step matches: allocated, held and ideal blocks, live slots, F,
// the utilization histogram and the moves, and the output tokens, in native, naive and vtoken
// mode; for H2O (signals read on every step) and for TOVA evicting every 4th step (signals read
// only then, the other steps' tokens come from their records too). A trace without native records
// (as written before 2026-12-03) still replays native, with the sim's own tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "lib/engine/engine.h"
#include "lib/model/llama_runner.h"
#include "lib/sim/signal_trace.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::sim {
namespace {

std::string ModelDir() {
  const char* src = std::getenv("VTOKEN_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/models/vt-tiny";
}

struct PolicyCase {
  const char* policy;
  int64_t evict_interval;
};

engine::EngineOptions Options(Mode mode, PolicyCase p = {"h2o", 1}) {
  engine::EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = 120, .block_size = 16, .headroom_blocks = 4};
  o.max_num_seqs = 6;
  o.max_prefill_chunk = 128;
  o.policy = p.policy;
  o.evictor = {
      .keep_ratio = 0.25, .num_sink = 4, .num_recent = 16, .evict_interval = p.evict_interval};
  o.reclaim.frag_threshold = 0.2;
  o.reclaim.low_watermark = 0.9;
  o.verify = true;
  return o;
}

class TraceReplayTest : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(TraceReplayTest, SimReplayOfAVtTinyRunMatchesItExactly) {
  const PolicyCase policy = GetParam();
  StatusOr<model::LlamaModel> m = model::LoadModel(ModelDir(), 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const engine::EngineOptions base = Options(Mode::kNaive);
  const int64_t slots = int64_t{base.pool.num_blocks} * base.pool.block_size;
  StatusOr<std::unique_ptr<model::LlamaRunner>> real =
      model::LlamaRunner::Create(std::move(*m), {.num_slots = slots, .async_copies = false});
  ASSERT_TRUE(real.ok());
  engine::WorkloadOptions w;
  w.kind = "longbench_like";
  w.num_requests = 8;
  w.input_min = 150;
  w.input_max = 300;
  w.output_min = 16;
  w.output_max = 40;
  StatusOr<std::vector<engine::Request>> requests =
      engine::GenerateWorkload(w, nullptr, (*real)->vocab_size());
  ASSERT_TRUE(requests.ok());

  const std::string path = (std::filesystem::temp_directory_path() /
                            ("vtoken_replay_test_" + std::string(policy.policy) + ".trace"))
                               .string();
  const std::vector<Mode> modes = {Mode::kNative, Mode::kNaive, Mode::kVtoken};
  std::vector<engine::EngineResult> recorded;
  {
    auto writer = SignalTraceWriter::Create(path, ModelDir());
    ASSERT_TRUE(writer.ok());
    for (Mode mode : modes) {
      RecordingRunner rec(**real, **writer, ModeName(mode));
      StatusOr<engine::EngineResult> r = engine::RunEngine(Options(mode, policy), rec, *requests);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      recorded.push_back(std::move(*r));
    }
    ASSERT_TRUE((*writer)->Close().ok());
  }
  ASSERT_GT(recorded[2].moves, 0) << "the workload must make vtoken relocate";

  SimConfig sim = DefaultSimConfig();
  sim.attention = "trace:" + path;
  sim.dtype = "float32";  // vt-tiny's KV dtype: the same bytes per moved token.
  StatusOr<std::unique_ptr<SimRunner>> runner =
      MakeSimRunner("sim:" + ModelDir() + "/config.json", sim, slots, false);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  for (size_t k = 0; k < modes.size(); ++k) {
    (*runner)->BeginRun(ModeName(modes[k]));
    StatusOr<engine::EngineResult> r =
        engine::RunEngine(Options(modes[k], policy), **runner, *requests);
    ASSERT_TRUE(r.ok()) << ModeName(modes[k]) << ": " << r.status().ToString();
    const engine::EngineResult& a = recorded[k];
    SCOPED_TRACE(ModeName(modes[k]));
    EXPECT_EQ(r->violations, 0);
    EXPECT_EQ(r->evictions, a.evictions);
    EXPECT_EQ(r->moves, a.moves);
    EXPECT_EQ(r->bytes_moved, a.bytes_moved);
    EXPECT_EQ(r->peak_running, a.peak_running);
    ASSERT_EQ(r->steps.size(), a.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
      const engine::StepRecord &x = r->steps[i], &y = a.steps[i];
      ASSERT_EQ(x.allocated_blocks, y.allocated_blocks) << "step " << i;
      ASSERT_EQ(x.held_blocks, y.held_blocks) << "step " << i;
      ASSERT_EQ(x.ideal_blocks, y.ideal_blocks) << "step " << i;
      ASSERT_EQ(x.live_slots, y.live_slots) << "step " << i;
      ASSERT_EQ(x.free_blocks, y.free_blocks) << "step " << i;
      ASSERT_EQ(x.waste_ratio, y.waste_ratio) << "step " << i;
      for (int b = 0; b < 4; ++b) ASSERT_EQ(x.hist[b], y.hist[b]) << "step " << i;
      ASSERT_EQ(x.moves, y.moves) << "step " << i;
      ASSERT_EQ(x.num_running, y.num_running) << "step " << i;
    }
    for (size_t i = 0; i < a.requests.size(); ++i) {
      EXPECT_EQ(r->requests[i].blocks_final, a.requests[i].blocks_final);
      EXPECT_EQ(r->requests[i].live_final, a.requests[i].live_final);
      EXPECT_EQ(r->requests[i].output_tokens, a.requests[i].output_tokens) << "request " << i;
    }
  }

  // The same trace without its native records: native replays with the sim's tokens.
  StatusOr<SignalTrace> trace = ReadSignalTrace(path);
  ASSERT_TRUE(trace.ok());
  // Every record holds both signals, whichever the recorded policy reads: a trace serves any
  // policy, and fit-signals fits the key norms.
  for (const SignalRecord& rec : trace->records) {
    ASSERT_FALSE(rec.key_norm.empty());
    ASSERT_GT(*std::min_element(rec.key_norm.begin(), rec.key_norm.end()), 0.0f)
        << rec.mode << " request " << rec.request;
  }
  const std::string old_path = path + ".old";
  {
    auto writer = SignalTraceWriter::Create(old_path, trace->model);
    ASSERT_TRUE(writer.ok());
    for (const SignalRecord& rec : trace->records) {
      if (rec.mode != "native") ASSERT_TRUE((*writer)->Append(rec).ok());
    }
    ASSERT_TRUE((*writer)->Close().ok());
  }
  sim.attention = "trace:" + old_path;
  runner = MakeSimRunner("sim:" + ModelDir() + "/config.json", sim, slots, false);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  (*runner)->BeginRun("native");
  StatusOr<engine::EngineResult> native =
      engine::RunEngine(Options(Mode::kNative, policy), **runner, *requests);
  ASSERT_TRUE(native.ok()) << native.status().ToString();
  ASSERT_EQ(native->steps.size(), recorded[0].steps.size());
  EXPECT_NE(native->requests[0].output_tokens, recorded[0].requests[0].output_tokens);
  std::filesystem::remove(path);
  std::filesystem::remove(old_path);
}

INSTANTIATE_TEST_SUITE_P(Policies, TraceReplayTest,
                         ::testing::Values(PolicyCase{"h2o", 1}, PolicyCase{"tova", 4}),
                         [](const auto& info) { return std::string(info.param.policy); });

}  // namespace
}  // namespace vtoken::sim
