// The model runtime's device and dtype names, as `[model] device` / `dtype` and the --device /
// --dtype flags spell them: "cpu", "cuda" or "cuda:N"; "float32", "bfloat16" or "float16".
// Torch-free, so the config parser validates them without libtorch; lib/model/torch_device.h
// turns them into torch values and checks that the device exists. Pure functions.
#pragma once

#include <string>
#include <string_view>

#include "lib/core/status.h"

namespace vtoken::model {

struct DeviceSpec {
  bool cuda = false;  // false: the CPU.
  int index = -1;     // CUDA device ordinal; -1 ("cuda") is the current device.
};

// Parses "cpu", "cuda" or "cuda:N" (N decimal, 0..999). InvalidArgument otherwise:
// `device "tpu": must be "cpu", "cuda" or "cuda:N"`.
StatusOr<DeviceSpec> ParseDeviceSpec(std::string_view name);

// The activation / weight / KV dtype names of LlamaOptions::compute_dtype.
enum class ComputeDtype { kFloat32, kBFloat16, kFloat16 };

// Parses "float32", "bfloat16" or "float16". InvalidArgument otherwise:
// `dtype "int8": must be "float32", "bfloat16" or "float16"`.
StatusOr<ComputeDtype> ParseComputeDtype(std::string_view name);

// "float32", "bfloat16" or "float16".
const char* ComputeDtypeName(ComputeDtype dtype);

// Bytes of one element: 4 or 2.
int ComputeDtypeBytes(ComputeDtype dtype);

}  // namespace vtoken::model
