// Trainer: next-token training of a LlamaModel on one tokenized corpus with torch's autograd and
// AdamW (decoupled weight decay on matrices only), linear warmup + cosine decay, and gradient-norm
// clipping.
//
// Data: the token stream is cut into chunks of `val_chunk_windows * context` tokens; every
// round(1 / val_fraction)-th chunk (the last of each group) is held out for validation, the rest
// are concatenated into the training stream. A training example is `context` consecutive tokens
// at a uniformly random offset of the training stream, fed as [bos, t0 .. t(c-2)] with targets
// [t0 .. t(c-1)], so the model also learns to start from BOS at any point of the text, which is
// how prompts reach it at inference. Validation uses the same format on non-overlapping windows
// of the held-out chunks (the first `eval_windows` of them), so every evaluation scores the same
// tokens.
//
// Schedule: progress = max(step / steps, elapsed / max_minutes) drives the cosine, so a run cut
// short by the wall-clock limit still ends annealed at min_lr.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/llama.h"

namespace vtoken::model {

struct TrainOptions {
  int64_t context = 1024;     // Tokens per training window (targets per row).
  int64_t batch = 8;          // Windows per optimizer step.
  int64_t steps = 1000;       // Stop after this many optimizer steps ...
  double max_minutes = 0;     // ... or this much wall-clock time (0: no limit).
  double lr = 3e-3;           // Peak learning rate.
  double min_lr_ratio = 0.1;  // Final learning rate as a fraction of `lr`.
  int64_t warmup_steps = 30;  // Linear warmup from lr / warmup_steps to lr.
  double weight_decay = 0.1;  // AdamW decay, applied to 2-D weights only.
  double beta1 = 0.9, beta2 = 0.95;
  double grad_clip = 1.0;         // Max global gradient L2 norm (0: no clipping).
  uint64_t seed = 1;              // Window sampling (model init is seeded by the caller).
  double val_fraction = 0.05;     // Share of chunks held out (0: no validation).
  int64_t val_chunk_windows = 4;  // Chunk length in windows; see the header comment.
  int64_t eval_every = 50;        // Evaluate every N steps and at the end (0: only at the end).
  int64_t eval_windows = 24;      // Validation windows scored per evaluation (at most).
  int threads = 2;                // torch intra-op threads.
};

struct TrainData {
  std::vector<int32_t> tokens;       // The whole corpus, tokenized once (no BOS inside).
  std::vector<int64_t> token_bytes;  // Per vocabulary id: UTF-8 bytes it decodes to.
  int32_t bos_id = 0;                // Prepended to every window.
};

// One row of training_log.csv. Validation fields are NaN where no evaluation happened.
struct TrainLogRow {
  int64_t step = 0;  // Optimizer steps completed.
  double elapsed_s = 0;
  double lr = 0;
  double train_loss = 0;  // nats/token of this step's batch.
  double val_loss = 0;    // nats/token.
  double val_nats_per_byte = 0;
};

struct TrainResult {
  std::vector<TrainLogRow> log;
  int64_t steps_done = 0;
  std::string stop_reason;                                 // "steps" or "time".
  int64_t train_tokens = 0, val_tokens = 0;                // Sizes of the two streams.
  int64_t val_scored_tokens = 0, val_scored_bytes = 0;     // What each evaluation scores.
  double final_val_loss = 0, final_val_nats_per_byte = 0;  // NaN without validation.
};

struct TrainCallbacks {
  // After every step (the row of that step, with validation filled in when it ran).
  std::function<void(const TrainLogRow&)> on_step;
  // After every evaluation, e.g. to checkpoint. A non-OK status stops training with it.
  std::function<Status(const TrainLogRow&)> on_eval;
};

// Trains `model` in place. Returns InvalidArgument when the corpus is too small for one training
// window (or, with val_fraction > 0, one validation window) or an option is out of range.
StatusOr<TrainResult> Train(LlamaModel& model, const TrainData& data, const TrainOptions& options,
                            const TrainCallbacks& callbacks = {});

// Learning rate at `step` (0-based) given the schedule progress in [0, 1]; see header comment.
double ScheduledLr(const TrainOptions& options, int64_t step, double progress);

}  // namespace vtoken::model
