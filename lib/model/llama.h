// LlamaModel: a Llama-architecture decoder (Llama 2/3/3.1, Mistral, Qwen2) computed exactly as
// Hugging Face's LlamaForCausalLM computes it, so HF checkpoints give the same logits: RMSNorm in
// fp32, RoPE with the rotate_half convention (optionally llama3-scaled), grouped-query attention,
// SwiGLU MLP, optional q/k/v bias, optional tied embeddings.
//
// Two forward paths share the weights:
//   ForwardDense  [B, T] tokens -> [B, T, vocab] logits with a causal mask; autograd-friendly,
//                 used for training and as the reference in tests.
//   ForwardPaged  one batched inference step over several sequences whose earlier K/V live in
//                 a KvTensors store at arbitrary slots; also returns per-token eviction signals.
//
// A LlamaModel is not thread-safe; use one per thread (weights could be shared but are not).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/status.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/io/hf_config.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/query_moments.h"
#include "lib/model/sampler.h"

namespace vtoken::model {

namespace internal {
class StaticDecode;
}  // namespace internal

struct LlamaOptions {
  // Dtype of activations and of the weights as held in memory. Checkpoint weights in another
  // dtype are converted at load time. RMSNorm and softmax always run in fp32.
  torch::Dtype compute_dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
  // ForwardPaged's attention on the CPU in fp32: the fused batched kernel
  // (cpu_paged_attention.h) when true, the per-sequence torch ops (the reference) when false.
  bool fused_cpu_attention = true;
  // FromGguf only: the linear weights (and the LM head) the file stores as Q8_0, Q4_0 or Q4_1 are
  // also kept as stored, and the fused CPU path's decode-sized projections read those blocks
  // (CpuQuantLinear, dequantizing in the kernel: a quarter to a seventh of fp32's bytes per
  // decode step) with the same bits as the fp32 weights. Prefill chunks (BLAS) and the other
  // paths use the fp32 weights, which stay. Needs device cpu, float32, the fused path and a KV
  // store in fp32 or fp16.
  bool weights_as_stored = false;
  // With weights_as_stored: those projections multiply as llama.cpp's CPU backend does, the
  // activations quantized per 32-element block to 8 bits and the products summed in integers
  // (CpuQ8Linear: AVX-512 VNNI where the CPU has it), in decode and in prefill chunks on the fused
  // path (whose rows are quantized once per projection input). Not the fp32 weights' bits: the
  // activations' rounding (about 0.4% of each block's largest element) is llama.cpp's too.
  bool q8_activations = false;
  // The linear weights (and the LM head) also kept rounded to bfloat16, which the fused CPU path's
  // projections read, in decode and in prefill chunks, with activations rounded to bfloat16
  // (CpuBf16Linear, cpu_bf16.h: vdpbf16ps where the CPU has AVX-512 BF16): half of fp32's bytes
  // per decode step, products of 8-bit significands summed in fp32 (about 2^-7 of sum |x w| from
  // the fp32 product). A copy made at load from the weights in compute_dtype, for any checkpoint;
  // training does not update it. Needs device cpu, float32, the fused path, a KV store in fp32 or
  // fp16, even in_features, and not weights_as_stored.
  bool bf16_weights = false;
  // The KV store's dtype (KvOptions); unset: compute_dtype. kHalf under fp32 compute on the CPU
  // (llama.cpp's default cache type): half the bytes per token, which the fused path writes
  // rounded to fp16 and its attention kernels widen back to fp32 as they read them
  // (cpu_paged_attention.h); the torch path casts as it gathers.
  std::optional<torch::Dtype> kv_dtype;
};

// What a paged step returns of a sequence's last-token logits.
enum class LogitsOut : uint8_t {
  kFull,    // PagedSeqOutput::last_logits, the [vocab] fp32 row.
  kArgMax,  // PagedSeqOutput::token only, the argmax (greedy sampling): on a GPU the argmax is
            // taken there and one id per sequence comes back instead of the row (128K floats for
            // Llama 3).
  kSample,  // PagedSeqOutput::token only, drawn by Sampler's rule with the input's `draw`
            // (sampler.h): on a GPU where the logits are (SampleRows), on the host otherwise.
  kNone,    // Nothing (a prefill chunk that samples no token).
};

// One sequence's part of a paged step. With G = the KvTensors store's num_kv_groups() (1 at token
// granularity) the slot lists are per KV group and group-major, as RunnerInput documents
// (lib/runner/model_runner.h); at G == 1 they are plain lists.
struct PagedSeqInput {
  std::vector<int32_t> tokens;     // New tokens: a prefill chunk, or 1 for decode.
  std::vector<int64_t> positions;  // RoPE positions of the new tokens.
  // [G * n]: group g's slots for the new tokens' K/V at [g * n, (g + 1) * n).
  std::vector<int64_t> write_slots;
  // Live slots of the earlier tokens, in logical order; group g's at
  // [context_offsets[g], context_offsets[g + 1]).
  std::vector<int64_t> context_slots;
  // RoPE positions of the context tokens, same layout (needed with a sliding window; else may be
  // empty).
  std::vector<int64_t> context_positions;
  int obs_window = 32;       // Signals come from the last min(obs_window, n) queries.
  bool want_signals = true;  // false: attn and key_norm are left empty.
  // [G + 1]; may be empty when G == 1. Last, so that positional initializers stay valid.
  std::vector<int64_t> context_offsets;
  // With want_signals, the signals to compute (lib/core/policy.h bits); the others come back
  // zero (both vectors keep their full length).
  uint8_t signals = kAttnSignal | kKeyNormSignal;
  LogitsOut logits = LogitsOut::kFull;
  SampleDraw draw{};  // LogitsOut::kSample's parameters and uniform.
};

// PagedSeqInput's contents as views into storage the caller keeps alive for the call: how
// LlamaRunner hands the engine's slot lists to the model without copying them.
struct PagedSeqView {
  std::span<const int32_t> tokens;
  std::span<const int64_t> positions, write_slots, context_slots, context_positions;
  int obs_window = 32;
  bool want_signals = true;
  std::span<const int64_t> context_offsets;
  uint8_t signals = kAttnSignal | kKeyNormSignal;
  LogitsOut logits = LogitsOut::kFull;
  SampleDraw draw{};
  // Non-null: every layer's queries of the new tokens (before RoPE) are added to it, and it
  // advances past them (query_moments.h). The static decode step does not: LlamaRunner runs such
  // a step eagerly.
  QueryMomentsTable* query_moments = nullptr;
};

// A view of `in`, any struct with PagedSeqInput's fields (PagedSeqInput, model_runner.h's
// RunnerInput, which has no `logits` and `draw`: the view then asks for kFull), valid while it
// is.
template <class Input>
PagedSeqView ViewOf(const Input& in) {
  PagedSeqView view{.tokens = in.tokens,
                    .positions = in.positions,
                    .write_slots = in.write_slots,
                    .context_slots = in.context_slots,
                    .context_positions = in.context_positions,
                    .obs_window = in.obs_window,
                    .want_signals = in.want_signals,
                    .context_offsets = in.context_offsets,
                    .signals = in.signals};
  if constexpr (requires { in.logits; }) view.logits = in.logits;
  if constexpr (requires { in.draw; }) view.draw = in.draw;
  return view;
}

// Views of `inputs`, valid while they are.
std::vector<PagedSeqView> ViewsOf(const std::vector<PagedSeqInput>& inputs);

struct PagedSeqOutput {
  // LogitsOut::kFull: [vocab] fp32 logits of the last new token; else undefined.
  torch::Tensor last_logits;
  // LogitsOut::kArgMax: the id of the largest of those logits, the lowest id on ties (as
  // Sampler's greedy mode picks it); kSample: the token drawn from them; else -1.
  int32_t token = -1;
  // Group-major: per group g, per token of g's context then the new tokens (ctx_g + n values from
  // context_offsets[g] + g * n): the attention mass it received, averaged over the query heads
  // that read the group (token: every layer's; layer: that layer's; head: that KV head's) and the
  // signal queries, so it sums to 1 per group.
  std::vector<float> attn;
  // Per token (same order): L2 norm of the cached K, averaged over the group's KV rows (token:
  // layers and KV heads; layer: that layer's KV heads; head: that row).
  std::vector<float> key_norm;
};

// Returns the RoPE inverse frequencies [head_dim / 2] (fp32) for `config`, with llama3 scaling
// applied when config.rope_scaling.type == "llama3" (HF's _compute_llama3_parameters).
torch::Tensor RopeInverseFrequencies(const ModelConfig& config);

// HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) computed in fp32, cast back, times weight.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

class LlamaModel {
 public:
  // Random weights (normal, std 0.02; norms at 1; biases 0) reproducible from `seed`, drawn on
  // options.device by its own generator: the same seed gives the same weights on the same device
  // type (CPU and CUDA draws differ); in bf16 / fp16 they are the fp32 weights rounded.
  // Returns InvalidArgument when the config is inconsistent (e.g. heads not divisible).
  static StatusOr<LlamaModel> RandomInit(const ModelConfig& config, uint64_t seed,
                                         const LlamaOptions& options = {});

  // Builds a model from HF-named tensors (any float dtype; converted to compute_dtype).
  // Returns NotFound naming the first missing tensor, InvalidArgument on a shape mismatch.
  static StatusOr<LlamaModel> FromNamedTensors(
      const ModelConfig& config, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
      const LlamaOptions& options = {});

  // Loads a Hugging Face model directory through LoadCheckpoint (config.json plus one
  // model.safetensors or index-listed shards; F32/F16/BF16). Its errors pass through unchanged.
  // config().bos_token_ids is the BOS the directory's tokenizer.json puts before a prompt
  // (PromptBosTokenIds: its post-processor template; none for a template without one), or
  // config.json's bos_token_id when there is no tokenizer.json.
  static StatusOr<LlamaModel> FromDirectory(const std::string& dir,
                                            const LlamaOptions& options = {});

  // Loads a GGUF file through GgufCheckpoint: every tensor dequantized to fp32 (Q and K rows
  // un-permuted), then converted to compute_dtype. config() is GgufCheckpoint's: its BOS is the
  // one llama.cpp prepends (none unless the file says so), its EOS ids include the end-of-turn
  // token. Errors are GgufCheckpoint::Open's.
  static StatusOr<LlamaModel> FromGguf(const std::string& path, const LlamaOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LlamaOptions& options() const { return options_; }

  // tokens: [B, T] int64 -> logits [B, T, vocab] in compute_dtype. Positions are 0..T-1.
  // `visible`, if given, is a [T, T] bool mask replacing the causal one: query i attends to key
  // j iff visible[i][j]. It lets a dense pass replay a paged run in which tokens were evicted.
  // REQUIRES: every row of `visible` has at least one true entry.
  torch::Tensor ForwardDense(const torch::Tensor& tokens,
                             const torch::Tensor& visible = torch::Tensor()) const;

  // One batched step. For every input, writes the new tokens' K/V of (layer l, KV head h) at the
  // write slots of group KvGroupOf(l, h), then query head q of layer l attends over that group's
  // context slots followed by its new-token slots, h = q / (heads / kv_heads) (causal among the
  // new ones; with the config's sliding_window W > 0 a query at position p sees only keys at
  // positions > p - W). Results do not depend on where tokens physically sit. Returns
  // InvalidArgument on inconsistent lengths (naming the field), a slot out of range, an empty
  // token list, a token id outside the vocabulary, or missing context_positions when the model
  // has a sliding window.
  StatusOr<std::vector<PagedSeqOutput>> ForwardPaged(const std::vector<PagedSeqInput>& inputs,
                                                     KvTensors& kv) const;
  // The same step over views of the inputs (no copy of their slot lists).
  StatusOr<std::vector<PagedSeqOutput>> ForwardPaged(std::span<const PagedSeqView> inputs,
                                                     KvTensors& kv) const;

  // Options for a KvTensors store of `num_slots` group slots that fits this model.
  KvTensorsOptions KvOptions(int64_t num_slots,
                             Granularity granularity = Granularity::kToken) const;

  // Trainable tensors under their HF names (model.embed_tokens.weight, model.layers.0....,
  // model.norm.weight, lm_head.weight unless tied). The tensors alias the model's weights.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const;

  int64_t NumParameters() const;
  // Bytes of the weights kept as stored or in bf16 (LlamaOptions::weights_as_stored,
  // bf16_weights; 0 without them).
  int64_t StoredWeightBytes() const;

  // Writes config.json and model.safetensors (fp32, HF names) into `dir` (which must exist).
  Status Save(const std::string& dir) const;

 private:
  // The decode step on static buffers (static_decode.h) reuses the paged step's pieces.
  friend class internal::StaticDecode;

  struct Layer {
    torch::Tensor input_norm, q, k, v, o;
    torch::Tensor q_bias, k_bias, v_bias, o_bias;  // undefined when the config has none
    torch::Tensor post_norm, gate, up, down;
    // LlamaOptions::weights_as_stored: the weights as the file stores them; bf16_weights: rounded
    // to bf16 (undefined otherwise).
    StoredWeight q_stored, k_stored, v_stored, o_stored, gate_stored, up_stored, down_stored;
  };

  // A paged step's batch in CSR form (llama_paged_batch.cc): per sequence its query rows; per
  // (sequence s, group g), unit u = s * num_groups + g, its keys [key_offsets[u],
  // key_offsets[u + 1]) (the group's context, then the new tokens), with the signal accumulators
  // summed over layers.
  struct PagedBatch {
    Granularity granularity = Granularity::kToken;
    int64_t num_groups = 1;
    // key_positions only with a sliding window (nothing else reads them; empty otherwise).
    std::vector<int64_t> q_offsets, key_offsets, key_slots, key_positions, num_signal;
    std::vector<uint8_t> want_signals;  // Per sequence: the signal bits to compute (0: none).
    // Per sequence: PagedSeqView::query_moments; empty when no sequence keeps them.
    std::vector<QueryMomentsTable*> query_moments;
    // The signals summed over the layers, fp32 [2, num keys] indexed like key_slots: attention
    // mass, then key norms. Only for a store on the CPU (empty otherwise).
    std::vector<float> sums;
    float* attn_sum() { return sums.data(); }
    float* norm_sum() { return sums.data() + key_slots.size(); }
    // The torch path off the CPU: the sums on the device ([2, num keys] fp32; undefined when no
    // sequence wants signals), which ForwardPaged brings back with the logits in one copy (the
    // key norms only when a sequence wants them).
    torch::Tensor device_sums;
    // Per batch row (new token): token id and position; writes [G * N]: group g's write slot of
    // row t at g * N + t.
    std::vector<int64_t> tokens, positions, writes;
    // When the step samples where the logits are: per sequence its SampleDraw's three doubles as
    // int64 words (else empty), which go up with the step's indexes; the torch path leaves them
    // there as device_draws ([num_seqs, 3] double).
    std::vector<int64_t> draws;
    torch::Tensor device_draws;
  };

  // ForwardPaged's checks of input `s` against the model and `kv`; returns its context_offsets
  // (G + 1 of them, filled in for a plain list at G == 1).
  StatusOr<std::vector<int64_t>> CheckPagedInput(const PagedSeqView& in, size_t s,
                                                 const KvTensors& kv) const;
  // The checked CSR of a step's inputs, signal sums zeroed; without `with_keys`, key_slots,
  // key_positions and sums stay empty (the caller writes the keys with WritePagedKeys).
  StatusOr<PagedBatch> BuildPagedBatch(std::span<const PagedSeqView> inputs, const KvTensors& kv,
                                       bool with_keys = true) const;
  // The keys of `inputs`, laid out by b.key_offsets, into slots / positions [num keys]
  // (BuildPagedBatch's key_slots / key_positions; `positions` may be null: not written).
  // REQUIRES: b = BuildPagedBatch(inputs, ...).
  void WritePagedKeys(std::span<const PagedSeqView> inputs, const PagedBatch& b, int64_t* slots,
                      int64_t* positions) const;
  // Sequence s's output signals from the sums over the layers (indexed like b.key_slots).
  void SeqSignals(const PagedBatch& b, int64_t s, const float* attn_sum, const float* norm_sum,
                  PagedSeqOutput& out) const;
  // SeqSignals of every input that wants signals, into outputs[s] (on the CPU pool's threads for
  // a large step).
  void BatchSignals(std::span<const PagedSeqView> inputs, const PagedBatch& b,
                    const float* attn_sum, const float* norm_sum,
                    std::vector<PagedSeqOutput>& outputs) const;
  // [num_layers * num_kv_heads]: the KV group (key range) KV head h of layer l reads, at
  // l * num_kv_heads + h.
  std::vector<int64_t> HeadGroups(Granularity gran) const;
  // Layer `layer` up to attention: input norm, q / k / v, RoPE (cos / sin of RopeCosSin), and the
  // new K / V written at write_index[group] ([N] slots per group). Returns q [N, heads, head_dim].
  // With b.query_moments, adds the queries before RoPE to them (AddQueryMoments).
  torch::Tensor LayerQueries(int64_t layer, const torch::Tensor& x, const torch::Tensor& cos,
                             const torch::Tensor& sin,
                             const std::vector<torch::Tensor>& write_index, KvTensors& kv,
                             const PagedBatch* b = nullptr) const;
  // Adds layer `layer`'s queries before RoPE (`q` [N, heads, head_dim] fp32 on the host, the
  // batch rows) to the tables of b.query_moments.
  void AddQueryMoments(const PagedBatch& b, int64_t layer, const float* q) const;
  // Advances b.query_moments past each sequence's new tokens (after the step's layers).
  static void AdvanceQueryMoments(const PagedBatch& b);

  LlamaModel() = default;
  // The layers of a paged step on the fused CPU fp32 path. `writes` [G * N]: group g's write
  // slot of batch row t at g * N + t.
  torch::Tensor PagedLayersCpu(torch::Tensor x, const std::vector<int64_t>& positions,
                               const std::vector<int64_t>& writes, PagedBatch& batch,
                               KvTensors& kv) const;
  // A paged step on the torch reference path (any device and dtype), its index arrays sent to the
  // device in one copy (step_upload.h); returns the hidden states of the batch rows `last_rows`
  // (one per sequence) [num_seqs, hidden].
  torch::Tensor PagedStepTorch(PagedBatch& batch, const std::vector<int64_t>& last_rows,
                               KvTensors& kv) const;
  // Fills inv_freq_ and checks shapes; shared by the factories.
  Status Finish();
  // LlamaOptions::bf16_weights: the linear weights and the LM head packed for CpuBf16Linear.
  Status KeepBf16Weights();
  torch::Tensor Embed(const torch::Tensor& tokens) const;
  torch::Tensor LmHead(const torch::Tensor& hidden) const;
  // cos/sin [N, head_dim] for int64 positions [N].
  std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const torch::Tensor& positions) const;
  torch::Tensor Mlp(const Layer& layer, const torch::Tensor& x) const;

  ModelConfig config_;
  LlamaOptions options_;
  torch::Tensor embed_;  // [vocab, hidden]
  std::vector<Layer> layers_;
  torch::Tensor norm_;     // [hidden]
  torch::Tensor lm_head_;  // [vocab, hidden]; aliases embed_ when tied
  // LlamaOptions::weights_as_stored or bf16_weights (undefined otherwise).
  StoredWeight lm_head_stored_;
  torch::Tensor inv_freq_;  // [head_dim / 2] fp32
};

}  // namespace vtoken::model
