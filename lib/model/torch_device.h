// The model runtime's device and dtype as torch values: the names of lib/model/io/device_spec.h
// resolved against this libtorch and this machine, and a probe of whether this libtorch runs a
// paged step in a dtype on a device (libtorch 1.13 has no fp16 matmul on the CPU, for one).
// Every error is one line naming the device or dtype.
#pragma once

#include <torch/torch.h>

#include <string>

#include "lib/core/status.h"
#include "lib/model/llama.h"

namespace vtoken::model {

// Whether the libtorch this process loaded has CUDA (libtorch_cuda), with or without a GPU.
bool LibtorchHasCuda();

// "cpu", "cuda" or "cuda:N" as a torch device. InvalidArgument for a malformed name or an index
// beyond the visible devices; FailedPrecondition `device "cuda": no CUDA device (this libtorch
// was built without CUDA)` or `(... no GPU is visible to this process)`.
StatusOr<torch::Device> TorchDevice(const std::string& name);

// "float32", "bfloat16" or "float16" as a torch dtype; InvalidArgument otherwise.
StatusOr<torch::Dtype> TorchDtype(const std::string& name);

// "float32", "bfloat16" or "float16" for those dtypes, c10's name for any other.
std::string TorchDtypeName(torch::Dtype dtype);

// LlamaOptions with `device` and `dtype` (the names above), every other field at its default.
// The errors of TorchDevice and TorchDtype.
StatusOr<LlamaOptions> LlamaOptionsFor(const std::string& device, const std::string& dtype);

// Sets options.weights_as_stored, q8_activations and bf16_weights for the name of the weights a
// model keeps (the key model.weights): "float32" (none), "as_stored" (weights_as_stored),
// "as_stored_q8" (both of those) or "bfloat16" (bf16_weights). InvalidArgument `weights "x": must
// be one of float32, as_stored, as_stored_q8, bfloat16` otherwise.
Status ApplyWeightsName(const std::string& weights, LlamaOptions& options);

// Free bytes on CUDA device `device` (lib/cuda's CudaMemoryInfo: before the model loads, what a
// run can allocate there). FailedPrecondition in a build without lib/cuda, InvalidArgument for a
// device that is not CUDA.
StatusOr<int64_t> CudaFreeBytes(const torch::Device& device);

// OK when this libtorch runs a paged prefill and decode step, a relocation and a KV hash in
// options.compute_dtype on options.device: it runs them on a two-layer model of width 16.
// FailedPrecondition `dtype float16 on cpu: not supported by this libtorch (<torch's error>)`
// otherwise. RandomInit / FromNamedTensors do not call it; LoadModel does.
Status CheckDtypeRuns(const LlamaOptions& options);

}  // namespace vtoken::model
