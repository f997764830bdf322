// LlamaModel::PagedStepTorch: the torch reference path of ForwardPaged (any device and dtype),
// which on CUDA KV tensors hands the decode-sized sequences to lib/cuda's paged attention kernel.
#include <algorithm>
#include <optional>

#include "lib/model/llama.h"
#include "lib/model/llama_ops.h"
#include "lib/model/paged_cuda_attention.h"
#include "lib/model/paged_torch_attention.h"
#include "lib/model/step_upload.h"

namespace vtoken::model {

using internal::ApplyRope;
using internal::AttendSeqLayer;
using internal::BatchView;
using internal::GatherAndMask;
using internal::GatherMask;
using internal::kBlasAttentionMinQueries;
using internal::Linear;
using internal::SignalAccumulators;
using internal::StepUpload;
#ifdef VTOKEN_MODEL_CUDA_KERNELS
using internal::CudaPagedAttention;
#endif

torch::Tensor LlamaModel::LayerQueries(int64_t li, const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin,
                                       const std::vector<torch::Tensor>& write_index, KvTensors& kv,
                                       const PagedBatch* b) const {
  const auto& c = config_;
  const Layer& l = layers_[li];
  const int64_t total = x.size(0), heads = c.num_attention_heads;
  const int64_t kv_heads = c.num_key_value_heads, hd = c.head_dim;
  const Granularity gran = kv.granularity();
  const torch::Dtype kv_dtype = kv.options().dtype;
  auto h = RmsNorm(x, l.input_norm, c.rms_norm_eps);
  auto q = Linear(h, l.q, l.q_bias).view({total, heads, hd});
  auto k = Linear(h, l.k, l.k_bias).view({total, kv_heads, hd});
  auto v = Linear(h, l.v, l.v_bias).view({total, kv_heads, hd});
  if (b != nullptr && !b->query_moments.empty()) {
    const torch::Tensor host = q.to(torch::kCPU, torch::kFloat32).contiguous();
    AddQueryMoments(*b, li, host.data_ptr<float>());
  }
  q = ApplyRope(q, cos.unsqueeze(1), sin.unsqueeze(1));
  k = ApplyRope(k, cos.unsqueeze(1), sin.unsqueeze(1));
  if (gran == Granularity::kHead) {
    for (int64_t hh = 0; hh < kv_heads; ++hh) {
      const torch::Tensor& index = write_index[KvGroupOf(gran, li, hh, kv_heads)];
      kv.k(li).index_copy_(0, index, k.narrow(1, hh, 1).to(kv_dtype));
      kv.v(li).index_copy_(0, index, v.narrow(1, hh, 1).to(kv_dtype));
    }
  } else {
    const torch::Tensor& index = write_index[KvGroupOf(gran, li, 0, kv_heads)];
    kv.k(li).index_copy_(0, index, k.to(kv_dtype));
    kv.v(li).index_copy_(0, index, v.to(kv_dtype));
  }
  return q;
}

// The reference path: per layer, torch ops; per sequence, K/V gathered with index_select and
// attention as bmm / softmax / bmm, with the causal and sliding-window mask. On CUDA KV tensors
// (when lib/cuda is built) the attention of the sequences with fewer than
// kBlasAttentionMinQueries new tokens is instead one CudaPagedAttention call per layer; longer
// prefill chunks stay on the torch ops (batched GEMMs). Every index array the step needs goes to
// the device in one upload, and every signal accumulates in one sums tensor there.
torch::Tensor LlamaModel::PagedStepTorch(PagedBatch& b, const std::vector<int64_t>& last_rows,
                                         KvTensors& kv) const {
  const auto& c = config_;
  // Used by the CUDA kernel's branch only (VTOKEN_MODEL_CUDA_KERNELS).
  [[maybe_unused]] const int64_t heads = c.num_attention_heads;
  [[maybe_unused]] const int64_t hd = c.head_dim;
  const int64_t total = static_cast<int64_t>(b.tokens.size());
  const int64_t num_seqs = static_cast<int64_t>(b.q_offsets.size()) - 1;
  const int64_t num_keys = static_cast<int64_t>(b.key_slots.size());
  const int64_t groups = b.num_groups;
  const torch::Device device = options_.device;
  StepUpload upload;
  const int64_t tokens_at = upload.Add(b.tokens);
  const int64_t last_at = upload.Add(last_rows);
  const int64_t positions_at = upload.Add(b.positions);
  const int64_t writes_at = upload.Add(b.writes);
  const int64_t slots_at = upload.Add(b.key_slots);
  // -1: no sliding window, no key positions (nothing reads them).
  const int64_t key_positions_at = c.sliding_window > 0 ? upload.Add(b.key_positions) : -1;
  const int64_t draws_at = upload.Add(b.draws);
  // The signal sums: b.sums itself on the CPU, one zeroed tensor on another device.
  torch::Tensor sums;
  if (std::any_of(b.want_signals.begin(), b.want_signals.end(), [](uint8_t w) { return w != 0; })) {
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    sums = device.is_cpu() ? torch::from_blob(b.sums.data(), {2, num_keys}, f32)
                           : torch::zeros({2, num_keys}, f32.device(device));
  }
  const BatchView view{groups, b.q_offsets.data(), b.key_offsets.data(), b.key_slots.data(),
                       b.key_positions.data()};
  // on_kernel[s]: sequence s is attended by the CUDA kernel, not by the torch ops.
  std::vector<uint8_t> on_kernel(static_cast<size_t>(num_seqs), 0);
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  std::optional<CudaPagedAttention> cuda_attention;
  std::vector<uint8_t> kernel_skip(static_cast<size_t>(num_seqs), 0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    kernel_skip[s] = b.q_offsets[s + 1] - b.q_offsets[s] >= kBlasAttentionMinQueries;
  }
  std::vector<int64_t> head_group;  // The kernel's table; Send reads it, so it lives until then.
  if (CudaPagedAttention::Usable(kv, options_.compute_dtype, heads) &&
      std::count(kernel_skip.begin(), kernel_skip.end(), 0) > 0) {
    head_group = HeadGroups(kv.granularity());
    for (int64_t s = 0; s < num_seqs; ++s) on_kernel[s] = kernel_skip[s] == 0;
    cuda_attention.emplace(view, num_seqs, b.num_signal.data(), b.want_signals.data(), kernel_skip,
                           head_group, heads, c.sliding_window, kv, slots_at, key_positions_at,
                           sums, upload);
  }
#endif
  const torch::Tensor uploaded = upload.Send(device);
  if (!b.draws.empty()) {
    b.device_draws = uploaded.narrow(0, draws_at, static_cast<int64_t>(b.draws.size()))
                         .view(torch::kDouble)
                         .view({num_seqs, 3});
  }
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  if (cuda_attention) cuda_attention->Bind(uploaded);
#endif
  const torch::Tensor key_slots = uploaded.narrow(0, slots_at, num_keys);
  const torch::Tensor key_positions =
      key_positions_at >= 0 ? uploaded.narrow(0, key_positions_at, num_keys) : torch::Tensor();
  std::vector<torch::Tensor> write_index;  // Per group: [N] slots of the batch rows.
  for (int64_t g = 0; g < groups; ++g) {
    write_index.push_back(uploaded.narrow(0, writes_at + g * total, total));
  }
  std::vector<GatherMask> gather_mask(static_cast<size_t>(num_seqs * groups));
  std::vector<int64_t> torch_seqs;
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (on_kernel[s] != 0) continue;
    for (int64_t u = s * groups; u < (s + 1) * groups; ++u) {
      gather_mask[u] = GatherAndMask(view, u, c.sliding_window, key_slots, key_positions);
    }
    torch_seqs.push_back(s);
  }
  auto signals = SignalAccumulators(torch_seqs, view, b.want_signals.data(), sums, num_seqs);
  auto x = Embed(uploaded.narrow(0, tokens_at, total));  // [N, hidden]
  auto [cos, sin] = RopeCosSin(uploaded.narrow(0, positions_at, total));
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    torch::Tensor q = LayerQueries(li, x, cos, sin, write_index, kv, &b);
    torch::Tensor attn;
#ifdef VTOKEN_MODEL_CUDA_KERNELS
    if (cuda_attention) {
      q = q.contiguous();
      attn = torch::empty({total, heads * hd}, q.options());
      cuda_attention->Attend(q, kv, li, attn);
      for (int64_t s : torch_seqs) {
        const int64_t begin = b.q_offsets[s], n = b.q_offsets[s + 1] - begin;
        attn.narrow(0, begin, n)
            .copy_(AttendSeqLayer(q.narrow(0, begin, n), kv, li, s, groups, gather_mask, signals,
                                  options_.compute_dtype, b.num_signal[s]));
      }
    }
#endif
    if (!attn.defined()) {
      std::vector<torch::Tensor> attn_out;
      attn_out.reserve(num_seqs);
      for (int64_t s = 0; s < num_seqs; ++s) {
        const int64_t begin = b.q_offsets[s];
        attn_out.push_back(AttendSeqLayer(q.narrow(0, begin, b.q_offsets[s + 1] - begin), kv, li, s,
                                          groups, gather_mask, signals, options_.compute_dtype,
                                          b.num_signal[s]));
      }
      attn = attn_out.size() == 1 ? attn_out[0] : torch::cat(attn_out, 0);
    }
    x = x + Linear(attn, l.o, l.o_bias);
    x = x + Mlp(l, x);
  }
  if (!device.is_cpu()) b.device_sums = sums;
  return x.index_select(0, uploaded.narrow(0, last_at, num_seqs));
}

}  // namespace vtoken::model
