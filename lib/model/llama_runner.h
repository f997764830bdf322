// LlamaRunner: the libtorch ModelRunner. Owns a LlamaModel, its paged KV tensors (laid out for
// the KV-group granularity, kv_tensors.h, on the model's device), a copy engine over them and one
// sampler per request. The copy engine is lib/cuda's CudaCopyEngine (relocation kernel on its own
// stream, ordered after the forward's KV writes on torch's default stream) when the KV tensors
// are on the current CUDA device and lib/model was built with lib/cuda
// (VTOKEN_MODEL_CUDA_KERNELS); a TorchCopyEngine otherwise. LoadModel resolves a model spec: a
// Hugging Face directory, a GGUF file, a fetched short name (model_files.h), or
// "synthetic:NAME" (real shapes, seeded random weights; see model::SyntheticConfigNames()).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"
#include "lib/model/query_moments.h"
#include "lib/model/sampler.h"
#include "lib/model/static_decode.h"
#include "lib/model/torch_copy_engine.h"
#include "lib/runner/model_runner.h"

namespace vtoken::model {

// Loads `spec`: a model directory (config.json + safetensors), a GGUF file, a short name
// (ResolveModelPath) or "synthetic:NAME". A synthetic
// model whose weights would not fit in this machine's memory is refused with a message giving the
// bytes it needs. `seed` seeds synthetic weights (drawn on options.device). Returns
// CheckDtypeRuns' error first when this libtorch cannot run options.compute_dtype there.
StatusOr<LlamaModel> LoadModel(const std::string& spec, uint64_t seed,
                               const LlamaOptions& options = {});
// What LoadModel checks before it reads or draws any weight: the dtype runs on the device, and
// for "synthetic:NAME" that the name is known and the weights fit (its errors, same messages).
// A dry run calls it instead of LoadModel.
Status CheckModelLoads(const std::string& spec, const LlamaOptions& options = {});

// How LlamaRunner runs a decode step (every sequence of the step has one new token, at most
// internal::StaticDecode::kMaxBatch of them); other steps always run through ForwardPaged.
enum class DecodeMode {
  kEager,       // ForwardPaged.
  kStatic,      // static_decode.h's padded step on static buffers, run eagerly: the body that
                // kCudaGraphs captures; on the CPU (fp32), the path CI checks against kEager.
  kCudaGraphs,  // That step captured as one CUDA graph per bucket and replayed (CUDA KV tensors
                // and a libtorch built with CUDA; Create refuses it otherwise).
};

struct LlamaRunnerOptions {
  int64_t num_slots = 0;  // KV group slots (num_blocks * block_size). Must be >= 1.
  // TorchCopyEngine: relocation copies on a worker thread. (CudaCopyEngine's copies are always
  // asynchronous, on its copy stream.)
  bool async_copies = false;
  // What a slot holds (lib/core/types.h); Forward then takes per-group slot lists (model_runner.h).
  Granularity granularity = Granularity::kToken;
  // kStatic / kCudaGraphs allocate one KV slot past num_slots (KvTensorsOptions::scratch_slots)
  // for the padding rows; num_slots() and Forward's slot checks stay the pool's.
  DecodeMode decode = DecodeMode::kEager;
};

class LlamaRunner final : public ModelRunner {
 public:
  static StatusOr<std::unique_ptr<LlamaRunner>> Create(LlamaModel model,
                                                       const LlamaRunnerOptions& options);

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t max_context() const override { return model_.config().max_position_embeddings; }
  std::optional<int32_t> bos_token_id() const override {
    if (model_.config().bos_token_ids.empty()) return std::nullopt;
    return static_cast<int32_t>(model_.config().bos_token_ids.front());
  }
  const std::vector<int64_t>& eos_token_ids() const override {
    return model_.config().eos_token_ids;
  }
  int64_t kv_bytes_per_token() const override;
  int64_t num_slots() const override { return kv_.num_slots(); }
  int32_t num_kv_groups() const override { return kv_.num_kv_groups(); }
  Granularity granularity() const override { return kv_.granularity(); }
  KvGroupRows kv_group_rows() const override {
    return KvGroupRowsOf(kv_.granularity(), kv_.options().num_layers, kv_.options().num_kv_heads);
  }
  StatusOr<std::vector<RunnerOutput>> Forward(const std::vector<RunnerInput>& inputs) override;
  CopyEngine& copy_engine() override { return *copy_engine_; }
  uint64_t TokenKvHash(SlotIndex slot) override { return model::TokenKvHash(kv_, slot); }
  // With the CudaCopyEngine: lib/cuda's hash kernel over the slots (one upload, one launch on the
  // forward's stream, one copy back); else, or if that fails (reported on stderr), TokenKvHash
  // per slot.
  std::vector<uint64_t> TokenKvHashes(std::span<const SlotIndex> slots) override;
  Status ReadKv(std::span<const SlotIndex> slots, std::vector<std::byte>& out) override {
    return kv_.ReadSlots(slots, out);
  }
  Status WriteKv(std::span<const SlotIndex> slots, std::span<const std::byte> bytes) override {
    return kv_.WriteSlots(slots, bytes);
  }
  Status TokenSignals(std::span<const SlotIndex> slots,
                      std::span<const TokenSignalInfo* const> signals,
                      const TokenSignalScope& scope, std::vector<float>& out) const override;
  void ForgetRequest(int64_t request) override {
    samplers_.erase(request);
    query_moments_.erase(request);
  }

  const LlamaModel& model() const { return model_; }
  KvTensors& kv() { return kv_; }
  // "cuda" (CudaCopyEngine) or "torch" (TorchCopyEngine).
  const char* copy_engine_kind() const { return copy_engine_kind_; }
  // What the static decode step did (all zero in kEager).
  DecodeStats decode_stats() const;
  // The query statistics kept for `request` (RunnerInput::keep_query_moments), or null.
  const QueryMomentsTable* query_moments(int64_t request) const {
    const auto it = query_moments_.find(request);
    return it == query_moments_.end() ? nullptr : &it->second;
  }
  // TokenKvHashes calls that hashed on the device / fell back to the host after a device failure.
  int64_t device_hash_calls() const { return device_hash_calls_; }
  int64_t device_hash_failures() const { return device_hash_failures_; }

 private:
  LlamaRunner(LlamaModel model, KvTensors kv) : model_(std::move(model)), kv_(std::move(kv)) {}

  LlamaModel model_;
  KvTensors kv_;
  std::unique_ptr<internal::StaticDecode> static_decode_;  // kStatic / kCudaGraphs.
  std::unique_ptr<CopyEngine> copy_engine_;
  const char* copy_engine_kind_ = "torch";
  // Set with the CudaCopyEngine: hashes slots on the device.
  std::function<StatusOr<std::vector<uint64_t>>(std::span<const SlotIndex>)> device_hashes_;
  int64_t device_hash_calls_ = 0, device_hash_failures_ = 0;
  std::map<int64_t, Sampler> samplers_;
  // Per request whose inputs keep them (RunnerInput::keep_query_moments); a step with one runs
  // through ForwardPaged, never the static decode step.
  std::map<int64_t, QueryMomentsTable> query_moments_;
  std::vector<float> rope_inv_freq_;  // RopeInverseFrequencies, for the tables (set by the first).
};

}  // namespace vtoken::model
