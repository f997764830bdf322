// LlamaModel::ForwardPaged: one batched inference step over the paged KV store (llama.h), on
// the fused CPU path (fp32 on the CPU) or the torch reference path (any device and dtype).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "lib/model/cpu_ops.h"
#include "lib/model/cpu_paged_attention.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/llama.h"
#include "lib/model/llama_ops.h"
#include "lib/model/paged_cuda_attention.h"
#include "lib/model/paged_torch_attention.h"
#include "lib/model/step_upload.h"

namespace vtoken::model {

using internal::ApplyRope;
using internal::ArgMaxRows;
using internal::AttendSeqLayer;
using internal::BatchView;
using internal::GatherAndMask;
using internal::GatherMask;
using internal::kMaxFloatExactVocab;
using internal::Linear;
using internal::SignalAccumulators;
using internal::StepUpload;
#ifdef VTOKEN_MODEL_CUDA_KERNELS
using internal::CudaPagedAttention;
#endif

namespace {

// A prefill chunk of at least this many new tokens is attended with BLAS (gather + bmm): the
// fused kernel's per-query loop wins for decode, GEMMs win for long query blocks
// (BM_PrefillFusedVsReference in bench/torch_model_bench.cc).
constexpr int64_t kBlasAttentionMinQueries = 16;

// A step with at least this many keys lays out its key lists and its signals on the CPU pool's
// threads (per (sequence, group) and per sequence): at head granularity a GPU step's host work
// is one pass per key over every group's list (8B model: 256 groups).
constexpr int64_t kParallelKeys = int64_t{1} << 16;

}  // namespace

std::vector<PagedSeqView> ViewsOf(const std::vector<PagedSeqInput>& inputs) {
  std::vector<PagedSeqView> views;
  views.reserve(inputs.size());
  for (const PagedSeqInput& in : inputs) views.push_back(ViewOf(in));
  return views;
}

StatusOr<std::vector<int64_t>> LlamaModel::CheckPagedInput(const PagedSeqView& in, size_t s,
                                                           const KvTensors& kv) const {
  const auto& c = config_;
  const int64_t groups = kv.num_kv_groups();
  const std::string where = "ForwardPaged: input " + std::to_string(s) + ": ";
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  const int64_t ctx = static_cast<int64_t>(in.context_slots.size());
  if (n == 0) return InvalidArgumentError(where + "no new tokens");
  if (static_cast<int64_t>(in.positions.size()) != n) {
    return InvalidArgumentError(where + "positions and tokens differ in length");
  }
  if (static_cast<int64_t>(in.write_slots.size()) != groups * n) {
    return InvalidArgumentError(where + "write_slots has " + std::to_string(in.write_slots.size()) +
                                " slots, expected " + std::to_string(groups) + " groups x " +
                                std::to_string(n) + " tokens");
  }
  std::vector<int64_t> offsets(in.context_offsets.begin(), in.context_offsets.end());
  if (offsets.empty() && groups == 1) offsets = {0, ctx};
  if (static_cast<int64_t>(offsets.size()) != groups + 1 || offsets.front() != 0 ||
      offsets.back() != ctx || !std::is_sorted(offsets.begin(), offsets.end())) {
    return InvalidArgumentError(where + "context_offsets must be " + std::to_string(groups + 1) +
                                " non-decreasing offsets from 0 to the " + std::to_string(ctx) +
                                " context_slots");
  }
  const bool has_positions = static_cast<int64_t>(in.context_positions.size()) == ctx;
  if (c.sliding_window > 0 && !has_positions) {
    return InvalidArgumentError(where + "the model has a sliding window: context_positions " +
                                "must give every context token's position");
  }
  for (int32_t t : in.tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgumentError(where + "token id " + std::to_string(t) +
                                  " outside the vocabulary");
    }
  }
  VTOKEN_RETURN_IF_ERROR(kv.CheckSlots(in.write_slots));
  VTOKEN_RETURN_IF_ERROR(kv.CheckSlots(in.context_slots));
  return offsets;
}

StatusOr<LlamaModel::PagedBatch> LlamaModel::BuildPagedBatch(std::span<const PagedSeqView> inputs,
                                                             const KvTensors& kv,
                                                             bool with_keys) const {
  const auto& c = config_;
  const KvTensorsOptions& kvo = kv.options();
  if (kvo.num_layers != c.num_hidden_layers || kvo.num_kv_heads != c.num_key_value_heads ||
      kvo.head_dim != c.head_dim) {
    return InvalidArgumentError("ForwardPaged: KvTensors shape does not match the model");
  }
  // CSR over the batch: query rows (new tokens) per sequence, keys (context, then new) per
  // (sequence, group).
  const int64_t groups = kv.num_kv_groups();
  PagedBatch b;
  b.granularity = kvo.granularity;
  b.num_groups = groups;
  b.q_offsets = {0};
  b.key_offsets = {0};
  for (size_t s = 0; s < inputs.size(); ++s) {
    const PagedSeqView& in = inputs[s];
    VTOKEN_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets, CheckPagedInput(in, s, kv));
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    b.tokens.insert(b.tokens.end(), in.tokens.begin(), in.tokens.end());
    b.positions.insert(b.positions.end(), in.positions.begin(), in.positions.end());
    for (int64_t g = 0; g < groups; ++g) {
      b.key_offsets.push_back(b.key_offsets.back() + offsets[g + 1] - offsets[g] + n);
    }
    b.q_offsets.push_back(static_cast<int64_t>(b.tokens.size()));
    b.num_signal.push_back(std::clamp<int64_t>(in.obs_window, 1, n));
    b.want_signals.push_back(in.want_signals ? in.signals & (kAttnSignal | kKeyNormSignal) : 0);
  }
  // Write slots group-major over the batch rows: group g's slot of row t at g * total + t.
  const int64_t total_rows = static_cast<int64_t>(b.tokens.size());
  b.writes.resize(static_cast<size_t>(groups * total_rows));
  for (size_t s = 0; s < inputs.size(); ++s) {
    const int64_t q0 = b.q_offsets[s], n = b.q_offsets[s + 1] - q0;
    for (int64_t g = 0; g < groups; ++g) {
      std::copy(inputs[s].write_slots.begin() + g * n, inputs[s].write_slots.begin() + (g + 1) * n,
                b.writes.begin() + g * total_rows + q0);
    }
  }
  if (with_keys) {
    const auto num_keys = static_cast<size_t>(b.key_offsets.back());
    b.key_slots.resize(num_keys);
    // Key positions only order the keys for a sliding window: without one nothing reads them.
    if (c.sliding_window > 0) b.key_positions.resize(num_keys);
    WritePagedKeys(inputs, b, b.key_slots.data(),
                   c.sliding_window > 0 ? b.key_positions.data() : nullptr);
    // The signal sums, zeroed for the CPU paths to sum into; a device step sums on the device and
    // its outputs read the copy that comes back (ForwardPaged).
    if (options_.device.is_cpu()) b.sums.assign(2 * num_keys, 0.0f);
  }
  return b;
}

void LlamaModel::WritePagedKeys(std::span<const PagedSeqView> inputs, const PagedBatch& b,
                                int64_t* slots, int64_t* positions) const {
  const int64_t groups = b.num_groups;
  // Unit u = (sequence s, group g): its keys go to [key_offsets[u], key_offsets[u + 1]).
  auto write = [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t s = u / groups, g = u % groups;
      const PagedSeqView& in = inputs[s];
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      const bool has_positions = in.context_positions.size() == in.context_slots.size();
      const int64_t k0 = b.key_offsets[u], ctx = b.key_offsets[u + 1] - k0 - n;
      // Where the group's context starts in the input.
      const int64_t c0 = k0 - b.key_offsets[s * groups] - g * n;
      std::copy_n(in.context_slots.begin() + c0, ctx, slots + k0);
      std::copy_n(in.write_slots.begin() + g * n, n, slots + k0 + ctx);
      if (positions == nullptr) continue;
      if (has_positions) {
        std::copy_n(in.context_positions.begin() + c0, ctx, positions + k0);
      } else {  // No window: positions only order the keys.
        std::iota(positions + k0, positions + k0 + ctx, int64_t{0});
      }
      std::copy_n(in.positions.begin(), n, positions + k0 + ctx);
    }
  };
  const int64_t units = static_cast<int64_t>(inputs.size()) * groups;
  if (b.key_offsets.back() < kParallelKeys) return write(0, units);
  TorchThreadsPool()->ParallelFor(units, write);
}

void LlamaModel::BatchSignals(std::span<const PagedSeqView> inputs, const PagedBatch& b,
                              const float* attn_sum, const float* norm_sum,
                              std::vector<PagedSeqOutput>& outputs) const {
  auto signals = [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if (inputs[s].want_signals) SeqSignals(b, s, attn_sum, norm_sum, outputs[s]);
    }
  };
  const auto num_seqs = static_cast<int64_t>(inputs.size());
  if (b.key_offsets.back() < kParallelKeys) return signals(0, num_seqs);
  TorchThreadsPool()->ParallelFor(num_seqs, signals);
}

void LlamaModel::SeqSignals(const PagedBatch& b, int64_t s, const float* attn_sum,
                            const float* norm_sum, PagedSeqOutput& out) const {
  // A group spans every layer at token granularity, one layer otherwise; its query heads are
  // all of a layer's, or at head granularity the ones reading its KV head.
  const auto& c = config_;
  const int64_t groups = b.num_groups;
  const Granularity gran = b.granularity;
  const float layers = static_cast<float>(gran == Granularity::kToken ? c.num_hidden_layers : 1);
  const int64_t group_heads = gran == Granularity::kHead
                                  ? c.num_attention_heads / c.num_key_value_heads
                                  : c.num_attention_heads;
  // Full length, a signal not asked for left at zero (the CUDA and torch paths compute both).
  const uint8_t want = b.want_signals[s];
  const int64_t base = b.key_offsets[s * groups];
  const float attn_div = layers * static_cast<float>(group_heads * b.num_signal[s]);
  out.attn.assign(static_cast<size_t>(b.key_offsets[(s + 1) * groups] - base), 0.0f);
  out.key_norm.assign(out.attn.size(), 0.0f);
  for (size_t j = 0; want & kAttnSignal && j < out.attn.size(); ++j) {
    out.attn[j] = attn_sum[base + j] / attn_div;
  }
  for (size_t j = 0; want & kKeyNormSignal && j < out.key_norm.size(); ++j) {
    out.key_norm[j] = norm_sum[base + j] / layers;
  }
}

StatusOr<std::vector<PagedSeqOutput>> LlamaModel::ForwardPaged(
    const std::vector<PagedSeqInput>& inputs, KvTensors& kv) const {
  const std::vector<PagedSeqView> views = ViewsOf(inputs);
  return ForwardPaged(std::span<const PagedSeqView>(views), kv);
}

StatusOr<std::vector<PagedSeqOutput>> LlamaModel::ForwardPaged(std::span<const PagedSeqView> inputs,
                                                               KvTensors& kv) const {
  const auto& c = config_;
  const KvTensorsOptions& kvo = kv.options();
  VTOKEN_ASSIGN_OR_RETURN(PagedBatch batch, BuildPagedBatch(inputs, kv));
  std::vector<PagedSeqOutput> outputs(inputs.size());
  if (inputs.empty()) return outputs;

  torch::NoGradGuard no_grad;
  auto idx = torch::TensorOptions().dtype(torch::kInt64).device(options_.device);
  const bool fused = options_.fused_cpu_attention && options_.device.is_cpu() &&
                     options_.compute_dtype == torch::kFloat32 && kvo.dtype == torch::kFloat32;
  // What comes back of the last rows' logits: the rows when a sequence wants its row; else each
  // row's token (the argmax, or the draw of a sampling sequence), taken where the logits are.
  const internal::LogitsAsked asked = internal::AskedOfLogits(inputs, c.vocab_size);
  if (asked.draws && !asked.rows && !fused) {
    batch.draws.resize(3 * inputs.size());
    internal::WriteDrawWords(inputs, static_cast<int64_t>(inputs.size()), batch.draws.data());
  }
  std::vector<int64_t> last_rows;
  for (size_t s = 0; s < inputs.size(); ++s) last_rows.push_back(batch.q_offsets[s + 1] - 1);
  torch::Tensor last;
  if (fused) {
    auto x = Embed(torch::tensor(batch.tokens, idx));  // [N, hidden]
    x = PagedLayersCpu(x, batch.positions, batch.writes, batch, kv);
    last = x.index_select(0, torch::tensor(last_rows, idx));
  } else {
    last = PagedStepTorch(batch, last_rows, kv);
  }
  // The signal sums the outputs read: the batch's own on the CPU; elsewhere the copy that comes
  // back with the logits, kept alive by `back`.
  const float* attn_sum = batch.sums.empty() ? nullptr : batch.attn_sum();
  const float* norm_sum = batch.sums.empty() ? nullptr : batch.norm_sum();
  torch::Tensor back;
  torch::Tensor logits;    // [rows, vocab] fp32 on the host, or undefined (tokens only).
  std::vector<float> ids;  // [rows] tokens taken where the logits are (tokens only).
  if (fused && static_cast<int64_t>(last_rows.size()) <= kCpuLinearMaxRows) {
    auto normed = RmsNorm(last, norm_, c.rms_norm_eps).contiguous();
    logits = torch::empty({last.size(0), c.vocab_size}, torch::kFloat32);
    const CpuLinearArgs a{.x = normed.data_ptr<float>(),
                          .w = lm_head_.data_ptr<float>(),
                          .y = logits.data_ptr<float>(),
                          .rows = last.size(0),
                          .in_features = c.hidden_size,
                          .out_features = c.vocab_size};
    TorchThreadsPool()->ParallelFor(
        c.vocab_size, [&](int64_t begin, int64_t end) { CpuLinear(a, begin, end); }, 64);
  } else {
    // One copy back: the logits, or the tokens when no sequence wants its row (sampled ones only
    // when the draws went up with the step), and the device's signal sums.
    logits = LmHead(last).to(torch::kFloat32);
    const bool tokens_only = !asked.rows && (!asked.draws || batch.device_draws.defined());
    torch::Tensor payload = !tokens_only ? logits
                            : batch.device_draws.defined()
                                ? SampleRows(logits, batch.device_draws, asked.nucleus)
                                : ArgMaxRows(logits);
    const int64_t count = payload.numel();
    if (batch.device_sums.defined()) {
      // The key norms' row only when a sequence wants them (H2O and most policies read the
      // attention alone): at head granularity each row is 4 bytes per key of every group.
      const bool norms = std::any_of(batch.want_signals.begin(), batch.want_signals.end(),
                                     [](uint8_t w) { return (w & kKeyNormSignal) != 0; });
      const torch::Tensor sums = norms ? batch.device_sums.flatten() : batch.device_sums[0];
      back = torch::cat({payload.flatten(), sums}).cpu();
      attn_sum = back.data_ptr<float>() + count;
      norm_sum = norms ? attn_sum + batch.key_slots.size() : nullptr;
      payload = back.narrow(0, 0, count);
    } else {
      payload = payload.cpu().contiguous();
    }
    if (tokens_only) {
      ids.assign(payload.data_ptr<float>(), payload.data_ptr<float>() + count);
      logits = torch::Tensor();
    } else {
      logits = payload.view({last.size(0), c.vocab_size});
    }
  }
  for (size_t s = 0; s < inputs.size(); ++s) {
    internal::TakeLogitsOut(inputs[s], logits.defined() ? logits[s] : torch::Tensor(),
                            ids.empty() ? nullptr : &ids[s], outputs[s]);
  }
  BatchSignals(inputs, batch, attn_sum, norm_sum, outputs);
  return outputs;
}

std::vector<int64_t> LlamaModel::HeadGroups(Granularity gran) const {
  const int64_t layers = config_.num_hidden_layers, kv_heads = config_.num_key_value_heads;
  std::vector<int64_t> head_group(static_cast<size_t>(layers * kv_heads));
  for (int64_t li = 0; li < layers; ++li) {
    for (int64_t hh = 0; hh < kv_heads; ++hh) {
      head_group[li * kv_heads + hh] = KvGroupOf(gran, li, hh, kv_heads);
    }
  }
  return head_group;
}

torch::Tensor LlamaModel::LayerQueries(int64_t li, const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin,
                                       const std::vector<torch::Tensor>& write_index,
                                       KvTensors& kv) const {
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
    torch::Tensor q = LayerQueries(li, x, cos, sin, write_index, kv);
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

// The fused CPU fp32 path: RMSNorm, RoPE, the K/V writes and SwiGLU as loops on raw memory, the
// projections as one GEMM each (bias and residual fused into addmm), attention as one
// CpuPagedAttention call over the whole batch. About 7 torch ops per layer instead of ~30 plus
// ~17 per sequence.
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
  // out = in W^T + bias, or out += in W^T + bias: CpuLinear for decode-sized batches, BLAS
  // for prefill chunks.
  auto linear = [&](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias,
                    torch::Tensor& out, bool accumulate) {
    const int64_t rows = in.size(0);
    if (rows <= kCpuLinearMaxRows) {
      if (!accumulate) out = torch::empty({rows, w.size(0)}, torch::kFloat32);
      const CpuLinearArgs a{.x = in.data_ptr<float>(),
                            .w = w.data_ptr<float>(),
                            .bias = bias.defined() ? bias.data_ptr<float>() : nullptr,
                            .y = out.data_ptr<float>(),
                            .rows = rows,
                            .in_features = w.size(1),
                            .out_features = w.size(0),
                            .accumulate = accumulate};
      pool.ParallelFor(
          w.size(0), [&](int64_t begin, int64_t end) { CpuLinear(a, begin, end); }, 64);
    } else if (accumulate) {
      out.addmm_(in, w.t());
      if (bias.defined()) out.add_(bias);
    } else {
      out = bias.defined() ? torch::addmm(bias, in, w.t()) : torch::mm(in, w.t());
    }
  };
  auto project = [&](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias) {
    torch::Tensor out;
    linear(in, w, bias, out, false);
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
          for (const CpuLinearArgs& a : args) {
            const int64_t lo = std::max(begin, first), hi = std::min(end, first + a.out_features);
            if (lo < hi) CpuLinear(a, lo - first, hi - first);
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
          CpuLinear(g, begin, end);
          CpuLinear(u, begin, end);
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
  CpuAttentionBatch attn_batch{
      .num_seqs = num_seqs,
      .num_heads = heads,
      .num_kv_heads = kv_heads,
      .head_dim = hd,
      .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))),
      .sliding_window = c.sliding_window,
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
  // Long prefill chunks go to BLAS (AttendTorch); the kernel skips them.
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
    for (int64_t u = s * groups; u < (s + 1) * groups; ++u) {
      blas_gather_mask[u] = GatherAndMask(view, u, c.sliding_window, key_slots, key_positions);
    }
  }
  attn_batch.skip = skip.data();
  auto blas_signals = SignalAccumulators(blas_seqs, view, b.want_signals.data(), sums, num_seqs);
  auto attn = torch::empty({total, heads * hd}, torch::kFloat32);
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    auto h = rms_norm(x, l.input_norm);
    torch::Tensor q, k, v;  // [N, H * hd], [N, KVH * hd], [N, KVH * hd]
    project_qkv(h, l, q, k, v);
    float* qp = q.data_ptr<float>();
    float* kp = k.data_ptr<float>();
    const float* vp = v.data_ptr<float>();
    float* k_cache = kv.k(li).data_ptr<float>();
    float* v_cache = kv.v(li).data_ptr<float>();
    const int64_t* layer_groups = head_group.data() + li * kv_heads;
    for (int64_t t = 0; t < total; ++t) {
      for (int64_t hh = 0; hh < heads; ++hh) rope(qp + (t * heads + hh) * hd, t);
      for (int64_t hh = 0; hh < kv_heads; ++hh) rope(kp + (t * kv_heads + hh) * hd, t);
      if (slot_per_head) {
        for (int64_t hh = 0; hh < kv_heads; ++hh) {
          const int64_t slot = writes[layer_groups[hh] * total + t];
          std::copy(kp + t * kv_row + hh * hd, kp + t * kv_row + (hh + 1) * hd,
                    k_cache + slot * hd);
          std::copy(vp + t * kv_row + hh * hd, vp + t * kv_row + (hh + 1) * hd,
                    v_cache + slot * hd);
        }
      } else {
        const int64_t slot = writes[layer_groups[0] * total + t];
        std::copy(kp + t * kv_row, kp + (t + 1) * kv_row, k_cache + slot * kv_row);
        std::copy(vp + t * kv_row, vp + (t + 1) * kv_row, v_cache + slot * kv_row);
      }
    }
    attn_batch.head_group = layer_groups;
    attn_batch.q = qp;
    attn_batch.k_cache = k_cache;
    attn_batch.v_cache = v_cache;
    attn_batch.out = attn.data_ptr<float>();
    CpuPagedAttention(attn_batch, pool);
    for (int64_t s : blas_seqs) {
      const int64_t begin = b.q_offsets[s], n = b.q_offsets[s + 1] - begin;
      attn.narrow(0, begin, n)
          .copy_(AttendSeqLayer(q.narrow(0, begin, n).view({n, heads, hd}), kv, li, s, groups,
                                blas_gather_mask, blas_signals, torch::kFloat32, b.num_signal[s]));
    }
    linear(attn, l.o, l.o_bias, x, /*accumulate=*/true);
    auto gate = swiglu(rms_norm(x, l.post_norm), l);  // [N, inter]
    linear(gate, l.down, torch::Tensor(), x, /*accumulate=*/true);
  }
  return x;
}

}  // namespace vtoken::model
