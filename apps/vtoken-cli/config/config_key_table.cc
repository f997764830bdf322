// The experiment config's keys, one declaration each (config_keys.h). A new key is one entry
// here plus the code that uses its value; parsing, `--set`, the range check, the resolved
// config, the docs and the flag spelling follow from the entry.
#include "apps/vtoken-cli/config/config_key_builder.h"
#include "apps/vtoken-cli/config/config_keys.h"
#include "lib/core/block_pool.h"
#include "lib/core/budget_allocation.h"
#include "lib/core/policy_registry.h"
#include "lib/core/reclaim_planner.h"
#include "lib/engine/tasks.h"
#include "lib/model/io/device_spec.h"

namespace vtoken::cli {
namespace {

using namespace config_key_builder;  // NOLINT: the table reads as declarations

std::vector<std::string> ModeNames(const ExperimentConfig& c) {
  std::vector<std::string> names;
  for (Mode m : c.modes) names.emplace_back(ModeName(m));
  return names;
}
// Native first, so the other modes can be scored against its outputs.
Status SetModes(ExperimentConfig& c, const std::vector<std::string>& names) {
  std::vector<Mode> modes;
  for (const std::string& m : names) {
    StatusOr<Mode> mode = ParseMode(m);
    if (!mode.ok()) return mode.status();
    if (std::find(modes.begin(), modes.end(), *mode) != modes.end()) {
      return InvalidArgumentError("names mode " + m + " twice");
    }
    modes.push_back(*mode);
  }
  if (modes.empty()) return InvalidArgumentError("must name at least one mode");
  std::stable_sort(modes.begin(), modes.end(),
                   [](Mode a, Mode b) { return (a == Mode::kNative) > (b == Mode::kNative); });
  c.modes = std::move(modes);
  return Status::Ok();
}
Status SetProtocol(ExperimentConfig& c, const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(c.workload.protocol, engine::ParseTaskProtocol(name));
  return Status::Ok();
}
Status SetAdmission(ExperimentConfig& c, const std::string& name) {
  c.engine.admission = name == "greedy" ? engine::EngineOptions::Admission::kGreedy
                                        : engine::EngineOptions::Admission::kReserve;
  return Status::Ok();
}
Status SetAllocation(ExperimentConfig& c, const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(c.engine.evictor.allocation, ParseBudgetAllocation(name));
  return Status::Ok();
}
Status SetGranularity(ExperimentConfig& c, const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(c.granularity, ParseGranularity(name));
  c.engine.evictor.granularity = c.granularity;
  return Status::Ok();
}
Status SetTrigger(ExperimentConfig& c, const std::string& name) {
  VTOKEN_ASSIGN_OR_RETURN(c.engine.reclaim.trigger, ParseTrigger(name));
  return Status::Ok();
}
Status SetParams(ExperimentConfig& c, const KeyValue& v) {
  c.engine.policy_params = std::get<RawParams>(v);
  return Status::Ok();
}

std::vector<ConfigKey> MakeKeys() {
  std::vector<ConfigKey> keys;
  Key entries[] = {
      Field(
          "name", [](ExperimentConfig & c) -> auto& { return c.name; })
          .DefaultText("file stem")
          .Doc("experiment name"),
      Custom(
          "modes", KeyType::kStringList,
          [](const ExperimentConfig& c) -> KeyValue { return ModeNames(c); },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetModes(c, std::get<std::vector<std::string>>(v));
          })
          .Doc("one run per mode"),
      Field(
          "db", [](ExperimentConfig & c) -> auto& { return c.db; })
          .NotResolved()
          .Doc("result database (`--db` overrides)"),
      Field(
          "seed", [](ExperimentConfig & c) -> auto& { return c.engine.seed; })
          .Doc("engine seed (policy RNG, per-request sampling seeds)"),
      Field(
          "model.path", [](ExperimentConfig & c) -> auto& { return c.model; })
          .Doc("Hugging Face model directory, a GGUF file (`llama` / `qwen2`, F32 ... Q6_K; "
               "docs/MODELS.md), a fetched model's short name (`smollm2-135m`: "
               "SmolLM2-135M-Instruct, which `scripts/fetch-model.sh` puts in `.cache/models`; a "
               "name not fetched yet is a one-line error giving the command), or `synthetic:NAME` "
               "(llama-3.1-8b, mistral-7b, qwen2.5-14b, llama-2-13b: real shapes, seeded random "
               "weights; refused when the weights would not fit in memory), or `sim:NAME` / "
               "`sim:path/to/config.json` (simulated: no weights or tensors, virtual clock; see "
               "docs/SIMULATION.md and the `[sim]` keys below)"),
      Field(
          "model.seed", [](ExperimentConfig & c) -> auto& { return c.model_seed; })
          .Doc("seed of synthetic weights, drawn on `model.device` by its own generator (same "
               "seed, same weights on the same device type; CPU and CUDA draws differ; in bf16 / "
               "fp16 the fp32 draws rounded)"),
      Field(
          "model.device", [](ExperimentConfig & c) -> auto& { return c.model_device; })
          .Check([](const std::string& s) { return model::ParseDeviceSpec(s).ok(); },
                 "must be \"cpu\", \"cuda\" or \"cuda:N\"")
          .Record(kSet)
          .Doc("`cpu`, `cuda` or `cuda:N`: weights, activations and KV store. Without a usable "
               "CUDA device `cuda` is a one-line error (`model.device \"cuda\": no CUDA device "
               "(this libtorch was built without CUDA)`, or `no GPU is visible`); an index beyond "
               "the devices too. On the current CUDA device relocations run on lib/cuda's "
               "`CudaCopyEngine` when it is built (docs/CUDA.md). Recorded in the resolved config "
               "only when not `cpu`"),
      Field(
          "model.dtype", [](ExperimentConfig & c) -> auto& { return c.model_dtype; })
          .Choices({"float32", "bfloat16", "float16"})
          .Record(kSet)
          .Doc("`float32`, `bfloat16`, `float16`: weights, activations and KV store (RMSNorm and "
               "softmax stay fp32); the fused CPU path runs fp32, other dtypes take the torch "
               "path. Before loading, a two-layer probe step checks that this libtorch runs the "
               "dtype on the device: Debian's libtorch 1.13 runs `bfloat16` on the CPU but has no "
               "fp16 matmul there, so `float16` on `cpu` is refused in one line (`dtype float16 on "
               "cpu: not supported by this libtorch (...)`). Recorded only when not `float32`"),
      Field(
          "model.weights", [](ExperimentConfig & c) -> auto& { return c.model_weights; })
          .Choices({"float32", "as_stored", "as_stored_q8", "bfloat16"})
          .Record(kSet)
          .Doc("`float32`, `as_stored`, `as_stored_q8` or `bfloat16`: a GGUF model's linear "
               "weights (and LM "
               "head) stored as Q8_0, Q4_0 or Q4_1 are also kept as the file stores them, and "
               "decode-sized steps of the fused CPU path read those blocks (lib/model/"
               "cpu_quant_ops.h: a quarter to a seventh of fp32's bytes per decode step). "
               "`as_stored` dequantizes them inside the matrix kernel, with the same bits as the "
               "fp32 weights; `as_stored_q8` multiplies as llama.cpp's CPU backend does, the "
               "activations quantized per 32-element block to 8 bits and the products summed in "
               "integers (AVX-512 VNNI where the CPU has it), prefill chunks included: faster, not "
               "the fp32 bits. With `as_stored`, prefill chunks of more than 64 tokens still "
               "multiply the fp32 weights. `bfloat16` (any model, not only GGUF) also keeps every "
               "linear weight rounded to bf16, and the fused CPU path's projections, decode and "
               "prefill chunks, multiply them by activations rounded to bf16 (lib/model/"
               "cpu_bf16.h: AVX-512 BF16's vdpbf16ps where the CPU has it): half of fp32's bytes "
               "per decode step, products of 8-bit significands (within about 2^-7 of sum |x w| "
               "of the fp32 product); not the compute dtype, which stays `float32`. `as_stored*` "
               "need a GGUF file; all need "
               "`model.device` `cpu`, "
               "`model.dtype` `float32` and `model.kv_dtype` `auto`, `float32` or `float16` "
               "(else a one-line error). Recorded only when not `float32`"),
      Field(
          "model.kv_dtype", [](ExperimentConfig & c) -> auto& { return c.model_kv_dtype; })
          .Choices({"auto", "float32", "bfloat16", "float16"})
          .Record(kSet)
          .Doc("the KV store's dtype: `auto` (that of `model.dtype`), or `float32`, `bfloat16`, "
               "`float16` whatever `model.dtype` is. `float16` under `model.dtype` `float32` on "
               "`cpu` (llama.cpp's default cache type) halves the bytes a token's K and V take: "
               "the fused CPU path writes them rounded to fp16 and its attention kernels widen "
               "them to fp32 as they read them (lib/model/cpu_paged_attention.h); any other pair "
               "takes the torch path, which casts as it gathers. Recorded only when not `auto`"),
      Field(
          "model.threads", [](ExperimentConfig & c) -> auto& { return c.model_threads; })
          .Unit("threads")
          .Range(0, 1024)
          .RangeText("0 (every CPU this process may use) to 1024")
          .Record(kSet)
          .Doc("CPU threads of the model's step: torch's intra-op pool and the fused CPU step's "
               "thread team (`CpuPool`, lib/model/cpu_pool.h), sized together; 0 = "
               "`OMP_NUM_THREADS` when it is set to a positive integer (`sweep --jobs N` sets it "
               "to CPUs / N for each run it starts), else every CPU this process may use (its "
               "affinity mask). libtorch 1.13 would otherwise size its pool from the cores cpuinfo "
               "reports, which is 1 on some virtual machines with 2 usable CPUs. Threads split "
               "output features and sequences, never a sum, so outputs do not depend on the count. "
               "`run` prints the count in its header (`BLAS: ...; model step on N CPU thread(s)`); "
               "`generate --threads N` is the same. 0 to 1024, else a one-line error. Recorded "
               "only when not 0"),
      Field(
          "workload.kind", [](ExperimentConfig & c) -> auto& { return c.workload.kind; })
          .Doc("`sharegpt_like` (lognormal lengths, means 230 in / 200 out), `longbench_like` "
               "(uniform lengths in the ranges below), `jsonl`, `task` (long-context tasks with a "
               "right answer, generated offline: docs/TASKS.md), `perplexity` (segments of "
               "`workload.corpus` of `context_tokens` tokens, the first the prompt, the rest "
               "teacher-forced and scored: docs/TASKS.md; evicting modes need "
               "`policy.budget_tokens`)"),
      Field(
          "workload.num_requests",
          [](ExperimentConfig & c) -> auto& { return c.workload.num_requests; })
          .Unit("requests")
          .Doc("requests (for jsonl: at most this many, 0 = all)"),
      Field(
          "workload.seed", [](ExperimentConfig & c) -> auto& { return c.workload.seed; })
          .Doc("lengths, prompts and arrivals"),
      Field(
          "workload.input_mean",
          [](ExperimentConfig & c) -> auto& { return c.workload.input_mean; })
          .Unit("tokens")
          .Doc("sharegpt_like: mean prompt length (lognormal)"),
      Field(
          "workload.output_mean",
          [](ExperimentConfig & c) -> auto& { return c.workload.output_mean; })
          .Unit("tokens")
          .Doc("sharegpt_like: mean output length (lognormal)"),
      Field(
          "workload.length_sigma",
          [](ExperimentConfig & c) -> auto& { return c.workload.length_sigma; })
          .Doc("sharegpt_like: sigma of the lognormal lengths"),
      Field(
          "workload.input_min", [](ExperimentConfig & c) -> auto& { return c.workload.input_min; })
          .Unit("tokens")
          .Doc("longbench_like: shortest prompt (inclusive)"),
      Field(
          "workload.input_max", [](ExperimentConfig & c) -> auto& { return c.workload.input_max; })
          .Unit("tokens")
          .Doc("longbench_like: longest prompt (inclusive)"),
      Field(
          "workload.output_min",
          [](ExperimentConfig & c) -> auto& { return c.workload.output_min; })
          .Unit("tokens")
          .Doc("longbench_like: shortest output (inclusive)"),
      Field(
          "workload.output_max",
          [](ExperimentConfig & c) -> auto& { return c.workload.output_max; })
          .Unit("tokens")
          .Doc("longbench_like: longest output (inclusive)"),
      Field(
          "workload.max_total_tokens",
          [](ExperimentConfig & c) -> auto& { return c.workload.max_total_tokens; })
          .Unit("tokens")
          .Doc("if > 0, input and output are scaled down to fit (use the model context minus 1 for "
               "BOS)"),
      Field(
          "workload.arrival", [](ExperimentConfig & c) -> auto& { return c.workload.arrival; })
          .Doc("`all`, `poisson`, `gamma`"),
      Field(
          "workload.rate", [](ExperimentConfig & c) -> auto& { return c.workload.rate; })
          .Unit("requests/s")
          .Doc("arrivals per second (poisson, gamma)"),
      Field(
          "workload.gamma_cv", [](ExperimentConfig & c) -> auto& { return c.workload.gamma_cv; })
          .Doc("gamma arrivals: coefficient of variation of the gaps"),
      Field(
          "workload.prefix_sharing_degree",
          [](ExperimentConfig & c) -> auto& { return c.workload.prefix_sharing_degree; })
          .Unit("requests")
          .Doc("groups of this many consecutive requests share a prompt prefix (1, 2, 4, 8)"),
      Field(
          "workload.shared_prefix_fraction",
          [](ExperimentConfig & c) -> auto& { return c.workload.shared_prefix_fraction; })
          .Doc("of the group's shortest prompt"),
      Field(
          "workload.jsonl", [](ExperimentConfig & c) -> auto& { return c.workload.jsonl_path; })
          .Doc("| dataset file (kind `jsonl` only): JSON lines in the simple format `{\"prompt\", "
               "\"max_tokens\"?, \"reference\"?}`, ShareGPT lines `{\"conversations\": [{\"from\", "
               "\"value\"}, ...]}` (first human turn = prompt, the gpt turn after it = reference "
               "and its length = max_tokens), or LongBench's released lines `{\"context\", "
               "\"input\", \"answers\", \"dataset\", ...}` (prompt = `workload.prompt_template` "
               "filled in, reference = `answers[0]`); or one JSON array of such objects "
               "(ShareGPT's released `.json` files). `max_tokens` (any format) in [1, 2147483647]"),
      Field(
          "workload.jsonl_default_max_tokens",
          [](ExperimentConfig & c) -> auto& { return c.workload.jsonl_default_max_tokens; })
          .Unit("tokens")
          .Doc("when a line gives none"),
      Field(
          "workload.prompt_template",
          [](ExperimentConfig & c) -> auto& { return c.workload.prompt_template; })
          .Record(kSet)
          .Doc("LongBench lines: the prompt, `{context}` and `{input}` replaced; set it to a "
               "task's template from LongBench's `dataset2prompt.json` to reproduce that task"),
      Field(
          "workload.truncate", [](ExperimentConfig & c) -> auto& { return c.workload.truncate; })
          .Record(kSet)
          .Doc("a jsonl prompt longer than `max_total_tokens` allows: `end` keeps its beginning, "
               "`middle` its first and last halves (LongBench's cut); the run header reports how "
               "many prompts were cut and the longest"),
      Field(
          "workload.corpus", [](ExperimentConfig & c) -> auto& { return c.workload.corpus_path; })
          .Doc("| text file prompts are drawn from (real models); `scripts/make-corpus.sh "
               "build/corpus` writes the KJV text to `build/corpus/kjv.txt`"),
      Field(
          "workload.chat", [](ExperimentConfig & c) -> auto& { return c.workload.chat; })
          .Record(kSet)
          .Doc("wrap every prompt as a user turn of the model's chat template (ChatML or Llama 3, "
               "read from the GGUF file's `tokenizer.chat_template` or the directory's "
               "`tokenizer_config.json`; docs/MODELS.md), its default system turn included, so an "
               "instruct model answers instead of continuing the text; generation stops at the "
               "end-of-turn token only with `engine.stop_at_eos`. Lengths count the prompt's "
               "content, the template's tokens come on top (SmolLM2: 30 tokens). A model without a "
               "template, or a synthetic one, is a one-line error. Recorded only when true"),
      Field(
          "workload.task", [](ExperimentConfig & c) -> auto& { return c.workload.task; })
          .Record(kTask)
          .Doc("kind `task`: `passkey`, `niah_single`, `niah_multikey`, `niah_multivalue`, "
               "`variable_tracking`, `common_words`, `frequent_words` (docs/TASKS.md); each "
               "request's `max_tokens` is the task's (16 to 96). Task keys are recorded for kind "
               "`task` only"),
      Field(
          "workload.context_tokens",
          [](ExperimentConfig & c) -> auto& { return c.workload.context_tokens; })
          .Unit("tokens")
          .Record(kTaskOrPerplexity)
          .Doc("kind `perplexity`: tokens per request (>= 2; recorded for kind perplexity); kind "
               "`task`: tokens of the instance's text (context and question, without the chat "
               "template) in the model's own tokenizer; every instance holds 99% to 100% of it (at "
               "most 16 tokens short below 1,600). 128 to 2147483647; a request (template and "
               "answer included) longer than `max_total_tokens` (> 0) or the model's context is a "
               "one-line error, never cut"),
      Field(
          "workload.depths", [](ExperimentConfig & c) -> auto& { return c.workload.depths; })
          .Record(kTask)
          .Doc("kind `task`: needle depths in [0, 1], request i at `depths[i % len]` (a needle "
               "starts after that share of the haystack's tokens, within 1%); the list tasks "
               "ignore it"),
      Field(
          "workload.filler", [](ExperimentConfig & c) -> auto& { return c.workload.filler; })
          .Record(kTask)
          .Doc("kind `task`: the niah haystack, `repeat` (filler sentences) or `corpus` (text of "
               "`workload.corpus` from a random line, verse numbers and headings dropped); passkey "
               "and variable tracking always repeat"),
      Field(
          "workload.answer_tokens",
          [](ExperimentConfig & c) -> auto& { return c.workload.answer_tokens; })
          .Unit("tokens")
          .Range(0, engine::kMaxRequestTokens)
          .Record(kSet)
          .Doc("kind `task`: tokens each request may generate; 0 = the task's own limit (enough "
               "for its answer and a short sentence; a list task's answer can need more)"),
      Custom(
          "workload.protocol", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return std::string(engine::TaskProtocolName(c.workload.protocol));
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetProtocol(c, std::get<std::string>(v));
          })
          .Choices({"question_aware", "query_agnostic"})
          .Record(kTask)
          .Doc("kind `task`: `question_aware` (the question ends the prompt: the policy's first "
               "eviction sees it) or `query_agnostic` (the context is prefilled and evicted, then "
               "the question is appended, prefilled without eviction, and answered; needs "
               "`engine.admission = \"reserve\"`)"),
      Field(
          "engine.num_blocks",
          [](ExperimentConfig & c) -> auto& { return c.engine.pool.num_blocks; })
          .Unit("blocks")
          .Range(1, kNone)
          .Doc("blocks in the pool (the block budget); with `engine.gpu_memory_utilization` "
               "derived from it"),
      Field(
          "engine.block_size",
          [](ExperimentConfig & c) -> auto& { return c.engine.pool.block_size; })
          .Unit("slots")
          .Range(1, kMaxBlockSize)
          .Doc("token slots per block"),
      Field(
          "engine.headroom_blocks",
          [](ExperimentConfig & c) -> auto& { return c.engine.pool.headroom_blocks; })
          .Unit("blocks")
          .Range(0, kNone)
          .Doc("blocks reserved for the reclaimer's destinations"),
      Field(
          "engine.max_num_seqs",
          [](ExperimentConfig & c) -> auto& { return c.engine.max_num_seqs; })
          .Unit("sequences")
          .Range(1, kNone)
          .Doc("running sequences at most"),
      Custom(
          "engine.admission", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return std::string(c.engine.admission == engine::EngineOptions::Admission::kReserve
                                   ? "reserve"
                                   : "greedy");
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetAdmission(c, std::get<std::string>(v));
          })
          .Choices({"reserve", "greedy"})
          .Doc("`reserve`: admit only while free blocks cover every running request's remaining "
               "prompt and output plus the new one's (never preempts); `greedy`: admit while the "
               "prompt fits, preempt (recompute, newest first) when the pool runs out"),
      Field(
          "engine.max_prefill_chunk",
          [](ExperimentConfig & c) -> auto& { return c.engine.max_prefill_chunk; })
          .Unit("tokens")
          .Range(kNone, engine::kMaxRequestTokens)
          .Doc("prompt tokens per sequence per step (chunked prefill)"),
      Field(
          "engine.max_batched_tokens",
          [](ExperimentConfig & c) -> auto& { return c.engine.max_batched_tokens; })
          .Unit("tokens")
          .Range(kNone, engine::kMaxRequestTokens)
          .Record(kSet)
          .Doc("new tokens per step over all sequences (vLLM's max_num_batched_tokens); 0 = no "
               "limit; > 0: decodes first, then prefill chunks in admission order while the budget "
               "lasts; must be 0 or >= `max_num_seqs`"),
      Field(
          "engine.indirection_only",
          [](ExperimentConfig & c) -> auto& { return c.engine.indirection_only; })
          .Doc("vtoken bookkeeping, no eviction (overhead ablation; mode vtoken only)"),
      Field(
          "engine.force_sync", [](ExperimentConfig & c) -> auto& { return c.engine.force_sync; })
          .Doc("wait for every relocation copy at once (ablation)"),
      Field(
          "engine.stop_at_eos", [](ExperimentConfig & c) -> auto& { return c.engine.stop_at_eos; })
          .Doc("stop a request at EOS (off: exactly max_tokens, as serving benchmarks do)"),
      Field(
          "engine.obs_window", [](ExperimentConfig & c) -> auto& { return c.engine.obs_window; })
          .Unit("queries")
          .Doc("prefill queries whose attention feeds the policy's first observation"),
      Field(
          "engine.verify", [](ExperimentConfig & c) -> auto& { return c.engine.verify; })
          .Doc("check invariants every step and KV hashes around every relocation"),
      Field(
          "engine.async_copies", [](ExperimentConfig & c) -> auto& { return c.async_copies; })
          .Doc("relocation copies on a worker thread"),
      Field(
          "engine.cuda_graphs", [](ExperimentConfig & c) -> auto& { return c.cuda_graphs; })
          .Record(kSet)
          .Doc("decode steps (every running sequence one new token, at most 256) replay one CUDA "
               "graph per batch bucket (1, 2, 4, then multiples of 8) and key bucket (the longest "
               "key range rounded up to a power of two >= 256), captured on first use; prefill "
               "steps stay eager (docs/ARCHITECTURE.md, \"Static decode and CUDA graphs\"). Each "
               "run ends with a line on stderr, `MODE: CUDA graphs: N decode steps, R replayed, B "
               "buckets captured, F capture failures`; a capture that fails is said once and the "
               "run goes on eagerly. Needs `model.device = \"cuda\"` (else a one-line config "
               "error) and a libtorch built with CUDA (else `CUDA graphs need a libtorch built "
               "with CUDA`). Recorded only when true"),
      Field(
          "engine.gpu_memory_utilization",
          [](ExperimentConfig & c) -> auto& { return c.gpu_memory_utilization; })
          .Record(kSet)
          .Doc("`sim:` models only; `num_blocks` may be given only with the value it derives (a "
               "resolved config records both): size the pool as vLLM does from the hardware's "
               "memory (docs/SIMULATION.md); the derivation is printed"),
      Field(
          "policy.name", [](ExperimentConfig & c) -> auto& { return c.engine.policy; })
          .Record(kEvicts)
          .Doc("a registered policy (`vtoken-cli policies`)"),
      Field(
          "policy.budget_tokens",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.budget_tokens; })
          .Unit("tokens")
          .Range(0, engine::kMaxRequestTokens)
          .Record(kEvicts)
          .Doc("absolute budget in tokens (exclusive with keep_ratio)"),
      Field(
          "policy.keep_ratio",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.keep_ratio; })
          .Range(0, 1)
          .MinExclusive()
          .Record(kEvicts)
          .Doc("budget as a fraction of the prompt (exclusive with budget_tokens; 0 only beside "
               "budget_tokens, the old way to choose it)"),
      Field(
          "policy.num_sink",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.num_sink; })
          .Unit("tokens")
          .Range(0, engine::kMaxRequestTokens)
          .Record(kEvicts)
          .Doc("first tokens never evicted"),
      Field(
          "policy.num_recent",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.num_recent; })
          .Unit("tokens")
          .Range(0, engine::kMaxRequestTokens)
          .Record(kEvicts)
          .Doc("last tokens never evicted"),
      Field(
          "policy.evict_interval",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.evict_interval; })
          .Unit("steps")
          .Range(1, engine::kMaxRequestTokens)
          .Record(kEvicts)
          .Doc("evict after prefill, then every N decode steps"),
      Custom(
          "policy.budget_allocation", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return std::string(BudgetAllocationName(c.engine.evictor.allocation));
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetAllocation(c, std::get<std::string>(v));
          })
          .Choices({"uniform", "pyramid", "adaptive"})
          .Record(kEvictsSet)
          .Doc("how the budget is split over KV groups: `uniform` (every group keeps the budget), "
               "`pyramid` (PyramidKV: layer l keeps b_max - (b_max - b_min) l / (L - 1) with b_min "
               "= budget / pyramid_beta, b_max = 2 budget - b_min, layer budgets summing to L x "
               "budget; needs `cache.granularity` layer or head), `adaptive` (AdaKV: the KV heads "
               "of a layer share H_kv x budget, kept by the highest scores after per-head "
               "normalisation; needs head)"),
      Field(
          "policy.pyramid_beta",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.pyramid_beta; })
          .Range(1, kNone)
          .Record(kPyramid)
          .Doc("pyramid: the last layer keeps budget / beta (PyramidKV's beta); >= 1"),
      Field(
          "policy.adaptive_floor",
          [](ExperimentConfig & c) -> auto& { return c.engine.evictor.adaptive_floor; })
          .Range(0, 1)
          .Record(kAdaptive)
          .Doc("adaptive: every head keeps at least this fraction of the budget (AdaKV's "
               "safeguard); in [0, 1]"),
      Custom(
          "policy.params", KeyType::kParams,
          [](const ExperimentConfig& c) -> KeyValue { return c.engine.policy_params; },
          [](ExperimentConfig& c, const KeyValue& v) { return SetParams(c, v); })
          .DefaultText("per policy")
          .Record(kEvicts)
          .Doc("the running policy's own parameters (see its file header and `vtoken-cli "
               "policies`). A table `policy.params.NAME` holds the parameters of policy `NAME`, "
               "applied only when `NAME` runs (so one config or grid sets several policies' "
               "parameters); checked against `NAME`'s parameters even when another policy runs; a "
               "key given both here and as `policy.params.KEY` for the running policy is an error. "
               "Runs record the applied parameters as `policy.params.KEY`"),
      Custom(
          "policy.source_xxh64", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return c.policy_source_xxh64.empty() ? PythonPolicySourceHash(c.engine.policy)
                                                 : c.policy_source_xxh64;
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            c.policy_source_xxh64 = std::get<std::string>(v);
            return Status::Ok();
          })
          .DefaultText("the file's")
          .RecordWhen(
              [](const ExperimentConfig& c) {
                return Evicts(c) && !PythonPolicySourceHash(c.engine.policy).empty();
              },
              "when the mode evicts and the policy is a Python one")
          .Doc("xxhash64 of a Python policy's file (`--python-policy`), recorded so that a "
               "changed file gives other config hashes (`sweep --resume` reruns its points); "
               "given, as in a recorded config, it must match the file"),
      Custom(
          "cache.granularity", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return std::string(GranularityName(c.granularity));
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetGranularity(c, std::get<std::string>(v));
          })
          .Choices({"token", "layer", "head"})
          .Record(kSet)
          .Doc("what one liveness bit covers: `token` (every layer and KV head, the paper's), "
               "`layer` (one token table per layer), `head` (one per layer and KV head). "
               "`engine.num_blocks`, `headroom_blocks` and `reclaim.max_moves_per_step` keep "
               "counting whole tokens (every layer and head), so every granularity gets the same "
               "KV bytes; the run splits them into blocks of one group. Block counts in the "
               "results are group blocks; the `*_token_blocks` summary figures (docs/METRICS.md) "
               "divide them back. Not with `sim.attention = \"trace:...\"` or `run "
               "--record-signals` (traces are token-level)"),
      Custom(
          "reclaim.trigger", KeyType::kString,
          [](const ExperimentConfig& c) -> KeyValue {
            return std::string(c.engine.reclaim.trigger == ReclaimOptions::Trigger::kAlways
                                   ? "always"
                                   : "pressure");
          },
          [](ExperimentConfig& c, const KeyValue& v) {
            return SetTrigger(c, std::get<std::string>(v));
          })
          .Choices({"pressure", "always"})
          .Record(kEvicts)
          .Doc("`pressure`: F > frag_threshold and free fraction < low_watermark; `always`"),
      Field(
          "reclaim.frag_threshold",
          [](ExperimentConfig & c) -> auto& { return c.engine.reclaim.frag_threshold; })
          .Range(0, 1)
          .MaxExclusive()
          .Record(kEvicts)
          .Doc("waste ratio trigger"),
      Field(
          "reclaim.low_watermark",
          [](ExperimentConfig & c) -> auto& { return c.engine.reclaim.low_watermark; })
          .Range(0, 1)
          .MinExclusive()
          .Record(kEvicts)
          .Doc("free fraction of the pool below which the pool is under pressure"),
      Field(
          "reclaim.max_moves_per_step",
          [](ExperimentConfig & c) -> auto& { return c.engine.reclaim.max_moves_per_step; })
          .Unit("tokens")
          .Range(kNone, engine::kMaxRequestTokens)
          .Record(kEvicts)
          .Doc("tokens one plan may move"),
      Field(
          "sampling.temperature",
          [](ExperimentConfig & c) -> auto& { return c.engine.sampling.temperature; })
          .Range(0, kNone)
          .Finite()
          .RangeText("a finite number >= 0 (0 = greedy)")
          .Doc("0 = greedy; each request draws from its own seeded stream (the same seed gives the "
               "same tokens); on a GPU the token is drawn on the device, on the CPU on the host, "
               "by the same rule"),
      Field(
          "sampling.top_p", [](ExperimentConfig & c) -> auto& { return c.engine.sampling.top_p; })
          .Range(0, 1)
          .MinExclusive()
          .Doc("nucleus sampling mass"),
      Field(
          "sampling.seed", [](ExperimentConfig & c) -> auto& { return c.engine.sampling.seed; })
          .Doc("seed of the sampling streams"),
  };
  for (Key& k : entries) keys.push_back(std::move(k));
  AppendSimKeys(keys);
  return keys;
}

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey> keys = MakeKeys();
  return keys;
}

}  // namespace vtoken::cli
