#include "apps/vtoken-cli/run/run_spec.h"

#include <algorithm>
#include <climits>
#include <string>

#include "apps/vtoken-cli/run/run_checks.h"
#include "lib/core/memory_budget.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken::cli {

StatusOr<RunSpec> MakeRunSpec(const engine::EngineOptions& options, Granularity granularity,
                              const model::ModelConfig* shape, std::span<const Mode> modes) {
  engine::EngineOptions e = options;
  e.evictor.granularity = granularity;
  int64_t groups = 1;
  if (shape != nullptr) {
    e.evictor.num_layers = static_cast<int32_t>(shape->num_hidden_layers);
    e.evictor.num_kv_heads = static_cast<int32_t>(shape->num_key_value_heads);
    groups = NumKvGroups(granularity, shape->num_hidden_layers, shape->num_key_value_heads);
  } else if (granularity != Granularity::kToken) {
    return InvalidArgumentError(std::string("granularity ") + GranularityName(granularity) +
                                " needs the model's shape before it loads");
  }
  const int64_t blocks = SaturatingMul(e.pool.num_blocks, groups);
  if (blocks > INT32_MAX || groups > kMaxKvGroups) {
    return InvalidArgumentError(std::to_string(e.pool.num_blocks) + " blocks at granularity " +
                                GranularityName(granularity) + " are " + std::to_string(blocks) +
                                " blocks of one KV group (" + std::to_string(groups) +
                                " groups); at most 2147483647");
  }
  e.pool.num_blocks = static_cast<int32_t>(blocks);
  e.pool.headroom_blocks = static_cast<int32_t>(e.pool.headroom_blocks * groups);
  // reclaim.max_moves_per_step counts tokens in every layer and head: the same copy bytes.
  e.reclaim.max_moves_per_step = SaturatingMul(e.reclaim.max_moves_per_step, groups);
  RunSpec spec{.granularity = granularity,
               .kv_groups = static_cast<int32_t>(groups),
               .num_slots = int64_t{e.pool.num_blocks} * e.pool.block_size,
               .runs = {}};
  for (Mode mode : modes) {
    spec.runs.push_back(e);
    spec.runs.back().mode = mode;
  }
  return spec;
}

StatusOr<ExperimentSpec> BuildExperimentSpec(
    const ExperimentConfig& c, const std::function<StatusOr<int64_t>()>& device_free) {
  const bool evicts =
      std::any_of(c.modes.begin(), c.modes.end(), [](Mode m) { return m != Mode::kNative; });
  if (c.workload.kind == "perplexity" && evicts && !c.engine.indirection_only &&
      c.engine.evictor.budget_tokens == 0) {
    return InvalidArgumentError(c.file +
                                ": workload.kind \"perplexity\" evicts from a 1-token prompt: "
                                "give the cache size as policy.budget_tokens, not keep_ratio");
  }
  ExperimentSpec spec;
  // What the run allocates and what the policy asks of the context, before anything is loaded.
  if (StatusOr<model::ModelConfig> shape = PeekModelConfig(c.model); shape.ok()) {
    VTOKEN_ASSIGN_OR_RETURN(const int64_t free_bytes, device_free());
    VTOKEN_RETURN_IF_ERROR(CheckRunMemory(c, *shape, /*available=*/-1, free_bytes));
    VTOKEN_RETURN_IF_ERROR(CheckPolicyAgainstContext(c, shape->max_position_embeddings));
    spec.shape = std::move(*shape);
  } else if (c.granularity != Granularity::kToken) {
    return shape.status();
  }
  StatusOr<RunSpec> run =
      MakeRunSpec(c.engine, c.granularity, spec.shape ? &*spec.shape : nullptr, c.modes);
  if (!run.ok())
    return InvalidArgumentError(c.file + ": engine.num_blocks: " + run.status().message());
  spec.run = std::move(*run);
  for (size_t i = 0; i < c.modes.size(); ++i) {
    const engine::EngineOptions& o = spec.run.runs[i];
    engine::RunRecord rec;
    rec.config_toml = c.resolved_toml[i];
    rec.config_hash = ConfigHash(c.resolved_toml[i]);
    rec.model = c.model;
    rec.mode = ModeName(c.modes[i]);
    rec.policy = c.modes[i] == Mode::kNative || o.indirection_only ? "" : o.policy;
    rec.budget = o.evictor.budget_tokens > 0 ? static_cast<double>(o.evictor.budget_tokens)
                                             : o.evictor.keep_ratio;
    rec.block_size = o.pool.block_size;
    rec.num_blocks = c.engine.pool.num_blocks;  // As configured (blocks of every group).
    rec.workload = c.workload.kind == "jsonl" ? c.workload.jsonl_path : c.workload.kind;
    rec.seed = o.seed;
    spec.records.push_back(std::move(rec));
  }
  return spec;
}

}  // namespace vtoken::cli
