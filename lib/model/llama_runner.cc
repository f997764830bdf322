#include "lib/model/llama_runner.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string_view>

#include "lib/model/io/hf_config.h"
#include "lib/model/io/model_files.h"
#include "lib/model/torch_device.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "lib/cuda/cuda_copy_engine.h"
#include "lib/cuda/kv_hash.h"
#endif

namespace vtoken::model {
namespace {

constexpr std::string_view kSyntheticPrefix = "synthetic:";

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

#ifdef VTOKEN_MODEL_CUDA_KERNELS
// lib/cuda launches on the current device: KV tensors on another one keep the TorchCopyEngine.
bool OnCurrentCudaDevice(const KvTensors& kv) {
  const torch::Device device = kv.options().device;
  if (!device.is_cuda()) return false;
  return device.index() < 0 ||
         c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() ==
             device.index();
}

// A CudaCopyEngine over the distinct K / V tensors of `kv` (one per layer at token granularity,
// else one, each contiguous [num_slots, heads, head_dim]: a row is one slot of one tensor). Its
// compute stream is the legacy default stream, where libtorch queues the forward's KV writes.
StatusOr<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(KvTensors& kv) {
  std::vector<void*> k, v;
  for (const torch::Tensor& t : kv.k_tensors()) k.push_back(t.data_ptr());
  for (const torch::Tensor& t : kv.v_tensors()) v.push_back(t.data_ptr());
  const torch::Tensor& first = kv.k_tensors().front();
  const int64_t bytes_per_row = first.stride(0) * first.element_size();
  VTOKEN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaCopyEngine> engine,
                          cuda::CudaCopyEngine::Create(k, v, kv.num_slots(), bytes_per_row));
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

// DeviceHashes' device buffers, grown to the largest call so far and reused: a verified run
// hashes every relocation twice, and cudaMalloc / cudaFree would synchronise the device each time.
struct HashBuffers {
  cuda::DeviceBuffer slots, hashes;
};

// Makes `buffer` hold at least `bytes`.
Status Reserve(cuda::DeviceBuffer& buffer, size_t bytes) {
  if (buffer.size() >= bytes) return Status::Ok();
  buffer = cuda::DeviceBuffer();  // Free the old one first: the device may be nearly full.
  VTOKEN_ASSIGN_OR_RETURN(buffer, cuda::DeviceBuffer::Allocate(bytes));
  return Status::Ok();
}

// TokenKvHash of `slots` on the device: the engine's view has the same distinct tensors in the
// same order (K then V per tensor), so the kernel's hash equals TokenKvHash's. It runs on the
// legacy default stream, after the forward's KV writes.
StatusOr<std::vector<uint64_t>> DeviceHashes(const cuda::KvLayersView& view,
                                             std::span<const SlotIndex> slots,
                                             HashBuffers& buffers) {
  std::vector<uint64_t> hashes(slots.size());
  if (slots.empty()) return hashes;
  static_assert(sizeof(SlotIndex) == sizeof(int64_t));
  VTOKEN_RETURN_IF_ERROR(Reserve(buffers.slots, slots.size_bytes()));
  VTOKEN_RETURN_IF_ERROR(Reserve(buffers.hashes, hashes.size() * sizeof(uint64_t)));
  VTOKEN_RETURN_IF_ERROR(buffers.slots.CopyFromHost(slots.data(), slots.size_bytes()));
  VTOKEN_RETURN_IF_ERROR(cuda::HashTokenRows(view, buffers.slots.as<int64_t>(),
                                             static_cast<int64_t>(slots.size()),
                                             buffers.hashes.as<uint64_t>(), nullptr));
  VTOKEN_RETURN_IF_ERROR(
      buffers.hashes.CopyToHost(hashes.data(), hashes.size() * sizeof(uint64_t)));
  return hashes;
}
#endif

// CheckModelLoads, returning the config of a "synthetic:NAME" spec (nullopt for a directory).
StatusOr<std::optional<ModelConfig>> CheckSpec(const std::string& spec,
                                               const LlamaOptions& options) {
  VTOKEN_RETURN_IF_ERROR(CheckDtypeRuns(options));
  if (std::string_view(spec).substr(0, kSyntheticPrefix.size()) != kSyntheticPrefix) {
    return std::optional<ModelConfig>();
  }
  VTOKEN_ASSIGN_OR_RETURN(ModelConfig config,
                          SyntheticConfig(spec.substr(kSyntheticPrefix.size())));
  const int64_t bytes =
      ParameterCount(config) * static_cast<int64_t>(c10::elementSize(options.compute_dtype));
  if (options.device.is_cpu() && bytes > PhysicalMemoryBytes() * 3 / 4) {
    return ResourceExhaustedError(
        "model " + spec + " needs " + std::to_string(bytes / (1 << 20)) + " MiB of weights in " +
        std::string(c10::toString(options.compute_dtype)) + ", more than 3/4 of this machine's " +
        std::to_string(PhysicalMemoryBytes() / (1 << 20)) + " MiB");
  }
  return std::optional<ModelConfig>(std::move(config));
}

}  // namespace

Status CheckModelLoads(const std::string& spec, const LlamaOptions& options) {
  return CheckSpec(spec, options).status();
}

StatusOr<LlamaModel> LoadModel(const std::string& spec, uint64_t seed,
                               const LlamaOptions& options) {
  VTOKEN_ASSIGN_OR_RETURN(std::optional<ModelConfig> synthetic, CheckSpec(spec, options));
  std::string path;
  if (!synthetic) {
    VTOKEN_ASSIGN_OR_RETURN(path, ResolveModelPath(spec));
    if (IsModelFile(path)) return LlamaModel::FromGguf(path, options);
  }
  if (options.weights_as_stored) {
    return InvalidArgumentError("weights as_stored need a GGUF model file; " + spec +
                                " is not one");
  }
  if (!synthetic) return LlamaModel::FromDirectory(path, options);
  return LlamaModel::RandomInit(*synthetic, seed, options);
}

StatusOr<std::unique_ptr<LlamaRunner>> LlamaRunner::Create(LlamaModel model,
                                                           const LlamaRunnerOptions& options) {
  if (options.num_slots < 1) {
    return InvalidArgumentError("num_slots must be >= 1, got " + std::to_string(options.num_slots));
  }
  const bool static_decode = options.decode != DecodeMode::kEager;
  KvTensorsOptions kv_options = model.KvOptions(options.num_slots, options.granularity);
  kv_options.scratch_slots = static_decode ? 1 : 0;  // The static step's padding rows.
  VTOKEN_ASSIGN_OR_RETURN(KvTensors kv, KvTensors::Create(kv_options));
  std::unique_ptr<LlamaRunner> runner(new LlamaRunner(std::move(model), std::move(kv)));
  if (static_decode) {
    VTOKEN_ASSIGN_OR_RETURN(
        runner->static_decode_,
        internal::StaticDecode::Create(runner->model_, runner->kv_,
                                       {.capture = options.decode == DecodeMode::kCudaGraphs}));
  }
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  if (OnCurrentCudaDevice(runner->kv_)) {
    VTOKEN_ASSIGN_OR_RETURN(runner->copy_engine_, MakeCudaCopyEngine(runner->kv_));
    runner->copy_engine_kind_ = "cuda";
    const cuda::KvLayersView view =
        static_cast<cuda::CudaCopyEngine&>(*runner->copy_engine_).view();
    runner->device_hashes_ =
        [view, buffers = std::make_shared<HashBuffers>()](std::span<const SlotIndex> slots) {
          return DeviceHashes(view, slots, *buffers);
        };
    return runner;
  }
#endif
  runner->copy_engine_ = std::make_unique<TorchCopyEngine>(runner->kv_, options.async_copies);
  return runner;
}

DecodeStats LlamaRunner::decode_stats() const {
  if (static_decode_ == nullptr) return {};
  return static_decode_->stats();
}

int64_t LlamaRunner::kv_bytes_per_token() const { return KvBytesPerToken(kv_.options()); }

std::vector<uint64_t> LlamaRunner::TokenKvHashes(std::span<const SlotIndex> slots) {
  if (device_hashes_) {
    StatusOr<std::vector<uint64_t>> hashes = device_hashes_(slots);
    if (hashes.ok()) {
      ++device_hash_calls_;
      return *std::move(hashes);
    }
    ++device_hash_failures_;
    std::fprintf(stderr, "vtoken: device KV hashing failed (%s); hashing on the host\n",
                 hashes.status().ToString().c_str());
  }
  return ModelRunner::TokenKvHashes(slots);
}

StatusOr<std::vector<RunnerOutput>> LlamaRunner::Forward(const std::vector<RunnerInput>& inputs) {
  // Views of the caller's vectors: the slot lists are not copied.
  std::vector<PagedSeqView> paged;
  paged.reserve(inputs.size());
  for (const RunnerInput& in : inputs) {
    PagedSeqView& view = paged.emplace_back(ViewOf(in));
    // The forward takes the token where the logits are (on a GPU only the ids come back): the
    // argmax for greedy sampling, else the draw with the uniform from the request's stream.
    if (!in.sample) {
      view.logits = LogitsOut::kNone;
    } else if (in.score_token >= 0) {
      view.logits = LogitsOut::kFull;  // the row, for the forced token's log-probability
    } else if (IsGreedy(in.sampling.temperature)) {
      view.logits = LogitsOut::kArgMax;
    } else {
      auto it = samplers_.find(in.request);
      if (it == samplers_.end()) {
        const SamplingParams& sp = in.sampling;
        it = samplers_
                 .emplace(in.request,
                          Sampler(SamplerOptions{
                              .temperature = sp.temperature, .top_p = sp.top_p, .seed = sp.seed}))
                 .first;
      }
      view.logits = LogitsOut::kSample;
      view.draw = {.temperature = in.sampling.temperature,
                   .top_p = in.sampling.top_p,
                   .uniform = it->second.NextUniform()};
    }
  }
  bool moments = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].keep_query_moments) continue;
    moments = true;
    auto it = query_moments_.find(inputs[i].request);
    if (it == query_moments_.end()) {
      const ModelConfig& c = model_.config();
      if (rope_inv_freq_.empty()) {
        const torch::Tensor freq = RopeInverseFrequencies(c).contiguous();
        rope_inv_freq_.assign(freq.data_ptr<float>(), freq.data_ptr<float>() + freq.numel());
      }
      QueryMomentsTable table(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                              c.head_dim, rope_inv_freq_);
      it = query_moments_.emplace(inputs[i].request, std::move(table)).first;
    }
    paged[i].query_moments = &it->second;
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<PagedSeqOutput> outs,
                          !moments && static_decode_ != nullptr && static_decode_->Eligible(paged)
                              ? static_decode_->Step(paged)
                              : model_.ForwardPaged(std::span<const PagedSeqView>(paged), kv_));
  std::vector<RunnerOutput> results(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    RunnerOutput& r = results[i];
    r.attn = std::move(outs[i].attn);
    r.key_norm = std::move(outs[i].key_norm);
    if (inputs[i].sample && inputs[i].score_token >= 0) {
      const int32_t t = inputs[i].score_token;
      const torch::Tensor row = outs[i].last_logits.to(torch::kCPU, torch::kDouble);
      if (t >= row.size(0)) {
        return InvalidArgumentError("score_token " + std::to_string(t) + " outside the " +
                                    std::to_string(row.size(0)) + "-token vocabulary");
      }
      r.score_logprob = torch::log_softmax(row, 0)[t].item<double>();
      r.next_token = t;
    } else if (inputs[i].sample) {
      r.next_token = outs[i].token;
    }
  }
  return results;
}

Status LlamaRunner::TokenSignals(std::span<const SlotIndex> slots,
                                 std::span<const TokenSignalInfo* const> signals,
                                 const TokenSignalScope& scope, std::vector<float>& out) const {
  const auto it = query_moments_.find(scope.request);
  KvTensors::MomentsOf moments;
  if (it != query_moments_.end()) {
    moments = [&table = it->second](int64_t layer, int64_t kv_head) {
      return table.Of(layer, kv_head);
    };
  }
  return kv_.TokenSignals(slots, signals, scope, moments, out);
}

}  // namespace vtoken::model
