// `vtoken-cli generate`: one prompt through a real model and the virtualized paged KV cache,
// optionally with an eviction policy under a token budget.
#include <algorithm>
#include <cstdio>
#include <string>

#include "apps/vtoken-cli/command.h"
#include "lib/engine/engine.h"
#include "lib/model/io/tokenizer.h"
#include "lib/model/llama_runner.h"

namespace vtoken::cli {
namespace {

struct GenerateArgs {
  std::string model = "models/vt-tiny";
  std::string prompt;
  int64_t max_tokens = 64;
  std::string policy;
  int64_t budget = 0;
  int64_t num_sink = 4;
  int64_t num_recent = -1;
  std::string mode;
  int32_t block_size = 16;
  double temperature = 0;
  double top_p = 1.0;
  uint64_t seed = 1;
  bool stop_at_eos = true;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "vtoken-cli: error: %s\n", message.c_str());
  return 1;
}

int RunGenerate(const GenerateArgs& a) {
  if (a.policy.empty() != (a.budget == 0)) {
    return Fail("--policy and --budget go together");
  }
  std::string mode_name = a.mode.empty() ? (a.policy.empty() ? "native" : "vtoken") : a.mode;
  StatusOr<Mode> mode = ParseMode(mode_name);
  if (!mode.ok()) return Fail(mode.status().message());
  if (*mode != Mode::kNative && a.policy.empty()) {
    return Fail("mode " + mode_name + " evicts tokens: give --policy and --budget");
  }
  if (*mode == Mode::kNative && !a.policy.empty()) {
    return Fail("mode native does not evict: drop --policy or use --mode naive|vtoken");
  }
  const bool synthetic = a.model.rfind("synthetic:", 0) == 0;
  StatusOr<model::LlamaModel> loaded = model::LoadModel(a.model, a.seed);
  if (!loaded.ok()) return Fail(loaded.status().message());
  std::vector<int32_t> prompt;
  std::optional<model::Tokenizer> tokenizer;
  if (synthetic) {
    return Fail("synthetic models have no tokenizer: generate needs a model directory");
  }
  StatusOr<model::Tokenizer> tok = model::Tokenizer::Load(a.model + "/tokenizer.json");
  if (!tok.ok()) return Fail(tok.status().message());
  tokenizer = std::move(*tok);
  const std::vector<int32_t> text = tokenizer->Encode(a.prompt);
  prompt.insert(prompt.end(), text.begin(), text.end());

  engine::EngineOptions o;
  o.mode = *mode;
  o.pool.block_size = a.block_size;
  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  o.pool.headroom_blocks = 2;
  o.pool.num_blocks = static_cast<int32_t>((total + a.block_size - 1) / a.block_size) + 4;
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.max_num_seqs = 1;
  o.stop_at_eos = a.stop_at_eos;
  o.sampling = {.temperature = a.temperature, .top_p = a.top_p, .seed = a.seed};
  o.seed = a.seed;
  if (!a.policy.empty()) {
    o.policy = a.policy;
    o.evictor = {};
    o.evictor.budget_tokens = a.budget;
    o.evictor.num_sink = std::min(a.num_sink, a.budget);
    o.evictor.num_recent =
        a.num_recent >= 0 ? a.num_recent : std::min<int64_t>(32, (a.budget - o.evictor.num_sink) / 2);
  }
  StatusOr<std::unique_ptr<model::LlamaRunner>> runner = model::LlamaRunner::Create(
      std::move(*loaded), {.num_slots = int64_t{o.pool.num_blocks} * o.pool.block_size});
  if (!runner.ok()) return Fail(runner.status().message());
  engine::Request request;
  request.id = 0;
  request.prompt = a.prompt;
  request.prompt_tokens = prompt;
  request.max_tokens = a.max_tokens;
  StatusOr<engine::EngineResult> result = engine::RunEngine(o, **runner, {request});
  if (!result.ok()) return Fail(result.status().message());
  const engine::RequestResult& r = result->requests[0];
  std::printf("%s%s\n", a.prompt.c_str(), tokenizer->Decode(r.output_tokens).c_str());
  std::fprintf(stderr,
               "[%s, mode %s%s%s: %zu prompt + %zu generated tokens in %.2f s; evicted %lld; "
               "relocations %lld moving %lld tokens (%lld blocks reclaimed); blocks held at end "
               "%d for %lld live tokens (ideal %lld)]\n",
               a.model.c_str(), ModeName(o.mode), a.policy.empty() ? "" : ", policy ",
               a.policy.c_str(), prompt.size(), r.output_tokens.size(), result->wall_s,
               static_cast<long long>(result->evictions), static_cast<long long>(result->plans),
               static_cast<long long>(result->moves),
               static_cast<long long>(result->blocks_reclaimed), r.blocks_final,
               static_cast<long long>(r.live_final), static_cast<long long>(r.ideal_blocks_final));
  return 0;
}

CLI::App* SetupGenerate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate a continuation with a real model through the paged KV cache");
  cmd->add_option("--model", a->model, "Model directory (Hugging Face layout)")
      ->capture_default_str();
  cmd->add_option("--prompt", a->prompt, "Prompt text")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--policy", a->policy, "Eviction policy (see `vtoken-cli policies`)");
  cmd->add_option("--budget", a->budget, "Live tokens kept per eviction")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--sink", a->num_sink, "First tokens never evicted")->capture_default_str();
  cmd->add_option("--recent", a->num_recent, "Last tokens never evicted (default min(32, budget/2))");
  cmd->add_option("--mode", a->mode, "native, naive or vtoken (default: vtoken with a policy)");
  cmd->add_option("--block-size", a->block_size, "Token slots per KV block")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("!--no-stop-at-eos", a->stop_at_eos, "Keep generating past an EOS token");
  cmd->callback([a] { SetExitCode(RunGenerate(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("generate", SetupGenerate);

}  // namespace vtoken::cli
