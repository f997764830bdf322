#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/vtoken-cli/interrupt.h"
#include "apps/vtoken-cli/model_threads.h"
#include "apps/vtoken-cli/run_checks.h"
#include "apps/vtoken-cli/run_experiment.h"
#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/engine/result_store.h"
#include "lib/engine/rouge.h"
#include "lib/engine/run_summary.h"
#include "lib/engine/stats.h"
#include "lib/engine/tasks.h"
#include "lib/engine/workload.h"
#include "lib/model/blas_info.h"
#include "lib/model/cpu_threads.h"
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

// The bytes free on the GPU for the run's KV store and weights when model.device is CUDA, else
// -1: CheckRunMemory then checks them against the host's memory, as it does where this build
// cannot ask the GPU (no lib/cuda). A device this machine lacks fails with TorchDevice's error,
// as the run would.
StatusOr<int64_t> DeviceFreeBytes(const ExperimentConfig& c) {
  if (sim::IsSimSpec(c.model)) return int64_t{-1};
  VTOKEN_ASSIGN_OR_RETURN(const torch::Device device, model::TorchDevice(c.model_device));
  if (!device.is_cuda()) return int64_t{-1};
  StatusOr<int64_t> free_bytes = model::CudaFreeBytes(device);
  if (free_bytes.status().code() == StatusCode::kFailedPrecondition) return int64_t{-1};
  return free_bytes;
}

bool IsSynthetic(const std::string& model) {
  return model.rfind("synthetic:", 0) == 0 || sim::IsSimSpec(model);
}

// What a dry run of a synthetic model validates against: the model's shape and the KV store's
// size, with no weights drawn and no KV allocated (an 8B shape would draw 16-32 GB of weights
// for a run that runs nothing). Forward refuses.
class ShapeRunner final : public model::ModelRunner {
 public:
  ShapeRunner(const model::ModelConfig& config, const model::LlamaOptions& options,
              int64_t num_slots, Granularity granularity)
      : config_(config),
        options_(options),
        num_slots_(num_slots),
        granularity_(granularity),
        store_(1, 1, 1),
        copies_(store_) {}

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_context() const override { return config_.max_position_embeddings; }
  std::optional<int32_t> bos_token_id() const override {
    if (config_.bos_token_ids.empty()) return std::nullopt;
    return static_cast<int32_t>(config_.bos_token_ids.front());
  }
  const std::vector<int64_t>& eos_token_ids() const override { return config_.eos_token_ids; }
  int64_t kv_bytes_per_token() const override {
    return model::KvBytesPerToken(
        {.num_layers = config_.num_hidden_layers,
         .num_kv_heads = config_.num_key_value_heads,
         .head_dim = config_.head_dim > 0 ? config_.head_dim
                                          : config_.hidden_size / config_.num_attention_heads,
         .dtype = options_.compute_dtype});
  }
  int64_t num_slots() const override { return num_slots_; }
  int32_t num_kv_groups() const override {
    return NumKvGroups(granularity_, config_.num_hidden_layers, config_.num_key_value_heads);
  }
  Granularity granularity() const override { return granularity_; }
  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>&) override {
    return FailedPreconditionError("a dry run has no weights to run");
  }
  CopyEngine& copy_engine() override { return copies_; }
  uint64_t TokenKvHash(SlotIndex) override { return 0; }
  void ForgetRequest(int64_t) override {}
  const model::LlamaOptions& options() const { return options_; }

 private:
  model::ModelConfig config_;
  model::LlamaOptions options_;
  int64_t num_slots_;
  Granularity granularity_;
  HostKvStore store_;
  SyncHostCopyEngine copies_;
};

bool IsSyntheticLlama(const std::string& model) { return model.rfind("synthetic:", 0) == 0; }

// A dry run's runner for a synthetic model: every check LoadModel makes before drawing weights,
// then the shape alone.
StatusOr<std::unique_ptr<model::ModelRunner>> MakeShapeRunner(const ExperimentConfig& c,
                                                              const model::ModelConfig& shape) {
  StatusOr<model::LlamaOptions> options = model::LlamaOptionsFor(c.model_device, c.model_dtype);
  if (!options.ok()) {
    return Status(options.status().code(), c.file + ": model." + options.status().message());
  }
  VTOKEN_RETURN_IF_ERROR(model::CheckModelLoads(c.model, *options));
  const int64_t slots = int64_t{c.engine.pool.num_blocks} * c.engine.pool.block_size;
  return std::unique_ptr<model::ModelRunner>(
      std::make_unique<ShapeRunner>(shape, *options, slots, c.granularity));
}

// This process's resident memory in bytes (/proc/self/statm), or -1 where it cannot be read.
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

// The run header's line on a loaded model: the file, its format and tensor types, parameters,
// load time, resident memory and the KV bytes one token takes in every layer and head (the
// runner's own figure, broken down by the model's shape).
std::string ModelLoadLine(const model::ModelDescription& d, const model::ModelConfig& mc,
                          int64_t parameters, double load_s, int64_t resident,
                          const std::string& dtype, int64_t kv_bytes) {
  const int64_t dtype_bytes =
      kv_bytes / (mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * 2);
  char line[1024];
  std::snprintf(line, sizeof(line),
                "model: %s (%s: %s), %.1fM parameters, loaded in %.2f s, resident %lld MiB; KV "
                "%lld bytes/token (%lld layers x %lld KV heads x %lld dims x K,V x %lld B %s)",
                d.path.c_str(), d.format.c_str(), d.quantization.c_str(),
                static_cast<double>(parameters) / 1e6, load_s,
                static_cast<long long>(resident >> 20), static_cast<long long>(kv_bytes),
                static_cast<long long>(mc.num_hidden_layers),
                static_cast<long long>(mc.num_key_value_heads), static_cast<long long>(mc.head_dim),
                static_cast<long long>(dtype_bytes), dtype.c_str());
  return line;
}

// `model_line`, when given, receives ModelLoadLine for a real model ("" otherwise).
StatusOr<std::unique_ptr<model::ModelRunner>> MakeRunner(const ExperimentConfig& c,
                                                         std::string* model_line = nullptr) {
  const int64_t slots = int64_t{c.engine.pool.num_blocks} * c.engine.pool.block_size;
  if (sim::IsSimSpec(c.model)) {
    StatusOr<std::unique_ptr<sim::SimRunner>> r =
        sim::MakeSimRunner(c.model, c.sim, slots, c.engine.force_sync, c.granularity);
    if (!r.ok()) return Status(r.status().code(), c.file + ": " + r.status().message());
    return std::unique_ptr<model::ModelRunner>(std::move(*r));
  }
  StatusOr<model::LlamaOptions> options = model::LlamaOptionsFor(c.model_device, c.model_dtype);
  if (!options.ok()) {
    return Status(options.status().code(), c.file + ": model." + options.status().message());
  }
  VTOKEN_RETURN_IF_ERROR(
      model::SetCpuThreads(static_cast<int>(ModelThreads(c.model_threads))).status());
  const auto start = std::chrono::steady_clock::now();
  VTOKEN_ASSIGN_OR_RETURN(model::LlamaModel m, model::LoadModel(c.model, c.model_seed, *options));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t resident = ResidentBytes();  // the weights, before the KV tensors exist
  const model::ModelConfig shape = m.config();
  const int64_t parameters = m.NumParameters();
  VTOKEN_ASSIGN_OR_RETURN(
      std::unique_ptr<model::LlamaRunner> r,
      model::LlamaRunner::Create(
          std::move(m),
          {.num_slots = slots,
           .async_copies = c.async_copies,
           .granularity = c.granularity,
           .decode = c.cuda_graphs ? model::DecodeMode::kCudaGraphs : model::DecodeMode::kEager}));
  if (model_line != nullptr && !IsSyntheticLlama(c.model)) {
    VTOKEN_ASSIGN_OR_RETURN(const model::ModelDescription d, model::DescribeModel(c.model));
    *model_line = ModelLoadLine(d, shape, parameters, load_s, resident, c.model_dtype,
                                r->kv_bytes_per_token());
  }
  return std::unique_ptr<model::ModelRunner>(std::move(r));
}

// The progress of one run on stderr. On a terminal: one line redrawn at most 5 times a second,
// with the requests done as a bar and the estimated wall time left. Elsewhere (files, CI logs):
// a plain line at most every 10 s and a last one when the run ends.
class Progress {
 public:
  Progress(std::string label, std::string time_unit)
      : label_(std::move(label)),
        unit_(std::move(time_unit)),
        tty_(isatty(2) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void Update(const engine::StepRecord& s, int64_t finished, int64_t total) {
    const double wall = Wall();
    const bool last = finished == total;
    if (!last && wall - printed_ < (tty_ ? 0.2 : 10.0)) return;
    printed_ = wall;
    char bar[21];
    const int filled = total > 0 ? static_cast<int>(20 * finished / total) : 20;
    for (int i = 0; i < 20; ++i) bar[i] = i < filled ? '#' : '.';
    bar[20] = 0;
    char eta[32] = "";
    if (finished > 0 && !last) {
      std::snprintf(eta, sizeof(eta), " eta %.0fs",
                    wall * static_cast<double>(total - finished) / static_cast<double>(finished));
    }
    std::fprintf(stderr,
                 "%s[%s] [%s] %lld/%lld done%s | step %lld, %.1f %s, running %d, waiting %d, "
                 "blocks %lld, F %.2f%s",
                 tty_ ? "\r" : "", label_.c_str(), bar, static_cast<long long>(finished),
                 static_cast<long long>(total), eta, static_cast<long long>(s.step), s.time_s,
                 unit_.c_str(), s.num_running, s.num_waiting,
                 static_cast<long long>(s.allocated_blocks), s.waste_ratio, tty_ ? "   " : "\n");
    std::fflush(stderr);
    shown_ = true;
  }
  void Finish() {
    if (tty_ && shown_) std::fprintf(stderr, "\n");
  }

 private:
  double Wall() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  std::string label_, unit_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  double printed_ = -1e9;
  bool shown_ = false;
};

}  // namespace

// What decides a prefill's K/V besides its tokens: the memo serves a chunk only to runs that
// agree on all of it.
std::string MemoPartition(const ExperimentConfig& c) {
  return c.model + "\n" + std::to_string(c.model_seed) + "\n" + c.model_device + "\n" +
         c.model_dtype + "\n" + std::to_string(ModelThreads(c.model_threads)) + "\n" +
         GranularityName(c.granularity) + "\n" + (c.cuda_graphs ? "graphs" : "eager");
}

StatusOr<RunOutcome> RunExperiment(const ExperimentConfig& config, const std::string& db_path,
                                   const std::string& sweep, bool dry_run,
                                   const std::string& record_signals, engine::PrefillMemo* memo) {
  ExperimentConfig c = config;  // With the pool split into KV-group blocks (ApplyKvGroups).
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
  if (c.workload.kind == "perplexity" && evicts && !c.engine.indirection_only &&
      c.engine.evictor.budget_tokens == 0) {
    return InvalidArgumentError(
        c.file +
        ": workload.kind \"perplexity\" evicts from a 1-token prompt: give the cache "
        "size as policy.budget_tokens (with keep_ratio = 0), not keep_ratio");
  }
  // What the run allocates and what the policy asks of the context, before anything is loaded.
  StatusOr<model::ModelConfig> shape = PeekModelConfig(c.model);
  {
    if (shape.ok()) {
      VTOKEN_ASSIGN_OR_RETURN(const int64_t device_free, DeviceFreeBytes(c));
      VTOKEN_RETURN_IF_ERROR(CheckRunMemory(c, *shape, /*available=*/-1, device_free));
      VTOKEN_RETURN_IF_ERROR(CheckPolicyAgainstContext(c, shape->max_position_embeddings));
      VTOKEN_RETURN_IF_ERROR(ApplyKvGroups(c, *shape));
    } else if (c.granularity != Granularity::kToken) {
      return shape.status();
    }
  }
  // One runner serves every mode: each run writes every KV slot before reading it, and a
  // finished run leaves no sampler state or pending copy behind.
  std::unique_ptr<model::ModelRunner> runner;
  std::string model_line;  // printed with the run's header, once nothing can fail before it
  if (dry_run && IsSyntheticLlama(c.model) && shape.ok()) {
    VTOKEN_ASSIGN_OR_RETURN(runner, MakeShapeRunner(c, *shape));
  } else {
    VTOKEN_ASSIGN_OR_RETURN(runner, MakeRunner(c, &model_line));
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
  for (Mode mode : c.modes) {
    engine::EngineOptions o = c.engine;
    o.mode = mode;
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
      c.engine.pool.num_blocks, c.engine.pool.block_size,
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
  if (sim_runner == nullptr) {
    std::fprintf(stderr, "BLAS: %s; model step on %d CPU thread(s)\n",
                 model::BlasDescription().c_str(), torch::get_num_threads());
  }
  if (auto* llama = dynamic_cast<model::LlamaRunner*>(runner.get())) {
    std::fprintf(stderr, "device %s, dtype %s, relocation by the %s copy engine\n",
                 llama->kv().options().device.str().c_str(),
                 model::TorchDtypeName(llama->kv().options().dtype).c_str(),
                 llama->copy_engine_kind());
  }
  if (auto* dry = dynamic_cast<ShapeRunner*>(runner.get())) {
    std::fprintf(stderr, "device %s, dtype %s (dry run: synthetic weights not drawn)\n",
                 dry->options().device.str().c_str(),
                 model::TorchDtypeName(dry->options().compute_dtype).c_str());
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
    // `config`, not c: the recorded configs are the user's, before the pool is split into
    // KV-group blocks (at G > 1 c's num_blocks is G times theirs).
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
    engine::EngineOptions o = c.engine;
    o.mode = mode;
    engine::RunRecord rec;
    rec.git_sha = sha;
    rec.config_toml = c.resolved_toml[mi];
    rec.config_hash = ConfigHash(c.resolved_toml[mi]);
    rec.sweep = sweep;
    rec.model = c.model;
    rec.mode = ModeName(mode);
    rec.policy = mode == Mode::kNative || o.indirection_only ? "" : o.policy;
    rec.budget = o.evictor.budget_tokens > 0 ? static_cast<double>(o.evictor.budget_tokens)
                                             : o.evictor.keep_ratio;
    rec.block_size = o.pool.block_size;
    rec.num_blocks = config.engine.pool.num_blocks;  // As configured (blocks of every group).
    rec.workload = c.workload.kind == "jsonl" ? c.workload.jsonl_path : c.workload.kind;
    rec.seed = o.seed;
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
      memo_runner.emplace(*runner, *memo, MemoPartition(c));
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
    std::vector<double> rouge_native, rouge_ref;
    // Simulated outputs are random ids: their ROUGE-L would measure nothing (reported n/a).
    if (mode == Mode::kNative && sim_runner == nullptr) native_text = texts;
    if (mode == Mode::kNaive && sim_runner == nullptr) naive_text = texts;
    std::vector<double> rouge_naive;
    if (mode == Mode::kVtoken && !naive_text.empty()) {
      for (size_t i = 0; i < texts.size(); ++i) {
        rouge_naive.push_back(engine::RougeLF1(texts[i], naive_text[i]));
      }
    }
    if (!native_text.empty() && sim_runner == nullptr) {
      for (size_t i = 0; i < texts.size(); ++i) {
        rouge_native.push_back(engine::RougeLF1(texts[i], native_text[i]));
      }
    }
    for (size_t i = 0; i < requests.size() && sim_runner == nullptr; ++i) {
      if (requests[i].reference)
        rouge_ref.push_back(engine::RougeLF1(texts[i], *requests[i].reference));
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
      double sum = 0;
      for (double x : rouge_naive) sum += x;
      summary["rouge_l_vs_naive"] = sum / static_cast<double>(rouge_naive.size());
    }
    // One transaction: a full disk leaves no partial rows, and the run is marked failed.
    Status s = store.CompleteRun(
        run_id,
        {.steps = result->steps, .requests = std::move(records), .outputs = std::move(outputs)},
        summary, {{"experiment", c.name}});
    if (!s.ok()) return fail(s);
  }
  if (trace) VTOKEN_RETURN_IF_ERROR(trace->Close());
  return outcome;
}

}  // namespace vtoken::cli
