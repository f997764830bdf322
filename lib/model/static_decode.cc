#include "lib/model/static_decode.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "lib/model/cpu_paged_attention.h"
#include "lib/model/llama_ops.h"
#include "lib/model/paged_cuda_attention.h"

#ifdef VTOKEN_MODEL_CUDA_KERNELS
#include "lib/cuda/paged_batch_attention.h"
#endif
#ifdef VTOKEN_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vtoken::model::internal {

struct StaticDecode::Layout {
  int64_t rows = 0;  // Bp.
  int64_t key_bucket = 0;
  bool signals = false;
  // int64 offsets into index_.
  int64_t tokens = 0, positions = 0, writes = 0, q_offsets = 0, key_offsets = 0, num_signal = 0;
  int64_t head_group = 0, want = 0, draws = 0, slots = 0, key_positions = 0, index_size = 0;
  // fp32 offsets into out_ (ids: each row's token, the argmax or a draw).
  int64_t logits = 0, ids = 0, attn = 0, norm = 0, out_size = 0;
};

struct StaticDecode::Body {
  Layout layout;
  CpuAttentionBatch cpu;  // The CPU attention's arguments, less q / K / V / out / head_group.
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  std::optional<CudaPagedAttention> cuda;
#endif
#ifdef VTOKEN_TORCH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

StaticDecode::Layout StaticDecode::MakeLayout(int64_t rows, int64_t key_bucket, bool signals,
                                              int64_t groups, int64_t head_groups,
                                              int64_t key_capacity, int64_t vocab) {
  Layout t;
  t.rows = rows;
  t.key_bucket = key_bucket;
  t.signals = signals;
  int64_t at = 0;
  auto take = [&](int64_t count) {
    const int64_t offset = at;
    at += count;
    return offset;
  };
  t.tokens = take(rows);
  t.positions = take(rows);
  t.writes = take(groups * rows);
  t.q_offsets = take(rows + 1);
  t.key_offsets = take(rows * groups + 1);
  t.num_signal = take(rows);
  t.head_group = take(head_groups);
  t.want = take((rows + 7) / 8);
  t.draws = take(3 * rows);
  t.slots = take(key_capacity);
  t.key_positions = take(key_capacity);
  t.index_size = at;
  t.logits = 0;
  t.ids = rows * vocab;
  t.attn = t.ids + rows;
  t.norm = t.attn + key_capacity;
  t.out_size = t.norm + key_capacity;
  return t;
}

StatusOr<std::unique_ptr<StaticDecode>> StaticDecode::Create(const LlamaModel& model, KvTensors& kv,
                                                             const StaticDecodeOptions& options) {
  if (kv.options().scratch_slots < 1) {
    return InvalidArgumentError(
        "static decode: the KV store has no scratch slot for the padding rows "
        "(KvTensorsOptions::scratch_slots)");
  }
  if (options.capture) {
#ifdef VTOKEN_TORCH_CUDA
    if (!kv.options().device.is_cuda()) {
      return FailedPreconditionError("CUDA graphs need the model on a CUDA device, not " +
                                     kv.options().device.str());
    }
#else
    return FailedPreconditionError(
        "CUDA graphs need a libtorch built with CUDA; this build's libtorch has no CUDA");
#endif
  }
  return std::unique_ptr<StaticDecode>(new StaticDecode(model, kv, options));
}

StaticDecode::StaticDecode(const LlamaModel& model, KvTensors& kv,
                           const StaticDecodeOptions& options)
    : model_(model), kv_(kv), options_(options), head_group_(model.HeadGroups(kv.granularity())) {
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  kernel_ = CudaPagedAttention::Usable(kv, model.options().compute_dtype,
                                       model.config().num_attention_heads);
#endif
}

// Graphs first: they hold the buffers' addresses.
StaticDecode::~StaticDecode() { bodies_.clear(); }

int64_t StaticDecode::BatchBucket(int64_t batch) {
  if (batch < 1 || batch > kMaxBatch) return 0;
  if (batch <= 4) return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(batch)));
  return (batch + 7) / 8 * 8;
}

int64_t StaticDecode::KeyBucket(int64_t max_keys) {
  return std::max<int64_t>(
      256,
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(max_keys, 1)))));
}

bool StaticDecode::Eligible(std::span<const PagedSeqView> inputs) const {
  if (BatchBucket(static_cast<int64_t>(inputs.size())) == 0) return false;
  for (const PagedSeqView& in : inputs) {
    if (in.tokens.size() != 1) return false;
  }
  const KvTensorsOptions& o = kv_.options();
  const torch::Dtype dtype = model_.options().compute_dtype;
  if (kernel_) return true;
  return o.device.is_cpu() && dtype == torch::kFloat32 && o.dtype == torch::kFloat32;
}

void StaticDecode::Reserve(int64_t batch_bucket, int64_t keys) {
  if (batch_bucket <= batch_capacity_ && keys <= key_capacity_) return;
  bodies_.clear();
  batch_capacity_ = std::max(batch_capacity_, batch_bucket);
  key_capacity_ = std::max(key_capacity_, KeyBucket(keys));
  const Layout largest = MakeLayout(batch_capacity_, 0, true, kv_.num_kv_groups(),
                                    static_cast<int64_t>(head_group_.size()), key_capacity_,
                                    model_.config().vocab_size);
  const torch::Device device = kv_.options().device;
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  index_ = torch::zeros({largest.index_size}, i64.device(device));
  index_host_ =
      device.is_cpu() ? index_ : torch::zeros({largest.index_size}, i64.pinned_memory(true));
  out_ = torch::zeros({largest.out_size},
                      torch::TensorOptions().dtype(torch::kFloat32).device(device));
  ++stats_.reallocations;
}

void StaticDecode::ReserveWorkspace(size_t bytes) {
  if (workspace_.defined() && static_cast<size_t>(workspace_.numel()) >= bytes) return;
  bodies_.clear();
  workspace_ = torch::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                            torch::TensorOptions().dtype(torch::kUInt8).device(index_.device()));
  ++stats_.reallocations;
}

#ifdef VTOKEN_MODEL_CUDA_KERNELS
cuda::PagedBatchArgs StaticDecode::KernelArgs(const Layout& t) const {
  const ModelConfig& c = model_.config();
  const int64_t* index = index_.data_ptr<int64_t>();
  float* out = out_.data_ptr<float>();
  cuda::PagedBatchArgs a = CudaPagedAttention::BaseArgs(kv_.options(), c.num_attention_heads,
                                                        kv_.num_kv_groups(), c.sliding_window);
  a.q_offsets = index + t.q_offsets;
  a.key_offsets = index + t.key_offsets;
  a.slots = index + t.slots;
  a.key_positions = index + t.key_positions;
  a.num_signal = index + t.num_signal;
  a.num_seqs = static_cast<int32_t>(t.rows);
  a.num_rows = t.rows;
  a.num_keys = key_capacity_;
  a.max_query_rows = 1;
  a.max_keys = t.key_bucket;
  if (t.signals) {
    a.want_signals = reinterpret_cast<const uint8_t*>(index + t.want);
    a.attn_sum = out + t.attn;
    a.norm_sum = out + t.norm;
    a.max_signal_rows = 1;
  }
  return a;
}
#endif

StatusOr<std::vector<PagedSeqOutput>> StaticDecode::Step(std::span<const PagedSeqView> inputs) {
  // The keys go straight into the pinned index below, not through the batch's vectors.
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel::PagedBatch batch,
                          model_.BuildPagedBatch(inputs, kv_, /*with_keys=*/false));
  const ModelConfig& c = model_.config();
  const int64_t b = static_cast<int64_t>(inputs.size());
  const int64_t rows = BatchBucket(b);
  const int64_t groups = batch.num_groups;
  const int64_t keys = batch.key_offsets.back();
  const int64_t padded_keys = keys + (rows - b) * groups;  // A padding unit has its own token.
  int64_t max_keys = 1;
  for (int64_t u = 0; u < b * groups; ++u) {
    max_keys = std::max(max_keys, batch.key_offsets[u + 1] - batch.key_offsets[u]);
  }
  bool signals = false, norms = false;
  for (uint8_t want : batch.want_signals) {
    signals |= want != 0;
    norms |= (want & kKeyNormSignal) != 0;
  }
  const BodyKey key{rows, KeyBucket(max_keys), signals};

  Reserve(rows, padded_keys);
  const Layout t =
      MakeLayout(rows, std::get<1>(key), signals, groups, static_cast<int64_t>(head_group_.size()),
                 key_capacity_, c.vocab_size);
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  if (kernel_) ReserveWorkspace(cuda::PagedBatchWorkspaceBytes(KernelArgs(t)));
#endif

  // The index, padded: padding rows decode token 0 at position 0 into the scratch slot and
  // attend to it alone.
  int64_t* p = index_host_.data_ptr<int64_t>();
  const int64_t scratch = kv_.num_slots();  // The first scratch slot.
  auto fill = [&](int64_t at, const std::vector<int64_t>& real, int64_t count, int64_t pad) {
    std::copy(real.begin(), real.begin() + count, p + at);
    std::fill(p + at + count, p + at + rows, pad);
  };
  fill(t.tokens, batch.tokens, b, 0);
  fill(t.positions, batch.positions, b, 0);
  for (int64_t g = 0; g < groups; ++g) {
    std::copy(batch.writes.begin() + g * b, batch.writes.begin() + (g + 1) * b,
              p + t.writes + g * rows);
    std::fill(p + t.writes + g * rows + b, p + t.writes + (g + 1) * rows, scratch);
  }
  for (int64_t s = 0; s <= rows; ++s) p[t.q_offsets + s] = s;
  std::copy(batch.key_offsets.begin(), batch.key_offsets.end(), p + t.key_offsets);
  for (int64_t u = b * groups + 1; u <= rows * groups; ++u) {
    p[t.key_offsets + u] = p[t.key_offsets + u - 1] + 1;
  }
  fill(t.num_signal, batch.num_signal, b, 1);
  std::copy(head_group_.begin(), head_group_.end(), p + t.head_group);
  auto* want = reinterpret_cast<uint8_t*>(p + t.want);
  std::fill(want, want + (rows + 7) / 8 * 8, uint8_t{0});
  std::copy(batch.want_signals.begin(), batch.want_signals.end(), want);
  // Key positions only where a sliding window makes the attention read them.
  const bool window = c.sliding_window > 0;
  model_.WritePagedKeys(inputs, batch, p + t.slots, window ? p + t.key_positions : nullptr);
  std::fill(p + t.slots + keys, p + t.slots + padded_keys, scratch);
  if (window) std::fill(p + t.key_positions + keys, p + t.key_positions + padded_keys, 0);
  // The tokens: the logits when a sequence wants its row (else the tokens alone, taken here).
  const LogitsAsked asked = AskedOfLogits(inputs, c.vocab_size);
  const bool full = asked.rows, draw_here = asked.draws && !asked.rows;
  if (draw_here) WriteDrawWords(inputs, rows, p + t.draws);
  if (index_.is_cuda()) {
    // Everything up to the last slot in one copy; the key positions only where a sliding window
    // makes the kernel read them.
    const int64_t head = t.slots + padded_keys;
    index_.narrow(0, 0, head).copy_(index_host_.narrow(0, 0, head), /*non_blocking=*/true);
    if (window) {
      index_.narrow(0, t.key_positions, padded_keys)
          .copy_(index_host_.narrow(0, t.key_positions, padded_keys), /*non_blocking=*/true);
    }
  }

  std::unique_ptr<Body>& body = bodies_[key];
  if (body == nullptr) {
    body = std::make_unique<Body>();
    body->layout = t;
    Prepare(*body);
  }
#ifdef VTOKEN_TORCH_CUDA
  if (body->graph != nullptr) {
    body->graph->replay();
    ++stats_.replays;
  } else {
    RunBody(*body);
  }
#else
  RunBody(*body);
#endif
  ++stats_.static_steps;
  if (draw_here) {
    // Sampling, after the body (eagerly, outside any graph): its rows' draws replace their argmax.
    const torch::Tensor logits =
        out_.narrow(0, t.logits, rows * c.vocab_size).view({rows, c.vocab_size});
    const torch::Tensor draws =
        index_.narrow(0, t.draws, 3 * rows).view(torch::kDouble).view({rows, 3});
    out_.narrow(0, t.ids, rows).copy_(SampleRows(logits, draws, asked.nucleus));
  }

  // One copy back: the logits when a sequence wants its row (else only the tokens), then the
  // signal sums when asked for.
  const int64_t from = full ? t.logits : t.ids;
  const int64_t end = !signals ? t.ids + rows : norms ? t.norm + keys : t.attn + keys;
  // (A copy on the CPU too: the outputs must not alias out_, which the next step overwrites.)
  const torch::Tensor host = out_.is_cpu() ? out_.narrow(0, from, end - from).clone()
                                           : out_.narrow(0, from, end - from).cpu();
  auto at = [&](int64_t offset) { return host.data_ptr<float>() + (offset - from); };
  std::vector<PagedSeqOutput> outputs(inputs.size());
  for (int64_t s = 0; s < b; ++s) {
    TakeLogitsOut(
        inputs[s],
        full ? host.narrow(0, t.logits - from + s * c.vocab_size, c.vocab_size) : torch::Tensor(),
        full ? nullptr : at(t.ids + s), outputs[s]);
  }
  model_.BatchSignals(inputs, batch, at(t.attn), norms ? at(t.norm) : nullptr, outputs);
  return outputs;
}

void StaticDecode::Prepare(Body& body) {
  const Layout& t = body.layout;
  const ModelConfig& c = model_.config();
  const KvTensorsOptions& o = kv_.options();
  const bool slot_per_head = o.granularity == Granularity::kHead;
  int64_t* index = index_.data_ptr<int64_t>();
  float* out = out_.data_ptr<float>();
  ++stats_.bodies_built;
  if (!kernel_) {
    body.cpu = CpuAttentionBatch{
        .num_seqs = t.rows,
        .num_heads = c.num_attention_heads,
        .num_kv_heads = c.num_key_value_heads,
        .head_dim = c.head_dim,
        .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
        .sliding_window = c.sliding_window,
        .slot_stride = slot_per_head ? o.head_dim : o.num_kv_heads * o.head_dim,
        .kv_head_stride = slot_per_head ? 0 : o.head_dim,
        .q_offsets = index + t.q_offsets,
        .groups_per_seq = kv_.num_kv_groups(),
        .key_offsets = index + t.key_offsets,
        .slots = index + t.slots,
        .key_positions = index + t.key_positions,
        .num_signal = index + t.num_signal,
        .want_signals = reinterpret_cast<const uint8_t*>(index + t.want),
        .attn_sum = t.signals ? out + t.attn : nullptr,
        .norm_sum = t.signals ? out + t.norm : nullptr,
        .norm_heads = slot_per_head ? 1 : o.num_kv_heads};
    return;
  }
#ifdef VTOKEN_MODEL_CUDA_KERNELS
  body.cuda.emplace(KernelArgs(t), index + t.head_group, workspace_);
#endif
#ifdef VTOKEN_TORCH_CUDA
  if (!options_.capture) return;
  // Capture on a side stream (the current one may be the legacy default stream, which cannot be
  // captured), after the index upload and everything else queued so far; a first run of the body
  // there initialises what torch creates lazily (cuBLAS handles and workspaces).
  // A capture that fails (torch or the driver refusing something in the body) leaves this runner
  // decoding eagerly, said once on stderr and counted, rather than failing the run.
  c10::cuda::getCurrentCUDAStream().synchronize();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false);
  // Outside the try: a failed capture must end on the stream it began on (CUDAGraph::capture_end
  // checks it), or the thread would stay in global-mode capture and later allocations fail.
  c10::cuda::CUDAStreamGuard guard(side);
  bool capturing = false;
  try {
    RunBody(body);
    side.synchronize();
    body.graph = std::make_unique<at::cuda::CUDAGraph>();
    body.graph->capture_begin();
    capturing = true;
    RunBody(body);
    capturing = false;
    body.graph->capture_end();
    side.synchronize();
  } catch (const std::exception& e) {
    if (capturing) {
      try {
        body.graph->capture_end();
      } catch (const std::exception&) {  // The capture is void either way.
      }
    }
    body.graph.reset();
    options_.capture = false;
    ++stats_.capture_failures;
    const std::string what = e.what();
    std::fprintf(stderr, "vtoken: CUDA graph capture failed (%s); decode steps run eagerly\n",
                 what.substr(0, what.find('\n')).c_str());
  }
#endif
}

void StaticDecode::RunBody(Body& body) {
  const Layout& t = body.layout;
  const LlamaModel& m = model_;
  const ModelConfig& c = m.config();
  const int64_t rows = t.rows, groups = kv_.num_kv_groups();
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> write_index;
  for (int64_t g = 0; g < groups; ++g) {
    write_index.push_back(index_.narrow(0, t.writes + g * rows, rows));
  }
  torch::Tensor x = m.Embed(index_.narrow(0, t.tokens, rows));
  auto [cos, sin] = m.RopeCosSin(index_.narrow(0, t.positions, rows));
  if (t.signals) out_.narrow(0, t.attn, 2 * key_capacity_).zero_();
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const LlamaModel::Layer& l = m.layers_[li];
    const torch::Tensor q = m.LayerQueries(li, x, cos, sin, write_index, kv_).contiguous();
    torch::Tensor attn = torch::empty({rows, heads * c.head_dim}, q.options());
    if (!kernel_) {
      CpuAttentionBatch a = body.cpu;
      a.q = q.data_ptr<float>();
      a.k_cache = kv_.k(li).data_ptr<float>();
      a.v_cache = kv_.v(li).data_ptr<float>();
      a.out = attn.data_ptr<float>();
      a.head_group = index_.data_ptr<int64_t>() + t.head_group + li * kv_heads;
      at::parallel_for(0, rows, 1,
                       [&](int64_t begin, int64_t end) { CpuPagedAttention(a, begin, end); });
    } else {
#ifdef VTOKEN_MODEL_CUDA_KERNELS
      body.cuda->Attend(q, kv_, li, attn);
#endif
    }
    x = x + Linear(attn, l.o, l.o_bias);
    x = x + m.Mlp(l, x);
  }
  const torch::Tensor logits =
      out_.narrow(0, t.logits, rows * c.vocab_size).view({rows, c.vocab_size});
  logits.copy_(m.LmHead(x).to(torch::kFloat32));
  if (c.vocab_size <= kMaxFloatExactVocab) out_.narrow(0, t.ids, rows).copy_(ArgMaxRows(logits));
}

}  // namespace vtoken::model::internal
