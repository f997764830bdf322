#include "lib/model/llama_runner.h"

#include <unistd.h>

#include <string_view>

#include "lib/model/io/hf_config.h"

namespace vtoken::model {
namespace {

constexpr std::string_view kSyntheticPrefix = "synthetic:";

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

}  // namespace

StatusOr<LlamaModel> LoadModel(const std::string& spec, uint64_t seed,
                               const LlamaOptions& options) {
  if (std::string_view(spec).substr(0, kSyntheticPrefix.size()) != kSyntheticPrefix) {
    return LlamaModel::FromDirectory(spec, options);
  }
  const std::string name = spec.substr(kSyntheticPrefix.size());
  VTOKEN_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(name));
  const int64_t bytes =
      ParameterCount(config) * static_cast<int64_t>(c10::elementSize(options.compute_dtype));
  if (options.device.is_cpu() && bytes > PhysicalMemoryBytes() * 3 / 4) {
    return ResourceExhaustedError(
        "model " + spec + " needs " + std::to_string(bytes / (1 << 20)) + " MiB of weights in " +
        std::string(c10::toString(options.compute_dtype)) + ", more than 3/4 of this machine's " +
        std::to_string(PhysicalMemoryBytes() / (1 << 20)) + " MiB");
  }
  return LlamaModel::RandomInit(config, seed, options);
}

LlamaRunner::LlamaRunner(LlamaModel model, KvTensors kv, bool async)
    : model_(std::move(model)), kv_(std::move(kv)) {
  copy_engine_ = std::make_unique<TorchCopyEngine>(kv_, async);
}

StatusOr<std::unique_ptr<LlamaRunner>> LlamaRunner::Create(LlamaModel model,
                                                           const LlamaRunnerOptions& options) {
  if (options.num_slots < 1) {
    return InvalidArgumentError("num_slots must be >= 1, got " + std::to_string(options.num_slots));
  }
  VTOKEN_ASSIGN_OR_RETURN(
      KvTensors kv, KvTensors::Create(model.KvOptions(options.num_slots, options.granularity)));
  return std::unique_ptr<LlamaRunner>(
      new LlamaRunner(std::move(model), std::move(kv), options.async_copies));
}

int64_t LlamaRunner::kv_bytes_per_token() const {
  const KvTensorsOptions& o = kv_.options();
  return 2 * o.num_layers * o.num_kv_heads * o.head_dim * c10::elementSize(o.dtype);
}

StatusOr<std::vector<RunnerOutput>> LlamaRunner::Forward(const std::vector<RunnerInput>& inputs) {
  std::vector<PagedSeqInput> paged;
  paged.reserve(inputs.size());
  for (const RunnerInput& in : inputs) {
    paged.push_back(PagedSeqInput{.tokens = in.tokens,
                                  .positions = in.positions,
                                  .write_slots = in.write_slots,
                                  .context_slots = in.context_slots,
                                  .context_positions = in.context_positions,
                                  .obs_window = in.obs_window,
                                  .want_signals = in.want_signals,
                                  .context_offsets = in.context_offsets});
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<PagedSeqOutput> outs, model_.ForwardPaged(paged, kv_));
  std::vector<RunnerOutput> results(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    RunnerOutput& r = results[i];
    r.attn = std::move(outs[i].attn);
    r.key_norm = std::move(outs[i].key_norm);
    if (!inputs[i].sample) continue;
    auto it = samplers_.find(inputs[i].request);
    if (it == samplers_.end()) {
      const SamplingParams& sp = inputs[i].sampling;
      it = samplers_
               .emplace(inputs[i].request,
                        Sampler(SamplerOptions{
                            .temperature = sp.temperature, .top_p = sp.top_p, .seed = sp.seed}))
               .first;
    }
    r.next_token = it->second.Sample(outs[i].last_logits);
  }
  return results;
}

}  // namespace vtoken::model
