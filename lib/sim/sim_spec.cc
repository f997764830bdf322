#include "lib/sim/sim_spec.h"

#include "lib/sim/signal_trace.h"

namespace vtoken::sim {

bool IsSimSpec(const std::string& model) { return model.rfind(kSimPrefix, 0) == 0; }

SimConfig DefaultSimConfig() {
  SimConfig c;
  c.hardware = *HardwarePreset("h100-sxm-80g");
  return c;
}

StatusOr<int64_t> DtypeBytes(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  if (dtype == "float32") return 4;
  return InvalidArgumentError("dtype '" + dtype + "' must be bfloat16, float16 or float32");
}

StatusOr<model::ModelConfig> SimModelConfig(const std::string& spec) {
  if (!IsSimSpec(spec)) return InvalidArgumentError("'" + spec + "' is not a sim: model");
  const std::string name = spec.substr(std::string(kSimPrefix).size());
  if (name.size() > 5 && name.substr(name.size() - 5) == ".json") {
    return model::ParseConfigJson(name);
  }
  return model::SyntheticConfig(name);
}

StatusOr<std::unique_ptr<SimRunner>> MakeSimRunner(const std::string& spec, const SimConfig& sim,
                                                   int64_t num_slots, bool force_sync,
                                                   Granularity granularity) {
  SimOptions o;
  VTOKEN_ASSIGN_OR_RETURN(o.config, SimModelConfig(spec));
  VTOKEN_ASSIGN_OR_RETURN(o.dtype_bytes, DtypeBytes(sim.dtype));
  o.hardware = sim.hardware;
  o.num_slots = num_slots;
  o.seed = sim.seed;
  o.force_sync = force_sync;
  o.measured_planner_time = sim.measured_planner_time;
  o.measured_policy_time = sim.measured_policy_time;
  o.measured_schedule_time = sim.measured_schedule_time;
  o.granularity = granularity;
  std::unique_ptr<SignalSource> signals;
  if (sim.attention == "parametric") {
    VTOKEN_RETURN_IF_ERROR(sim.parametric.Validate());
    signals = std::make_unique<ParametricSignals>(sim.parametric);
  } else if (sim.attention.rfind("trace:", 0) == 0) {
    if (granularity != Granularity::kToken) {
      return InvalidArgumentError("sim.attention = \"" + sim.attention +
                                  "\": a signal trace holds token-granularity "
                                  "signals; cache.granularity \"" +
                                  GranularityName(granularity) +
                                  "\" needs sim.attention = \"parametric\"");
    }
    const std::string path = sim.attention.substr(6);
    VTOKEN_ASSIGN_OR_RETURN(SignalTrace trace, ReadSignalTrace(path));
    signals = std::make_unique<TraceSignals>(std::move(trace), path);
  } else {
    return InvalidArgumentError("sim.attention '" + sim.attention +
                                "' must be \"parametric\" or \"trace:FILE\"");
  }
  return SimRunner::Create(o, std::move(signals));
}

}  // namespace vtoken::sim
