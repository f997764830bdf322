// `vtoken-cli generate`: one prompt through a real model and the virtualized paged KV cache,
// optionally with an eviction policy under a token budget, or with --drop: exactly the listed
// positions evicted right after prefill (the `drop` policy).
//
// Output (--output): text (default) the prompt and the continuation as bytes, special tokens
// left out; ids the generated token ids; json the prompt and output ids, the text and the
// eviction / relocation counts. The run's figures go to stderr.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/cli_checks.h"
#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/key_flags.h"
#include "apps/vtoken-cli/config/config_keys.h"
#include "apps/vtoken-cli/run/model_threads.h"
#include "apps/vtoken-cli/run/run_spec.h"
#include "lib/core/memory_budget.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/engine/engine.h"
#include "lib/engine/workload.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_threads.h"
#include "lib/model/io/model_files.h"
#include "lib/model/io/tokenizer.h"
#include "lib/model/llama_runner.h"
#include "lib/model/torch_device.h"

namespace vtoken::cli {
namespace {

struct GenerateArgs {
  std::string model = "models/vt-tiny";
  std::string prompt;
  bool chat = false;
  int64_t max_tokens = 64;
  std::string policy;
  std::vector<std::string> policy_params;
  int64_t budget = 0;
  int64_t num_sink = 4;
  int64_t num_recent = -1;  // -1: min(32, (budget - sink) / 2)
  int64_t evict_interval = EvictorOptions{}.evict_interval;
  std::string drop;
  std::string mode;
  std::string output = "text";
  int32_t block_size = 16;
  double temperature = 0;
  double top_p = 1.0;
  uint64_t seed = 1;
  bool stop_at_eos = true;
  std::string device = "cpu";
  std::string dtype = "float32";
  std::string weights = "float32";
  std::string kv_dtype = "auto";
  std::string granularity = "token";
  bool cuda_graphs = false;
  int threads = 0;  // 0: every CPU this process may use.
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "vtoken-cli: error: %s\n", message.c_str());
  return 1;
}

// "3,4,9" -> {3, 4, 9}: distinct non-negative positions below `limit`.
StatusOr<std::vector<int64_t>> ParseDrop(const std::string& text, int64_t limit) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    if (item.empty() || item.size() > 10 || item.find_first_not_of("0123456789") != item.npos) {
      return InvalidArgumentError("--drop '" + text +
                                  "': expected comma-separated positions, e.g. 3,4,9");
    }
    const int64_t p = std::stoll(item);
    if (p >= limit) {
      return InvalidArgumentError("--drop " + item + ": the prompt has positions 0.." +
                                  std::to_string(limit - 1));
    }
    if (!seen.insert(p).second) return InvalidArgumentError("--drop lists " + item + " twice");
    out.push_back(p);
    start = end + 1;
  }
  return out;
}

int RunGenerate(const GenerateArgs& a) {
  const bool dropping = !a.drop.empty();
  if (dropping && (!a.policy.empty() || a.budget != 0)) {
    return Fail("--drop chooses the evicted tokens itself: drop --policy and --budget");
  }
  if (a.policy.empty() != (a.budget == 0) && !dropping) {
    return Fail("--policy and --budget go together");
  }
  if (!a.policy_params.empty() && a.policy.empty()) return Fail("--policy-param needs --policy");
  const bool evicting = dropping || !a.policy.empty();
  std::string mode_name = a.mode.empty() ? (evicting ? "vtoken" : "native") : a.mode;
  StatusOr<Mode> mode = ParseMode(mode_name);
  if (!mode.ok()) return Fail(mode.status().message());
  if (*mode != Mode::kNative && !evicting) {
    return Fail("mode " + mode_name + " evicts tokens: give --policy and --budget, or --drop");
  }
  if (*mode == Mode::kNative && evicting) {
    return Fail("mode native does not evict: use --mode naive|vtoken");
  }
  RawParams params;
  if (!a.policy.empty()) {
    StatusOr<const PolicyInfo*> info = FindPolicy(a.policy);
    if (!info.ok()) return Fail(info.status().message());
    StatusOr<RawParams> raw = ParseParamAssignments(a.policy, (*info)->params, a.policy_params);
    if (!raw.ok()) return Fail(raw.status().message());
    params = std::move(*raw);
  }
  if (a.model.rfind("synthetic:", 0) == 0 || a.model.rfind("sim:", 0) == 0) {
    return Fail("synthetic models have no tokenizer: generate needs a model directory or file");
  }
  // Errors start with `device "..."` / `dtype "..."`: "--" makes them name the flag.
  StatusOr<model::LlamaOptions> options = model::LlamaOptionsFor(a.device, a.dtype);
  if (!options.ok()) return Fail("--" + options.status().message());
  if (Status s = model::ApplyWeightsName(a.weights, *options); !s.ok()) {
    return Fail("--" + s.message());
  }
  if (a.kv_dtype != "auto") {
    StatusOr<torch::Dtype> kv = model::TorchDtype(a.kv_dtype);
    if (!kv.ok()) return Fail("--kv-dtype: " + kv.status().message());
    options->kv_dtype = *kv;
  }
  if (a.cuda_graphs && !options->device.is_cuda()) {
    return Fail("--cuda-graphs needs --device cuda (got --device " + a.device + ")");
  }
  StatusOr<int> threads = model::SetCpuThreads(static_cast<int>(ModelThreads(a.threads)));
  if (!threads.ok()) return Fail("--" + threads.status().message());
  if (Status isa = model::ApplyCpuIsaEnvironment(); !isa.ok()) return Fail(isa.message());
  StatusOr<Granularity> granularity = ParseGranularity(a.granularity);
  if (!granularity.ok()) return Fail("--granularity: " + granularity.status().message());
  StatusOr<model::ModelConfig> config = model::ReadModelConfig(a.model);
  if (!config.ok()) return Fail(config.status().message());
  StatusOr<model::Tokenizer> tokenizer = model::LoadModelTokenizer(a.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status().message());
  const int64_t bos = model::PromptBosId(&*tokenizer, *config) ? 1 : 0;
  // --chat: the prompt as the model's chat template renders one user turn (special tokens in it
  // are parsed, as llama.cpp does with a rendered template).
  std::string prompt_text = a.prompt;
  if (a.chat) {
    StatusOr<model::ChatTemplate> chat = model::LoadModelChatTemplate(a.model);
    if (!chat.ok()) return Fail("--chat: " + chat.status().message());
    const model::ChatWrap wrap = model::ChatWrapFor(*chat, bos == 1);
    prompt_text = wrap.before + a.prompt + wrap.after;
  }
  const std::vector<int32_t> prompt = tokenizer->Encode(prompt_text);
  if (prompt.empty()) return Fail("--prompt encodes to no tokens");

  // Everything that can be refused is refused before the weights and KV tensors exist.
  const int64_t positions = static_cast<int64_t>(prompt.size()) + bos;
  if (positions + a.max_tokens > config->max_position_embeddings) {
    return Fail("--max-tokens " + std::to_string(a.max_tokens) + ": the prompt's " +
                std::to_string(positions) + " positions plus the tokens to generate exceed the " +
                "model's context (" + std::to_string(config->max_position_embeddings) + ")");
  }
  if (a.budget > positions + a.max_tokens) {
    return Fail("--budget " + std::to_string(a.budget) + " is more than the " +
                std::to_string(positions + a.max_tokens) + " tokens this generation holds");
  }
  engine::EngineOptions o;
  o.mode = *mode;
  o.pool.block_size = a.block_size;
  const int64_t total = positions + a.max_tokens;
  o.pool.headroom_blocks = 2;
  o.pool.num_blocks = static_cast<int32_t>((total + a.block_size - 1) / a.block_size) + 4;
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.max_num_seqs = 1;
  o.stop_at_eos = a.stop_at_eos;
  o.sampling = {.temperature = a.temperature, .top_p = a.top_p, .seed = a.seed};
  o.seed = a.seed;
  std::vector<int64_t> dropped;
  if (dropping) {
    StatusOr<std::vector<int64_t>> d = ParseDrop(a.drop, positions);
    if (!d.ok()) return Fail(d.status().message());
    dropped = std::move(*d);
    if (static_cast<int64_t>(dropped.size()) == positions) {
      return Fail("--drop lists every position of the prompt: nothing would be left to attend to");
    }
    std::string list;
    for (int64_t p : dropped) list += (list.empty() ? "" : ",") + std::to_string(p);
    o.policy = "drop";
    o.policy_params = {{"positions", list}};
    // Once, right after prefill: the budget is what is left, and no later step evicts again.
    o.evictor = {.budget_tokens = positions - static_cast<int64_t>(dropped.size()),
                 .num_sink = 0,
                 .num_recent = 0,
                 .evict_interval = INT64_MAX};
  } else if (!a.policy.empty()) {
    o.policy = a.policy;
    o.policy_params = params;
    o.evictor = {};
    o.evictor.budget_tokens = a.budget;
    o.evictor.num_sink = std::min(a.num_sink, a.budget);
    o.evictor.num_recent = a.num_recent >= 0
                               ? a.num_recent
                               : std::min<int64_t>(32, (a.budget - o.evictor.num_sink) / 2);
    o.evictor.evict_interval = a.evict_interval;
  }
  // The pool above counts blocks of every layer and head; a layer / head run splits it into
  // blocks of one KV group (the same bytes).
  const int64_t kv_bytes = SaturatingMul(
      SaturatingMul(int64_t{o.pool.num_blocks} * o.pool.block_size,
                    2 * static_cast<int64_t>(c10::elementSize(options->compute_dtype)) *
                        config->num_hidden_layers),
      config->num_key_value_heads * config->head_dim);
  StatusOr<RunSpec> spec = MakeRunSpec(o, *granularity, &*config, {{o.mode}});
  if (!spec.ok()) return Fail("--granularity " + a.granularity + ": " + spec.status().message());
  // Host memory; a CUDA device's KV cache is its own.
  Status fits =
      options->device.is_cpu()
          ? CheckMemory(kv_bytes, "--max-tokens " + std::to_string(a.max_tokens) + ": the KV cache")
          : Status::Ok();
  if (!fits.ok()) return Fail(fits.message());

  StatusOr<model::LlamaModel> loaded = model::LoadModel(a.model, a.seed, *options);
  if (!loaded.ok()) return Fail(loaded.status().message());
  StatusOr<std::unique_ptr<model::LlamaRunner>> runner = model::LlamaRunner::Create(
      std::move(*loaded),
      {.num_slots = spec->num_slots,
       .granularity = *granularity,
       .decode = a.cuda_graphs ? model::DecodeMode::kCudaGraphs : model::DecodeMode::kEager});
  if (!runner.ok()) return Fail(runner.status().message());
  engine::Request request;
  request.id = 0;
  request.prompt = prompt_text;
  request.prompt_tokens = prompt;
  request.max_tokens = a.max_tokens;
  StatusOr<engine::EngineResult> result = engine::RunEngine(spec->runs[0], **runner, {request});
  if (!result.ok()) return Fail(result.status().message());
  const engine::RequestResult& r = result->requests[0];
  const std::string text = tokenizer->Decode(r.output_tokens, /*skip_special=*/true);
  if (a.output == "text") {
    // fwrite: the bytes exactly, a NUL included. A chat prints the answer alone.
    if (!a.chat) std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } else if (a.output == "ids") {
    for (size_t i = 0; i < r.output_tokens.size(); ++i) {
      std::printf("%s%d", i ? " " : "", r.output_tokens[i]);
    }
    std::printf("\n");
  } else {
    nlohmann::json j = {
        {"model", a.model},
        {"mode", ModeName(o.mode)},
        {"device", a.device},
        {"dtype", a.dtype},
        {"weights", a.weights},
        {"kv_dtype", a.kv_dtype},
        {"granularity", a.granularity},
        {"chat", a.chat},
        {"cuda_graphs", a.cuda_graphs},
        {"threads", torch::get_num_threads()},
        {"kv_groups", result->kv_groups},
        {"policy", evicting ? o.policy : ""},
        {"prompt_ids", prompt},
        {"bos", (*runner)->bos_token_id() ? nlohmann::json(*(*runner)->bos_token_id())
                                          : nlohmann::json(nullptr)},
        {"output_ids", r.output_tokens},
        {"text", text},
        {"dropped", dropped},
        {"evictions", result->evictions},
        {"relocations", result->plans},
        {"tokens_moved", result->moves},
        {"blocks_reclaimed", result->blocks_reclaimed}};
    const std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  }
  const char* unit = *granularity == Granularity::kToken ? "tokens" : "group slots";
  std::fprintf(
      stderr,
      "[%s on %s in %s, granularity %s, mode %s%s%s: %zu prompt + %zu generated tokens "
      "in %.2f s; evicted %lld; relocations %lld moving %lld %s (%lld blocks "
      "reclaimed); blocks held at end %d for %lld live %s (ideal %lld)]\n",
      a.model.c_str(), a.device.c_str(), a.dtype.c_str(), a.granularity.c_str(), ModeName(o.mode),
      evicting ? ", policy " : "", evicting ? o.policy.c_str() : "", prompt.size(),
      r.output_tokens.size(), result->wall_s, static_cast<long long>(result->evictions),
      static_cast<long long>(result->plans), static_cast<long long>(result->moves), unit,
      static_cast<long long>(result->blocks_reclaimed), r.blocks_final,
      static_cast<long long>(r.live_final), unit, static_cast<long long>(r.ideal_blocks_final));
  return 0;
}

CLI::App* SetupGenerate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate a continuation with a real model through the paged KV cache");
  cmd->add_option("--model", a->model,
                  "Model: a Hugging Face directory, a .gguf file or a fetched name "
                  "(smollm2-135m; scripts/fetch-model.sh)")
      ->capture_default_str();
  cmd->add_option("--prompt", a->prompt, "Prompt text")->required();
  cmd->add_flag("--chat", a->chat,
                "Wrap the prompt as a user turn of the model's chat template (ChatML, Llama 3) "
                "and print only the answer; generation stops at the end-of-turn token");
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(IntIn(1, engine::kMaxRequestTokens));
  cmd->add_option("--policy", a->policy, "Eviction policy (see `vtoken-cli policies`)");
  cmd->add_option("--policy-param", a->policy_params,
                  "With --policy: a policy parameter KEY=VALUE (repeatable)");
  // Flags that mirror config keys take the key's spelling, help and range (key_flags.h); the
  // old spellings still work and say so.
  AddKeyFlag(*cmd, "policy.budget_tokens", a->budget, "With --policy: ", {"--budget"})
      ->check(IntIn(1));
  AddKeyFlag(*cmd, "policy.num_sink", a->num_sink, "With --policy: ", {"--sink"})
      ->capture_default_str();
  AddKeyFlag(*cmd, "policy.num_recent", a->num_recent, "With --policy: ", {"--recent"})
      ->description("With --policy: last tokens never evicted (default min(32, budget/2))");
  AddKeyFlag(*cmd, "policy.evict_interval", a->evict_interval, "With --policy: ")
      ->capture_default_str();
  cmd->add_option("--drop", a->drop,
                  "Evict exactly these positions (comma-separated; BOS is 0) right after "
                  "prefill, RoPE positions kept; instead of --policy/--budget");
  cmd->add_option("--mode", a->mode, "native, naive or vtoken (default: vtoken when evicting)");
  cmd->add_option("--output", a->output, "text, ids or json")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "ids", "json"}));
  AddKeyFlag(*cmd, "engine.block_size", a->block_size)->capture_default_str();
  AddKeyFlag(*cmd, "sampling.temperature", a->temperature)->capture_default_str();
  AddKeyFlag(*cmd, "sampling.top_p", a->top_p)->capture_default_str();
  cmd->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("!--no-stop-at-eos", a->stop_at_eos, "Keep generating past an EOS token");
  AddKeyFlag(*cmd, "model.device", a->device)->capture_default_str();
  AddKeyFlag(*cmd, "model.dtype", a->dtype)->capture_default_str();
  AddKeyFlag(*cmd, "model.weights", a->weights)->capture_default_str();
  AddKeyFlag(*cmd, "model.kv_dtype", a->kv_dtype)->capture_default_str();
  AddKeyFlag(*cmd, "cache.granularity", a->granularity)->capture_default_str();
  cmd->add_flag("--cuda-graphs", a->cuda_graphs,
                "Decode steps replay CUDA graphs (engine.cuda_graphs; needs --device cuda)");
  AddKeyFlag(*cmd, "model.threads", a->threads)->capture_default_str();
  cmd->callback([a] { SetExitCode(RunGenerate(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("generate", SetupGenerate);

}  // namespace vtoken::cli
