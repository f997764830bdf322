#include "lib/model/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <span>

#include "lib/model/cpu_paged_attention.h"
#include "lib/model/io/checkpoint.h"
#include "lib/model/io/safetensors.h"

namespace vtoken::model {
namespace {

std::string LayerName(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return b.defined() ? torch::nn::functional::linear(x, w, b) : torch::matmul(x, w.t());
}

torch::Tensor RotateHalf(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

// The runtime's own limits on top of ValidateConfig (the config file's rules).
Status CheckRunnable(const ModelConfig& c) {
  VTOKEN_RETURN_IF_ERROR(ValidateConfig(c));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return InvalidArgumentError("model config: head_dim must be positive and even for RoPE, got " +
                                std::to_string(c.head_dim));
  }
  return Status::Ok();
}

}  // namespace

torch::Tensor RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  auto exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim;
  auto inv_freq = 1.0 / torch::pow(config.rope_theta, exponents);
  const RopeScaling& s = config.rope_scaling;
  if (s.type != "llama3") return inv_freq;
  // HF _compute_llama3_parameters: long wavelengths are divided by `factor`, short ones kept,
  // and the band in between is interpolated smoothly.
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  auto wavelen = 2 * std::numbers::pi / inv_freq;
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  auto smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat32);
  auto variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (x32 * torch::rsqrt(variance + eps)).to(x.scalar_type());
}

StatusOr<LlamaModel> LlamaModel::RandomInit(const ModelConfig& config, uint64_t seed,
                                            const LlamaOptions& options) {
  VTOKEN_RETURN_IF_ERROR(CheckRunnable(config));
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  auto topt = torch::TensorOptions().dtype(torch::kFloat32);
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, 0.02, shape, gen, topt); };
  const auto& c = config;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  LlamaModel m;
  m.config_ = config;
  m.options_ = options;
  m.embed_ = normal({c.vocab_size, c.hidden_size});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer l;
    l.input_norm = torch::ones({c.hidden_size}, topt);
    l.q = normal({q_dim, c.hidden_size});
    l.k = normal({kv_dim, c.hidden_size});
    l.v = normal({kv_dim, c.hidden_size});
    l.o = normal({c.hidden_size, q_dim});
    if (c.attention_bias) {
      l.q_bias = torch::zeros({q_dim}, topt);
      l.k_bias = torch::zeros({kv_dim}, topt);
      l.v_bias = torch::zeros({kv_dim}, topt);
    }
    if (c.attention_output_bias) l.o_bias = torch::zeros({c.hidden_size}, topt);
    l.post_norm = torch::ones({c.hidden_size}, topt);
    l.gate = normal({c.intermediate_size, c.hidden_size});
    l.up = normal({c.intermediate_size, c.hidden_size});
    l.down = normal({c.hidden_size, c.intermediate_size});
    m.layers_.push_back(std::move(l));
  }
  m.norm_ = torch::ones({c.hidden_size}, topt);
  m.lm_head_ = c.tie_word_embeddings ? m.embed_ : normal({c.vocab_size, c.hidden_size});
  VTOKEN_RETURN_IF_ERROR(m.Finish());
  return m;
}

StatusOr<LlamaModel> LlamaModel::FromNamedTensors(
    const ModelConfig& config, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
    const LlamaOptions& options) {
  VTOKEN_RETURN_IF_ERROR(CheckRunnable(config));
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  const auto& c = config;
  auto get = [&](const std::string& name, std::vector<int64_t> shape,
                 torch::Tensor* out) -> Status {
    auto it = by_name.find(name);
    if (it == by_name.end()) return NotFoundError("checkpoint: missing tensor " + name);
    if (it->second.sizes() != c10::IntArrayRef(shape)) {
      return InvalidArgumentError("checkpoint: tensor " + name + " has shape " +
                                  c10::str(it->second.sizes()) + ", expected " +
                                  c10::str(c10::IntArrayRef(shape)));
    }
    *out = it->second.to(options.device, options.compute_dtype).contiguous();
    return Status::Ok();
  };
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  LlamaModel m;
  m.config_ = config;
  m.options_ = options;
  VTOKEN_RETURN_IF_ERROR(
      get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, &m.embed_));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer l;
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "input_layernorm.weight"), {c.hidden_size}, &l.input_norm));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "self_attn.q_proj.weight"), {q_dim, c.hidden_size}, &l.q));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "self_attn.k_proj.weight"), {kv_dim, c.hidden_size}, &l.k));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "self_attn.v_proj.weight"), {kv_dim, c.hidden_size}, &l.v));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "self_attn.o_proj.weight"), {c.hidden_size, q_dim}, &l.o));
    if (c.attention_bias) {
      VTOKEN_RETURN_IF_ERROR(get(LayerName(i, "self_attn.q_proj.bias"), {q_dim}, &l.q_bias));
      VTOKEN_RETURN_IF_ERROR(get(LayerName(i, "self_attn.k_proj.bias"), {kv_dim}, &l.k_bias));
      VTOKEN_RETURN_IF_ERROR(get(LayerName(i, "self_attn.v_proj.bias"), {kv_dim}, &l.v_bias));
    }
    if (c.attention_output_bias) {
      VTOKEN_RETURN_IF_ERROR(
          get(LayerName(i, "self_attn.o_proj.bias"), {c.hidden_size}, &l.o_bias));
    }
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "post_attention_layernorm.weight"), {c.hidden_size}, &l.post_norm));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "mlp.gate_proj.weight"), {c.intermediate_size, c.hidden_size}, &l.gate));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "mlp.up_proj.weight"), {c.intermediate_size, c.hidden_size}, &l.up));
    VTOKEN_RETURN_IF_ERROR(
        get(LayerName(i, "mlp.down_proj.weight"), {c.hidden_size, c.intermediate_size}, &l.down));
    m.layers_.push_back(std::move(l));
  }
  VTOKEN_RETURN_IF_ERROR(get("model.norm.weight", {c.hidden_size}, &m.norm_));
  if (c.tie_word_embeddings) {
    m.lm_head_ = m.embed_;
  } else {
    VTOKEN_RETURN_IF_ERROR(get("lm_head.weight", {c.vocab_size, c.hidden_size}, &m.lm_head_));
  }
  VTOKEN_RETURN_IF_ERROR(m.Finish());
  return m;
}

StatusOr<LlamaModel> LlamaModel::FromDirectory(const std::string& dir,
                                               const LlamaOptions& options) {
  VTOKEN_ASSIGN_OR_RETURN(Checkpoint checkpoint, LoadCheckpoint(dir));
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const TensorSpec& spec : RequiredTensors(checkpoint.config())) {
    const TensorView* view = checkpoint.Find(spec.name);
    // Converting through fp32 handles unaligned data and every supported dtype in one path;
    // one tensor at a time, so the fp32 copy never holds more than the largest tensor.
    auto t = torch::empty(view->shape, torch::kFloat32);
    VTOKEN_RETURN_IF_ERROR(ConvertToFloat(*view, std::span<float>(t.data_ptr<float>(), t.numel())));
    tensors.emplace_back(spec.name, t.to(options.compute_dtype));
  }
  return FromNamedTensors(checkpoint.config(), tensors, options);
}

Status LlamaModel::Finish() {
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor& t) {
    if (t.defined()) t = t.to(options_.device, options_.compute_dtype).contiguous();
  };
  move(embed_);
  for (Layer& l : layers_) {
    for (torch::Tensor* t : {&l.input_norm, &l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias,
                             &l.o_bias, &l.post_norm, &l.gate, &l.up, &l.down}) {
      move(*t);
    }
  }
  move(norm_);
  // Re-alias after the move so that tied weights stay one tensor (one gradient, one update).
  if (config_.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    move(lm_head_);
  }
  inv_freq_ = RopeInverseFrequencies(config_).to(options_.device);
  return Status::Ok();
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaModel::NamedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_);
  for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) {
    const Layer& l = layers_[i];
    out.emplace_back(LayerName(i, "input_layernorm.weight"), l.input_norm);
    out.emplace_back(LayerName(i, "self_attn.q_proj.weight"), l.q);
    out.emplace_back(LayerName(i, "self_attn.k_proj.weight"), l.k);
    out.emplace_back(LayerName(i, "self_attn.v_proj.weight"), l.v);
    out.emplace_back(LayerName(i, "self_attn.o_proj.weight"), l.o);
    if (l.q_bias.defined()) {
      out.emplace_back(LayerName(i, "self_attn.q_proj.bias"), l.q_bias);
      out.emplace_back(LayerName(i, "self_attn.k_proj.bias"), l.k_bias);
      out.emplace_back(LayerName(i, "self_attn.v_proj.bias"), l.v_bias);
    }
    if (l.o_bias.defined()) out.emplace_back(LayerName(i, "self_attn.o_proj.bias"), l.o_bias);
    out.emplace_back(LayerName(i, "post_attention_layernorm.weight"), l.post_norm);
    out.emplace_back(LayerName(i, "mlp.gate_proj.weight"), l.gate);
    out.emplace_back(LayerName(i, "mlp.up_proj.weight"), l.up);
    out.emplace_back(LayerName(i, "mlp.down_proj.weight"), l.down);
  }
  out.emplace_back("model.norm.weight", norm_);
  if (!config_.tie_word_embeddings) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

int64_t LlamaModel::NumParameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : NamedParameters()) n += t.numel();
  return n;
}

KvTensorsOptions LlamaModel::KvOptions(int64_t num_slots) const {
  KvTensorsOptions o;
  o.num_layers = config_.num_hidden_layers;
  o.num_slots = num_slots;
  o.num_kv_heads = config_.num_key_value_heads;
  o.head_dim = config_.head_dim;
  o.dtype = options_.compute_dtype;
  o.device = options_.device;
  return o;
}

torch::Tensor LlamaModel::Embed(const torch::Tensor& tokens) const {
  return torch::embedding(embed_, tokens);
}

torch::Tensor LlamaModel::LmHead(const torch::Tensor& hidden) const {
  return torch::matmul(RmsNorm(hidden, norm_, config_.rms_norm_eps), lm_head_.t());
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::RopeCosSin(
    const torch::Tensor& positions) const {
  auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // [N, head_dim / 2]
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(options_.compute_dtype), emb.sin().to(options_.compute_dtype)};
}

torch::Tensor LlamaModel::Mlp(const Layer& l, const torch::Tensor& x) const {
  auto h = RmsNorm(x, l.post_norm, config_.rms_norm_eps);
  return torch::matmul(torch::silu(torch::matmul(h, l.gate.t())) * torch::matmul(h, l.up.t()),
                       l.down.t());
}

torch::Tensor LlamaModel::ForwardDense(const torch::Tensor& tokens,
                                       const torch::Tensor& visible) const {
  const auto& c = config_;
  const int64_t batch = tokens.size(0), len = tokens.size(1);
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t group = heads / kv_heads, hd = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto dev = torch::TensorOptions().device(options_.device);
  auto [cos, sin] = RopeCosSin(torch::arange(len, dev.dtype(torch::kInt64)));
  // Additive causal mask, one [T, T] block per query head of a group: [G*T, T].
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto mask = visible.defined()
                  ? torch::zeros({len, len}, dev.dtype(options_.compute_dtype))
                        .masked_fill(visible.to(options_.device).logical_not(), neg_inf)
                  : torch::full({len, len}, neg_inf, dev.dtype(options_.compute_dtype)).triu(1);
  mask = mask.repeat({group, 1});
  auto x = Embed(tokens.to(options_.device));
  for (const Layer& l : layers_) {
    auto h = RmsNorm(x, l.input_norm, c.rms_norm_eps);
    auto q = Linear(h, l.q, l.q_bias).view({batch, len, heads, hd}).transpose(1, 2);
    auto k = Linear(h, l.k, l.k_bias).view({batch, len, kv_heads, hd}).transpose(1, 2);
    auto v = Linear(h, l.v, l.v_bias).view({batch, len, kv_heads, hd}).transpose(1, 2);
    q = ApplyRope(q, cos, sin);
    k = ApplyRope(k, cos, sin);
    // Query head h reads KV head h / group (HF repeat_kv); folding the group into the query
    // axis lets one matmul per KV head serve all its query heads without copying K/V.
    // baddbmm fuses the scale and the mask add: at long contexts the [G*T, T] score tensors,
    // not the matmuls, dominate training time.
    auto qg = q.reshape({batch * kv_heads, group * len, hd});
    auto kt = k.reshape({batch * kv_heads, len, hd}).transpose(1, 2);
    auto scores = torch::baddbmm(mask, qg, kt, /*beta=*/1, /*alpha=*/scale);  // [B*KVH, G*T, T]
    auto probs = torch::softmax(scores, -1, torch::kFloat32).to(options_.compute_dtype);
    auto attn = torch::bmm(probs, v.reshape({batch * kv_heads, len, hd}));
    attn = attn.view({batch, heads, len, hd}).transpose(1, 2).reshape({batch, len, heads * hd});
    x = x + Linear(attn, l.o, l.o_bias);
    x = x + Mlp(l, x);
  }
  return LmHead(x);
}

StatusOr<std::vector<PagedSeqOutput>> LlamaModel::ForwardPaged(
    const std::vector<PagedSeqInput>& inputs, KvTensors& kv) const {
  const auto& c = config_;
  const KvTensorsOptions& kvo = kv.options();
  if (kvo.num_layers != c.num_hidden_layers || kvo.num_kv_heads != c.num_key_value_heads ||
      kvo.head_dim != c.head_dim) {
    return InvalidArgumentError("ForwardPaged: KvTensors shape does not match the model");
  }
  // CSR over the batch: query rows (new tokens) and keys (context, then new) per sequence.
  std::vector<int64_t> all_tokens, all_positions, all_writes;
  std::vector<int64_t> q_offsets = {0}, key_offsets = {0}, key_slots, key_positions, num_signal;
  std::vector<uint8_t> want_signals;
  for (size_t s = 0; s < inputs.size(); ++s) {
    const PagedSeqInput& in = inputs[s];
    const std::string where = "ForwardPaged: input " + std::to_string(s) + ": ";
    if (in.tokens.empty()) return InvalidArgumentError(where + "no new tokens");
    if (in.positions.size() != in.tokens.size() || in.write_slots.size() != in.tokens.size()) {
      return InvalidArgumentError(where + "tokens, positions and write_slots differ in length");
    }
    if (c.sliding_window > 0 && in.context_positions.size() != in.context_slots.size()) {
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
    all_tokens.insert(all_tokens.end(), in.tokens.begin(), in.tokens.end());
    all_positions.insert(all_positions.end(), in.positions.begin(), in.positions.end());
    all_writes.insert(all_writes.end(), in.write_slots.begin(), in.write_slots.end());
    key_slots.insert(key_slots.end(), in.context_slots.begin(), in.context_slots.end());
    key_slots.insert(key_slots.end(), in.write_slots.begin(), in.write_slots.end());
    if (in.context_positions.size() == in.context_slots.size()) {
      key_positions.insert(key_positions.end(), in.context_positions.begin(),
                           in.context_positions.end());
    } else {  // No window: positions only order the keys.
      for (size_t i = 0; i < in.context_slots.size(); ++i) {
        key_positions.push_back(static_cast<int64_t>(i));
      }
    }
    key_positions.insert(key_positions.end(), in.positions.begin(), in.positions.end());
    q_offsets.push_back(static_cast<int64_t>(all_tokens.size()));
    key_offsets.push_back(static_cast<int64_t>(key_slots.size()));
    num_signal.push_back(std::clamp<int64_t>(in.obs_window, 1,
                                             static_cast<int64_t>(in.tokens.size())));
    want_signals.push_back(in.want_signals ? 1 : 0);
  }
  std::vector<PagedSeqOutput> outputs(inputs.size());
  if (inputs.empty()) return outputs;

  torch::NoGradGuard no_grad;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t group = heads / kv_heads, hd = c.head_dim;
  const int64_t total = static_cast<int64_t>(all_tokens.size());
  const int64_t num_keys = static_cast<int64_t>(key_slots.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto idx = torch::TensorOptions().dtype(torch::kInt64).device(options_.device);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(options_.device);
  auto write_index = torch::tensor(all_writes, idx);
  auto [cos, sin] = RopeCosSin(torch::tensor(all_positions, idx));
  const bool fused = options_.fused_cpu_attention && options_.device.is_cpu() &&
                     options_.compute_dtype == torch::kFloat32 && kvo.dtype == torch::kFloat32;
  // Signal accumulators over every key of the batch, summed across layers.
  std::vector<float> attn_sum(static_cast<size_t>(num_keys), 0.0f);
  std::vector<float> norm_sum(static_cast<size_t>(num_keys), 0.0f);

  // The torch reference path: per sequence, the gather index, the mask over the new queries
  // (causal, and the sliding window), unchanged across layers.
  struct SeqState {
    torch::Tensor gather, mask;
  };
  std::vector<SeqState> seqs;
  if (!fused) {
    seqs.resize(inputs.size());
    for (size_t s = 0; s < inputs.size(); ++s) {
      const int64_t k0 = key_offsets[s], keys = key_offsets[s + 1] - k0;
      const int64_t n = q_offsets[s + 1] - q_offsets[s], ctx = keys - n;
      seqs[s].gather = torch::tensor(
          std::vector<int64_t>(key_slots.begin() + k0, key_slots.begin() + k0 + keys), idx);
      const float neg_inf = -std::numeric_limits<float>::infinity();
      auto mask = torch::zeros({n, keys}, f32);
      if (n > 1) mask = torch::full({n, keys}, neg_inf, f32).triu(ctx + 1);
      if (c.sliding_window > 0) {
        auto kp = torch::tensor(
            std::vector<int64_t>(key_positions.begin() + k0, key_positions.begin() + k0 + keys),
            idx);
        auto qp = kp.narrow(0, ctx, n).unsqueeze(1);
        mask = mask.masked_fill((qp - kp.unsqueeze(0)) >= c.sliding_window, neg_inf);
      }
      if (n > 1 || c.sliding_window > 0) seqs[s].mask = mask;
    }
  }
  CpuAttentionBatch batch{.num_seqs = static_cast<int64_t>(inputs.size()),
                          .num_heads = heads,
                          .num_kv_heads = kv_heads,
                          .head_dim = hd,
                          .scale = static_cast<float>(scale),
                          .sliding_window = c.sliding_window,
                          .q_offsets = q_offsets.data(),
                          .key_offsets = key_offsets.data(),
                          .slots = key_slots.data(),
                          .key_positions = key_positions.data(),
                          .num_signal = num_signal.data(),
                          .want_signals = want_signals.data(),
                          .attn_sum = attn_sum.data(),
                          .norm_sum = norm_sum.data()};

  auto x = Embed(torch::tensor(all_tokens, idx));  // [N, hidden]
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    auto h = RmsNorm(x, l.input_norm, c.rms_norm_eps);
    auto q = Linear(h, l.q, l.q_bias).view({total, heads, hd});
    auto k = Linear(h, l.k, l.k_bias).view({total, kv_heads, hd});
    auto v = Linear(h, l.v, l.v_bias).view({total, kv_heads, hd});
    q = ApplyRope(q, cos.unsqueeze(1), sin.unsqueeze(1));
    k = ApplyRope(k, cos.unsqueeze(1), sin.unsqueeze(1));
    kv.k(li).index_copy_(0, write_index, k.to(kvo.dtype));
    kv.v(li).index_copy_(0, write_index, v.to(kvo.dtype));

    torch::Tensor attn;
    if (fused) {
      q = q.contiguous();
      attn = torch::empty({total, heads * hd}, f32);
      batch.q = q.data_ptr<float>();
      batch.k_cache = kv.k(li).data_ptr<float>();
      batch.v_cache = kv.v(li).data_ptr<float>();
      batch.out = attn.data_ptr<float>();
      at::parallel_for(0, batch.num_seqs, 1, [&](int64_t begin, int64_t end) {
        CpuPagedAttention(batch, begin, end);
      });
    } else {
      std::vector<torch::Tensor> attn_out;
      attn_out.reserve(seqs.size());
      for (size_t s = 0; s < seqs.size(); ++s) {
        const SeqState& st = seqs[s];
        const int64_t k0 = key_offsets[s], keys = key_offsets[s + 1] - k0;
        const int64_t begin = q_offsets[s], n = q_offsets[s + 1] - begin;
        auto ks = kv.k(li).index_select(0, st.gather).to(options_.compute_dtype);  // [S, KVH, hd]
        auto vs = kv.v(li).index_select(0, st.gather).to(options_.compute_dtype);
        // [n, H, hd] -> [KVH, G*n, hd]: query head h reads KV head h / G (HF repeat_kv).
        auto qs = q.narrow(0, begin, n).view({n, kv_heads, group, hd}).permute({1, 2, 0, 3});
        qs = qs.reshape({kv_heads, group * n, hd});
        auto scores = torch::bmm(qs, ks.permute({1, 2, 0})) * scale;  // [KVH, G*n, S]
        scores = scores.view({kv_heads, group, n, keys});
        if (st.mask.defined()) scores = scores + st.mask;
        auto probs = torch::softmax(scores, -1, torch::kFloat32);  // [KVH, G, n, S]
        auto out = torch::bmm(probs.to(options_.compute_dtype).view({kv_heads, group * n, keys}),
                              vs.permute({1, 0, 2}));  // [KVH, G*n, hd]
        attn_out.push_back(
            out.view({kv_heads, group, n, hd}).permute({2, 0, 1, 3}).reshape({n, heads * hd}));
        if (!want_signals[s]) continue;
        auto a = probs.narrow(2, n - num_signal[s], num_signal[s]).sum({0, 1, 2}).cpu();
        auto nk = ks.to(torch::kFloat32).norm(2, -1).mean(-1).cpu();
        for (int64_t j = 0; j < keys; ++j) {
          attn_sum[k0 + j] += a.data_ptr<float>()[j];
          norm_sum[k0 + j] += nk.data_ptr<float>()[j];
        }
      }
      attn = attn_out.size() == 1 ? attn_out[0] : torch::cat(attn_out, 0);
    }
    x = x + Linear(attn.to(options_.compute_dtype), l.o, l.o_bias);
    x = x + Mlp(l, x);
  }

  std::vector<int64_t> last_rows;
  for (size_t s = 0; s < inputs.size(); ++s) last_rows.push_back(q_offsets[s + 1] - 1);
  auto logits = LmHead(x.index_select(0, torch::tensor(last_rows, idx))).to(torch::kFloat32).cpu();
  const float layers = static_cast<float>(c.num_hidden_layers);
  for (size_t s = 0; s < inputs.size(); ++s) {
    PagedSeqOutput& out = outputs[s];
    out.last_logits = logits[s];
    if (!want_signals[s]) continue;
    const int64_t k0 = key_offsets[s], keys = key_offsets[s + 1] - k0;
    const float attn_div = layers * static_cast<float>(heads * num_signal[s]);
    out.attn.resize(static_cast<size_t>(keys));
    out.key_norm.resize(static_cast<size_t>(keys));
    for (int64_t j = 0; j < keys; ++j) {
      out.attn[j] = attn_sum[k0 + j] / attn_div;
      out.key_norm[j] = norm_sum[k0 + j] / layers;
    }
  }
  return outputs;
}

Status LlamaModel::Save(const std::string& dir) const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> keep_alive;
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : NamedParameters()) {
    keep_alive.push_back(t.detach().to(torch::kCPU, torch::kFloat32).contiguous());
    const torch::Tensor& cpu = keep_alive.back();
    tensors.push_back({name, DType::kF32,
                       std::vector<int64_t>(cpu.sizes().begin(), cpu.sizes().end()),
                       cpu.data_ptr()});
  }
  ModelConfig config = config_;
  config.torch_dtype = "float32";
  VTOKEN_RETURN_IF_ERROR(WriteConfigJson(dir + "/config.json", config));
  return WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace vtoken::model
