// LlamaModel::PagedLayersCpu: the fused CPU fp32 path of ForwardPaged.
#include <algorithm>
#include <cmath>
#include <optional>

#include "lib/model/cpu_bf16.h"
#include "lib/model/cpu_blas_gemm.h"
#include "lib/model/cpu_gemm.h"
#include "lib/model/cpu_ops.h"
#include "lib/model/cpu_paged_attention.h"
#include "lib/model/cpu_prefill_attention.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/llama.h"
#include "lib/model/llama_ops.h"
#include "lib/model/paged_torch_attention.h"

namespace vtoken::model {

using internal::AttendSeqLayer;
using internal::BatchView;
using internal::GatherAndMask;
using internal::GatherMask;
using internal::kBlasAttentionMinQueries;
using internal::SignalAccumulators;

// The fused CPU fp32 path (over an fp32 or fp16 KV store): RMSNorm, RoPE, the K/V writes and
// SwiGLU as loops on raw memory, the projections as one GEMM each (bias and residual fused into
// addmm), attention as one CpuPagedAttention call over the whole batch. About 7 torch ops per layer
// instead of ~30 plus ~17 per sequence.
torch::Tensor LlamaModel::PagedLayersCpu(torch::Tensor x, const std::vector<int64_t>& positions,
                                         const std::vector<int64_t>& writes, PagedBatch& b,
                                         KvTensors& kv) const {
  const auto& c = config_;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t hd = c.head_dim, half = hd / 2, hidden = c.hidden_size;
  const int64_t total = x.size(0), inter = c.intermediate_size;
  const int64_t num_seqs = static_cast<int64_t>(b.q_offsets.size()) - 1;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::shared_ptr<CpuPool> pool_ref = TorchThreadsPool();
  CpuPool& pool = *pool_ref;
  x = x.contiguous();
  // cos / sin [N, head_dim / 2] in fp32, as RopeCosSin computes them.
  std::vector<float> cos(static_cast<size_t>(total * half)), sin(cos.size());
  const float* inv_freq = inv_freq_.data_ptr<float>();
  for (int64_t t = 0; t < total; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float f = static_cast<float>(positions[t]) * inv_freq[i];
      cos[t * half + i] = std::cos(f);
      sin[t * half + i] = std::sin(f);
    }
  }
  auto rms_norm = [&](const torch::Tensor& in, const torch::Tensor& weight) {
    auto out = torch::empty_like(in);
    CpuRmsNorm(in.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), total, hidden,
               eps);
    return out;
  };
  // out = in W^T + bias, or out += in W^T + bias: CpuLinear (or the stored weight's kernel) for
  // decode-sized batches; for prefill chunks CpuQ8Linear or CpuBf16Linear on a weight kept for
  // them, else CpuGemm where it is the faster (UseCpuGemm, cpu_gemm.h), else the BLAS on
  // the pool's threads where PoolSgemm can (cpu_blas_gemm.h), else torch's addmm.
  const bool pool_sgemm = PoolSgemmAvailable();
  const bool own_gemm = UseCpuGemm();
  // Prefill chunks on weights whose kernel reads its rows prepared (StoredDot::kQ8: quantized to
  // 8 bits; kBf16: rounded to bf16): the rows are prepared once, on the pool, for every projection
  // that reads them (prepare), and each projection's outputs split over the pool.
  CpuQ8Activations q8_in;
  CpuBf16Activations bf16_in;
  auto prepare = [&](const torch::Tensor& in, StoredDot dot) {
    const float* rows = in.data_ptr<float>();
    if (dot == StoredDot::kQ8) {
      CpuQ8Prepare(in.size(0), in.size(1), q8_in);
      pool.ParallelFor(in.size(0),
                       [&](int64_t begin, int64_t end) { CpuQ8Quantize(rows, begin, end, q8_in); });
    } else {
      CpuBf16Prepare(in.size(0), in.size(1), bf16_in);
      pool.ParallelFor(
          in.size(0), [&](int64_t begin, int64_t end) { CpuBf16Round(rows, begin, end, bf16_in); });
    }
  };
  auto linear_prepared = [&](const CpuLinearArgs& a, const StoredWeight& stored) {
    const CpuQuantLinearArgs q = StoredArgs(a, stored);
    if (stored.dot == StoredDot::kQ8) {
      pool.ParallelFor(
          a.out_features, [&](int64_t begin, int64_t end) { CpuQ8Linear(q, q8_in, begin, end); },
          kQ8GroupRows);
    } else {
      pool.ParallelFor(
          a.out_features,
          [&](int64_t begin, int64_t end) { CpuBf16Linear(q, bf16_in, begin, end); },
          kBf16PanelRows);
    }
  };
  auto prepared = [](const StoredWeight& stored) {
    return stored.defined() && stored.dot != StoredDot::kExact;
  };
  auto linear = [&](const torch::Tensor& in, const torch::Tensor& w, const StoredWeight& stored,
                    const torch::Tensor& bias, torch::Tensor& out, bool accumulate) {
    const int64_t rows = in.size(0);
    const bool small = rows <= kCpuLinearMaxRows;
    if (small || own_gemm || pool_sgemm || prepared(stored)) {
      if (!accumulate) out = torch::empty({rows, w.size(0)}, torch::kFloat32);
      const CpuLinearArgs a{.x = in.data_ptr<float>(),
                            .w = w.data_ptr<float>(),
                            .bias = bias.defined() ? bias.data_ptr<float>() : nullptr,
                            .y = out.data_ptr<float>(),
                            .rows = rows,
                            .in_features = w.size(1),
                            .out_features = w.size(0),
                            .accumulate = accumulate};
      if (!small && prepared(stored)) {
        prepare(in, stored.dot);
        return linear_prepared(a, stored);
      }
      if (!small && own_gemm) {
        pool.ParallelFor(
            (a.out_features + kGemmPanel - 1) / kGemmPanel, [&](int64_t begin, int64_t end) {
              CpuGemm(a, begin * kGemmPanel, std::min(a.out_features, end * kGemmPanel));
            });
        return;
      }
      if (!small) return PoolSgemm(a, pool);
      pool.ParallelFor(
          w.size(0), [&](int64_t begin, int64_t end) { CpuLinearOrStored(a, stored, begin, end); },
          64);
    } else if (accumulate) {
      out.addmm_(in, w.t());
      if (bias.defined()) out.add_(bias);
    } else {
      out = bias.defined() ? torch::addmm(bias, in, w.t()) : torch::mm(in, w.t());
    }
  };
  auto project = [&](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias) {
    torch::Tensor out;
    linear(in, w, StoredWeight(), bias, out, false);  // Prefill chunks only: BLAS.
    return out;
  };
  auto linear_args = [](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias,
                        torch::Tensor& out) {
    out = torch::empty({in.size(0), w.size(0)}, torch::kFloat32);
    return CpuLinearArgs{.x = in.data_ptr<float>(),
                         .w = w.data_ptr<float>(),
                         .bias = bias.defined() ? bias.data_ptr<float>() : nullptr,
                         .y = out.data_ptr<float>(),
                         .rows = in.size(0),
                         .in_features = w.size(1),
                         .out_features = w.size(0)};
  };
  // q, k and v of a decode-sized batch in one pool call over their output features together:
  // a small step's few calls are what its threads synchronise on.
  auto project_qkv = [&](const torch::Tensor& h, const Layer& l, torch::Tensor& q, torch::Tensor& k,
                         torch::Tensor& v) {
    const StoredWeight* stored[3] = {&l.q_stored, &l.k_stored, &l.v_stored};
    if (h.size(0) > kCpuLinearMaxRows && prepared(l.q_stored) && prepared(l.k_stored) &&
        prepared(l.v_stored)) {  // One option sets all three: one kind (StoredDot).
      prepare(h, l.q_stored.dot);
      linear_prepared(linear_args(h, l.q, l.q_bias, q), l.q_stored);
      linear_prepared(linear_args(h, l.k, l.k_bias, k), l.k_stored);
      linear_prepared(linear_args(h, l.v, l.v_bias, v), l.v_stored);
      return;
    }
    if (h.size(0) > kCpuLinearMaxRows) {
      q = project(h, l.q, l.q_bias);
      k = project(h, l.k, l.k_bias);
      v = project(h, l.v, l.v_bias);
      return;
    }
    const CpuLinearArgs args[3] = {linear_args(h, l.q, l.q_bias, q),
                                   linear_args(h, l.k, l.k_bias, k),
                                   linear_args(h, l.v, l.v_bias, v)};
    const int64_t total = args[0].out_features + args[1].out_features + args[2].out_features;
    pool.ParallelFor(
        total,
        [&](int64_t begin, int64_t end) {
          int64_t first = 0;
          for (int i = 0; i < 3; ++i) {
            const CpuLinearArgs& a = args[i];
            const int64_t lo = std::max(begin, first), hi = std::min(end, first + a.out_features);
            if (lo < hi) CpuLinearOrStored(a, *stored[i], lo - first, hi - first);
            first += a.out_features;
          }
        },
        64);
  };
  // SwiGLU's silu(gate) * up of a decode-sized batch in one pool call over the intermediate
  // features (each share computes its gate and up features, then their product); BLAS and one
  // CpuSiluMul for prefill chunks. Returns [N, intermediate].
  auto swiglu = [&](const torch::Tensor& h2, const Layer& l) {
    torch::Tensor gate, up;
    if (h2.size(0) > kCpuLinearMaxRows && prepared(l.gate_stored) && prepared(l.up_stored)) {
      prepare(h2, l.gate_stored.dot);
      linear_prepared(linear_args(h2, l.gate, torch::Tensor(), gate), l.gate_stored);
      linear_prepared(linear_args(h2, l.up, torch::Tensor(), up), l.up_stored);
      CpuSiluMul(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel());
      return gate;
    }
    if (h2.size(0) > kCpuLinearMaxRows) {
      gate = project(h2, l.gate, torch::Tensor());
      up = project(h2, l.up, torch::Tensor());
      CpuSiluMul(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel());
      return gate;
    }
    const CpuLinearArgs g = linear_args(h2, l.gate, torch::Tensor(), gate);
    const CpuLinearArgs u = linear_args(h2, l.up, torch::Tensor(), up);
    pool.ParallelFor(
        inter,
        [&](int64_t begin, int64_t end) {
          CpuLinearOrStored(g, l.gate_stored, begin, end);
          CpuLinearOrStored(u, l.up_stored, begin, end);
          for (int64_t r = 0; r < g.rows; ++r) {
            CpuSiluMul(g.y + r * inter + begin, u.y + r * inter + begin, end - begin);
          }
        },
        32);
    return gate;
  };
  // Rotates one head row in place (HF rotate_half convention).
  auto rope = [&](float* row, int64_t t) {
    const float* cs = cos.data() + t * half;
    const float* sn = sin.data() + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = row[i], bb = row[i + half];
      row[i] = a * cs[i] - bb * sn[i];
      row[i + half] = bb * cs[i] + a * sn[i];
    }
  };
  // A slot holds every KV head of a layer (token, layer) or one (head).
  const Granularity gran = kv.granularity();
  const bool slot_per_head = gran == Granularity::kHead;
  const int64_t groups = b.num_groups;
  const std::vector<int64_t> head_group = HeadGroups(gran);
  const int64_t kv_row = kv_heads * hd, slot_row = slot_per_head ? hd : kv_row;
  const bool kv_half = kv.options().dtype == torch::kHalf;
  CpuAttentionBatch attn_batch{
      .num_seqs = num_seqs,
      .num_heads = heads,
      .num_kv_heads = kv_heads,
      .head_dim = hd,
      .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))),
      .sliding_window = c.sliding_window,
      .kv_element = kv_half ? CpuKvElement::kFloat16 : CpuKvElement::kFloat32,
      .slot_stride = slot_row,
      .kv_head_stride = slot_per_head ? 0 : hd,
      .q_offsets = b.q_offsets.data(),
      .groups_per_seq = groups,
      .key_offsets = b.key_offsets.data(),
      .slots = b.key_slots.data(),
      .key_positions = c.sliding_window > 0 ? b.key_positions.data() : nullptr,
      .num_signal = b.num_signal.data(),
      .want_signals = b.want_signals.data(),
      .attn_sum = b.attn_sum(),
      .norm_sum = b.norm_sum(),
      .norm_heads = slot_per_head ? 1 : kv_heads};
  // Long prefill chunks go to BLAS: CpuPrefillAttention on the pool where PoolSgemm can, else
  // AttendTorch; the kernel skips them.
  std::vector<uint8_t> skip(static_cast<size_t>(num_seqs), 0);
  std::vector<int64_t> blas_seqs;
  std::vector<GatherMask> blas_gather_mask(static_cast<size_t>(num_seqs * groups));
  const BatchView view{groups, b.q_offsets.data(), b.key_offsets.data(), b.key_slots.data(),
                       b.key_positions.data()};
  // The batch's arrays as tensors in place: the BLAS path reads and sums into them.
  const int64_t num_keys = static_cast<int64_t>(b.key_slots.size());
  const torch::Tensor key_slots = torch::from_blob(b.key_slots.data(), {num_keys}, torch::kInt64);
  const torch::Tensor key_positions =
      c.sliding_window > 0 ? torch::from_blob(b.key_positions.data(), {num_keys}, torch::kInt64)
                           : torch::Tensor();
  const torch::Tensor sums = torch::from_blob(b.sums.data(), {2, num_keys}, torch::kFloat32);
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (b.q_offsets[s + 1] - b.q_offsets[s] < kBlasAttentionMinQueries) continue;
    skip[s] = 1;
    blas_seqs.push_back(s);
    if (pool_sgemm) continue;
    for (int64_t u = s * groups; u < (s + 1) * groups; ++u) {
      blas_gather_mask[u] = GatherAndMask(view, u, c.sliding_window, key_slots, key_positions);
    }
  }
  attn_batch.skip = skip.data();
  // The torch path's signal views (CpuPrefillAttention adds into the sums itself).
  auto blas_signals = SignalAccumulators(pool_sgemm ? std::vector<int64_t>() : blas_seqs, view,
                                         b.want_signals.data(), sums, num_seqs);
  auto attn = torch::empty({total, heads * hd}, torch::kFloat32);
  // The BLAS's own threads would spin against the pool's between the step's GEMMs; a step with
  // no prefill chunk calls no BLAS.
  std::optional<OneBlasThread> one_blas_thread;
  if (total > kCpuLinearMaxRows || !blas_seqs.empty()) one_blas_thread.emplace();
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    auto h = rms_norm(x, l.input_norm);
    torch::Tensor q, k, v;  // [N, H * hd], [N, KVH * hd], [N, KVH * hd]
    project_qkv(h, l, q, k, v);
    float* qp = q.data_ptr<float>();
    float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    void* k_cache = kv.k(li).data_ptr();
    void* v_cache = kv.v(li).data_ptr();
    const CpuKvElement kve = attn_batch.kv_element;
    const int64_t* layer_groups = head_group.data() + li * kv_heads;
    if (!b.query_moments.empty()) AddQueryMoments(b, li, qp);
    for (int64_t t = 0; t < total; ++t) {
      for (int64_t hh = 0; hh < heads; ++hh) rope(qp + (t * heads + hh) * hd, t);
      for (int64_t hh = 0; hh < kv_heads; ++hh) rope(kp + (t * kv_heads + hh) * hd, t);
      if (slot_per_head) {
        for (int64_t hh = 0; hh < kv_heads; ++hh) {
          const int64_t slot = writes[layer_groups[hh] * total + t];
          CpuStoreKvRow(kve, kp + t * kv_row + hh * hd, hd, k_cache, slot * hd);
          CpuStoreKvRow(kve, vp + t * kv_row + hh * hd, hd, v_cache, slot * hd);
        }
      } else {
        const int64_t slot = writes[layer_groups[0] * total + t];
        CpuStoreKvRow(kve, kp + t * kv_row, kv_row, k_cache, slot * kv_row);
        CpuStoreKvRow(kve, vp + t * kv_row, kv_row, v_cache, slot * kv_row);
      }
    }
    attn_batch.head_group = layer_groups;
    attn_batch.q = qp;
    attn_batch.k_cache = k_cache;
    attn_batch.v_cache = v_cache;
    attn_batch.out = attn.data_ptr<float>();
    CpuPagedAttention(attn_batch, pool);
    for (int64_t s : blas_seqs) {
      if (pool_sgemm) {
        CpuPrefillAttention(attn_batch, s, pool);
        continue;
      }
      const int64_t begin = b.q_offsets[s], n = b.q_offsets[s + 1] - begin;
      attn.narrow(0, begin, n)
          .copy_(AttendSeqLayer(q.narrow(0, begin, n).view({n, heads, hd}), kv, li, s, groups,
                                blas_gather_mask, blas_signals, torch::kFloat32, b.num_signal[s]));
    }
    linear(attn, l.o, l.o_stored, l.o_bias, x, /*accumulate=*/true);
    auto gate = swiglu(rms_norm(x, l.post_norm), l);  // [N, inter]
    linear(gate, l.down, l.down_stored, torch::Tensor(), x, /*accumulate=*/true);
  }
  return x;
}

}  // namespace vtoken::model
