// `vtoken-cli check`: drives the virtual KV cache through a randomized workload with a host KV
// store, verifying invariants and per-token KV hashes on every relocation.
#include <cstdio>
#include <string>

#include "apps/vtoken-cli/command.h"
#include "lib/core/check_harness.h"

namespace vtoken::cli {
namespace {

struct CheckArgs {
  CheckOptions options;
  std::string mode = "vtoken";
  std::string trigger = "always";
};

int RunCheckCommand(CheckArgs& args) {
  StatusOr<Mode> mode = ParseMode(args.mode);
  if (!mode.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", mode.status().message().c_str());
    return 2;
  }
  StatusOr<ReclaimOptions::Trigger> trigger = ParseTrigger(args.trigger);
  if (!trigger.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", trigger.status().message().c_str());
    return 2;
  }
  args.options.mode = *mode;
  args.options.reclaim.trigger = *trigger;
  StatusOr<CheckReport> report = RunCheck(args.options);
  if (!report.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", report.status().message().c_str());
    return 2;
  }
  const CheckReport& r = *report;
  const CheckOptions& o = args.options;
  std::printf("vtoken check: seed %llu, mode %s, %s copies, %d blocks x %d slots, headroom %d\n",
              static_cast<unsigned long long>(o.seed), ModeName(o.mode),
              o.async_copies ? "async" : "sync", o.pool.num_blocks, o.pool.block_size,
              o.pool.headroom_blocks);
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
  return r.violations == 0 ? 0 : 1;
}

CLI::App* SetupCheck(CLI::App& app) {
  auto args = std::make_shared<CheckArgs>();
  CheckOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "check", "Randomized relocation workload over a host KV store; verifies invariants and "
               "per-token KV hashes; exits 1 on any violation");
  cmd->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  cmd->add_option("--steps", o.steps, "Operations to run")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--block-size", o.pool.block_size, "Token slots per block")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--num-blocks", o.pool.num_blocks, "Blocks in the pool")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--headroom", o.pool.headroom_blocks, "Blocks reserved for the reclaimer")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--mode", args->mode, "native, naive or vtoken")->capture_default_str();
  cmd->add_flag("--async", o.async_copies, "Copy on a worker thread");
  cmd->add_option("--copy-delay-us", o.copy_delay_us,
                  "With --async: stall each copy this long (exercises the read fence)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--layers", o.num_layers, "KV layers")->capture_default_str()->check(
      CLI::PositiveNumber);
  cmd->add_option("--bytes-per-token", o.bytes_per_token, "KV bytes per token per layer")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-seqs", o.max_seqs, "Concurrent sequences at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-prompt", o.max_prompt_tokens, "Longest initial prompt in tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--trigger", args->trigger, "Reclaim trigger: always or pressure")
      ->capture_default_str();
  cmd->add_option("--frag-threshold", o.reclaim.frag_threshold, "Waste ratio trigger")
      ->capture_default_str();
  cmd->add_option("--max-moves", o.reclaim.max_moves_per_step, "Moves per reclaim step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([args] { SetExitCode(RunCheckCommand(*args)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("check", SetupCheck);

}  // namespace vtoken::cli
