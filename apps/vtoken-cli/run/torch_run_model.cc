#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "apps/vtoken-cli/run/model_threads.h"
#include "apps/vtoken-cli/run/run_model.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/io/model_files.h"
#include "lib/model/torch_device.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::cli {
namespace {

// This process's resident memory in bytes (/proc/self/statm), or -1 where it cannot be read.
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

// The run header's line on a loaded model: the file, its format and tensor types, parameters,
// load time, resident memory and the KV bytes one token takes in every layer and head (the
// runner's own figure, broken down by the model's shape).
std::string ModelLoadLine(const model::ModelDescription& d, const model::ModelConfig& mc,
                          int64_t parameters, double load_s, int64_t resident,
                          const std::string& dtype, int64_t kv_bytes) {
  const int64_t dtype_bytes =
      kv_bytes / (mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * 2);
  char line[1024];
  std::snprintf(line, sizeof(line),
                "model: %s (%s: %s), %.1fM parameters, loaded in %.2f s, resident %lld MiB; KV "
                "%lld bytes/token (%lld layers x %lld KV heads x %lld dims x K,V x %lld B %s)",
                d.path.c_str(), d.format.c_str(), d.quantization.c_str(),
                static_cast<double>(parameters) / 1e6, load_s,
                static_cast<long long>(resident >> 20), static_cast<long long>(kv_bytes),
                static_cast<long long>(mc.num_hidden_layers),
                static_cast<long long>(mc.num_key_value_heads), static_cast<long long>(mc.head_dim),
                static_cast<long long>(dtype_bytes), dtype.c_str());
  return line;
}

// The model options a run asks for: [model] device, dtype, weights and kv_dtype.
StatusOr<model::LlamaOptions> RunOptions(const ExperimentConfig& c) {
  StatusOr<model::LlamaOptions> options = model::LlamaOptionsFor(c.model_device, c.model_dtype);
  if (!options.ok()) {
    return Status(options.status().code(), c.file + ": model." + options.status().message());
  }
  if (Status s = model::ApplyWeightsName(c.model_weights, *options); !s.ok()) {
    return Status(s.code(), c.file + ": model." + s.message());
  }
  if (c.model_kv_dtype != "auto") {
    VTOKEN_ASSIGN_OR_RETURN(options->kv_dtype, model::TorchDtype(c.model_kv_dtype));
  }
  return options;
}

}  // namespace

StatusOr<int64_t> DeviceFreeBytes(const ExperimentConfig& c) {
  if (sim::IsSimSpec(c.model)) return int64_t{-1};
  VTOKEN_ASSIGN_OR_RETURN(const torch::Device device, model::TorchDevice(c.model_device));
  if (!device.is_cuda()) return int64_t{-1};
  StatusOr<int64_t> free_bytes = model::CudaFreeBytes(device);
  if (free_bytes.status().code() == StatusCode::kFailedPrecondition) return int64_t{-1};
  return free_bytes;
}

bool IsSynthetic(const std::string& model) {
  return model.rfind("synthetic:", 0) == 0 || sim::IsSimSpec(model);
}

bool IsSyntheticLlama(const std::string& model) { return model.rfind("synthetic:", 0) == 0; }

StatusOr<std::unique_ptr<model::ModelRunner>> MakeShapeRunner(const ExperimentConfig& c,
                                                              const model::ModelConfig& shape,
                                                              int64_t slots) {
  VTOKEN_ASSIGN_OR_RETURN(const model::LlamaOptions options, RunOptions(c));
  VTOKEN_RETURN_IF_ERROR(model::CheckModelLoads(c.model, options));
  return std::unique_ptr<model::ModelRunner>(
      std::make_unique<ShapeRunner>(shape, options, slots, c.granularity));
}

StatusOr<std::unique_ptr<model::ModelRunner>> MakeRunner(const ExperimentConfig& c, int64_t slots,
                                                         std::string* model_line) {
  if (sim::IsSimSpec(c.model)) {
    StatusOr<std::unique_ptr<sim::SimRunner>> r =
        sim::MakeSimRunner(c.model, c.sim, slots, c.engine.force_sync, c.granularity);
    if (!r.ok()) return Status(r.status().code(), c.file + ": " + r.status().message());
    return std::unique_ptr<model::ModelRunner>(std::move(*r));
  }
  VTOKEN_ASSIGN_OR_RETURN(const model::LlamaOptions options, RunOptions(c));
  VTOKEN_RETURN_IF_ERROR(
      model::SetCpuThreads(static_cast<int>(ModelThreads(c.model_threads))).status());
  VTOKEN_RETURN_IF_ERROR(model::ApplyCpuIsaEnvironment());  // VTOKEN_CPU_ISA (cpu_isa.h)
  const auto start = std::chrono::steady_clock::now();
  VTOKEN_ASSIGN_OR_RETURN(model::LlamaModel m, model::LoadModel(c.model, c.model_seed, options));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t resident = ResidentBytes();  // the weights, before the KV tensors exist
  const model::ModelConfig shape = m.config();
  const int64_t parameters = m.NumParameters();
  VTOKEN_ASSIGN_OR_RETURN(
      std::unique_ptr<model::LlamaRunner> r,
      model::LlamaRunner::Create(
          std::move(m),
          {.num_slots = slots,
           .async_copies = c.async_copies,
           .granularity = c.granularity,
           .decode = c.cuda_graphs ? model::DecodeMode::kCudaGraphs : model::DecodeMode::kEager}));
  if (model_line != nullptr && !IsSyntheticLlama(c.model)) {
    VTOKEN_ASSIGN_OR_RETURN(const model::ModelDescription d, model::DescribeModel(c.model));
    *model_line =
        ModelLoadLine(d, shape, parameters, load_s, resident,
                      model::TorchDtypeName(r->kv().options().dtype), r->kv_bytes_per_token());
  }
  return std::unique_ptr<model::ModelRunner>(std::move(r));
}

}  // namespace vtoken::cli
