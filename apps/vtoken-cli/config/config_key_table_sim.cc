// The [sim] keys of the config key table (config_keys.h): the simulated runner's signals,
// hardware and clock, read only by sim: models and recorded only for them.
#include "apps/vtoken-cli/config/config_key_builder.h"
#include "lib/sim/cost_model.h"

namespace vtoken::cli::config_key_builder {
namespace {

std::string Measured(bool measured) { return measured ? "measured" : "none"; }
Status SetMeasured(bool& measured, const KeyValue& v) {
  measured = std::get<std::string>(v) == "measured";
  return Status::Ok();
}
Status SetPreset(ExperimentConfig& c, const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(c.sim.hardware, sim::HardwarePreset(name));
  return Status::Ok();
}

}  // namespace

void AppendSimKeys(std::vector<ConfigKey>& keys) {
  Key entries[] = {
      Field(
          "sim.attention", [](ExperimentConfig & c) -> auto& { return c.sim.attention; })
          .Check(
              [](const std::string& s) {
                return s == "parametric" || (s.rfind("trace:", 0) == 0 && s.size() > 6);
              },
              "must be \"parametric\" or \"trace:FILE\"")
          .Record(kSim)
          .Doc("`sim:` models: `parametric` (the generative attention model) or `trace:FILE` "
               "(replay of `run --record-signals FILE`)"),
      Field(
          "sim.dtype", [](ExperimentConfig & c) -> auto& { return c.sim.dtype; })
          .Choices({"bfloat16", "float16", "float32"})
          .Record(kSim)
          .Doc("KV and weight dtype of the simulated model: `bfloat16`, `float16`, `float32`"),
      Custom(
          "sim.planner_time", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return Measured(c.sim.measured_planner_time);
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetMeasured(c.sim.measured_planner_time, v);
          })
          .Choices({"none", "measured"})
          .Record(kSim)
          .Doc("`measured`: add the planner's real CPU time to the virtual clock (latencies then "
               "vary slightly between runs); `none`: deterministic"),
      Custom(
          "sim.policy_time", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return Measured(c.sim.measured_policy_time);
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetMeasured(c.sim.measured_policy_time, v);
          })
          .Choices({"none", "measured"})
          .Record(kSimSet)
          .Doc("`measured`: add the engine's real policy time per step (observe, score, pick, "
               "evict, on this host's hardware threads) to the virtual clock's host phase, on top "
               "of `sim.hardware.host_overhead_s` (latencies then vary between runs and machines); "
               "`none`: deterministic, `host_overhead_s` is all the host's work"),
      Custom(
          "sim.schedule_time", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return Measured(c.sim.measured_schedule_time);
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetMeasured(c.sim.measured_schedule_time, v);
          })
          .Choices({"none", "measured"})
          .Record(kSimSet)
          .Doc("`measured`: add the engine's real scheduling time per step (building the step's "
               "inputs: the new tokens' slots and every sequence's context per KV group, "
               "`schedule_s`) to the virtual clock's host phase before the forward, on top of "
               "`sim.hardware.host_overhead_s` (latencies then vary between runs and machines); "
               "`none`: deterministic"),
      Field(
          "sim.seed", [](ExperimentConfig & c) -> auto& { return c.sim.seed; })
          .Record(kSim)
          .Doc("seed of the simulated output token ids"),
      Field(
          "sim.profile_tokens", [](ExperimentConfig & c) -> auto& { return c.sim.profile_tokens; })
          .Unit("tokens")
          .Range(1, kNone)
          .Record(kSim)
          .Doc("tokens of vLLM's profiling forward, for `gpu_memory_utilization`"),
      Custom(
          "sim.hardware.preset", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue { return c.sim.hardware.name; },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetPreset(c, std::get<std::string>(v));
          })
          .Record(kSim)
          .Doc("`h100-sxm-80g`, `h200`, `a100-80g`"),
      Custom(
          "sim.hardware.memory_gib", KeyType::kDouble,
          [](const ExperimentConfig& c) -> KeyValue { return c.sim.hardware.memory_bytes / kGiB; },
          [](ExperimentConfig& c, const KeyValue& v) {
            return (c.sim.hardware.memory_bytes = std::get<double>(v) * kGiB, Status::Ok());
          })
          .Unit("GiB")
          .DefaultText("preset")
          .Record(kSim)
          .Doc("device memory (default: the preset's)"),
      Custom(
          "sim.hardware.hbm_tbps", KeyType::kDouble,
          [](const ExperimentConfig& c) -> KeyValue { return c.sim.hardware.hbm_bandwidth / 1e12; },
          [](ExperimentConfig& c, const KeyValue& v) {
            return (c.sim.hardware.hbm_bandwidth = std::get<double>(v) * 1e12, Status::Ok());
          })
          .Unit("TB/s")
          .DefaultText("preset")
          .Record(kSim)
          .Doc("HBM bandwidth (default: the preset's)"),
      Custom(
          "sim.hardware.peak_tflops", KeyType::kDouble,
          [](const ExperimentConfig& c) -> KeyValue { return c.sim.hardware.peak_flops / 1e12; },
          [](ExperimentConfig& c, const KeyValue& v) {
            return (c.sim.hardware.peak_flops = std::get<double>(v) * 1e12, Status::Ok());
          })
          .Unit("TFLOP/s")
          .DefaultText("preset")
          .Record(kSim)
          .Doc("dense bf16 peak (default: the preset's)"),
      Custom(
          "sim.hardware.copy_tbps", KeyType::kDouble,
          [](const ExperimentConfig& c) -> KeyValue {
            return c.sim.hardware.copy_bandwidth / 1e12;
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return (c.sim.hardware.copy_bandwidth = std::get<double>(v) * 1e12, Status::Ok());
          })
          .Unit("TB/s")
          .DefaultText("preset")
          .Record(kSim)
          .Doc("relocation copy bandwidth (payload) (default: the preset's)"),
      Custom(
          "sim.hardware.non_torch_gib", KeyType::kDouble,
          [](const ExperimentConfig& c) -> KeyValue {
            return c.sim.hardware.non_torch_bytes / kGiB;
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return (c.sim.hardware.non_torch_bytes = std::get<double>(v) * kGiB, Status::Ok());
          })
          .Unit("GiB")
          .DefaultText("preset")
          .Record(kSim)
          .Doc("memory outside torch (default: the preset's)"),
      Field(
          "sim.hardware.memory_efficiency",
          [](ExperimentConfig & c) -> auto& { return c.sim.hardware.memory_efficiency; })
          .Record(kSim)
          .Doc("fraction of the memory bandwidth peak a step reaches"),
      Field(
          "sim.hardware.compute_efficiency",
          [](ExperimentConfig & c) -> auto& { return c.sim.hardware.compute_efficiency; })
          .Record(kSim)
          .Doc("fraction of the compute peak a step reaches"),
      Field(
          "sim.hardware.forward_overhead_s",
          [](ExperimentConfig & c) -> auto& { return c.sim.hardware.forward_overhead_s; })
          .Unit("s")
          .Record(kSim)
          .Doc("per forward (launches)"),
      Field(
          "sim.hardware.host_overhead_s",
          [](ExperimentConfig & c) -> auto& { return c.sim.hardware.host_overhead_s; })
          .Unit("s")
          .Record(kSim)
          .Doc("per step on the host (scheduling, sampling)"),
      Field(
          "sim.parametric.num_sinks",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.num_sinks; })
          .Record(kSim)
          .Doc("sink tokens of the attention model (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.sink_weight",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.sink_weight; })
          .Record(kSim)
          .Doc("attention mass of the sinks (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.recency_weight",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.recency_weight; })
          .Record(kSim)
          .Doc("attention mass of the recency term (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.recency_exponent",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.recency_exponent; })
          .Record(kSim)
          .Doc("decay exponent of the recency term (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.importance_sigma",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.importance_sigma; })
          .Record(kSim)
          .Doc("spread of the per-token importance (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.noise_sigma",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.noise_sigma; })
          .Record(kSim)
          .Doc("per-step noise of the attention (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.key_norm_median",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.key_norm_median; })
          .Record(kSim)
          .Doc("median key norm (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.key_norm_rho",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.key_norm_rho; })
          .Record(kSim)
          .Doc("correlation of key norm and importance (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.key_norm_sigma",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.key_norm_sigma; })
          .Record(kSim)
          .Doc("spread of the key norms (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.group_sigma",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.group_sigma; })
          .Record(kSimGrouped)
          .Doc("per-group importance spread of layer/head runs (not fitted) (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.seed",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.seed; })
          .Record(kSim)
          .Doc("seed of the attention model (docs/SIMULATION.md)"),
      Field(
          "sim.parametric.fitted_on",
          [](ExperimentConfig & c) -> auto& { return c.sim.parametric.fitted_on; })
          .Record(kSim)
          .Doc("a label: what the parameters were fitted on (docs/SIMULATION.md)"),
  };
  for (Key& k : entries) keys.push_back(std::move(k));
}

}  // namespace vtoken::cli::config_key_builder
