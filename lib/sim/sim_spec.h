// How an experiment asks for a simulated model: `model.path = "sim:NAME"` (a published shape,
// model::SyntheticConfigNames()) or "sim:path/to/config.json", with the [sim] table of the
// experiment config parsed into SimConfig. MakeSimRunner turns both into a SimRunner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "lib/model/io/hf_config.h"
#include "lib/sim/cost_model.h"
#include "lib/sim/parametric_signals.h"
#include "lib/sim/sim_runner.h"

namespace vtoken::sim {

inline constexpr const char* kSimPrefix = "sim:";
bool IsSimSpec(const std::string& model);

struct SimConfig {
  // "parametric" | "trace:FILE".
  std::string attention = "parametric";
  HardwareSpec hardware;                // A preset with [sim.hardware] overrides applied.
  std::string dtype = "bfloat16";       // "bfloat16" | "float16" | "float32"
  bool measured_planner_time = false;   // [sim] planner_time = "measured" | "none"
  bool measured_policy_time = false;    // [sim] policy_time = "measured" | "none"
  bool measured_schedule_time = false;  // [sim] schedule_time = "measured" | "none"
  uint64_t seed = 1;                    // Sampled tokens.
  ParametricParams parametric = VtTinyFit();
  // Tokens of vLLM's profiling forward (its max_num_batched_tokens) for pool sizing.
  int64_t profile_tokens = 16384;
};
// The default [sim] configuration: h100-sxm-80g, parametric signals fitted on vt-tiny.
SimConfig DefaultSimConfig();
// Bytes per element of a dtype name; InvalidArgument otherwise.
StatusOr<int64_t> DtypeBytes(const std::string& dtype);

// The model configuration a sim spec names. NotFound for an unknown name or missing file,
// InvalidArgument for a spec without the prefix or a bad config.json.
StatusOr<model::ModelConfig> SimModelConfig(const std::string& spec);

// A SimRunner for `spec` with `num_slots` KV slots. Errors: the spec's, a bad [sim] value, an
// unreadable or malformed trace (NotFound / DataLoss naming the file).
StatusOr<std::unique_ptr<SimRunner>> MakeSimRunner(const std::string& spec, const SimConfig& sim,
                                                   int64_t num_slots, bool force_sync,
                                                   Granularity granularity = Granularity::kToken);

}  // namespace vtoken::sim
