// StaticDecode: LlamaRunner's decode step (every sequence of the step has one new token) on
// static buffers, so that a CUDA graph can capture it once per bucket and replay it for every
// later step of that bucket. Internal to lib/model.
//
// A step of B sequences runs padded to a batch bucket Bp (1, 2, 4, then multiples of 8 up to
// kMaxBatch): the padding rows decode token 0 at position 0 and write and read the KV store's
// first scratch slot (KvTensorsOptions::scratch_slots), which no sequence can name. Every tensor
// the step reads or writes lives in three buffers that outlive it:
//   index  int64 [tokens Bp | positions Bp | writes G x Bp | q_offsets Bp + 1 |
//          key_offsets Bp x G + 1 | num_signal Bp | head_group L x KVH | want_signals (bytes) |
//          draws 3 x Bp (doubles) | slots Kc | key_positions Kc], the step's inputs in the
//          attention kernel's CSR form and the sampling sequences' draws;
//          it goes up in one copy from a pinned twin (two with a sliding window, whose key
//          positions the kernel reads);
//   out    fp32 [logits Bp x vocab | tokens Bp | attn_sum Kc | norm_sum Kc], down in one copy
//          (from the tokens on when no sequence wants its logits row: LogitsOut::kArgMax,
//          kSample, kNone);
//   workspace  the attention kernel's split-K and signal scratch (CUDA).
// Kc is the capacity in keys, grown to a power of two when a step needs more (the buffers are
// reallocated and every graph is dropped, to be captured again). A graph is keyed by (Bp, the
// key bucket: the longest key range rounded up to a power of two >= 256, which fixes the
// kernel's split-K grid, whether signals are computed).
//
// On CUDA the attention is lib/cuda's batched kernel (paged_cuda_attention.h) on torch's current
// stream; on the CPU (fp32) it is CpuPagedAttention, eagerly: that is the path the CPU tests
// check against ForwardPaged, padding and buckets included. With capture (a libtorch built with
// CUDA, VTOKEN_TORCH_CUDA) the first step of a bucket runs the body once on a side stream (lazy
// initialisation), captures it with at::cuda::CUDAGraph, and every step replays the graph on the
// current stream after uploading the index: no allocation and no host sync inside the step, one
// host-to-device and one device-to-host copy around it. The body also takes each row's argmax
// (greedy sampling) where the logits are; when a sequence samples (LogitsOut::kSample),
// SampleRows runs after the body, eagerly on the same stream, and its tokens replace the argmax
// of the sampling rows (every row's, padding included, is sampled then). A capture that throws
// turns capture off for good (one line on stderr, stats().capture_failures).
//
// Not thread-safe (one LlamaRunner, one thread).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/llama.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include "lib/cuda/views.h"
#endif

namespace vtoken::model {

// What a runner's static decode step did (LlamaRunner::decode_stats).
struct DecodeStats {
  int64_t static_steps = 0;      // Decode steps run on the static buffers.
  int64_t bodies_built = 0;      // Buckets prepared (CUDA graphs captured, with capture).
  int64_t replays = 0;           // Steps that replayed a CUDA graph.
  int64_t reallocations = 0;     // Buffer growths; each drops the buckets prepared before it.
  int64_t capture_failures = 0;  // Captures that failed (the runner then decodes eagerly).
};

namespace internal {

struct StaticDecodeOptions {
  bool capture = false;  // CUDA graphs (Create refuses them without VTOKEN_TORCH_CUDA).
};

class StaticDecode {
 public:
  static constexpr int64_t kMaxBatch = 256;

  // Returns FailedPrecondition when capture is asked for and this build cannot capture (libtorch
  // without CUDA) or kv is not on a CUDA device, InvalidArgument when kv has no scratch slot.
  // `model` and `kv` must outlive the StaticDecode.
  static StatusOr<std::unique_ptr<StaticDecode>> Create(const LlamaModel& model, KvTensors& kv,
                                                        const StaticDecodeOptions& options);
  ~StaticDecode();

  // The bucket a batch of `batch` sequences pads to: 1, 2, 4, then the next multiple of 8; 0
  // above kMaxBatch.
  static int64_t BatchBucket(int64_t batch);
  // The key bucket of a step whose longest key range holds `max_keys` keys: the next power of
  // two, at least 256.
  static int64_t KeyBucket(int64_t max_keys);

  // Whether Step runs `inputs`: 1 to kMaxBatch sequences, one new token each, and the attention
  // can run here (fp32 on the CPU; on CUDA the kernel's dtypes and shapes).
  bool Eligible(std::span<const PagedSeqView> inputs) const;
  // ForwardPaged's contract and errors for an eligible step. REQUIRES: Eligible(inputs).
  StatusOr<std::vector<PagedSeqOutput>> Step(std::span<const PagedSeqView> inputs);

  const DecodeStats& stats() const { return stats_; }

 private:
  struct Layout;  // Offsets of one bucket's arrays in the buffers.
  struct Body;    // One bucket's prepared body (and its graph).
  using BodyKey = std::tuple<int64_t, int64_t, bool>;  // (Bp, key bucket, signals)

  StaticDecode(const LlamaModel& model, KvTensors& kv, const StaticDecodeOptions& options);
  // The offsets of bucket (rows, key_bucket, signals) with the buffers' key capacity.
  static Layout MakeLayout(int64_t rows, int64_t key_bucket, bool signals, int64_t groups,
                           int64_t head_groups, int64_t key_capacity, int64_t vocab);
  // Grows the buffers (dropping every body) unless a step of Bp rows and `keys` keys fits.
  void Reserve(int64_t batch_bucket, int64_t keys);
  // Grows the kernel's workspace (dropping every body) to `bytes` unless it holds them.
  void ReserveWorkspace(size_t bytes);
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  // The attention kernel's arguments for bucket `t` on the buffers (q / K / V / out / head_group
  // are set per layer by CudaPagedAttention::Attend).
  cuda::PagedBatchArgs KernelArgs(const Layout& t) const;
#endif
  // Runs the layers and the LM head of `body` on the buffers (eagerly, or under capture).
  void RunBody(Body& body);
  void Prepare(Body& body);

  const LlamaModel& model_;
  KvTensors& kv_;
  StaticDecodeOptions options_;
  std::vector<int64_t> head_group_;  // HeadGroups(kv granularity).
  // lib/cuda's kernel attends (CudaPagedAttention::Usable when constructed); else, on the CPU in
  // fp32, CpuPagedAttention.
  bool kernel_ = false;
  int64_t batch_capacity_ = 0, key_capacity_ = 0;
  torch::Tensor index_, index_host_;  // index_host_ is index_ itself on the CPU.
  torch::Tensor out_, workspace_;
  std::map<BodyKey, std::unique_ptr<Body>> bodies_;
  DecodeStats stats_;
};

}  // namespace internal
}  // namespace vtoken::model
