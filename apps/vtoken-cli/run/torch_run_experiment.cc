#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/vtoken-cli/run/interrupt.h"
#include "apps/vtoken-cli/run/model_threads.h"
#include "apps/vtoken-cli/run/progress.h"
#include "apps/vtoken-cli/run/run_checks.h"
#include "apps/vtoken-cli/run/run_experiment.h"
#include "apps/vtoken-cli/run/run_model.h"
#include "apps/vtoken-cli/run/run_spec.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/engine/result_store.h"
#include "lib/engine/rouge.h"
#include "lib/engine/run_summary.h"
#include "lib/engine/stats.h"
#include "lib/engine/tasks.h"
#include "lib/engine/workload.h"
#include "lib/model/blas_info.h"
#include "lib/model/cpu_bf16.h"
#include "lib/model/cpu_isa.h"
#include "lib/model/cpu_quant_ops.h"
#include "lib/model/io/model_files.h"
#include "lib/model/io/tokenizer.h"
#include "lib/model/llama_runner.h"
#include "lib/model/torch_device.h"
#include "lib/sim/signal_trace.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::cli {
namespace {

std::string GitSha() {
  FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[64] = {0};
  std::string sha;
  if (fgets(buf, sizeof(buf), p) != nullptr) sha = buf;
  pclose(p);
  while (!sha.empty() && (sha.back() == '\n' || sha.back() == '\r')) sha.pop_back();
  if (sha.empty()) return "";
  p = popen("git status --porcelain --untracked-files=no 2>/dev/null", "r");
  if (p != nullptr) {
    if (fgets(buf, sizeof(buf), p) != nullptr) sha += "-dirty";
    pclose(p);
  }
  return sha;
}

}  // namespace

// What decides a prefill's K/V besides its tokens: the memo serves a chunk only to runs that
// agree on all of it.
std::string MemoPartition(const ExperimentConfig& c) {
  return c.model + "\n" + std::to_string(c.model_seed) + "\n" + c.model_device + "\n" +
         c.model_dtype + "\n" + std::to_string(ModelThreads(c.model_threads)) + "\n" +
         GranularityName(c.granularity) + "\n" + (c.cuda_graphs ? "graphs" : "eager") +
         (c.model_weights != "float32" ? "\n" + c.model_weights : "") +
         (c.model_kv_dtype != "auto" ? "\nkv " + c.model_kv_dtype : "");
}

// What a persistent memo's chunks also depend on in a later invocation: this binary, the
// contents of the model's files, the host's CPU and kernel path, BLAS and libtorch.
StatusOr<std::string> MemoIdentity(const ExperimentConfig& c,
                                   const std::map<std::string, std::string>& host) {
  std::vector<std::string> files = {"/proc/self/exe"};
  if (!IsSynthetic(c.model)) {  // a synthetic model's weights follow from model_seed
    VTOKEN_ASSIGN_OR_RETURN(const std::string path, model::ResolveModelPath(c.model));
    if (model::IsModelFile(path)) {
      files.push_back(path);
    } else {
      std::vector<std::string> in_dir;
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) in_dir.push_back(entry.path().string());
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    }
  }
  VTOKEN_ASSIGN_OR_RETURN(const uint64_t hash, engine::PrefillMemo::HashFiles(files));
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  std::string identity = std::string("files ") + hex + "\ntorch " + TORCH_VERSION;
  for (const auto& [key, value] : host) {
    if (key != "cpu_threads") identity += "\n" + key + " " + value;
  }
  return identity;
}

StatusOr<RunOutcome> RunExperiment(const ExperimentConfig& config, const std::string& db_path,
                                   const std::string& sweep, bool dry_run,
                                   const std::string& record_signals, engine::PrefillMemo* memo) {
  const ExperimentConfig& c = config;
  // Everything that can fail on bad input fails here, before the database is touched.
  VTOKEN_RETURN_IF_ERROR(CheckRunFiles(c));
  std::optional<model::Tokenizer> tokenizer;
  if (!IsSynthetic(c.model)) {
    VTOKEN_ASSIGN_OR_RETURN(model::Tokenizer t, model::LoadModelTokenizer(c.model));
    tokenizer = std::move(t);
  }
  std::optional<model::ChatTemplate> chat;
  if (c.workload.chat) {
    if (!tokenizer) {
      return InvalidArgumentError(c.file +
                                  ": workload.chat needs a model with a tokenizer and a "
                                  "chat template, not " +
                                  c.model);
    }
    VTOKEN_ASSIGN_OR_RETURN(model::ChatTemplate t, model::LoadModelChatTemplate(c.model));
    chat = std::move(t);
  }
  if ((c.workload.kind == "sharegpt_like" || c.workload.kind == "longbench_like") && tokenizer &&
      c.workload.corpus_path.empty()) {
    return InvalidArgumentError(c.file + ": workload.corpus is required for a real model");
  }
  const bool evicts =
      std::any_of(c.modes.begin(), c.modes.end(), [](Mode m) { return m != Mode::kNative; });
  VTOKEN_ASSIGN_OR_RETURN(const ExperimentSpec spec,
                          BuildExperimentSpec(c, [&] { return DeviceFreeBytes(c); }));
  // One runner serves every mode: each run writes every KV slot before reading it, and a
  // finished run leaves no sampler state or pending copy behind.
  std::unique_ptr<model::ModelRunner> runner;
  std::string model_line;  // printed with the run's header, once nothing can fail before it
  if (dry_run && IsSyntheticLlama(c.model) && spec.shape) {
    VTOKEN_ASSIGN_OR_RETURN(runner, MakeShapeRunner(c, *spec.shape, spec.run.num_slots));
  } else {
    VTOKEN_ASSIGN_OR_RETURN(runner, MakeRunner(c, spec.run.num_slots, &model_line));
  }
  auto* sim_runner = dynamic_cast<sim::SimRunner*>(runner.get());
  if (!record_signals.empty() && c.granularity != Granularity::kToken) {
    return InvalidArgumentError("--record-signals records token-granularity signals; " + c.file +
                                " sets cache.granularity \"" + GranularityName(c.granularity) +
                                "\"");
  }
  if (sim_runner != nullptr && !record_signals.empty()) {
    return InvalidArgumentError("--record-signals needs a real model, not " + c.model);
  }
  engine::WorkloadOptions wo = c.workload;
  if (chat) {
    const model::ChatWrap wrap = model::ChatWrapFor(*chat, runner->bos_token_id().has_value());
    wo.chat_prefix = wrap.before;
    wo.chat_suffix = wrap.after;
  }
  VTOKEN_ASSIGN_OR_RETURN(
      std::vector<engine::Request> requests,
      engine::GenerateWorkload(wo, tokenizer ? &*tokenizer : nullptr, runner->vocab_size()));
  for (const engine::EngineOptions& o : spec.run.runs) {
    VTOKEN_RETURN_IF_ERROR(engine::ValidateEngineOptions(o, *runner, requests));
  }
  // Opened (created) once everything else is valid, and before the run's description prints:
  // a database error is then the only line.
  std::optional<engine::ResultStore> opened;
  if (!dry_run) {
    VTOKEN_ASSIGN_OR_RETURN(engine::ResultStore s, engine::ResultStore::Open(db_path));
    opened.emplace(std::move(s));
  }
  const std::string warning = ProtectionWarning(c, requests, runner->bos_token_id().has_value());
  if (!warning.empty()) std::fprintf(stderr, "vtoken-cli: warning: %s\n", warning.c_str());
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (const engine::Request& r : requests) {
    prompt_tokens += static_cast<int64_t>(r.prompt_tokens.size());
    output_tokens += r.max_tokens;
  }
  if (!model_line.empty()) std::fprintf(stderr, "%s\n", model_line.c_str());
  std::fprintf(
      stderr,
      "experiment %s: model %s, %zu requests (%s, %lld prompt / %lld output tokens), "
      "pool %d x %d slots%s, modes:",
      c.name.c_str(), c.model.c_str(), requests.size(), c.workload.kind.c_str(),
      static_cast<long long>(prompt_tokens), static_cast<long long>(output_tokens),
      spec.run.runs.front().pool.num_blocks, spec.run.runs.front().pool.block_size,
      c.granularity == Granularity::kToken
          ? ""
          : (std::string(" of one KV group (granularity ") + GranularityName(c.granularity) + ", " +
             std::to_string(runner->num_kv_groups()) + " groups)")
                .c_str());
  for (Mode m : c.modes) std::fprintf(stderr, " %s", ModeName(m));
  std::fprintf(stderr, "\n");
  int64_t cut = 0, longest = 0;
  for (const engine::Request& r : requests) {
    if (r.truncated_from == 0) continue;
    ++cut;
    longest = std::max(longest, r.truncated_from);
  }
  if (cut > 0) {
    std::fprintf(stderr,
                 "workload: %lld of %zu prompts longer than workload.max_total_tokens allows "
                 "(longest %lld tokens) were cut (truncate = \"%s\")\n",
                 static_cast<long long>(cut), requests.size(), static_cast<long long>(longest),
                 c.workload.truncate.c_str());
  }
  if (sim_runner != nullptr) {
    std::fprintf(stderr,
                 "simulated: no weights or KV tensors; %s signals; virtual clock of %s (%s); "
                 "outputs are random token ids (quality n/a)\n",
                 sim_runner->signals().Describe().c_str(), c.sim.hardware.name.c_str(),
                 c.sim.dtype.c_str());
  }
  if (!c.pool_sizing.empty()) std::fprintf(stderr, "pool sizing: %s\n", c.pool_sizing.c_str());
  if (evicts && !c.engine.indirection_only) {
    StatusOr<std::unique_ptr<Policy>> policy =
        CreatePolicy(c.engine.policy, c.engine.policy_params);
    if (policy.ok()) {
      std::fprintf(stderr, "policy %s %s\n", c.engine.policy.c_str(),
                   SignalSchedule(**policy, c.engine.evictor.evict_interval).c_str());
    }
  }
  // The host a model run measured on, recorded with each run (summary_text) and printed.
  std::map<std::string, std::string> host;
  if (sim_runner == nullptr) {
    host = {{"cpu_model", model::CpuModelName()},
            {"cpu_isa", std::string(model::CpuIsaName(model::ActiveCpuIsa()))},
            {"cpu_threads", std::to_string(torch::get_num_threads())},
            {"blas", model::BlasDescription()}};
    // Weights as stored times 8-bit activations: the integer kernel in use (VNNI or not).
    // bf16 weights: the bf16 kernel in use (AVX-512 BF16 or not).
    std::string kernels;
    if (c.model_weights == "as_stored_q8") {
      host["cpu_q8_kernel"] = std::string(model::CpuQ8KernelName(model::ActiveCpuQ8Kernel()));
      kernels = ", q8 " + host["cpu_q8_kernel"];
    }
    if (c.model_weights == "bfloat16") {
      host["cpu_bf16_kernel"] = std::string(model::CpuBf16KernelName(model::ActiveCpuBf16Kernel()));
      kernels = ", bf16 " + host["cpu_bf16_kernel"];
    }
    std::fprintf(stderr, "BLAS: %s; model step on %d CPU thread(s)\n",
                 model::BlasDescription().c_str(), torch::get_num_threads());
    std::fprintf(stderr, "CPU: %s; kernels for %s%s\n", host["cpu_model"].c_str(),
                 host["cpu_isa"].c_str(), kernels.c_str());
  }
  // A persistent memo serves later invocations: its partition also names what they may differ in.
  std::string memo_partition = MemoPartition(c);
  if (memo != nullptr && memo->persistent() && sim_runner == nullptr) {
    VTOKEN_ASSIGN_OR_RETURN(const std::string identity, MemoIdentity(c, host));
    memo_partition += "\n" + identity;
  }
  if (auto* llama = dynamic_cast<model::LlamaRunner*>(runner.get())) {
    std::fprintf(stderr, "device %s, dtype %s, KV %s, relocation by the %s copy engine\n",
                 llama->kv().options().device.str().c_str(),
                 model::TorchDtypeName(llama->model().options().compute_dtype).c_str(),
                 model::TorchDtypeName(llama->kv().options().dtype).c_str(),
                 llama->copy_engine_kind());
  }
  if (auto* dry = dynamic_cast<ShapeRunner*>(runner.get())) {
    const model::LlamaOptions& o = dry->options();
    std::fprintf(stderr, "device %s, dtype %s, KV %s (dry run: synthetic weights not drawn)\n",
                 o.device.str().c_str(), model::TorchDtypeName(o.compute_dtype).c_str(),
                 model::TorchDtypeName(o.kv_dtype.value_or(o.compute_dtype)).c_str());
  }
  if (dry_run) {
    for (size_t i = 0; i < c.modes.size(); ++i) {
      std::printf("# run %zu: %s (config hash %s)\n%s\n", i + 1, ModeName(c.modes[i]),
                  ConfigHash(c.resolved_toml[i]).c_str(), c.resolved_toml[i].c_str());
    }
    return RunOutcome{};
  }

  std::unique_ptr<sim::SignalTraceWriter> trace;
  if (!record_signals.empty()) {
    VTOKEN_ASSIGN_OR_RETURN(trace, sim::SignalTraceWriter::Create(record_signals, c.model));
  }
  InstallInterruptHandlers();
  engine::ResultStore& store = *opened;
  const std::string sha = GitSha();
  RunOutcome outcome;
  std::vector<std::string> native_text, naive_text;
  // A sweep resumed half-way runs only its missing modes: score them against the outputs of
  // the point's native / naive runs completed earlier in the same sweep.
  auto earlier_outputs = [&](Mode mode, std::vector<std::string>& texts) -> Status {
    if (sweep.empty() || std::find(c.modes.begin(), c.modes.end(), mode) != c.modes.end()) {
      return Status::Ok();
    }
    VTOKEN_ASSIGN_OR_RETURN(std::optional<int64_t> id,
                            store.FindCompleted(ConfigHash(ResolvedToml(config, mode)), sweep));
    if (!id) return Status::Ok();
    VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::OutputRecord> outputs, store.GetOutputs(*id));
    if (outputs.size() != requests.size()) return Status::Ok();
    std::sort(outputs.begin(), outputs.end(),
              [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
    for (const engine::OutputRecord& o : outputs) texts.push_back(o.text);
    return Status::Ok();
  };
  VTOKEN_RETURN_IF_ERROR(earlier_outputs(Mode::kNative, native_text));
  VTOKEN_RETURN_IF_ERROR(earlier_outputs(Mode::kNaive, naive_text));
  for (size_t mi = 0; mi < c.modes.size(); ++mi) {
    const Mode mode = c.modes[mi];
    const engine::EngineOptions& o = spec.run.runs[mi];
    engine::RunRecord rec = spec.records[mi];
    rec.git_sha = sha;
    rec.sweep = sweep;
    if (InterruptSignal() != 0) {
      return FailedPreconditionError(std::string("interrupted by ") + InterruptSignalName() +
                                     " before mode " + ModeName(mode));
    }
    VTOKEN_ASSIGN_OR_RETURN(int64_t run_id, store.BeginRun(rec));
    outcome.run_ids.push_back(run_id);
    // A run that does not complete keeps none of its rows (FailRun deletes them).
    auto fail = [&](const Status& s) {
      Status marked = store.FailRun(run_id, s.message());
      if (marked.ok()) return s;
      return Status(s.code(), s.message() + " (and run " + std::to_string(run_id) +
                                  " could not be marked failed: " + marked.message() + ")");
    };
    const std::string label = std::string(ModeName(mode));
    Progress progress(label + " " + std::to_string(mi + 1) + "/" + std::to_string(c.modes.size()),
                      sim_runner != nullptr ? "virtual s" : "s");
    if (sim_runner != nullptr) sim_runner->BeginRun(label);
    // The prefill memo below the recorder: a recorded trace sees the signals a run observes.
    std::optional<engine::MemoRunner> memo_runner;
    if (memo != nullptr && sim_runner == nullptr) {
      memo_runner.emplace(*runner, *memo, memo_partition);
    }
    model::ModelRunner& model_runner =
        memo_runner ? static_cast<model::ModelRunner&>(*memo_runner) : *runner;
    const engine::PrefillMemoStats memo_before = memo ? memo->stats() : engine::PrefillMemoStats{};
    std::optional<sim::RecordingRunner> recorder;
    if (trace) recorder.emplace(model_runner, *trace, label);
    model::ModelRunner& run_with =
        recorder ? static_cast<model::ModelRunner&>(*recorder) : model_runner;
    auto* llama_runner = dynamic_cast<model::LlamaRunner*>(runner.get());
    const model::DecodeStats graphs_before =
        llama_runner != nullptr ? llama_runner->decode_stats() : model::DecodeStats{};
    // A torch error inside the model (out of device memory, a failed check) fails this run like
    // any other error: one line, the run marked failed, its rows deleted.
    auto run_engine = [&]() -> StatusOr<engine::EngineResult> {
      try {
        return engine::RunEngine(
            o, run_with, requests,
            [&](const engine::StepRecord& s, int64_t finished, int64_t total) {
              progress.Update(s, finished, total);
            },
            [] { return InterruptSignal() != 0; });
      } catch (const std::exception& e) {
        const std::string what = e.what();
        return InternalError(label + ": the model failed: " + what.substr(0, what.find('\n')));
      }
    };
    StatusOr<engine::EngineResult> result = run_engine();
    progress.Finish();
    if (c.cuda_graphs && llama_runner != nullptr) {  // What engine.cuda_graphs did in this run.
      const model::DecodeStats g = llama_runner->decode_stats();
      std::fprintf(stderr,
                   "%s: CUDA graphs: %lld decode steps, %lld replayed, %lld buckets captured, "
                   "%lld capture failures\n",
                   label.c_str(),
                   static_cast<long long>(g.static_steps - graphs_before.static_steps),
                   static_cast<long long>(g.replays - graphs_before.replays),
                   static_cast<long long>(g.bodies_built - graphs_before.bodies_built),
                   static_cast<long long>(g.capture_failures - graphs_before.capture_failures));
    }
    if (!result.ok() && InterruptSignal() != 0) {
      const std::string why = std::string("interrupted by ") + InterruptSignalName() + " (" +
                              result.status().message() + ")";
      Status marked = store.InterruptRun(run_id, why);
      return FailedPreconditionError(
          "run " + std::to_string(run_id) + " " + why +
          (marked.ok() ? "; marked interrupted" : "; could not mark it: " + marked.message()));
    }
    if (!result.ok()) return fail(result.status());
    if (result->violations > 0) {
      return fail(InternalError("verification found " + std::to_string(result->violations) +
                                " violations; first: " + result->first_violations[0]));
    }
    std::vector<engine::OutputRecord> outputs;
    std::vector<std::string> texts;
    std::vector<engine::RequestRecord> records = engine::ToRequestRecords(*result);
    for (const engine::RequestResult& q : result->requests) {
      // Special tokens (EOS) are no part of the text that ROUGE-L scores.
      std::string text =
          tokenizer ? tokenizer->Decode(q.output_tokens, /*skip_special=*/true) : std::string();
      if (!tokenizer) {
        for (int32_t t : q.output_tokens) text += std::to_string(t) + " ";
      }
      texts.push_back(text);
      outputs.push_back({.request_id = q.request_id, .text = text, .token_ids = q.output_tokens});
      if (!q.token_logprobs.empty()) {
        outputs.back().token_logprobs = nlohmann::json(q.token_logprobs).dump();
      }
    }
    // ROUGE-L of each request's output: against native's, naive's (vtoken runs) and the
    // reference, stored per request; the summary keeps their means.
    // Simulated outputs are random ids: their ROUGE-L would measure nothing (reported n/a).
    if (mode == Mode::kNative && sim_runner == nullptr) native_text = texts;
    if (mode == Mode::kNaive && sim_runner == nullptr) naive_text = texts;
    std::vector<double> rouge_native, rouge_naive, rouge_ref;
    for (size_t i = 0; i < texts.size() && sim_runner == nullptr; ++i) {
      engine::RequestRecord& rec_i = records[i];
      if (i < native_text.size()) {
        rec_i.rouge_l_vs_native = engine::RougeLF1(texts[i], native_text[i]);
      }
      if (mode == Mode::kVtoken && i < naive_text.size()) {
        rec_i.rouge_l_vs_naive = engine::RougeLF1(texts[i], naive_text[i]);
      }
      if (requests[i].reference) {
        rec_i.rouge_l_vs_reference = engine::RougeLF1(texts[i], *requests[i].reference);
      }
      if (rec_i.rouge_l_vs_native) rouge_native.push_back(*rec_i.rouge_l_vs_native);
      if (rec_i.rouge_l_vs_naive) rouge_naive.push_back(*rec_i.rouge_l_vs_naive);
      if (rec_i.rouge_l_vs_reference) rouge_ref.push_back(*rec_i.rouge_l_vs_reference);
    }
    std::map<std::string, double> summary = engine::SummarizeRun(*result, rouge_native, rouge_ref);
    // Task requests: RULER's score of each output against its expected strings.
    std::vector<double> scores;
    for (size_t i = 0; i < requests.size(); ++i) {
      engine::RequestRecord& rec_i = records[i];
      const std::vector<double>& lps = result->requests[i].token_logprobs;
      if (!lps.empty() && sim_runner == nullptr) {
        double nll = 0;
        for (double lp : lps) nll -= lp;
        rec_i.nll_mean = nll / static_cast<double>(lps.size());
      }
      if (!requests[i].task) continue;
      const engine::Request::Task& t = *requests[i].task;
      rec_i.task = t.name;
      rec_i.context_tokens = t.context_tokens;
      rec_i.depth = t.depth;
      rec_i.needle_depth = t.needle_depth;
      rec_i.expected = nlohmann::json(t.expected).dump();
      if (sim_runner != nullptr) continue;  // random ids: no score
      rec_i.score = engine::ScoreTaskOutput(t.scoring, t.expected, texts[i]);
      rec_i.score_partial = engine::PartialTaskScore(t.scoring, t.expected, texts[i]);
      scores.push_back(*rec_i.score);
    }
    // Teacher-forced requests: perplexity over every scored token of the run.
    double logprob_sum = 0;
    int64_t scored = 0;
    for (const engine::RequestResult& q : result->requests) {
      for (double lp : q.token_logprobs) {
        logprob_sum += lp;
        ++scored;
      }
    }
    if (scored > 0 && sim_runner == nullptr) {
      summary["nll_mean"] = -logprob_sum / static_cast<double>(scored);
      summary["perplexity"] = std::exp(summary["nll_mean"]);
    }
    if (!scores.empty()) {
      const engine::MeanCi acc = engine::MeanCi95(scores);
      summary["task_accuracy"] = acc.mean;
      summary["task_accuracy_ci95"] = acc.half_width;
    }
    if (memo_runner) {
      const engine::PrefillMemoStats& m = memo->stats();
      const int64_t restored = m.tokens_restored - memo_before.tokens_restored;
      summary["prefill_restored_tokens"] = static_cast<double>(restored);
      if (restored > 0) {
        engine::DropRequestTimes(summary);
        std::fprintf(stderr,
                     "%s: %lld prompt tokens' prefill restored from an earlier run (their K/V, "
                     "first token and signals as computed there; the run records no request "
                     "times)\n",
                     label.c_str(), static_cast<long long>(restored));
      }
      if (m.kv_mismatches > memo_before.kv_mismatches) {
        std::fprintf(stderr,
                     "%s: warning: %lld recomputed prefill chunks differ from the memo's K/V "
                     "(the model's step is not batch-invariant); rerun with --no-prefill-memo "
                     "for exact separate runs\n",
                     label.c_str(),
                     static_cast<long long>(m.kv_mismatches - memo_before.kv_mismatches));
      }
    }
    if (!rouge_naive.empty()) {
      summary["rouge_l_vs_naive"] = engine::MeanCi95(rouge_naive).mean;
    }
    // ROUGE-L's interval over the run's requests, as the task accuracy's.
    if (rouge_native.size() > 1) {
      summary["rouge_l_vs_native_ci95"] = engine::MeanCi95(rouge_native).half_width;
    }
    // One transaction: a full disk leaves no partial rows, and the run is marked failed.
    std::map<std::string, std::string> text = host;
    text["experiment"] = c.name;
    Status s = store.CompleteRun(
        run_id,
        {.steps = result->steps, .requests = std::move(records), .outputs = std::move(outputs)},
        summary, text);
    if (!s.ok()) return fail(s);
  }
  if (trace) VTOKEN_RETURN_IF_ERROR(trace->Close());
  return outcome;
}

}  // namespace vtoken::cli
