// LlamaModel's PagedBatch (llama.h): the paged step's inputs checked and laid out in CSR form
// (query rows per sequence, keys per (sequence, KV group)), and each sequence's signals read back
// out of the batch's sums.
#include <algorithm>
#include <numeric>

#include "lib/model/cpu_threads.h"
#include "lib/model/llama.h"

namespace vtoken::model {
namespace {

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
    if (in.query_moments != nullptr) {
      b.query_moments.resize(inputs.size(), nullptr);
      b.query_moments[s] = in.query_moments;
    }
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

}  // namespace vtoken::model
