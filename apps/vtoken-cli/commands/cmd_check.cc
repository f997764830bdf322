// `vtoken-cli check`: drives the virtual KV cache through a randomized workload with a host KV
// store, verifying invariants and per-token KV hashes on every relocation. With --policy, a
// registered eviction policy (fed synthetic attention signals) chooses every eviction.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/cli_checks.h"
#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/key_flags.h"
#include "apps/vtoken-cli/commands/model_check.h"
#include "apps/vtoken-cli/config/config_keys.h"
#include "lib/core/budget_allocation.h"
#include "lib/core/check_harness.h"
#include "lib/core/memory_budget.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/core/synthetic_signals.h"

namespace vtoken::cli {
namespace {

struct CheckArgs {
  CheckOptions options;
  std::string mode = "vtoken";
  std::string trigger = "always";
  std::string policy;  // Empty: uniformly random victims.
  std::vector<std::string> policy_params;
  EvictorOptions evictor{.budget_tokens = 32};
  std::string model;  // With a model: the check runs on its real K/V tensors.
  int64_t num_requests = 8;
  std::string granularity = "token";
  int32_t kv_heads = 2;
  std::string allocation = "uniform";
  std::string device = "cpu";  // With a model.
  std::string dtype = "float32";
};

// --granularity as a Granularity; errors name the flag.
StatusOr<Granularity> GranularityFlag(const std::string& text) {
  StatusOr<Granularity> g = ParseGranularity(text);
  if (!g.ok()) return InvalidArgumentError("--granularity: " + g.status().message());
  return g;
}

int RunModelCheckCommand(const CheckArgs& args, bool max_prompt_given) {
  if (ModelCheckHook() == nullptr) {
    std::fprintf(stderr, "vtoken-cli: error: --model needs a build with libtorch\n");
    return 2;
  }
  StatusOr<Granularity> granularity = GranularityFlag(args.granularity);
  if (!granularity.ok()) {
    PrintError(granularity.status());
    return 2;
  }
  ModelCheckArgs m;
  m.model = args.model;
  m.device = args.device;
  m.dtype = args.dtype;
  m.granularity = *granularity;
  if (!args.policy.empty()) m.policy = args.policy;
  m.seed = args.options.seed;
  m.num_requests = args.num_requests;
  m.block_size = args.options.pool.block_size;
  m.async_copies = args.options.async_copies;
  if (max_prompt_given) m.max_prompt = args.options.max_prompt_tokens;
  return ModelCheckHook()(m);
}

// Builds the evictor for --policy; prints the error and returns nullptr on failure.
std::unique_ptr<PolicyEvictor> MakeEvictor(const CheckArgs& args) {
  StatusOr<const PolicyInfo*> info = FindPolicy(args.policy);
  if (!info.ok()) {
    PrintError(info.status());
    return nullptr;
  }
  StatusOr<RawParams> raw = ParseParamAssignments(args.policy, (*info)->params, args.policy_params);
  if (!raw.ok()) {
    PrintError(raw.status());
    return nullptr;
  }
  StatusOr<std::unique_ptr<PolicyEvictor>> evictor =
      PolicyEvictor::Create(args.policy, *raw, args.evictor);
  if (!evictor.ok()) {
    PrintError(evictor.status());
    return nullptr;
  }
  return std::move(evictor).value();
}

int RunCheckCommand(CheckArgs& args) {
  StatusOr<Mode> mode = ParseMode(args.mode);
  if (!mode.ok()) {
    PrintError(mode.status());
    return 2;
  }
  StatusOr<ReclaimOptions::Trigger> trigger = ParseTrigger(args.trigger);
  if (!trigger.ok()) {
    PrintError(trigger.status());
    return 2;
  }
  StatusOr<Granularity> granularity = GranularityFlag(args.granularity);
  if (!granularity.ok()) {
    PrintError(granularity.status());
    return 2;
  }
  StatusOr<BudgetAllocation> allocation = ParseBudgetAllocation(args.allocation);
  if (!allocation.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: --budget-allocation: %s\n",
                 allocation.status().message().c_str());
    return 2;
  }
  args.options.mode = *mode;
  args.options.reclaim.trigger = *trigger;
  args.evictor.seed = args.options.seed;
  // KV groups: at token granularity a slot holds every layer's row; otherwise one group's row.
  const int64_t groups = int64_t{NumKvGroups(*granularity, args.options.num_layers, args.kv_heads)};
  if (groups > kMaxKvGroups) {
    std::fprintf(stderr, "vtoken-cli: error: --layers x --kv-heads = %lld KV groups, at most %d\n",
                 static_cast<long long>(groups), kMaxKvGroups);
    return 2;
  }
  args.evictor.granularity = *granularity;
  args.evictor.num_layers = args.options.num_layers;
  args.evictor.num_kv_heads = args.kv_heads;
  args.evictor.allocation = *allocation;
  args.options.num_groups = static_cast<int32_t>(groups);
  if (*granularity != Granularity::kToken) args.options.num_layers = 1;
  std::unique_ptr<PolicyEvictor> evictor;
  std::unique_ptr<SyntheticSignalDriver> driver;
  if (!args.policy.empty()) {
    evictor = MakeEvictor(args);
    if (evictor == nullptr) return 2;
    driver = std::make_unique<SyntheticSignalDriver>(*evictor);
  } else if (!args.policy_params.empty()) {
    std::fprintf(stderr, "vtoken-cli: error: --policy-param needs --policy\n");
    return 2;
  }
  // The host store is [layers][slots][bytes_per_token]: refuse before allocating it.
  const CheckOptions& opt = args.options;
  const int64_t store_bytes = SaturatingAdd(
      SaturatingMul(
          SaturatingMul(opt.num_layers, SaturatingMul(opt.pool.num_blocks, opt.pool.block_size)),
          opt.bytes_per_token),
      PoolMetadataBytes(opt.pool.num_blocks, opt.pool.block_size));
  Status fits = CheckMemory(
      store_bytes, "the host KV store (--num-blocks " + std::to_string(opt.pool.num_blocks) +
                       " x --block-size " + std::to_string(opt.pool.block_size) + " x --layers " +
                       std::to_string(opt.num_layers) + " x --bytes-per-token " +
                       std::to_string(opt.bytes_per_token) + ")");
  if (!fits.ok()) {
    PrintError(fits);
    return 2;
  }
  StatusOr<CheckReport> report = RunCheck(args.options, driver.get());
  if (!report.ok()) {
    PrintError(report.status());
    return 2;
  }
  const CheckReport& r = *report;
  const CheckOptions& o = args.options;
  std::printf(
      "vtoken check: seed %llu, mode %s, %s copies, %d blocks x %d slots, headroom %d, "
      "granularity %s (%d KV groups)\n",
      static_cast<unsigned long long>(o.seed), ModeName(o.mode), o.async_copies ? "async" : "sync",
      o.pool.num_blocks, o.pool.block_size, o.pool.headroom_blocks, args.granularity.c_str(),
      o.num_groups);
  std::printf("  steps              %12lld\n", static_cast<long long>(r.steps));
  std::printf("  tokens appended    %12lld\n", static_cast<long long>(r.appended_tokens));
  std::printf("  evictions          %12lld\n", static_cast<long long>(r.evictions));
  std::printf("  forks              %12lld\n", static_cast<long long>(r.forks));
  std::printf("  pool exhausted     %12lld\n", static_cast<long long>(r.pool_exhausted));
  std::printf("  relocations        %12lld\n", static_cast<long long>(r.relocations));
  std::printf("  tokens moved       %12lld\n", static_cast<long long>(r.tokens_moved));
  std::printf("  blocks reclaimed   %12lld\n", static_cast<long long>(r.blocks_reclaimed));
  std::printf("  hash checks        %12lld\n", static_cast<long long>(r.hash_checks));
  std::printf("  invariant checks   %12lld\n", static_cast<long long>(r.invariant_checks));
  std::printf("  tokens verified    %12lld\n", static_cast<long long>(r.tokens_verified));
  std::printf("  fence waits        %12lld\n", static_cast<long long>(r.fence_waits));
  std::printf("  violations         %12lld\n", static_cast<long long>(r.violations));
  for (const std::string& v : r.first_violations) std::printf("    %s\n", v.c_str());
  if (driver != nullptr) {
    const EvictorOptions& e = args.evictor;
    char budget[64];
    if (e.budget_tokens > 0) {
      std::snprintf(budget, sizeof(budget), "%lld tokens", static_cast<long long>(e.budget_tokens));
    } else {
      std::snprintf(budget, sizeof(budget), "%g of the prompt", e.keep_ratio);
    }
    std::printf("  policy %s: budget %s (%s), %lld sink, %lld recent, evict every %lld steps\n",
                args.policy.c_str(), budget, BudgetAllocationName(e.allocation),
                static_cast<long long>(e.num_sink), static_cast<long long>(e.num_recent),
                static_cast<long long>(e.evict_interval));
    std::printf("  policy steps       %12lld\n", static_cast<long long>(driver->policy_steps()));
    std::printf("  policy victims     %12lld\n", static_cast<long long>(driver->victims()));
    if (!driver->status().ok()) {
      std::printf("  policy error: %s\n", driver->status().message().c_str());
      return 1;
    }
  }
  return r.violations == 0 ? 0 : 1;
}

CLI::App* SetupCheck(CLI::App& app) {
  auto args = std::make_shared<CheckArgs>();
  CheckOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Randomized relocation workload over a host KV store; verifies invariants and "
      "per-token KV hashes; exits 1 on any violation");
  cmd->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  cmd->add_option("--steps", o.steps, "Operations to run")->capture_default_str()->check(IntIn(0));
  // Flags that mirror config keys take the key's spelling, help and range (key_flags.h); the
  // old spellings still work and say so.
  AddKeyFlag(*cmd, "engine.block_size", o.pool.block_size)->capture_default_str();
  AddKeyFlag(*cmd, "engine.num_blocks", o.pool.num_blocks)->capture_default_str();
  AddKeyFlag(*cmd, "engine.headroom_blocks", o.pool.headroom_blocks, "", {"--headroom"})
      ->capture_default_str();
  cmd->add_option("--mode", args->mode, "native, naive or vtoken")->capture_default_str();
  cmd->add_flag("--async", o.async_copies, "Copy on a worker thread");
  cmd->add_option("--copy-delay-us", o.copy_delay_us,
                  "With --async: stall each copy this long (exercises the read fence)")
      ->capture_default_str()
      ->check(IntIn(0));
  cmd->add_option("--layers", o.num_layers, "KV layers")->capture_default_str()->check(IntIn(1));
  AddKeyFlag(*cmd, "cache.granularity", args->granularity)
      ->description(
          "What one liveness bit covers: token (every layer and head), layer or head; layer and "
          "head give each sequence --layers (x --kv-heads) token tables")
      ->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads, "KV heads per layer (--granularity head)")
      ->capture_default_str()
      ->check(IntIn(1));
  AddKeyFlag(*cmd, "policy.budget_allocation", args->allocation, "With --policy: ")
      ->capture_default_str();
  cmd->add_option("--bytes-per-token", o.bytes_per_token, "KV bytes per token per layer")
      ->capture_default_str()
      ->check(IntIn(1));
  cmd->add_option("--max-seqs", o.max_seqs, "Concurrent sequences at most")
      ->capture_default_str()
      ->check(IntIn(1));
  cmd->add_option("--max-prompt", o.max_prompt_tokens,
                  "Longest initial prompt in tokens (with --model: default half to three "
                  "quarters of the model's context)")
      ->capture_default_str()
      ->check(IntIn(1));
  AddKeyFlag(*cmd, "reclaim.trigger", args->trigger)->capture_default_str();
  AddKeyFlag(*cmd, "reclaim.frag_threshold", o.reclaim.frag_threshold)->capture_default_str();
  AddKeyFlag(*cmd, "reclaim.max_moves_per_step", o.reclaim.max_moves_per_step, "", {"--max-moves"})
      ->capture_default_str();
  cmd->add_option("--policy", args->policy,
                  "Eviction policy choosing the victims (see `vtoken-cli policies`); default: "
                  "uniformly random victims");
  cmd->add_option("--policy-param", args->policy_params, "Policy parameter key=value (repeatable)");
  CLI::Option* budget =
      AddKeyFlag(*cmd, "policy.budget_tokens", args->evictor.budget_tokens, "With --policy: ")
          ->capture_default_str()
          ->check(IntIn(1));
  AddKeyFlag(*cmd, "policy.keep_ratio", args->evictor.keep_ratio, "With --policy: ")
      ->excludes(budget)
      ->each([args](const std::string&) { args->evictor.budget_tokens = 0; });
  AddKeyFlag(*cmd, "policy.num_sink", args->evictor.num_sink, "With --policy: ")
      ->capture_default_str();
  AddKeyFlag(*cmd, "policy.num_recent", args->evictor.num_recent, "With --policy: ")
      ->capture_default_str();
  AddKeyFlag(*cmd, "policy.evict_interval", args->evictor.evict_interval, "With --policy: ")
      ->capture_default_str();
  cmd->add_option("--model", args->model,
                  "Run the check on a real model's K/V tensors (a model directory or "
                  "synthetic:NAME) through the engine, naive vs vtoken, instead of the host store");
  cmd->add_option("--requests", args->num_requests, "With --model: requests to serve")
      ->capture_default_str()
      ->check(IntIn(1));
  cmd->add_option("--device", args->device, "With --model: cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "With --model: float32, bfloat16 or float16")
      ->capture_default_str();
  cmd->callback([args, cmd] {
    for (const char* flag : {"--requests", "--device", "--dtype"}) {
      if (args->model.empty() && cmd->count(flag) > 0) {
        std::fprintf(stderr, "vtoken-cli: error: %s needs --model (the host check has no model)\n",
                     flag);
        SetExitCode(2);
        return;
      }
    }
    SetExitCode(args->model.empty() ? RunCheckCommand(*args)
                                    : RunModelCheckCommand(*args, cmd->count("--max-prompt") > 0));
  });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("check", SetupCheck);

}  // namespace vtoken::cli
