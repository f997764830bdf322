// Checks of an experiment against its model and workload that need more than the config file:
// what the run will allocate, and policy keys that make no sense for the model's context. They
// run before the model is loaded or the database touched; each error names the key. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/core/status.h"
#include "lib/engine/workload.h"
#include "lib/model/io/hf_config.h"

namespace vtoken::cli {

// The model's shape without loading weights: the config.json of a directory, the published
// shape of synthetic:NAME and sim:NAME.
StatusOr<model::ModelConfig> PeekModelConfig(const std::string& model);

// The files every run reads first: the model directory (not for synthetic: / sim: models) and the
// workload's corpus. NotFound naming the file.
Status CheckRunFiles(const ExperimentConfig& config);

// Bytes the run allocates: KV store (K and V per layer in model.dtype for real and synthetic
// models, one 8-byte tag per slot for sim:), pool metadata, weights (not for sim:), the workload.
// `available` is the host's memory (AvailableMemoryBytes() when < 0). With `device_available`
// >= 0 the KV store and the weights live on a GPU with that many bytes free (model.device
// "cuda[:N]") and are checked against it, the rest against the host; otherwise all of it against
// the host. kResourceExhausted naming engine.num_blocks or workload.num_requests and the sizes
// when something does not fit.
Status CheckRunMemory(const ExperimentConfig& config, const model::ModelConfig& model,
                      int64_t available = -1, int64_t device_available = -1);

// policy.budget_tokens, num_sink, num_recent against the model's context (max_position_embeddings):
// a value no request can reach is an error. Native-only configs are not checked.
Status CheckPolicyAgainstContext(const ExperimentConfig& config, int64_t max_context);

// A one-line warning when policy.keep_ratio leaves some request a budget smaller than
// num_sink + num_recent (the evictor then shrinks the protection to the budget); "" otherwise.
// `bos` counts the BOS token the engine prepends.
std::string ProtectionWarning(const ExperimentConfig& config,
                              const std::vector<engine::Request>& requests, bool bos);

}  // namespace vtoken::cli
