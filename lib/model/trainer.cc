#include "lib/model/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>

namespace vtoken::model {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Split {
  std::vector<int32_t> train;
  std::vector<std::vector<int32_t>> val_chunks;
};

Split SplitTokens(const std::vector<int32_t>& tokens, const TrainOptions& o) {
  Split split;
  if (o.val_fraction <= 0) {
    split.train = tokens;
    return split;
  }
  const int64_t every = std::max<int64_t>(2, std::llround(1.0 / o.val_fraction));
  const int64_t chunk = o.val_chunk_windows * o.context;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0, index = 0; begin < n; begin += chunk, ++index) {
    auto first = tokens.begin() + begin;
    auto last = tokens.begin() + std::min(n, begin + chunk);
    if (index % every == every - 1) {
      split.val_chunks.emplace_back(first, last);
    } else {
      split.train.insert(split.train.end(), first, last);
    }
  }
  return split;
}

// Row r of the batch: [bos, w0 .. w(c-2)] as input, [w0 .. w(c-1)] as target.
void FillRow(const int32_t* window, int64_t context, int32_t bos, int64_t* input, int64_t* target) {
  input[0] = bos;
  for (int64_t i = 0; i < context; ++i) {
    if (i + 1 < context) input[i + 1] = window[i];
    target[i] = window[i];
  }
}

torch::Tensor LossOf(const LlamaModel& model, const torch::Tensor& input,
                     const torch::Tensor& target,
                     torch::nn::functional::CrossEntropyFuncOptions options) {
  auto logits = model.ForwardDense(input);
  return torch::nn::functional::cross_entropy(
      logits.view({-1, logits.size(-1)}).to(torch::kFloat32), target.view({-1}), options);
}

}  // namespace

double ScheduledLr(const TrainOptions& o, int64_t step, double progress) {
  const double warm =
      o.warmup_steps > 0 ? std::min(1.0, static_cast<double>(step + 1) / o.warmup_steps) : 1.0;
  const double min_lr = o.lr * o.min_lr_ratio;
  const double p = std::clamp(progress, 0.0, 1.0);
  return warm * (min_lr + (o.lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
}

StatusOr<TrainResult> Train(LlamaModel& model, const TrainData& data, const TrainOptions& o,
                            const TrainCallbacks& callbacks) {
  if (o.context < 2 || o.batch < 1 || o.steps < 0 || o.val_chunk_windows < 1 || o.threads < 1 ||
      o.val_fraction < 0 || o.val_fraction >= 1) {
    return InvalidArgumentError(
        "train: context >= 2, batch >= 1, steps >= 0, threads >= 1 and "
        "0 <= val_fraction < 1 are required");
  }
  const int64_t vocab = model.config().vocab_size;
  if (static_cast<int64_t>(data.token_bytes.size()) != vocab) {
    return InvalidArgumentError("train: token_bytes has " +
                                std::to_string(data.token_bytes.size()) +
                                " entries but the vocabulary has " + std::to_string(vocab));
  }
  for (int32_t t : data.tokens) {
    if (t < 0 || t >= vocab) {
      return InvalidArgumentError("train: corpus token id " + std::to_string(t) +
                                  " outside the vocabulary");
    }
  }
  torch::set_num_threads(o.threads);
  Split split = SplitTokens(data.tokens, o);
  const int64_t context = o.context;
  if (static_cast<int64_t>(split.train.size()) < context) {
    return InvalidArgumentError("train: " + std::to_string(split.train.size()) +
                                " training tokens, fewer than one window of " +
                                std::to_string(context));
  }
  // Fixed validation windows, whole windows inside one held-out chunk.
  std::vector<const int32_t*> val_windows;
  for (const auto& chunk : split.val_chunks) {
    for (size_t b = 0; b + context <= chunk.size(); b += context) {
      if (static_cast<int64_t>(val_windows.size()) < o.eval_windows) {
        val_windows.push_back(chunk.data() + b);
      }
    }
  }
  if (o.val_fraction > 0 && val_windows.empty()) {
    return InvalidArgumentError("train: the held-out chunks hold no full validation window of " +
                                std::to_string(context) + " tokens");
  }

  TrainResult result;
  result.train_tokens = static_cast<int64_t>(split.train.size());
  for (const auto& chunk : split.val_chunks) result.val_tokens += chunk.size();
  for (const int32_t* w : val_windows) {
    for (int64_t i = 0; i < context; ++i) result.val_scored_bytes += data.token_bytes[w[i]];
  }
  result.val_scored_tokens = static_cast<int64_t>(val_windows.size()) * context;

  auto evaluate = [&]() -> std::pair<double, double> {
    if (val_windows.empty()) return {kNaN, kNaN};
    torch::NoGradGuard no_grad;
    double nats = 0;
    for (size_t b = 0; b < val_windows.size(); b += o.batch) {
      const int64_t rows = std::min<int64_t>(o.batch, val_windows.size() - b);
      auto input = torch::empty({rows, context}, torch::kInt64);
      auto target = torch::empty({rows, context}, torch::kInt64);
      for (int64_t r = 0; r < rows; ++r) {
        FillRow(val_windows[b + r], context, data.bos_id, input[r].data_ptr<int64_t>(),
                target[r].data_ptr<int64_t>());
      }
      nats += LossOf(model, input, target,
                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                  .item<double>();
    }
    return {nats / result.val_scored_tokens, nats / result.val_scored_bytes};
  };

  // Decay matrices only: scaling norm gains and biases toward 0 hurts and buys nothing.
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [name, t] : model.NamedParameters()) {
    t.set_requires_grad(true);
    (t.dim() >= 2 ? decay : no_decay).push_back(t);
  }
  auto adam = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adam(o.weight_decay));
  groups.emplace_back(no_decay, adam(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(o.lr));
  std::vector<torch::Tensor> params = decay;
  params.insert(params.end(), no_decay.begin(), no_decay.end());

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> offset_dist(0, result.train_tokens - context);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double max_seconds = o.max_minutes * 60.0;
  result.stop_reason = "steps";
  Status callback_status;
  for (int64_t step = 0; step < o.steps; ++step) {
    if (max_seconds > 0 && elapsed() >= max_seconds) {
      result.stop_reason = "time";
      break;
    }
    double progress = static_cast<double>(step) / o.steps;
    if (max_seconds > 0) progress = std::max(progress, elapsed() / max_seconds);
    const double lr = ScheduledLr(o, step, progress);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    auto input = torch::empty({o.batch, context}, torch::kInt64);
    auto target = torch::empty({o.batch, context}, torch::kInt64);
    for (int64_t r = 0; r < o.batch; ++r) {
      FillRow(split.train.data() + offset_dist(rng), context, data.bos_id,
              input[r].data_ptr<int64_t>(), target[r].data_ptr<int64_t>());
    }
    optimizer.zero_grad();
    auto loss = LossOf(model, input, target, torch::nn::functional::CrossEntropyFuncOptions());
    loss.backward();
    if (o.grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, o.grad_clip);
    optimizer.step();

    TrainLogRow row{step + 1, elapsed(), lr, loss.item<double>(), kNaN, kNaN};
    const bool last = step + 1 == o.steps;
    if ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last) {
      std::tie(row.val_loss, row.val_nats_per_byte) = evaluate();
      row.elapsed_s = elapsed();
    }
    result.log.push_back(row);
    result.steps_done = step + 1;
    if (callbacks.on_step) callbacks.on_step(row);
    if (!std::isnan(row.val_loss) && callbacks.on_eval) {
      callback_status = callbacks.on_eval(row);
      if (!callback_status.ok()) break;
    }
  }
  for (auto& t : params) {
    t.mutable_grad() = torch::Tensor();
    t.set_requires_grad(false);
  }
  VTOKEN_RETURN_IF_ERROR(callback_status);
  // A run stopped by time has not been evaluated at its last step yet.
  if (result.log.empty() || std::isnan(result.log.back().val_loss)) {
    auto [loss, per_byte] = evaluate();
    if (!result.log.empty()) {
      result.log.back().val_loss = loss;
      result.log.back().val_nats_per_byte = per_byte;
      if (callbacks.on_eval && !std::isnan(loss)) {
        VTOKEN_RETURN_IF_ERROR(callbacks.on_eval(result.log.back()));
      }
    }
  }
  if (!result.log.empty()) {
    result.final_val_loss = result.log.back().val_loss;
    result.final_val_nats_per_byte = result.log.back().val_nats_per_byte;
  } else {
    std::tie(result.final_val_loss, result.final_val_nats_per_byte) = evaluate();
  }
  return result;
}

}  // namespace vtoken::model
