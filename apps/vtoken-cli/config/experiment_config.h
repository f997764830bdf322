// Experiment configuration: the TOML file of `vtoken-cli run` / `sweep`, parsed into the option
// structs of the engine. Only apps/ parses TOML. Every key is declared once in the key table
// (config_keys.h), which docs/EXPERIMENTS.md's key reference is generated from; an unknown key,
// a wrong type or an impossible value is an error naming the file, the key and the line (or the
// --set), reported before anything runs or is written.
#pragma once

#include <string>
#include <vector>

#include "apps/vtoken-cli/config/sweep_grid.h"
#include "lib/core/status.h"
#include "lib/core/types.h"
#include "lib/engine/engine.h"
#include "lib/engine/workload.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::cli {

struct ExperimentConfig {
  std::string name;  // Experiment name (defaults to the file's stem).
  std::string file;  // The TOML file it came from.
  // Runs to make, one per mode, native first.
  std::vector<Mode> modes = {Mode::kNative, Mode::kNaive, Mode::kVtoken};
  std::string db = "results/vtoken.db";
  // Model directory, "synthetic:NAME" (real shapes, random weights) or "sim:NAME" (simulated:
  // no weights, lib/sim).
  std::string model = "models/vt-tiny";
  uint64_t model_seed = 1;  // Seeds synthetic weights.
  // [model] device ("cpu", "cuda", "cuda:N") and dtype ("float32", "bfloat16", "float16") of a
  // real or synthetic model's weights, activations and KV store.
  std::string model_device = "cpu";
  std::string model_dtype = "float32";
  // [model] weights: "float32", "as_stored" (decode reads a GGUF file's Q8_0 / Q4_0 / Q4_1
  // blocks as the file stores them: LlamaOptions::weights_as_stored), "as_stored_q8" (and
  // multiplies them by 8-bit activations: LlamaOptions::q8_activations) or "bfloat16" (linear
  // weights kept in bf16, times activations in bf16: LlamaOptions::bf16_weights).
  std::string model_weights = "float32";
  // [model] kv_dtype: the KV store's dtype, "auto" (model_dtype's) or a dtype name
  // (LlamaOptions::kv_dtype).
  std::string model_kv_dtype = "auto";
  // [model] threads: CPU threads of the model's step (torch's intra-op pool and the fused CPU
  // step's CpuPool); 0 = every CPU this process may use.
  int64_t model_threads = 0;
  // [sim]: the simulated runner's signals, hardware and clock (sim: models only).
  sim::SimConfig sim = sim::DefaultSimConfig();
  // engine.gpu_memory_utilization > 0 (sim: models): num_blocks derived as vLLM does;
  // pool_sizing explains the derivation.
  double gpu_memory_utilization = 0;
  std::string pool_sizing;
  bool async_copies = true;  // Relocation copies on a worker thread.
  // engine.cuda_graphs: decode steps replay one CUDA graph per batch bucket
  // (model::DecodeMode::kCudaGraphs); needs model.device cuda.
  bool cuda_graphs = false;
  // [cache] granularity: what one liveness bit covers. engine.num_blocks counts blocks of
  // block_size tokens in every layer and head at any granularity (the same KV bytes); a run
  // splits them into NumKvGroups blocks of one group each (MakeRunSpec, run_spec.h).
  Granularity granularity = Granularity::kToken;
  engine::WorkloadOptions workload;
  engine::EngineOptions engine;  // `mode` is set per run.
  // policy.source_xxh64 as a config gave it ("" when not given): the hash of the Python policy's
  // file that the config was recorded with, checked against the file (CrossCheck).
  std::string policy_source_xxh64;
  // The [sweep] table, read only by `sweep` (`run` ignores it): `name` (default: the
  // experiment's name), the [sweep.grid] axes (with `seeds`), the [[sweep.exclude]] entries and
  // the [[sweep.add]] points (ExpandSweep). It is not part of the resolved config, so editing
  // the grid leaves the config hashes of existing points unchanged.
  std::string sweep_name;
  std::vector<SweepAxis> sweep_grid;
  std::vector<SweepOverrides> sweep_exclude;
  std::vector<SweepOverrides> sweep_add;
  bool has_sweep_table = false;  // The file (or a --set) has a [sweep] table.
  // The resolved configuration as TOML (overrides applied), one text per mode: what a run
  // records, and what its config hash is computed from.
  std::vector<std::string> resolved_toml;
};

// Reads `path`, applies `overrides` ("section.key=value", value parsed as a TOML value, or as a
// string when it does not parse), and validates. Errors name the file and key.
// `check_sweep_points` = false skips the checks of the [sweep] table's exclusions and added points
// against the whole grid (CheckPointLists): `sweep` loads the file once with them, then each of
// its points without (they would cost a grid expansion per point).
StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                const std::vector<std::string>& overrides,
                                                bool check_sweep_points = true);

// The resolved configuration of `config` run in `mode` (need not be one of config.modes): every
// key with its effective value. config.resolved_toml holds it for each of config.modes.
std::string ResolvedToml(const ExperimentConfig& config, Mode mode);

// Hex xxhash64 of a resolved config text.
std::string ConfigHash(const std::string& resolved_toml);

// Hex xxhash64 of the source file of registered policy `policy` when it is a Python policy
// (lib/pypolicy/python_policy.h: a .py file), "" for a C++ policy, an unknown name or an
// unreadable file. Recorded in resolved configs (policy.source_xxh64), so that runs of a changed
// file get another config hash.
std::string PythonPolicySourceHash(const std::string& policy);

}  // namespace vtoken::cli
