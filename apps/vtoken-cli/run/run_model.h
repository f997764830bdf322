// The model runner of a run (torch): the real model (weights loaded, the KV store allocated for
// the spec's slots), a simulated one (sim:), or for a dry run of a synthetic model its shape
// alone (ShapeRunner), and what a run checks of the GPU before it allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/status.h"
#include "lib/model/llama_runner.h"

namespace vtoken::cli {

// The bytes free on the GPU for the run's KV store and weights when model.device is CUDA, else
// -1: CheckRunMemory then checks them against the host's memory, as it does where this build
// cannot ask the GPU (no lib/cuda). A device this machine lacks fails with TorchDevice's error,
// as the run would.
StatusOr<int64_t> DeviceFreeBytes(const ExperimentConfig& c);

// synthetic:NAME or sim:NAME: no tokenizer, no files.
bool IsSynthetic(const std::string& model);
// synthetic:NAME (real shapes, random weights).
bool IsSyntheticLlama(const std::string& model);

// What a dry run of a synthetic model validates against: the model's shape and the KV store's
// size, with no weights drawn and no KV allocated (an 8B shape would draw 16-32 GB of weights
// for a run that runs nothing). Forward refuses.
class ShapeRunner final : public model::ModelRunner {
 public:
  ShapeRunner(const model::ModelConfig& config, const model::LlamaOptions& options,
              int64_t num_slots, Granularity granularity)
      : config_(config),
        options_(options),
        num_slots_(num_slots),
        granularity_(granularity),
        store_(1, 1, 1),
        copies_(store_) {}

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_context() const override { return config_.max_position_embeddings; }
  std::optional<int32_t> bos_token_id() const override {
    if (config_.bos_token_ids.empty()) return std::nullopt;
    return static_cast<int32_t>(config_.bos_token_ids.front());
  }
  const std::vector<int64_t>& eos_token_ids() const override { return config_.eos_token_ids; }
  int64_t kv_bytes_per_token() const override {
    return model::KvBytesPerToken(
        {.num_layers = config_.num_hidden_layers,
         .num_kv_heads = config_.num_key_value_heads,
         .head_dim = config_.head_dim > 0 ? config_.head_dim
                                          : config_.hidden_size / config_.num_attention_heads,
         .dtype = options_.kv_dtype.value_or(options_.compute_dtype)});
  }
  int64_t num_slots() const override { return num_slots_; }
  int32_t num_kv_groups() const override {
    return NumKvGroups(granularity_, config_.num_hidden_layers, config_.num_key_value_heads);
  }
  Granularity granularity() const override { return granularity_; }
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>&) override {
    return FailedPreconditionError("a dry run has no weights to run");
  }
  CopyEngine& copy_engine() override { return copies_; }
  uint64_t TokenKvHash(SlotIndex) override { return 0; }
  void ForgetRequest(int64_t) override {}
  const model::LlamaOptions& options() const { return options_; }

 private:
  model::ModelConfig config_;
  model::LlamaOptions options_;
  int64_t num_slots_;
  Granularity granularity_;
  HostKvStore store_;
  SyncHostCopyEngine copies_;
};

// A dry run's runner for a synthetic model: every check LoadModel makes before drawing weights,
// then the shape alone, with `slots` KV slots.
StatusOr<std::unique_ptr<model::ModelRunner>> MakeShapeRunner(const ExperimentConfig& c,
                                                              const model::ModelConfig& shape,
                                                              int64_t slots);

// The run's runner with `slots` KV slots: sim: models simulated, the others loaded (weights,
// threads, decode mode). `model_line`, when given, receives the header line on a loaded real
// model ("" otherwise): file, format, parameters, load time, resident memory, KV bytes per token.
StatusOr<std::unique_ptr<model::ModelRunner>> MakeRunner(const ExperimentConfig& c, int64_t slots,
                                                         std::string* model_line = nullptr);

}  // namespace vtoken::cli
