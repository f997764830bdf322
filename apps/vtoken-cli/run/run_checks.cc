#include "apps/vtoken-cli/run/run_checks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "lib/core/memory_budget.h"
#include "lib/model/io/device_spec.h"
#include "lib/model/io/model_files.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::cli {

Status CheckRunFiles(const ExperimentConfig& c) {
  if (!sim::IsSimSpec(c.model) && c.model.rfind("synthetic:", 0) != 0) {
    VTOKEN_RETURN_IF_ERROR(model::ResolveModelPath(c.model).status());
  }
  if (!c.workload.corpus_path.empty() && !std::filesystem::exists(c.workload.corpus_path)) {
    return NotFoundError("corpus file " + c.workload.corpus_path +
                         " not found (scripts/make-corpus.sh builds the KJV corpus)");
  }
  return Status::Ok();
}

namespace {

bool EvictionConfigured(const ExperimentConfig& c) {
  if (c.engine.indirection_only) return false;
  return std::any_of(c.modes.begin(), c.modes.end(), [](Mode m) { return m != Mode::kNative; });
}

}  // namespace

StatusOr<model::ModelConfig> PeekModelConfig(const std::string& model) {
  if (sim::IsSimSpec(model)) return sim::SimModelConfig(model);
  if (model.rfind("synthetic:", 0) == 0) return model::SyntheticConfig(model.substr(10));
  return model::ReadModelConfig(model);
}

Status CheckRunMemory(const ExperimentConfig& c, const model::ModelConfig& m, int64_t available,
                      int64_t device_available) {
  const int64_t num_blocks = c.engine.pool.num_blocks, block_size = c.engine.pool.block_size;
  const int64_t slots = SaturatingMul(num_blocks, block_size);
  const bool sim = sim::IsSimSpec(c.model);
  // KV store and weights in model.dtype (the KV store takes the compute dtype).
  StatusOr<model::ComputeDtype> dtype = model::ParseComputeDtype(c.model_dtype);
  if (!dtype.ok()) return InvalidArgumentError(c.file + ": model." + dtype.status().message());
  const int64_t dtype_bytes = model::ComputeDtypeBytes(*dtype);
  const int64_t per_slot = sim ? 8
                               : SaturatingMul(SaturatingMul(2 * dtype_bytes, m.num_hidden_layers),
                                               SaturatingMul(m.num_key_value_heads, m.head_dim));
  const int64_t store = SaturatingMul(slots, per_slot);
  const int64_t metadata = PoolMetadataBytes(num_blocks, block_size);
  const int64_t weights = sim ? 0 : SaturatingMul(model::ParameterCount(m), dtype_bytes);
  const int64_t workload = engine::WorkloadBytes(c.workload);
  if (available < 0) available = AvailableMemoryBytes();
  const std::string pool = std::to_string(num_blocks) + " x " + std::to_string(block_size) +
                           " slots x " + std::to_string(per_slot) + " bytes";
  const std::string blocks = c.file + ": engine.num_blocks = " + std::to_string(num_blocks) +
                             ": the KV store (" + pool + (weights > 0 ? ") and weights" : ")");
  const std::string requests =
      c.file + ": workload.num_requests = " + std::to_string(c.workload.num_requests) +
      ": the requests (" + FormatBytes(workload) + ")";
  if (device_available >= 0) {  // The store and the weights on the GPU, the rest on the host.
    VTOKEN_RETURN_IF_ERROR(CheckMemory(SaturatingAdd(store, weights),
                                       blocks + " on " + c.model_device, device_available));
    return CheckMemory(SaturatingAdd(metadata, workload),
                       requests + " with the pool's metadata, on the host", available);
  }
  const int64_t kv = SaturatingAdd(store, metadata);
  VTOKEN_RETURN_IF_ERROR(CheckMemory(SaturatingAdd(kv, weights), blocks, available));
  return CheckMemory(SaturatingAdd(SaturatingAdd(kv, weights), workload),
                     requests + " with the KV store and weights", available);
}

Status CheckPolicyAgainstContext(const ExperimentConfig& c, int64_t max_context) {
  if (!EvictionConfigured(c)) return Status::Ok();
  const EvictorOptions& e = c.engine.evictor;
  const std::pair<const char*, int64_t> keys[] = {
      {"budget_tokens", e.budget_tokens}, {"num_sink", e.num_sink}, {"num_recent", e.num_recent}};
  for (const auto& [key, value] : keys) {
    if (value > max_context) {
      return InvalidArgumentError(c.file + ": key 'policy." + key + "' = " + std::to_string(value) +
                                  " exceeds the model's context (" + std::to_string(max_context) +
                                  " positions)");
    }
  }
  return Status::Ok();
}

std::string ProtectionWarning(const ExperimentConfig& c,
                              const std::vector<engine::Request>& requests, bool bos) {
  const EvictorOptions& e = c.engine.evictor;
  if (!EvictionConfigured(c) || e.keep_ratio <= 0) return "";
  const int64_t protect = e.num_sink + e.num_recent;
  int64_t short_requests = 0, worst_budget = 0, worst_prompt = 0, worst_id = -1;
  for (const engine::Request& r : requests) {
    const int64_t prompt = static_cast<int64_t>(r.prompt_tokens.size()) + (bos ? 1 : 0);
    const int64_t budget =
        std::max<int64_t>(1, static_cast<int64_t>(e.keep_ratio * static_cast<double>(prompt)));
    if (budget >= protect) continue;
    ++short_requests;
    if (worst_id < 0 || budget < worst_budget) {
      worst_budget = budget;
      worst_prompt = prompt;
      worst_id = r.id;
    }
  }
  if (short_requests == 0) return "";
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%s: policy.keep_ratio = %g leaves %lld of %zu requests a budget below "
                "policy.num_sink + policy.num_recent = %lld (request %lld: %lld of %lld prompt "
                "tokens); their protection shrinks to the budget",
                c.file.c_str(), e.keep_ratio, static_cast<long long>(short_requests),
                requests.size(), static_cast<long long>(protect), static_cast<long long>(worst_id),
                static_cast<long long>(worst_budget), static_cast<long long>(worst_prompt));
  return buf;
}

}  // namespace vtoken::cli
