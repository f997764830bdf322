#include <cstdio>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/model_check.h"
#include "apps/vtoken-cli/run/run_spec.h"
#include "lib/engine/engine.h"
#include "lib/engine/workload.h"
#include "lib/model/llama_runner.h"
#include "lib/model/torch_device.h"

namespace vtoken::cli {
namespace {

int Fail(const Status& s) {
  PrintError(s);
  return 2;
}

int RunModelCheck(const ModelCheckArgs& a) {
  // Errors start with `device "..."` / `dtype "..."`: "--" makes them name the flag.
  StatusOr<model::LlamaOptions> options = model::LlamaOptionsFor(a.device, a.dtype);
  if (!options.ok()) {
    return Fail(Status(options.status().code(), "--" + options.status().message()));
  }
  StatusOr<model::LlamaModel> loaded = model::LoadModel(a.model, a.seed, *options);
  if (!loaded.ok()) return Fail(loaded.status());
  const int64_t context = loaded->config().max_position_embeddings;
  const int64_t vocab_size = loaded->config().vocab_size;
  // Synthetic workload: random token ids, prompts filling most of the context.
  engine::WorkloadOptions w;
  w.kind = "longbench_like";
  w.num_requests = a.num_requests;
  w.seed = a.seed;
  w.input_min = std::max<int64_t>(8, context / 2);
  w.input_max = std::max<int64_t>(9, context * 3 / 4);
  if (a.max_prompt > 0) {  // --max-prompt: prompts of half that to that
    w.input_max = std::min(w.input_max, std::max<int64_t>(9, a.max_prompt));
    w.input_min = std::min(w.input_min, std::max<int64_t>(8, w.input_max / 2));
  }
  w.output_min = 32;
  w.output_max = 64;
  w.max_total_tokens = context - 1;
  StatusOr<std::vector<engine::Request>> requests =
      engine::GenerateWorkload(w, nullptr, vocab_size);
  if (!requests.ok()) return Fail(requests.status());

  engine::EngineOptions o;
  o.pool.block_size = a.block_size;
  int64_t tokens = 0;
  for (const engine::Request& r : *requests) {
    tokens = std::max<int64_t>(tokens, static_cast<int64_t>(r.prompt_tokens.size()) + r.max_tokens);
  }
  // Room for about half the requests' prompts at once: admission and preemption get exercised.
  o.pool.num_blocks = static_cast<int32_t>(
      (tokens / a.block_size + 2) * std::max<int64_t>(2, a.num_requests / 2) + 8);
  o.pool.headroom_blocks = 8;
  o.reclaim.trigger = ReclaimOptions::Trigger::kAlways;
  o.max_num_seqs = static_cast<int32_t>(a.num_requests);
  o.max_prefill_chunk = 128;
  o.policy = a.policy;
  o.evictor = {.keep_ratio = 0.25, .num_sink = 4, .num_recent = 16};
  o.verify = true;
  o.seed = a.seed;
  // The pool above counts blocks of every layer and head; layer / head runs split it.
  const Mode modes[] = {Mode::kNaive, Mode::kVtoken};
  StatusOr<RunSpec> spec = MakeRunSpec(o, a.granularity, &loaded->config(), modes);
  if (!spec.ok()) return Fail(spec.status());

  // One runner for both modes: each run writes every KV slot before it reads it.
  StatusOr<std::unique_ptr<model::LlamaRunner>> runner = model::LlamaRunner::Create(
      std::move(*loaded),
      {.num_slots = spec->num_slots, .async_copies = a.async_copies, .granularity = a.granularity});
  if (!runner.ok()) return Fail(runner.status());
  std::vector<engine::EngineResult> results;
  for (const engine::EngineOptions& run : spec->runs) {
    StatusOr<engine::EngineResult> r = engine::RunEngine(run, **runner, *requests);
    if (!r.ok()) return Fail(r.status());
    results.push_back(std::move(*r));
  }
  const engine::EngineResult& naive = results[0];
  const engine::EngineResult& vt = results[1];
  int64_t mismatched = 0;
  for (size_t i = 0; i < naive.requests.size(); ++i) {
    if (naive.requests[i].output_tokens != vt.requests[i].output_tokens) ++mismatched;
  }
  const int64_t violations = vt.violations + naive.violations + mismatched;
  std::printf(
      "vtoken check on %s (synthetic workload: random token ids): policy %s, %lld "
      "requests, %d blocks x %d slots, granularity %s (%d KV groups), %s %s, %s %s "
      "copies\n",
      a.model.c_str(), a.policy.c_str(), static_cast<long long>(a.num_requests),
      spec->runs[0].pool.num_blocks, spec->runs[0].pool.block_size, GranularityName(a.granularity),
      (*runner)->num_kv_groups(), a.device.c_str(), a.dtype.c_str(), (*runner)->copy_engine_kind(),
      std::string((*runner)->copy_engine_kind()) == "cuda" || a.async_copies ? "async" : "sync");
  std::printf("  steps              %12zu\n", vt.steps.size());
  std::printf("  evictions          %12lld\n", static_cast<long long>(vt.evictions));
  std::printf("  preemptions        %12lld\n", static_cast<long long>(vt.preemptions));
  std::printf("  relocations        %12lld\n", static_cast<long long>(vt.plans));
  std::printf("  tokens moved       %12lld\n", static_cast<long long>(vt.moves));
  std::printf("  bytes moved        %12lld\n", static_cast<long long>(vt.bytes_moved));
  std::printf("  hash checks        %12lld\n", static_cast<long long>(vt.hash_checks));
  std::printf("  invariant checks   %12lld\n", static_cast<long long>(vt.invariant_checks));
  std::printf("  outputs != naive   %12lld of %zu requests\n", static_cast<long long>(mismatched),
              vt.requests.size());
  std::printf("  violations         %12lld\n", static_cast<long long>(violations));
  for (const std::string& v : vt.first_violations) std::printf("    %s\n", v.c_str());
  return violations == 0 ? 0 : 1;
}

const bool registered = [] {
  ModelCheckHook() = &RunModelCheck;
  return true;
}();

}  // namespace
}  // namespace vtoken::cli
