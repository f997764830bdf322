#include "lib/sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace vtoken::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Published figures: memory as torch.cuda.mem_get_info reports it on the device (what vLLM
// multiplies by gpu_memory_utilization), HBM bandwidth and dense bf16 tensor throughput from
// NVIDIA's data sheets. Copy bandwidth is payload bytes per second of a device-to-device copy,
// which reads and writes every byte: half the HBM bandwidth at 80% efficiency.
std::vector<HardwareSpec> Presets() {
  auto make = [](const char* name, double mem_gib, double tbps, double tflops) {
    HardwareSpec hw;
    hw.name = name;
    hw.memory_bytes = mem_gib * kGiB;
    hw.hbm_bandwidth = tbps * 1e12;
    hw.peak_flops = tflops * 1e12;
    hw.copy_bandwidth = 0.5 * 0.8 * hw.hbm_bandwidth;
    hw.non_torch_bytes = 0.35 * kGiB;
    return hw;
  };
  return {make("a100-80g", 79.15, 2.039, 312.0), make("h100-sxm-80g", 79.19, 3.35, 989.0),
          make("h200", 139.8, 4.8, 989.0)};
}

}  // namespace

StatusOr<HardwareSpec> HardwarePreset(std::string_view name) {
  for (const HardwareSpec& hw : Presets()) {
    if (hw.name == name) return hw;
  }
  std::string known;
  for (const std::string& n : HardwarePresetNames()) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("unknown hardware '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> HardwarePresetNames() {
  std::vector<std::string> names;
  for (const HardwareSpec& hw : Presets()) names.push_back(hw.name);
  return names;
}

Status ValidateHardware(const HardwareSpec& hw) {
  const std::pair<const char*, double> positive[] = {{"memory_bytes", hw.memory_bytes},
                                                     {"hbm_bandwidth", hw.hbm_bandwidth},
                                                     {"peak_flops", hw.peak_flops},
                                                     {"copy_bandwidth", hw.copy_bandwidth},
                                                     {"memory_efficiency", hw.memory_efficiency},
                                                     {"compute_efficiency", hw.compute_efficiency}};
  for (const auto& [name, v] : positive) {
    if (!(v > 0) || !std::isfinite(v)) {
      return InvalidArgumentError(std::string(name) + " must be > 0");
    }
  }
  if (hw.memory_efficiency > 1) return InvalidArgumentError("memory_efficiency must be in (0, 1]");
  if (hw.compute_efficiency > 1) {
    return InvalidArgumentError("compute_efficiency must be in (0, 1]");
  }
  const std::pair<const char*, double> non_negative[] = {
      {"forward_overhead_s", hw.forward_overhead_s},
      {"host_overhead_s", hw.host_overhead_s},
      {"non_torch_bytes", hw.non_torch_bytes}};
  for (const auto& [name, v] : non_negative) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return InvalidArgumentError(std::string(name) + " must be >= 0");
    }
  }
  return Status::Ok();
}

ModelShape ShapeOf(const model::ModelConfig& c, int64_t dtype_bytes) {
  ModelShape s;
  s.num_layers = c.num_hidden_layers;
  s.num_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.hidden_size = c.hidden_size;
  s.intermediate_size = c.intermediate_size;
  s.vocab_size = c.vocab_size;
  s.parameters = model::ParameterCount(c);
  s.lm_head_parameters = c.vocab_size * c.hidden_size;
  s.embedding_parameters = c.tie_word_embeddings ? 0 : s.lm_head_parameters;
  s.dtype_bytes = dtype_bytes;
  s.kv_bytes_per_token = 2 * s.num_layers * s.num_kv_heads * s.head_dim * dtype_bytes;
  return s;
}

StepCost ForwardCost(const ModelShape& m, const HardwareSpec& hw,
                     const std::vector<SeqWork>& batch) {
  StepCost c;
  if (batch.empty()) return c;
  const double linear_params =
      static_cast<double>(m.parameters - m.embedding_parameters - m.lm_head_parameters);
  double new_tokens = 0, sampled = 0, kv_tokens = 0, attn_pairs = 0;
  for (const SeqWork& w : batch) {
    const double n = static_cast<double>(w.new_tokens);
    const double ctx = static_cast<double>(w.context_tokens);
    new_tokens += n;
    sampled += w.sampled ? 1 : 0;
    kv_tokens += ctx + 2 * n;  // Context and new tokens read, new tokens written.
    attn_pairs += n * (ctx + (n + 1) / 2);
  }
  c.bytes = static_cast<double>(m.parameters - m.embedding_parameters) *
                static_cast<double>(m.dtype_bytes) +
            kv_tokens * static_cast<double>(m.kv_bytes_per_token);
  c.flops = 2 * linear_params * new_tokens +
            2 * static_cast<double>(m.lm_head_parameters) * sampled +
            4.0 * static_cast<double>(m.num_layers * m.num_heads * m.head_dim) * attn_pairs;
  c.memory_s = c.bytes / (hw.hbm_bandwidth * hw.memory_efficiency);
  c.compute_s = c.flops / (hw.peak_flops * hw.compute_efficiency);
  c.forward_s = std::max(c.memory_s, c.compute_s) + hw.forward_overhead_s;
  return c;
}

double CopySeconds(const ModelShape& m, const HardwareSpec& hw, int64_t tokens) {
  return static_cast<double>(tokens) * static_cast<double>(m.kv_bytes_per_token) /
         hw.copy_bandwidth;
}

std::string PoolSizing::Explain() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "KV pool = %.2f GiB budget - %.2f GiB weights - %.2f GiB activations - %.2f GiB "
                "non-torch = %.2f GiB / %.1f MiB per block = %lld blocks",
                budget_bytes / kGiB, weight_bytes / kGiB, activation_bytes / kGiB,
                non_torch_bytes / kGiB, kv_bytes / kGiB,
                static_cast<double>(block_bytes) / (1024.0 * 1024.0),
                static_cast<long long>(num_blocks));
  return buf;
}

StatusOr<PoolSizing> SizePool(const ModelShape& m, const HardwareSpec& hw,
                              double gpu_memory_utilization, int32_t block_size,
                              int64_t profile_tokens) {
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return InvalidArgumentError("gpu_memory_utilization must be in (0, 1]");
  }
  if (block_size < 1) return InvalidArgumentError("block_size must be >= 1");
  if (profile_tokens < 1) return InvalidArgumentError("profile_tokens must be >= 1");
  PoolSizing p;
  p.budget_bytes = hw.memory_bytes * gpu_memory_utilization;
  p.weight_bytes = static_cast<double>(m.parameters) * static_cast<double>(m.dtype_bytes);
  p.activation_bytes = static_cast<double>(profile_tokens) *
                       static_cast<double>(4 * m.hidden_size + 3 * m.intermediate_size) *
                       static_cast<double>(m.dtype_bytes);
  p.non_torch_bytes = hw.non_torch_bytes;
  p.kv_bytes = p.budget_bytes - p.weight_bytes - p.activation_bytes - p.non_torch_bytes;
  p.block_bytes = int64_t{block_size} * m.kv_bytes_per_token;
  p.num_blocks =
      p.kv_bytes > 0
          ? static_cast<int64_t>(std::floor(p.kv_bytes / static_cast<double>(p.block_bytes)))
          : 0;
  if (p.num_blocks < 1) {
    return InvalidArgumentError("gpu_memory_utilization " + std::to_string(gpu_memory_utilization) +
                                " leaves no KV block: " + p.Explain());
  }
  return p;
}

}  // namespace vtoken::sim
