// `vtoken-cli train`: trains a small Llama-architecture model from scratch on one text corpus and
// writes a Hugging Face-style model directory (config.json, model.safetensors, tokenizer.json)
// plus its training record (training_log.csv, TRAINING.md). The model is checkpointed at every
// evaluation, so an interrupted run still leaves a usable directory.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "lib/model/io/hf_config.h"
#include "lib/model/io/tokenizer.h"
#include "lib/model/llama.h"
#include "lib/model/trainer.h"

namespace vtoken::cli {
namespace {

struct TrainArgs {
  std::string corpus, tokenizer, out;
  int64_t layers = 4, hidden = 128, heads = 4, kv_heads = 2, intermediate = 352;
  uint64_t model_seed = 0;  // 0: same as --seed
  model::TrainOptions train;
  std::string command_line;
};

std::string FormatDouble(double v, int precision = 4) {
  if (std::isnan(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

Status WriteText(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.good()) return InvalidArgumentError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return InvalidArgumentError("cannot rename " + tmp + ": " + ec.message());
  return Status::Ok();
}

Status WriteLogCsv(const std::filesystem::path& path, const std::vector<model::TrainLogRow>& log) {
  std::ostringstream out;
  out << "step,elapsed_s,lr,train_loss,val_loss,val_nats_per_byte\n";
  for (const auto& r : log) {
    out << r.step << ',' << FormatDouble(r.elapsed_s, 1) << ',' << FormatDouble(r.lr, 6) << ','
        << FormatDouble(r.train_loss) << ',' << FormatDouble(r.val_loss) << ','
        << FormatDouble(r.val_nats_per_byte) << '\n';
  }
  return WriteText(path, out.str());
}

std::string TrainingRecord(const TrainArgs& a, const model::ModelConfig& config, int64_t num_params,
                           int64_t corpus_bytes, int64_t corpus_tokens, const model::TrainResult& r,
                           double wall_s) {
  const auto& o = a.train;
  std::ostringstream md;
  md << "# Training record\n\n"
     << "Produced by `vtoken-cli train` (apps/vtoken-cli/commands/torch_cmd_train.cc, "
        "lib/model/trainer.cc).\n\n"
     << "## Command\n\n```\n"
     << a.command_line << "\n```\n\n"
     << "## Model\n\n"
     << "Llama architecture, " << config.num_hidden_layers << " layers, hidden "
     << config.hidden_size << ", " << config.num_attention_heads << " heads / "
     << config.num_key_value_heads << " KV heads (head_dim " << config.head_dim << "), SwiGLU "
     << config.intermediate_size << ", vocab " << config.vocab_size
     << ", tied embeddings, rope_theta " << config.rope_theta << ", " << num_params
     << " parameters, fp32.\n\n"
     << "## Data\n\n"
     << "- corpus: `" << a.corpus << "`, " << corpus_bytes << " bytes, " << corpus_tokens
     << " tokens (" << FormatDouble(static_cast<double>(corpus_bytes) / corpus_tokens, 3)
     << " bytes/token)\n"
     << "- split: ";
  if (o.val_fraction > 0) {
    md << "the token stream is cut into chunks of " << o.val_chunk_windows * o.context
       << " tokens; every " << std::max<int64_t>(2, std::llround(1.0 / o.val_fraction))
       << "th chunk is held out (val_fraction " << o.val_fraction << "): ";
  } else {
    md << "none (val_fraction 0): ";
  }
  md << r.train_tokens << " training tokens, " << r.val_tokens << " held-out tokens\n"
     << "- training windows: " << o.context
     << " tokens at uniformly random offsets of the training stream, BOS prepended\n"
     << "- each evaluation scores the same " << r.val_scored_tokens << " held-out tokens ("
     << r.val_scored_bytes << " bytes)\n\n"
     << "## Optimization\n\n"
     << "AdamW (betas " << o.beta1 << "/" << o.beta2 << ", weight decay " << o.weight_decay
     << " on matrices), peak lr " << o.lr << ", " << o.warmup_steps << " warmup steps, cosine to "
     << o.min_lr_ratio * o.lr << " (progress = max(step/steps, time/max-minutes)), gradient clip "
     << o.grad_clip << ", batch " << o.batch << " x " << o.context << " tokens, seed " << o.seed
     << ", " << o.threads << " threads.\n\n"
     << "## Result\n\n"
     << "- steps: " << r.steps_done << " (stopped by " << r.stop_reason << "), wall clock "
     << FormatDouble(wall_s / 60, 1) << " min, " << r.steps_done * o.batch * o.context
     << " training tokens seen\n"
     << "- final validation loss: " << FormatDouble(r.final_val_loss) << " nats/token, "
     << FormatDouble(r.final_val_nats_per_byte) << " nats/byte\n\n"
     << "## Curve (evaluations)\n\n"
     << "| step | minutes | lr | train loss | val nats/token | val nats/byte |\n"
     << "|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& row : r.log) {
    if (std::isnan(row.val_loss)) continue;
    md << "| " << row.step << " | " << FormatDouble(row.elapsed_s / 60, 1) << " | "
       << FormatDouble(row.lr, 5) << " | " << FormatDouble(row.train_loss) << " | "
       << FormatDouble(row.val_loss) << " | " << FormatDouble(row.val_nats_per_byte) << " |\n";
  }
  md << "\nThe full per-step log is training_log.csv.\n";
  return md.str();
}

int RunTrain(const TrainArgs& a) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", message.c_str());
    return 1;
  };
  auto tokenizer = model::Tokenizer::Load(a.tokenizer);
  if (!tokenizer.ok()) return fail(tokenizer.status().message());
  if (!tokenizer->bos_id() || !tokenizer->eos_id()) {
    return fail(a.tokenizer + ": the tokenizer defines no BOS or no EOS token");
  }
  std::ifstream in(a.corpus, std::ios::binary);
  if (!in) return fail("cannot read corpus " + a.corpus);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  model::TrainData data;
  data.tokens = tokenizer->Encode(text);
  data.bos_id = *tokenizer->bos_id();
  const int32_t vocab = tokenizer->vocab_size();
  for (int32_t id = 0; id < vocab; ++id) {
    data.token_bytes.push_back(static_cast<int64_t>(tokenizer->Decode({&id, 1}).size()));
  }
  std::printf("corpus %s: %zu bytes, %zu tokens\n", a.corpus.c_str(), text.size(),
              data.tokens.size());

  model::ModelConfig config;
  config.model_type = "llama";
  config.vocab_size = vocab;
  config.hidden_size = a.hidden;
  config.intermediate_size = a.intermediate;
  config.num_hidden_layers = a.layers;
  config.num_attention_heads = a.heads;
  config.num_key_value_heads = a.kv_heads;
  config.head_dim = a.heads > 0 ? a.hidden / a.heads : 0;
  config.max_position_embeddings = a.train.context;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 10000.0;
  config.tie_word_embeddings = true;
  config.bos_token_ids = {*tokenizer->bos_id()};
  config.eos_token_ids = {*tokenizer->eos_id()};
  config.torch_dtype = "float32";
  if (a.heads <= 0 || a.hidden % a.heads != 0) {
    return fail("--hidden must be a positive multiple of --heads");
  }
  auto model =
      model::LlamaModel::RandomInit(config, a.model_seed != 0 ? a.model_seed : a.train.seed);
  if (!model.ok()) return fail(model.status().message());
  std::printf("model: %lld parameters\n", static_cast<long long>(model->NumParameters()));

  const std::filesystem::path out(a.out);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return fail("cannot create " + a.out + ": " + ec.message());
  const auto tokenizer_dst = out / "tokenizer.json";
  if (!std::filesystem::exists(tokenizer_dst)) {
    if (tokenizer->template_bos_id() == tokenizer->bos_id()) {
      std::filesystem::copy_file(a.tokenizer, tokenizer_dst, ec);
      if (ec)
        return fail("cannot copy tokenizer to " + tokenizer_dst.string() + ": " + ec.message());
    } else {
      // The model is trained with BOS: its tokenizer's post_processor must add it, so Hugging
      // Face encodes prompts as the workbench does.
      model::TokenizerSpec spec = tokenizer->spec();
      for (const model::AddedToken& t : spec.added_tokens) {
        if (t.id == *tokenizer->bos_id()) spec.bos_token = t.content;
      }
      StatusOr<model::Tokenizer> with_bos = model::Tokenizer::Create(std::move(spec));
      Status saved = with_bos.ok() ? with_bos->Save(tokenizer_dst.string()) : with_bos.status();
      if (!saved.ok()) return fail(saved.message());
    }
  }

  std::vector<model::TrainLogRow> log;
  model::TrainCallbacks callbacks;
  callbacks.on_step = [&](const model::TrainLogRow& row) {
    log.push_back(row);
    if (row.step <= 5 || row.step % 10 == 0 || !std::isnan(row.val_loss)) {
      std::printf("step %lld  %.1fs  lr %.5f  train %.4f", static_cast<long long>(row.step),
                  row.elapsed_s, row.lr, row.train_loss);
      if (!std::isnan(row.val_loss)) {
        std::printf("  val %.4f nats/token %.4f nats/byte", row.val_loss, row.val_nats_per_byte);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  };
  callbacks.on_eval = [&](const model::TrainLogRow&) -> Status {
    VTOKEN_RETURN_IF_ERROR(model->Save(a.out));
    return WriteLogCsv(out / "training_log.csv", log);
  };
  const auto start = std::chrono::steady_clock::now();
  auto result = model::Train(*model, data, a.train, callbacks);
  if (!result.ok()) return fail(result.status().message());
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The trainer may fill in the last row's validation after on_step saw it.
  Status status = model->Save(a.out);
  if (status.ok()) status = WriteLogCsv(out / "training_log.csv", result->log);
  if (status.ok()) {
    status = WriteText(
        out / "TRAINING.md",
        TrainingRecord(a, config, model->NumParameters(), static_cast<int64_t>(text.size()),
                       static_cast<int64_t>(data.tokens.size()), *result, wall_s));
  }
  if (!status.ok()) return fail(status.message());
  std::printf("done: %lld steps (%s), val %.4f nats/token %.4f nats/byte -> %s\n",
              static_cast<long long>(result->steps_done), result->stop_reason.c_str(),
              result->final_val_loss, result->final_val_nats_per_byte, a.out.c_str());
  return 0;
}

CLI::App* SetupTrain(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a small Llama model on a text corpus");
  cmd->add_option("--corpus", args->corpus, "UTF-8 text file")->required();
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json (BOS/EOS required)")->required();
  cmd->add_option("--out", args->out, "output model directory")->required();
  cmd->add_option("--layers", args->layers, "decoder layers")->capture_default_str();
  cmd->add_option("--hidden", args->hidden, "hidden size")->capture_default_str();
  cmd->add_option("--heads", args->heads, "attention heads")->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads, "key/value heads")->capture_default_str();
  cmd->add_option("--intermediate", args->intermediate, "SwiGLU width")->capture_default_str();
  auto& t = args->train;
  cmd->add_option("--context", t.context, "tokens per training window")->capture_default_str();
  cmd->add_option("--batch", t.batch, "windows per step")->capture_default_str();
  cmd->add_option("--steps", t.steps, "optimizer steps")->capture_default_str();
  cmd->add_option("--max-minutes", t.max_minutes, "wall-clock limit (0: none)")
      ->capture_default_str();
  cmd->add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr-ratio", t.min_lr_ratio, "final lr / peak lr")->capture_default_str();
  cmd->add_option("--warmup", t.warmup_steps, "warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", t.weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--grad-clip", t.grad_clip, "max gradient norm")->capture_default_str();
  cmd->add_option("--seed", t.seed, "seed for data order and init")->capture_default_str();
  cmd->add_option("--model-seed", args->model_seed, "init seed (0: --seed)");
  cmd->add_option("--val-fraction", t.val_fraction, "held-out share of the corpus")
      ->capture_default_str();
  cmd->add_option("--eval-every", t.eval_every, "evaluate every N steps")->capture_default_str();
  cmd->add_option("--eval-windows", t.eval_windows, "validation windows per evaluation")
      ->capture_default_str();
  cmd->add_option("--threads", t.threads, "torch threads")->capture_default_str();
  cmd->callback([args, cmd] {
    std::ostringstream line;
    line << "vtoken-cli train";
    for (const auto* opt : cmd->get_options()) {
      if (opt->count() == 0 || opt->get_name() == "--help") continue;
      for (const auto& value : opt->results()) line << ' ' << opt->get_name() << ' ' << value;
    }
    args->command_line = line.str();
    SetExitCode(RunTrain(*args));
  });
  return cmd;
}

VTOKEN_REGISTER_COMMAND("train", SetupTrain);

}  // namespace
}  // namespace vtoken::cli
