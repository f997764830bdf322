#include "lib/model/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <span>
#include <tuple>

#include "lib/model/cpu_bf16.h"
#include "lib/model/io/checkpoint.h"
#include "lib/model/io/gguf_model.h"
#include "lib/model/io/safetensors.h"
#include "lib/model/io/tokenizer.h"
#include "lib/model/llama_ops.h"

namespace vtoken::model {
namespace {

using internal::ApplyRope;
using internal::Linear;

std::string LayerName(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
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

// A layer's linear weights with their names in the checkpoint and the StoredWeight each may
// keep beside it (LlamaModel::Layer, deduced: the type is private).
template <typename L>
auto LinearWeights(L& l) {
  return std::array<std::tuple<const char*, decltype(&l.q), decltype(&l.q_stored)>, 7>{
      {{"self_attn.q_proj.weight", &l.q, &l.q_stored},
       {"self_attn.k_proj.weight", &l.k, &l.k_stored},
       {"self_attn.v_proj.weight", &l.v, &l.v_stored},
       {"self_attn.o_proj.weight", &l.o, &l.o_stored},
       {"mlp.gate_proj.weight", &l.gate, &l.gate_stored},
       {"mlp.up_proj.weight", &l.up, &l.up_stored},
       {"mlp.down_proj.weight", &l.down, &l.down_stored}}};
}

// The fused CPU path that weights kept beside the fp32 ones (`what`) are read by.
Status CheckFusedCpuPath(const LlamaOptions& options, const std::string& what) {
  const torch::Dtype kv_dtype = options.kv_dtype.value_or(options.compute_dtype);
  if (!options.device.is_cpu() || options.compute_dtype != torch::kFloat32 ||
      !options.fused_cpu_attention || (kv_dtype != torch::kFloat32 && kv_dtype != torch::kHalf)) {
    return InvalidArgumentError(what +
                                " need the fused CPU path: device cpu, dtype float32, KV float32 "
                                "or float16");
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
  // Drawn on the target device by a generator of that device seeded with `seed` (never drawn on
  // the CPU and copied): the same seed gives the same weights on the same device type. Each
  // tensor is drawn in fp32 and cast at once, so a bf16 model's weights are the fp32 model's
  // rounded, and the fp32 draw never holds more than one tensor.
  at::Generator gen = options.device.is_cpu()
                          ? at::detail::createCPUGenerator(seed)
                          : at::globalContext().defaultGenerator(options.device).clone();
  gen.set_current_seed(seed);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(options.device);
  auto topt = f32.dtype(options.compute_dtype);
  auto normal = [&](std::vector<int64_t> shape) {
    return at::normal(0.0, 0.02, shape, gen, f32).to(options.compute_dtype);
  };
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
    // one tensor at a time, each moved to the device at once, so host memory never holds more
    // than the largest tensor in fp32.
    auto t = torch::empty(view->shape, torch::kFloat32);
    VTOKEN_RETURN_IF_ERROR(ConvertToFloat(*view, std::span<float>(t.data_ptr<float>(), t.numel())));
    tensors.emplace_back(spec.name, t.to(options.device, options.compute_dtype));
  }
  // The BOS a prompt starts with is the tokenizer's (its post-processor template), as Hugging Face
  // encodes it; config.json's bos_token_id only when the directory has no tokenizer.
  ModelConfig config = checkpoint.config();
  VTOKEN_ASSIGN_OR_RETURN(config.bos_token_ids, PromptBosTokenIds(dir, config));
  return FromNamedTensors(config, tensors, options);
}

StatusOr<LlamaModel> LlamaModel::FromGguf(const std::string& path, const LlamaOptions& options) {
  VTOKEN_ASSIGN_OR_RETURN(GgufCheckpoint checkpoint, GgufCheckpoint::Open(path));
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const TensorSpec& spec : RequiredTensors(checkpoint.config())) {
    // One tensor at a time, moved to the device at once, as FromDirectory does.
    auto t = torch::empty(spec.shape, torch::kFloat32);
    VTOKEN_RETURN_IF_ERROR(
        checkpoint.Read(spec.name, std::span<float>(t.data_ptr<float>(), t.numel())));
    tensors.emplace_back(spec.name, t.to(options.device, options.compute_dtype));
  }
  VTOKEN_ASSIGN_OR_RETURN(LlamaModel model,
                          FromNamedTensors(checkpoint.config(), tensors, options));
  if (!options.weights_as_stored) {
    if (options.q8_activations)
      return InvalidArgumentError("q8 activations need weights as_stored");
    return model;
  }
  VTOKEN_RETURN_IF_ERROR(CheckFusedCpuPath(options, "weights as_stored"));
  // Each linear weight the fused kernels can read as stored; the others stay fp32 only.
  auto keep = [&](const std::string& name, const torch::Tensor& fp32, StoredWeight& out) -> Status {
    VTOKEN_ASSIGN_OR_RETURN(GgufCheckpoint::Stored stored, checkpoint.ReadStored(name));
    if (!CpuQuantLinearSupports(stored.type)) return Status::Ok();
    if (!options.q8_activations) {
      out = {stored.type, std::move(stored.bytes)};
      return Status::Ok();
    }
    out = {stored.type, PackStoredQ8(stored.type, stored.bytes, fp32.size(0), fp32.size(1)),
           StoredDot::kQ8};
    return Status::Ok();
  };
  for (int64_t i = 0; i < static_cast<int64_t>(model.layers_.size()); ++i) {
    for (const auto& [name, fp32, out] : LinearWeights(model.layers_[i])) {
      VTOKEN_RETURN_IF_ERROR(keep(LayerName(i, name), *fp32, *out));
    }
  }
  VTOKEN_RETURN_IF_ERROR(
      keep(model.config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
           model.lm_head_, model.lm_head_stored_));
  return model;
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
  return options_.bf16_weights ? KeepBf16Weights() : Status::Ok();
}

Status LlamaModel::KeepBf16Weights() {
  if (options_.weights_as_stored) {
    return InvalidArgumentError("weights bfloat16 and as_stored exclude each other");
  }
  VTOKEN_RETURN_IF_ERROR(CheckFusedCpuPath(options_, "weights bfloat16"));
  std::vector<std::pair<const torch::Tensor*, StoredWeight*>> weights;
  for (Layer& l : layers_) {
    for (const auto& [name, w, out] : LinearWeights(l)) weights.emplace_back(w, out);
  }
  weights.emplace_back(&lm_head_, &lm_head_stored_);
  for (const auto& [w, out] : weights) {
    if (w->size(1) % 2 != 0) {
      return InvalidArgumentError("weights bfloat16 need even input widths; a linear weight has " +
                                  std::to_string(w->size(1)));
    }
    *out = {GgmlType::kBF16, PackBf16(w->data_ptr<float>(), w->size(0), w->size(1)),
            StoredDot::kBf16};
  }
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

int64_t LlamaModel::StoredWeightBytes() const {
  int64_t n = static_cast<int64_t>(lm_head_stored_.bytes.size());
  for (const Layer& l : layers_) {
    for (const auto& [name, w, stored] : LinearWeights(l)) {
      n += static_cast<int64_t>(stored->bytes.size());
    }
  }
  return n;
}

KvTensorsOptions LlamaModel::KvOptions(int64_t num_slots, Granularity granularity) const {
  KvTensorsOptions o;
  o.granularity = granularity;
  o.num_layers = config_.num_hidden_layers;
  o.num_slots = num_slots;
  o.num_kv_heads = config_.num_key_value_heads;
  o.head_dim = config_.head_dim;
  o.dtype = options_.kv_dtype.value_or(options_.compute_dtype);
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
