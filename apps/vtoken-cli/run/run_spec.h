// What a run runs, built once and never rewritten: the engine options a run hands the engine,
// with the pool split into blocks of one KV group, the KV slots the store allocates, and for an
// experiment config, what each mode's run records. `run` and `sweep` build an ExperimentSpec from
// the parsed config (BuildExperimentSpec: every check that needs more than the file), `generate`
// and `check` a RunSpec from their flags' engine options (MakeRunSpec); the simulator runs
// through `run`. The parsed config (ExperimentConfig) stays as the user gave it: what a run
// records is the user's config, what it runs is the spec's. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/core/status.h"
#include "lib/core/types.h"
#include "lib/engine/engine.h"
#include "lib/engine/result_schema.h"
#include "lib/model/io/hf_config.h"

namespace vtoken::cli {

struct RunSpec {
  Granularity granularity = Granularity::kToken;
  int32_t kv_groups = 1;  // NumKvGroups(granularity, layers, KV heads)
  // KV slots the store allocates: the pool's blocks (of one KV group) x block_size.
  int64_t num_slots = 0;
  // One per mode, in the order given: the options the run hands the engine (mode set; the pool,
  // its headroom and reclaim.max_moves_per_step in blocks and moves of one KV group; the
  // evictor told the granularity and the model's layout).
  std::vector<engine::EngineOptions> runs;
};

// `options` counts blocks of block_size tokens in every layer and head (the config's
// engine.num_blocks, a command's pool) at any granularity: the same KV bytes. Splits them into
// kv_groups blocks of one KV group each, scales reclaim.max_moves_per_step (token moves) to
// group-slot moves of the same bytes, and makes one run per mode. `shape` may be null only at
// token granularity (a model whose shape cannot be read before loading). InvalidArgument when
// the split pool would exceed 2^31 - 1 blocks (the message names neither key nor file).
StatusOr<RunSpec> MakeRunSpec(const engine::EngineOptions& options, Granularity granularity,
                              const model::ModelConfig* shape, std::span<const Mode> modes);

// An experiment config's runs: its RunSpec (one run per config.modes) and, per mode, the record
// its run begins with (everything but git_sha and sweep, which the caller knows).
struct ExperimentSpec {
  RunSpec run;
  std::vector<engine::RunRecord> records;  // One per config.modes, as run.runs.
  // The model's shape read before loading (PeekModelConfig); nullopt where it cannot be.
  std::optional<model::ModelConfig> shape;
};

// Checks what the file alone cannot (a perplexity workload's budget, the memory the run
// allocates, the policy's token counts against the model's context, the pool's split) and
// builds the spec. `device_free` returns the bytes free on the GPU for a CUDA model.device, or
// -1 (CheckRunMemory); it is asked only when the model's shape is known. Errors name the file
// and the key.
StatusOr<ExperimentSpec> BuildExperimentSpec(const ExperimentConfig& config,
                                             const std::function<StatusOr<int64_t>()>& device_free);

}  // namespace vtoken::cli
