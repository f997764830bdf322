#include "lib/model/paged_cuda_attention.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS

#include <algorithm>
#include <cmath>

#include "lib/cuda/paged_batch_attention.h"

#ifdef VTOKEN_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace vtoken::model::internal {
namespace {

bool KernelDtype(torch::Dtype dtype, cuda::AttnDtype* out) {
  switch (dtype) {
    case torch::kFloat32:
      *out = cuda::AttnDtype::kFloat32;
      return true;
    case torch::kBFloat16:
      *out = cuda::AttnDtype::kBFloat16;
      return true;
    case torch::kHalf:
      *out = cuda::AttnDtype::kFloat16;
      return true;
    default:
      return false;
  }
}

cuda::Stream CurrentStream() {
#ifdef VTOKEN_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream().stream();
#else
  return nullptr;
#endif
}

}  // namespace

cuda::PagedBatchArgs CudaPagedAttention::BaseArgs(const KvTensorsOptions& o, int64_t num_heads,
                                                  int64_t groups_per_seq, int64_t sliding_window) {
  cuda::PagedBatchArgs a;
  KernelDtype(o.dtype, &a.dtype);
  a.num_heads = static_cast<int32_t>(num_heads);
  a.num_kv_heads = static_cast<int32_t>(o.num_kv_heads);
  a.head_dim = static_cast<int32_t>(o.head_dim);
  a.num_slots = o.num_slots + o.scratch_slots;  // The tensors' extent: padding rows read scratch.
  const bool slot_per_head = o.granularity == Granularity::kHead;
  a.slot_stride = slot_per_head ? o.head_dim : o.num_kv_heads * o.head_dim;
  a.kv_head_stride = slot_per_head ? 0 : o.head_dim;
  a.groups_per_seq = groups_per_seq;
  a.norm_heads = slot_per_head ? 1 : o.num_kv_heads;
  a.sliding_window = sliding_window;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o.head_dim)));
  return a;
}

CudaPagedAttention::CudaPagedAttention(const cuda::PagedBatchArgs& args, const int64_t* head_group,
                                       torch::Tensor workspace)
    : args_(args),
      num_kv_heads_(args.num_kv_heads),
      head_group_(head_group),
      workspace_(std::move(workspace)) {}

#ifdef VTOKEN_CUDA_EMULATION
namespace {
int on_host_scopes = 0;  // Live OnHost objects (one thread: the tests).
}  // namespace
CudaPagedAttention::OnHost::OnHost() { ++on_host_scopes; }
CudaPagedAttention::OnHost::~OnHost() { --on_host_scopes; }
#endif

bool CudaPagedAttention::Usable(const KvTensors& kv, torch::Dtype compute_dtype,
                                int64_t num_heads) {
  const KvTensorsOptions& o = kv.options();
  cuda::AttnDtype dtype;
#ifdef VTOKEN_CUDA_EMULATION
  const bool on_device = on_host_scopes > 0 ? o.device.is_cpu() : o.device.is_cuda();
#else
  const bool on_device = o.device.is_cuda();
#endif
  return on_device && o.dtype == compute_dtype && KernelDtype(o.dtype, &dtype) &&
         o.head_dim <= 256 && num_heads <= 256;
}

CudaPagedAttention::CudaPagedAttention(const BatchView& b, int64_t num_seqs,
                                       const int64_t* num_signal, const uint8_t* want_signals,
                                       const std::vector<uint8_t>& skip,
                                       const std::vector<int64_t>& head_group, int64_t num_heads,
                                       int64_t sliding_window, const KvTensors& kv,
                                       int64_t slots_at, int64_t positions_at, torch::Tensor sums,
                                       StepUpload& upload)
    : sums_(std::move(sums)) {
  const KvTensorsOptions& o = kv.options();
  const int64_t units = num_seqs * b.num_groups;
  const int64_t num_keys = b.key_offsets[units];
  num_kv_heads_ = o.num_kv_heads;
  at_.q = upload.Add(b.q_offsets, num_seqs + 1);
  at_.keys = upload.Add(b.key_offsets, units + 1);
  at_.slots = slots_at;
  at_.positions = positions_at;
  at_.num_signal = upload.Add(num_signal, num_seqs);
  at_.head_group = upload.Add(head_group);
  at_.want = upload.AddBytes(want_signals, num_seqs);
  at_.skip = upload.AddBytes(skip.data(), num_seqs);

  args_ = BaseArgs(o, num_heads, b.num_groups, sliding_window);
  cuda::PagedBatchArgs& a = args_;
  a.num_seqs = static_cast<int32_t>(num_seqs);
  a.num_rows = b.q_offsets[num_seqs];
  a.num_keys = num_keys;
  bool any_signals = false;
  a.max_query_rows = 1;
  a.max_keys = 1;
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (skip[s] != 0) continue;
    const int64_t n = b.q_offsets[s + 1] - b.q_offsets[s];
    a.max_query_rows = std::max(a.max_query_rows, n);
    for (int64_t u = s * b.num_groups; u < (s + 1) * b.num_groups; ++u) {
      a.max_keys = std::max(a.max_keys, b.key_offsets[u + 1] - b.key_offsets[u]);
    }
    if (want_signals[s] != 0) {
      any_signals = true;
      a.max_signal_rows = std::max(a.max_signal_rows, std::clamp<int64_t>(num_signal[s], 1, n));
    }
  }
  if (any_signals) {
    // o.device may be "cuda" with no index (the current device), a tensor's device always has
    // one: compare with the KV tensors' own device.
    const torch::Device kv_device = kv.k_tensors().front().device();
    TORCH_CHECK(sums_.defined() && sums_.is_contiguous() && sums_.numel() == 2 * num_keys &&
                    sums_.scalar_type() == torch::kFloat32 && sums_.device() == kv_device,
                "CudaPagedAttention: the signal sums must be fp32 [2, ", num_keys, "] on ",
                kv_device);
    a.attn_sum = sums_.data_ptr<float>();
    a.norm_sum = a.attn_sum + num_keys;
  }
}

void CudaPagedAttention::Bind(const torch::Tensor& uploaded) {
  TORCH_CHECK(uploaded.scalar_type() == torch::kInt64 && uploaded.is_contiguous(),
              "CudaPagedAttention: the step's upload must be a contiguous int64 tensor");
  csr_ = uploaded;
  const int64_t* dev = csr_.data_ptr<int64_t>();
  cuda::PagedBatchArgs& a = args_;
  a.q_offsets = dev + at_.q;
  a.key_offsets = dev + at_.keys;
  a.slots = dev + at_.slots;
  a.key_positions = at_.positions >= 0 ? dev + at_.positions : nullptr;
  a.num_signal = dev + at_.num_signal;
  // No signals asked of the kernel's sequences: it reads no flags and writes no sums.
  a.want_signals =
      a.attn_sum != nullptr ? reinterpret_cast<const uint8_t*>(dev + at_.want) : nullptr;
  a.skip = reinterpret_cast<const uint8_t*>(dev + at_.skip);
  head_group_ = dev + at_.head_group;
  // Sized once the arguments are complete: the signal scratch counts only with want_signals.
  const size_t bytes = cuda::PagedBatchWorkspaceBytes(a);
  workspace_ = torch::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                            torch::TensorOptions().dtype(torch::kUInt8).device(uploaded.device()));
}

void CudaPagedAttention::Attend(const torch::Tensor& q, KvTensors& kv, int64_t layer,
                                torch::Tensor& out) {
  const int64_t width = static_cast<int64_t>(args_.num_heads) * args_.head_dim;
  TORCH_CHECK(q.is_contiguous() && q.dim() == 3 && q.size(0) == args_.num_rows &&
                  q.size(1) * q.size(2) == width,
              "CudaPagedAttention: q must be contiguous [", args_.num_rows, ", heads, head_dim]");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == q.scalar_type() &&
                  out.device() == q.device() && out.numel() == args_.num_rows * width,
              "CudaPagedAttention: out must be contiguous [", args_.num_rows, ", ", width,
              "] of q's dtype and device");
  const torch::Tensor& k = kv.k(layer);
  const torch::Tensor& v = kv.v(layer);
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && k.scalar_type() == q.scalar_type(),
              "CudaPagedAttention: K/V must be contiguous and of q's dtype");
  cuda::PagedBatchArgs a = args_;
  a.q = q.data_ptr();
  a.k_cache = k.data_ptr();
  a.v_cache = v.data_ptr();
  a.out = out.data_ptr();
  a.head_group = head_group_ + layer * num_kv_heads_;
  const Status status = cuda::PagedBatchAttention(
      a, workspace_.data_ptr(), static_cast<size_t>(workspace_.numel()), CurrentStream());
  TORCH_CHECK(status.ok(), "CudaPagedAttention: ", status.ToString());
}

}  // namespace vtoken::model::internal

#endif  // VTOKEN_MODEL_CUDA_KERNELS
