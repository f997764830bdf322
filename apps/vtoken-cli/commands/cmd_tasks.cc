// `vtoken-cli tasks CONFIG.toml --out FILE.jsonl`: writes the task instances a config's workload
// (kind task) holds as JSON lines, so other tools (kvpress, llama.cpp, a Python script) can run on
// exactly the same inputs. One object per request, in request order:
//   {"id", "task", "context_tokens", "depth", "needle_depth", "context", "question", "prompt",
//    "answers", "scoring", "max_tokens", "protocol", "input_tokens"}
// prompt = context + question (no chat template: the reader applies its own); input_tokens
// counts them in the model's tokenizer. `workload.kind = "jsonl"` reads the file back (prompt,
// max_tokens; reference = the first answer).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/config/experiment_config.h"
#include "lib/engine/workload.h"
#include "lib/model/io/mapped_file.h"
#include "lib/model/io/model_files.h"

namespace vtoken::cli {
namespace {

struct TasksArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out = "-";
};

StatusOr<std::string> TaskLines(const ExperimentConfig& c) {
  if (c.workload.kind != "task") {
    return InvalidArgumentError(c.file + ": workload.kind is \"" + c.workload.kind +
                                "\", not \"task\": there are no task instances to write");
  }
  VTOKEN_ASSIGN_OR_RETURN(const model::Tokenizer tokenizer, model::LoadModelTokenizer(c.model));
  engine::WorkloadOptions wo = c.workload;
  wo.chat = false;  // the raw texts: a reader applies its own template
  VTOKEN_ASSIGN_OR_RETURN(const std::vector<engine::Request> requests,
                          engine::GenerateWorkload(wo, &tokenizer, tokenizer.vocab_size()));
  std::string lines;
  for (const engine::Request& r : requests) {
    const engine::Request::Task& t = *r.task;
    nlohmann::json j = {
        {"id", r.id},
        {"task", t.name},
        {"context_tokens", t.context_tokens},
        {"depth", t.depth ? nlohmann::json(*t.depth) : nlohmann::json(nullptr)},
        {"needle_depth",
         t.needle_depth ? nlohmann::json(*t.needle_depth) : nlohmann::json(nullptr)},
        {"prompt", r.prompt},
        {"answers", t.expected},
        {"scoring", t.scoring == engine::TaskScoring::kAll ? "all" : "part"},
        {"max_tokens", r.max_tokens},
        {"protocol", engine::TaskProtocolName(c.workload.protocol)},
        {"input_tokens", r.prompt_tokens.size() + r.question_tokens.size()},
        {"reference", t.expected.empty() ? "" : t.expected[0]},
    };
    // The split both protocols use: the context, then the question (prompt's end: no template).
    j["context"] = r.prompt.substr(0, r.prompt.size() - t.question.size());
    j["question"] = t.question;
    lines += j.dump() + "\n";
  }
  return lines;
}

int RunTasks(const TasksArgs& a) {
  StatusOr<ExperimentConfig> config = LoadExperimentConfig(a.config, a.sets);
  if (!config.ok()) {
    PrintError(config.status());
    return 2;
  }
  StatusOr<std::string> lines = TaskLines(*config);
  if (!lines.ok()) {
    PrintError(lines.status());
    return 1;
  }
  if (a.out == "-") {
    std::fwrite(lines->data(), 1, lines->size(), stdout);
    return 0;
  }
  // A failed write leaves no partial file.
  const Status written = model::WriteFileAtomically(
      a.out, [&](model::FileSink& out) { return out.Write(lines->data(), lines->size()); });
  if (!written.ok()) {
    std::fprintf(stderr, "vtoken-cli: error: tasks --out: %s\n", written.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %lld task instances to %s\n",
               static_cast<long long>(config->workload.num_requests), a.out.c_str());
  return 0;
}

CLI::App* SetupTasks(CLI::App& app) {
  auto a = std::make_shared<TasksArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tasks", "Write a task workload's instances as JSON lines (prompt, answers, depth, ...)");
  cmd->add_option("config", a->config, "Experiment TOML file (workload.kind = \"task\")")
      ->required();
  cmd->add_option("--set", a->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", a->out, "Output file, - for stdout")->capture_default_str();
  cmd->callback([a] { SetExitCode(RunTasks(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("tasks", SetupTasks);

}  // namespace vtoken::cli
