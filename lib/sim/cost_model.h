// CostModel: the virtual clock's arithmetic. A roofline model of one batched step of a
// Llama-family decoder on a named GPU, the time of relocation copies, and vLLM-style sizing of
// the KV pool from gpu_memory_utilization. Every figure is a pure function of its inputs, so a
// simulated run's latencies are the same on every machine.
//
// Step time = max(bytes / (hbm_bandwidth * memory_efficiency),
//                 flops / (peak_flops * compute_efficiency)) + forward_overhead_s
//   bytes = weights read (every parameter but the input embedding table, which is only gathered)
//         + KV read (every context and new token of every sequence, all layers, K and V)
//         + KV written (the new tokens)
//   flops = 2 * (non-embedding parameters - lm_head) * new tokens
//         + 2 * lm_head parameters * sampled sequences
//         + attention: 4 * layers * query heads * head_dim * sum over sequences of
//           new * (context + (new + 1) / 2)   (QK^T and PV, causal among the new tokens)
// The host's own work per step (scheduling, sampling) is `host_overhead_s`, on the host timeline.
// Relocation copies take bytes / copy_bandwidth on the copy stream.
//
// Thread-safe: pure functions and immutable structs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/hf_config.h"

namespace vtoken::sim {

// A GPU as the cost model sees it. Presets carry published figures (HardwarePreset); every
// field can be overridden in an experiment's [sim.hardware] table.
struct HardwareSpec {
  std::string name;
  double memory_bytes = 0;             // Device memory a process can use (what vLLM sizes from).
  double hbm_bandwidth = 0;            // Bytes/s, peak.
  double peak_flops = 0;               // Dense bf16/fp16 tensor FLOP/s, peak.
  double memory_efficiency = 0.75;     // Fraction of hbm_bandwidth a decode step reaches.
  double compute_efficiency = 0.6;     // Fraction of peak_flops a prefill step reaches.
  double copy_bandwidth = 0;           // Bytes/s of a device-to-device relocation copy (payload).
  double forward_overhead_s = 0.0004;  // Launch and synchronisation cost of one forward.
  double host_overhead_s = 0.002;      // Host time per step: scheduling, sampling, bookkeeping.
  double non_torch_bytes = 0;          // Pool sizing: CUDA context, library workspaces.
};

// "h100-sxm-80g", "h200", "a100-80g". NotFound listing the names otherwise.
StatusOr<HardwareSpec> HardwarePreset(std::string_view name);
std::vector<std::string> HardwarePresetNames();
// InvalidArgument naming the first field that is not positive (efficiencies in (0, 1]).
Status ValidateHardware(const HardwareSpec& hw);

// The model shape figures the cost model needs, derived once from a config.
struct ModelShape {
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t parameters = 0;            // ParameterCount.
  int64_t embedding_parameters = 0;  // Input embedding table (read by gather only).
  int64_t lm_head_parameters = 0;    // vocab * hidden (tied or not: always multiplied).
  int64_t dtype_bytes = 2;
  int64_t kv_bytes_per_token = 0;  // 2 * layers * kv heads * head_dim * dtype_bytes.
};
ModelShape ShapeOf(const model::ModelConfig& config, int64_t dtype_bytes);

// One sequence's part of a step: `new_tokens` computed over `context_tokens` live earlier ones.
struct SeqWork {
  int64_t context_tokens = 0;
  int64_t new_tokens = 0;
  bool sampled = true;
};

struct StepCost {
  double bytes = 0;  // HBM traffic.
  double flops = 0;
  double memory_s = 0;   // bytes / effective bandwidth.
  double compute_s = 0;  // flops / effective compute.
  double forward_s = 0;  // max(memory_s, compute_s) + forward_overhead_s.
};
StepCost ForwardCost(const ModelShape& shape, const HardwareSpec& hw,
                     const std::vector<SeqWork>& batch);

// Seconds the copy stream needs to relocate `tokens` tokens (all layers, K and V).
double CopySeconds(const ModelShape& shape, const HardwareSpec& hw, int64_t tokens);

// vLLM-style pool sizing: the KV pool gets what is left of memory_bytes * utilization after the
// weights, the activation peak of a profiling forward over `profile_tokens` tokens and the
// non-torch memory.
struct PoolSizing {
  double budget_bytes = 0;      // memory_bytes * gpu_memory_utilization
  double weight_bytes = 0;      // parameters * dtype_bytes
  double activation_bytes = 0;  // profile_tokens * (4 * hidden + 3 * intermediate) * dtype_bytes
  double non_torch_bytes = 0;
  double kv_bytes = 0;          // budget - weights - activations - non-torch
  int64_t block_bytes = 0;      // block_size * kv_bytes_per_token
  int64_t num_blocks = 0;       // floor(kv_bytes / block_bytes)
  std::string Explain() const;  // One line with every term, in GiB.
};
// InvalidArgument when utilization is outside (0, 1] or the budget leaves no block.
StatusOr<PoolSizing> SizePool(const ModelShape& shape, const HardwareSpec& hw,
                              double gpu_memory_utilization, int32_t block_size,
                              int64_t profile_tokens);

}  // namespace vtoken::sim
