#include "lib/model/torch_device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <string_view>

#include "lib/model/io/device_spec.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/torch_copy_engine.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include "lib/cuda/device.h"
#endif

namespace vtoken::model {
namespace {

// The first line of a torch error, without the C++ backtrace torch appends.
std::string FirstLine(const c10::Error& e) {
  const std::string_view what = e.what_without_backtrace();
  return std::string(what.substr(0, what.find('\n')));
}

// The paged step CheckDtypeRuns runs: prefill of 3 tokens, decode of 1 over them with signals,
// a relocation and a hash of the moved slot.
Status RunProbeStep(const LlamaOptions& options) {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel model, LlamaModel::RandomInit(c, 1, options));
  VTOKEN_ASSIGN_OR_RETURN(KvTensors kv, KvTensors::Create(model.KvOptions(8)));
  PagedSeqInput prefill;
  prefill.tokens = {1, 2, 3};
  prefill.positions = {0, 1, 2};
  prefill.write_slots = {0, 1, 2};
  VTOKEN_RETURN_IF_ERROR(model.ForwardPaged({prefill}, kv).status());
  PagedSeqInput decode;
  decode.tokens = {4};
  decode.positions = {3};
  decode.write_slots = {3};
  decode.context_slots = {0, 1, 2};
  VTOKEN_RETURN_IF_ERROR(model.ForwardPaged({decode}, kv).status());
  VTOKEN_RETURN_IF_ERROR(kv.CopySlots({0}, {5}));
  TokenKvHash(kv, 5);
  return Status::Ok();
}

}  // namespace

bool LibtorchHasCuda() {
  // libtorch's CUDA half (libc10_cuda, loaded with libtorch_cuda) registers the CUDA device guard
  // when it loads, GPU or not. (at::hasCUDA() is no test of this: it is false without a device.)
  return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
}

StatusOr<torch::Device> TorchDevice(const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDeviceSpec(name));
  if (!spec.cuda) return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    return FailedPreconditionError("device \"" + name + "\": no CUDA device (" +
                                   (LibtorchHasCuda() ? "no GPU is visible to this process"
                                                      : "this libtorch was built without CUDA") +
                                   ")");
  }
  const int count = static_cast<int>(torch::cuda::device_count());
  if (spec.index >= count) {
    return InvalidArgumentError("device \"" + name + "\": this machine has " +
                                std::to_string(count) + " CUDA device(s), cuda:0.." +
                                std::to_string(count - 1));
  }
  // "cuda" names the current device; resolved to its index here, because a tensor's device
  // always carries one and Device's == compares indexes (cuda != cuda:0).
  const c10::DeviceIndex index =
      spec.index >= 0 ? static_cast<c10::DeviceIndex>(spec.index)
                      : c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  return torch::Device(torch::kCUDA, index);
}

StatusOr<int64_t> CudaFreeBytes(const torch::Device& device) {
  if (!device.is_cuda()) {
    return InvalidArgumentError("CudaFreeBytes: " + device.str() + " is not a CUDA device");
  }
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  const int index = device.index() >= 0
                        ? device.index()
                        : c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  VTOKEN_ASSIGN_OR_RETURN(cuda::DeviceMemory memory, cuda::CudaMemoryInfo(index));
  return memory.free_bytes;
#else
  return FailedPreconditionError("CudaFreeBytes: this build has no lib/cuda");
#endif
}

StatusOr<torch::Dtype> TorchDtype(const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(ComputeDtype dtype, ParseComputeDtype(name));
  switch (dtype) {
    case ComputeDtype::kBFloat16:
      return torch::kBFloat16;
    case ComputeDtype::kFloat16:
      return torch::kFloat16;
    case ComputeDtype::kFloat32:
      break;
  }
  return torch::kFloat32;
}

std::string TorchDtypeName(torch::Dtype dtype) {
  if (dtype == torch::kFloat32) return ComputeDtypeName(ComputeDtype::kFloat32);
  if (dtype == torch::kBFloat16) return ComputeDtypeName(ComputeDtype::kBFloat16);
  if (dtype == torch::kFloat16) return ComputeDtypeName(ComputeDtype::kFloat16);
  return c10::toString(dtype);
}

StatusOr<LlamaOptions> LlamaOptionsFor(const std::string& device, const std::string& dtype) {
  LlamaOptions options;
  VTOKEN_ASSIGN_OR_RETURN(options.device, TorchDevice(device));
  VTOKEN_ASSIGN_OR_RETURN(options.compute_dtype, TorchDtype(dtype));
  return options;
}

Status ApplyWeightsName(const std::string& weights, LlamaOptions& options) {
  if (weights != "float32" && weights != "as_stored" && weights != "as_stored_q8" &&
      weights != "bfloat16") {
    return InvalidArgumentError("weights \"" + weights +
                                "\": must be one of float32, as_stored, as_stored_q8, bfloat16");
  }
  options.weights_as_stored = weights == "as_stored" || weights == "as_stored_q8";
  options.q8_activations = weights == "as_stored_q8";
  options.bf16_weights = weights == "bfloat16";
  return Status::Ok();
}

Status CheckDtypeRuns(const LlamaOptions& options) {
  Status status;
  try {
    status = RunProbeStep(options);
  } catch (const c10::Error& e) {
    return FailedPreconditionError("dtype " + TorchDtypeName(options.compute_dtype) + " on " +
                                   options.device.str() + ": not supported by this libtorch (" +
                                   FirstLine(e) + ")");
  }
  if (!status.ok()) {
    return InternalError("the " + TorchDtypeName(options.compute_dtype) + " probe step on " +
                         options.device.str() + " failed: " + status.message());
  }
  return Status::Ok();
}

}  // namespace vtoken::model
