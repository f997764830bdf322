// `vtoken-cli check --model DIR`: the check on a real model. Relocations move rows of the model's
// K/V tensors; the engine verifies invariants after every step and per-token KV hashes around
// every relocation, and the vtoken run's outputs must equal the naive run's token for token.
// Implemented only when built with libtorch (torch_model_check.cc registers the hook).
#pragma once

#include <cstdint>
#include <string>

#include "lib/core/types.h"

namespace vtoken::cli {

struct ModelCheckArgs {
  std::string model;
  std::string policy = "h2o";
  uint64_t seed = 1;
  int64_t num_requests = 8;
  int32_t block_size = 16;
  bool async_copies = false;
  std::string device = "cpu";     // "cpu", "cuda" or "cuda:N".
  std::string dtype = "float32";  // "float32", "bfloat16" or "float16".
  Granularity granularity = Granularity::kToken;
  // Longest prompt in tokens; 0: prompts of half to three quarters of the model's context.
  int64_t max_prompt = 0;
};

using ModelCheckFn = int (*)(const ModelCheckArgs&);
// nullptr when the binary was built without libtorch.
ModelCheckFn& ModelCheckHook();

}  // namespace vtoken::cli
