#include "lib/model/paged_cuda_attention.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS

#include <algorithm>
#include <cmath>
#include <cstring>

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
                                                  int64_t groups_per_seq,
                                                  int64_t sliding_window) {
  cuda::PagedBatchArgs a;
  KernelDtype(o.dtype, &a.dtype);
  a.num_heads = static_cast<int32_t>(num_heads);
  a.num_kv_heads = static_cast<int32_t>(o.num_kv_heads);
  a.head_dim = static_cast<int32_t>(o.head_dim);
  a.num_slots = o.num_slots;
  const bool slot_per_head = o.granularity == Granularity::kHead;
  a.slot_stride = slot_per_head ? o.head_dim : o.num_kv_heads * o.head_dim;
  a.kv_head_stride = slot_per_head ? 0 : o.head_dim;
  a.groups_per_seq = groups_per_seq;
  a.norm_heads = slot_per_head ? 1 : o.num_kv_heads;
  a.sliding_window = sliding_window;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o.head_dim)));
  return a;
}

CudaPagedAttention::CudaPagedAttention(const cuda::PagedBatchArgs& args,
                                       const int64_t* head_group, torch::Tensor workspace)
    : args_(args),
      num_kv_heads_(args.num_kv_heads),
      head_group_(head_group),
      workspace_(std::move(workspace)) {}

bool CudaPagedAttention::Usable(const KvTensors& kv, torch::Dtype compute_dtype,
                                int64_t num_heads) {
  const KvTensorsOptions& o = kv.options();
  cuda::AttnDtype dtype;
  return o.device.is_cuda() && o.dtype == compute_dtype && KernelDtype(o.dtype, &dtype) &&
         o.head_dim <= 256 && num_heads <= 256;
}

CudaPagedAttention::CudaPagedAttention(const BatchView& b, int64_t num_seqs,
                                       const int64_t* num_signal, const uint8_t* want_signals,
                                       const std::vector<uint8_t>& skip,
                                       const std::vector<int64_t>& head_group, int64_t num_heads,
                                       int64_t sliding_window, const KvTensors& kv) {
  const KvTensorsOptions& o = kv.options();
  const int64_t units = num_seqs * b.num_groups;
  const int64_t num_keys = b.key_offsets[units];
  num_kv_heads_ = o.num_kv_heads;
  // One int64 array: q_offsets, key_offsets, slots, positions, num_signal, head_group, then
  // want_signals and skip as bytes.
  const int64_t flag_words = (num_seqs + 7) / 8;
  std::vector<int64_t> host;
  host.reserve(static_cast<size_t>(num_seqs * 2 + units + 2 + 2 * num_keys) + head_group.size() +
               static_cast<size_t>(2 * flag_words));
  auto append = [&](const int64_t* data, int64_t count) {
    const int64_t at = static_cast<int64_t>(host.size());
    host.insert(host.end(), data, data + count);
    return at;
  };
  auto append_bytes = [&](const uint8_t* data) {
    const int64_t at = static_cast<int64_t>(host.size());
    host.resize(host.size() + static_cast<size_t>(flag_words), 0);
    std::memcpy(host.data() + at, data, static_cast<size_t>(num_seqs));
    return at;
  };
  const int64_t q_at = append(b.q_offsets, num_seqs + 1);
  const int64_t key_at = append(b.key_offsets, units + 1);
  const int64_t slot_at = append(b.key_slots, num_keys);
  const int64_t pos_at = append(b.key_positions, num_keys);
  const int64_t signal_at = append(num_signal, num_seqs);
  const int64_t group_at = append(head_group.data(), static_cast<int64_t>(head_group.size()));
  const int64_t want_at = append_bytes(want_signals);
  const int64_t skip_at = append_bytes(skip.data());
  // Up from pinned memory without blocking the host (a pageable copy would wait for the work
  // queued before it); torch's caching host allocator keeps the block until the copy is done.
  torch::Tensor pinned = torch::empty({static_cast<int64_t>(host.size())},
                                      torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true));
  std::memcpy(pinned.data_ptr<int64_t>(), host.data(), host.size() * sizeof(int64_t));
  csr_ = pinned.to(o.device, /*non_blocking=*/true);
  const int64_t* dev = csr_.data_ptr<int64_t>();
  head_group_ = dev + group_at;

  args_ = BaseArgs(o, num_heads, b.num_groups, sliding_window);
  cuda::PagedBatchArgs& a = args_;
  a.q_offsets = dev + q_at;
  a.key_offsets = dev + key_at;
  a.slots = dev + slot_at;
  a.key_positions = dev + pos_at;
  a.num_signal = dev + signal_at;
  a.want_signals = reinterpret_cast<const uint8_t*>(dev + want_at);
  a.skip = reinterpret_cast<const uint8_t*>(dev + skip_at);
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
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(o.device);
    sums_ = torch::zeros({2, num_keys}, f32);
    a.attn_sum = sums_.data_ptr<float>();
    a.norm_sum = a.attn_sum + num_keys;
  } else {
    a.want_signals = nullptr;
  }
  const size_t bytes = cuda::PagedBatchWorkspaceBytes(a);
  workspace_ = torch::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                            torch::TensorOptions().dtype(torch::kUInt8).device(o.device));
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
