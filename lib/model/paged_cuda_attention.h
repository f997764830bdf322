// CudaPagedAttention: a paged step's attention on CUDA KV tensors through lib/cuda's batched
// kernel (paged_batch_attention.h), one call per layer over the whole batch. The batch's CSR
// arrays go to the device in the step's one upload (step_upload.h); the signals accumulate over
// the layers in the step's device fp32 sums [2, num keys], which ForwardPaged brings back
// together with the logits in one copy. Internal to lib/model; exists only when lib/cuda is built
// (VTOKEN_MODEL_CUDA_KERNELS).
//
// The kernel runs on torch's current CUDA stream when libtorch has CUDA (VTOKEN_TORCH_CUDA: a CUDA
// graph capture's stream, say); else on the legacy default stream (nullptr), torch's default:
// at::cuda::getCurrentCUDAStream lives in libtorch_cuda, which Debian's CPU-only libtorch 1.13
// that CI builds against does not have.
#pragma once

#ifdef VTOKEN_MODEL_CUDA_KERNELS

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "lib/cuda/views.h"
#include "lib/model/kv_tensors.h"
#include "lib/model/paged_torch_attention.h"
#include "lib/model/step_upload.h"

namespace vtoken::model::internal {

class CudaPagedAttention {
 public:
  // Whether the kernel can attend over `kv` with queries of `compute_dtype`: KV tensors on a CUDA
  // device, one dtype for both, fp32 / bf16 / fp16, head_dim and num_heads <= 256.
  static bool Usable(const KvTensors& kv, torch::Dtype compute_dtype, int64_t num_heads);

#ifdef VTOKEN_CUDA_EMULATION
  // Only in the build against the CPU emulation of lib/cuda (tests/cuda_emu, docs/CUDA.md): while
  // an OnHost object lives, Usable accepts KV tensors on the CPU instead, and the emulated kernel
  // runs on host memory, so the model's kernel path runs on the CPU in CI.
  class OnHost {
   public:
    OnHost();
    ~OnHost();
    OnHost(const OnHost&) = delete;
    OnHost& operator=(const OnHost&) = delete;
  };
#endif

  // The step's batch: `b` (num_seqs sequences), num_signal / want_signals [num_seqs], skip
  // [num_seqs] (sequences another path attends), head_group [num_layers * num_kv_heads] (the key
  // range KV head h of layer l reads at l * num_kv_heads + h). Adds the kernel's arrays to
  // `upload`, where the caller has put b.key_slots at slots_at and b.key_positions at
  // positions_at (-1: none, without a sliding window); `sums` is the step's device fp32 [2, num
  // keys] (attention mass, key norms), undefined when no sequence wants signals. REQUIRES: the
  // arrays outlive upload.Send; Bind to its tensor before Attend.
  CudaPagedAttention(const BatchView& b, int64_t num_seqs, const int64_t* num_signal,
                     const uint8_t* want_signals, const std::vector<uint8_t>& skip,
                     const std::vector<int64_t>& head_group, int64_t num_heads,
                     int64_t sliding_window, const KvTensors& kv, int64_t slots_at,
                     int64_t positions_at, torch::Tensor sums, StepUpload& upload);

  // Points the kernel's arguments into `uploaded`, the device tensor upload.Send returned.
  void Bind(const torch::Tensor& uploaded);

  // The kernel arguments every batch over a store of options `kv` shares, whatever its CSR:
  // dtype, heads, strides, groups, window, scale.
  static cuda::PagedBatchArgs BaseArgs(const KvTensorsOptions& kv, int64_t num_heads,
                                       int64_t groups_per_seq, int64_t sliding_window);

  // A batch whose CSR arrays already lie in device memory that outlives this object
  // (static_decode.h): `args` is BaseArgs with them and its host bounds; head_group is the device
  // table [num_layers * num_kv_heads]; `workspace` holds PagedBatchWorkspaceBytes(args) bytes.
  // No copy, no allocation: a CUDA graph can capture Attend.
  CudaPagedAttention(const cuda::PagedBatchArgs& args, const int64_t* head_group,
                     torch::Tensor workspace);

  // Writes the rows of the sequences not skipped of `out` [N, num_heads * head_dim] (contiguous,
  // q's dtype and device) with layer `layer`'s attention of q [N, num_heads, head_dim], adding
  // their signals to the device sums. Throws c10::Error if the kernel cannot run.
  void Attend(const torch::Tensor& q, KvTensors& kv, int64_t layer, torch::Tensor& out);

 private:
  // Where the batch's arrays lie in the step's upload (int64 words).
  struct UploadOffsets {
    int64_t q = 0, keys = 0, slots = 0, positions = 0, num_signal = 0, head_group = 0;
    int64_t want = 0, skip = 0;
  };

  cuda::PagedBatchArgs args_;  // Device pointers into csr_ and sums_.
  int64_t num_kv_heads_ = 0;
  const int64_t* head_group_ = nullptr;  // Device [num_layers * num_kv_heads].
  UploadOffsets at_;
  torch::Tensor csr_;        // The step's upload: every int64 array, the uint8 ones packed.
  torch::Tensor sums_;       // Device fp32 [2, num_keys], or undefined.
  torch::Tensor workspace_;  // Device bytes, PagedBatchWorkspaceBytes(args_).
};

}  // namespace vtoken::model::internal

#endif  // VTOKEN_MODEL_CUDA_KERNELS
