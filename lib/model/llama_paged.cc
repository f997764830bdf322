// LlamaModel::ForwardPaged: one batched inference step over the paged KV store (llama.h). It builds
// the step's batch (llama_paged_batch.cc), runs its layers on the fused CPU path (fp32 on the CPU,
// llama_paged_cpu.cc) or the torch reference path (any device and dtype, llama_paged_torch.cc),
// then takes each sequence's logits and signals out.
#include <algorithm>

#include "lib/model/cpu_ops.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/llama.h"
#include "lib/model/llama_ops.h"

namespace vtoken::model {

using internal::ArgMaxRows;

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
                     options_.compute_dtype == torch::kFloat32 &&
                     (kvo.dtype == torch::kFloat32 || kvo.dtype == torch::kHalf);
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
        c.vocab_size,
        [&](int64_t begin, int64_t end) { CpuLinearOrStored(a, lm_head_stored_, begin, end); }, 64);
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
  AdvanceQueryMoments(batch);
  return outputs;
}

void LlamaModel::AddQueryMoments(const PagedBatch& b, int64_t layer, const float* q) const {
  const int64_t row = config_.num_attention_heads * config_.head_dim;
  for (size_t s = 0; s < b.query_moments.size(); ++s) {
    if (b.query_moments[s] == nullptr) continue;
    const int64_t begin = b.q_offsets[s];
    b.query_moments[s]->Add(layer, q + begin * row, b.q_offsets[s + 1] - begin,
                            b.positions.data() + begin);
  }
}

void LlamaModel::AdvanceQueryMoments(const PagedBatch& b) {
  for (size_t s = 0; s < b.query_moments.size(); ++s) {
    if (b.query_moments[s] == nullptr) continue;
    b.query_moments[s]->Advance(b.positions[b.q_offsets[s + 1] - 1] + 1);
  }
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

}  // namespace vtoken::model
