// `vtoken-cli sweep CONFIG.toml`: runs every point of the config's [sweep.grid] (one
// RunExperiment each, its runs tagged with the sweep name), with a progress line; --resume
// skips what the database already has, --shard I/N runs a deterministic share, --jobs N runs
// points in parallel child processes (`vtoken-cli run ... --sweep NAME`). See docs/SWEEPS.md.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/vtoken-cli/commands/command.h"
#include "apps/vtoken-cli/commands/memo_flags.h"
#include "apps/vtoken-cli/config/experiment_config.h"
#include "apps/vtoken-cli/config/sweep_grid.h"
#include "apps/vtoken-cli/run/interrupt.h"
#include "apps/vtoken-cli/run/run_checks.h"
#include "apps/vtoken-cli/run/run_experiment.h"
#include "lib/core/policy_registry.h"
#include "lib/engine/result_store.h"

extern char** environ;

namespace vtoken::cli {
namespace {

// Child processes at most (--jobs): each loads its own model.
constexpr int64_t kMaxJobs = 256;

struct SweepArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string db;
  std::string shard = "0/1";
  int64_t jobs = 1;
  bool resume = false;
  bool dry_run = false;
  MemoArgs memo;
};

// One point of the grid with its loaded config and what is left to run of it.
struct PointPlan {
  SweepPoint point;
  ExperimentConfig config;
  std::vector<std::string> hashes;  // config hash per mode, in config.modes order
  std::vector<bool> completed;      // per mode: a completed run of this sweep exists
  // Per mode: the index (into the plans) of the earlier point that runs this mode's config, or
  // -1. Points that differ only in what a mode does not read (native: [policy] and [reclaim],
  // so native runs once per distinct native config) share one run.
  std::vector<int64_t> same_as;
  std::vector<Mode> todo;          // modes this invocation runs
  std::string status = "pending";  // then "skipped" | "done" | "failed"
  std::string error;
};

// The modes `p` shares with earlier points, e.g. " (native: point 0's run)"; "" when none.
std::string SharedRuns(const PointPlan& p, const std::vector<PointPlan>& plans) {
  std::string out;
  for (size_t m = 0; m < p.same_as.size(); ++m) {
    if (p.same_as[m] < 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(ModeName(p.config.modes[m])) + ": point " +
           std::to_string(plans[p.same_as[m]].point.index) + "'s run";
  }
  return out.empty() ? "" : " (" + out + ")";
}

std::string JoinOverrides(const std::vector<std::string>& overrides) {
  std::string out;
  for (const std::string& o : overrides) out += (out.empty() ? "" : ", ") + o;
  return out.empty() ? "(base config)" : out;
}

std::string ModeList(const std::vector<Mode>& modes) {
  std::string out;
  for (Mode m : modes) out += (out.empty() ? "" : " ") + std::string(ModeName(m));
  return out.empty() ? "-" : out;
}

// The `--set modes=[...]` override that restricts a point to the modes still to run. The
// resolved config of a run names only its own mode, so this leaves the config hashes alone.
std::string ModesOverride(const std::vector<Mode>& modes) {
  std::string out = "modes=[";
  for (size_t i = 0; i < modes.size(); ++i) {
    out += (i ? ", '" : "'") + std::string(ModeName(modes[i])) + "'";
  }
  return out + "]";
}

// The point's config restricted to `modes` (a subset of its own, same order).
ExperimentConfig RestrictModes(const ExperimentConfig& c, const std::vector<Mode>& modes) {
  ExperimentConfig out = c;
  out.modes.clear();
  out.resolved_toml.clear();
  for (size_t i = 0; i < c.modes.size(); ++i) {
    if (std::find(modes.begin(), modes.end(), c.modes[i]) == modes.end()) continue;
    out.modes.push_back(c.modes[i]);
    out.resolved_toml.push_back(c.resolved_toml[i]);
  }
  return out;
}

// What a run needs that LoadExperimentConfig does not look at (files, the policy and its
// params); checked for every point up front so a typo in one value of the grid fails before
// the first point runs.
Status CheckPoint(const ExperimentConfig& c) {
  const bool evicts =
      std::any_of(c.modes.begin(), c.modes.end(), [](Mode m) { return m != Mode::kNative; });
  if (evicts && !c.engine.indirection_only) {
    VTOKEN_RETURN_IF_ERROR(CreatePolicy(c.engine.policy, c.engine.policy_params).status());
  }
  if (sim::IsSimSpec(c.model)) {
    VTOKEN_RETURN_IF_ERROR(sim::SimModelConfig(c.model).status());
    if (c.sim.attention.rfind("trace:", 0) == 0 &&
        !std::filesystem::exists(c.sim.attention.substr(6))) {
      return NotFoundError("signal trace " + c.sim.attention.substr(6) + " not found");
    }
  }
  VTOKEN_RETURN_IF_ERROR(CheckRunFiles(c));
  if (c.workload.kind == "jsonl" && !std::filesystem::exists(c.workload.jsonl_path)) {
    return NotFoundError("workload file " + c.workload.jsonl_path + " not found");
  }
  return Status::Ok();
}

// The progress line on stderr: redrawn in place on a terminal, one line per change otherwise.
class ProgressLine {
 public:
  explicit ProgressLine(int64_t jobs)
      : jobs_(jobs), tty_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // Prints `text` on its own line, above the bar.
  void Message(const std::string& text) {
    std::fprintf(stderr, "%s%s\n", tty_ && drawn_ ? "\r\033[K" : "", text.c_str());
    drawn_ = false;
  }
  // Draws the bar; `keep` ends it with a newline (when other output follows it).
  void Draw(const SweepProgress& p, bool keep) {
    const std::string bar = FormatProgress(p, elapsed_s(), jobs_);
    if (tty_ && !keep) {
      std::fprintf(stderr, "\r%s\033[K", bar.c_str());
      drawn_ = true;
    } else {
      std::fprintf(stderr, "%s%s\n", tty_ && drawn_ ? "\r\033[K" : "", bar.c_str());
      drawn_ = false;
    }
    std::fflush(stderr);
  }

 private:
  int64_t jobs_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

// The error a failed child reported: its last "vtoken-cli: error:" line, else its last line.
std::string ChildError(const std::string& log_path, int wait_status) {
  std::ifstream in(log_path);
  std::string line, last, error;
  while (std::getline(in, line)) {
    const size_t cr = line.rfind('\r');
    if (cr != std::string::npos) line = line.substr(cr + 1);
    if (line.empty()) continue;
    last = line;
    if (line.rfind("vtoken-cli: error: ", 0) == 0) error = line.substr(19);
  }
  std::string why = WIFSIGNALED(wait_status)
                        ? "killed by signal " + std::to_string(WTERMSIG(wait_status))
                        : "exit status " + std::to_string(WEXITSTATUS(wait_status));
  if (!error.empty()) return error + " (" + why + ")";
  return why + (last.empty() ? "" : ": " + last);
}

struct Child {
  pid_t pid;
  size_t plan;           // index into the plans
  std::string log_path;  // the child's stdout and stderr
};

// Starts `vtoken-cli run` for one point; its output goes to a temporary log file.
StatusOr<Child> StartChild(const SweepArgs& a, const std::string& db, const std::string& sweep,
                           const PointPlan& p, size_t plan_index) {
  std::vector<std::string> args = {"/proc/self/exe", "run", a.config, "--db", db, "--sweep", sweep};
  // Each child keeps its own prefill memo (its point's modes share it), within its share.
  if (a.memo.off) args.push_back("--no-prefill-memo");
  if (a.memo.on) args.push_back("--prefill-memo");
  if (!a.memo.dir.empty()) args.insert(args.end(), {"--prefill-memo-dir", a.memo.dir});
  args.insert(args.end(), {"--prefill-memo-gib", std::to_string(a.memo.gib / a.jobs)});
  std::vector<std::string> sets = a.sets;
  sets.insert(sets.end(), p.point.overrides.begin(), p.point.overrides.end());
  if (p.todo.size() != p.config.modes.size()) sets.push_back(ModesOverride(p.todo));
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    // N torch processes each sized for the whole machine oversubscribe it badly.
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    env.push_back("OMP_NUM_THREADS=" + std::to_string(std::max<int64_t>(1, cores / a.jobs)));
  }
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<char*> argv, envp;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);

  std::string log_path =
      (std::filesystem::temp_directory_path() / "vtoken-sweep-XXXXXX.log").string();
  const int log_fd = mkstemps(log_path.data(), 4);
  if (log_fd < 0) return InternalError("cannot create a log file in " + log_path);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return InternalError("fork failed for sweep point " + std::to_string(p.point.index));
  }
  if (pid == 0) {
    // A child outliving a kill -9'd sweep would finish its run behind the back of the
    // resume that follows and record the point twice.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(log_fd);
  return Child{.pid = pid, .plan = plan_index, .log_path = log_path};
}

int RunSweep(const SweepArgs& a) {
  auto fail = [](const std::string& message, int code) {
    std::fprintf(stderr, "vtoken-cli: error: %s\n", message.c_str());
    return code;
  };
  StatusOr<ExperimentConfig> base = LoadExperimentConfig(a.config, a.sets);
  if (!base.ok()) return fail(base.status().message(), 2);
  if (!base->has_sweep_table) {
    return fail(a.config +
                    " has no [sweep] table: nothing to sweep (`vtoken-cli run` runs one "
                    "config)",
                2);
  }
  StatusOr<Shard> shard = ParseShard(a.shard);
  if (!shard.ok()) return fail(shard.status().message(), 2);
  if (a.jobs < 1 || a.jobs > kMaxJobs) {
    return fail(
        "--jobs must be in [1, " + std::to_string(kMaxJobs) + "], got " + std::to_string(a.jobs),
        2);
  }
  for (const std::string& s : a.sets) {
    const std::string key = s.substr(0, s.find('='));
    for (const SweepAxis& axis : base->sweep_grid) {
      if (axis.key == key) return fail("--set " + key + ": the key is swept by sweep.grid", 2);
    }
    for (const SweepOverrides& point : base->sweep_add) {
      for (const std::string& kv : point) {
        if (kv.substr(0, kv.find('=')) == key) {
          return fail("--set " + key + ": the key is set by a [[sweep.add]] point", 2);
        }
      }
    }
  }
  const std::string sweep = base->sweep_name;
  const std::string db = a.db.empty() ? base->db : a.db;

  // Load every point of the whole grid (all shards) before anything runs.
  const std::vector<SweepPoint> grid =
      ExpandSweep(base->sweep_grid, base->sweep_exclude, base->sweep_add);
  if (shard->index >= static_cast<int64_t>(grid.size())) {
    return fail("--shard " + a.shard + ": the grid has " + std::to_string(grid.size()) +
                    " point(s), so shard " + std::to_string(shard->index) + " would run none",
                2);
  }
  std::vector<PointPlan> plans;
  for (const SweepPoint& point : grid) {
    std::vector<std::string> overrides = a.sets;
    overrides.insert(overrides.end(), point.overrides.begin(), point.overrides.end());
    // The base load checked the exclusions and added points against the whole grid.
    StatusOr<ExperimentConfig> c =
        LoadExperimentConfig(a.config, overrides, /*check_sweep_points=*/false);
    Status s = c.ok() ? CheckPoint(*c) : c.status();
    if (!s.ok()) {
      return fail(a.config + ": sweep point " + std::to_string(point.index) + " (" +
                      JoinOverrides(point.overrides) + "): " + s.message(),
                  2);
    }
    if (!shard->Contains(point.index)) continue;
    PointPlan p;
    p.point = point;
    p.config = std::move(*c);
    for (const std::string& toml : p.config.resolved_toml) p.hashes.push_back(ConfigHash(toml));
    p.completed.assign(p.config.modes.size(), false);
    p.same_as.assign(p.config.modes.size(), -1);
    plans.push_back(std::move(p));
  }
  // The first point of this invocation with a (mode, config hash) runs it; later points with
  // the same one reuse that run (their summaries read its outputs from the database).
  std::map<std::string, int64_t> first_with_hash;
  for (size_t i = 0; i < plans.size(); ++i) {
    for (size_t m = 0; m < plans[i].hashes.size(); ++m) {
      auto [it, added] = first_with_hash.try_emplace(plans[i].hashes[m], static_cast<int64_t>(i));
      if (!added) plans[i].same_as[m] = it->second;
    }
  }

  // What the database already has. A dry run neither creates the database nor writes to it (it
  // reads it as it is: no migration to this build's schema, which would lock out an older build
  // that is running a sweep into it).
  std::optional<engine::ResultStore> store;
  if (!a.dry_run || std::filesystem::exists(db)) {
    StatusOr<engine::ResultStore> s =
        a.dry_run ? engine::ResultStore::OpenReadOnly(db) : engine::ResultStore::Open(db);
    if (!s.ok()) return fail(s.status().message(), 1);
    store = std::move(*s);
  }
  SweepProgress progress{.total = static_cast<int64_t>(plans.size())};
  for (PointPlan& p : plans) {
    for (size_t m = 0; m < p.config.modes.size(); ++m) {
      if (store) {
        StatusOr<std::optional<int64_t>> found = store->FindCompleted(p.hashes[m], sweep);
        if (!found.ok()) return fail(found.status().message(), 1);
        p.completed[m] = found->has_value();
      }
      if (p.same_as[m] < 0 && (!a.resume || !p.completed[m])) {
        p.todo.push_back(p.config.modes[m]);
      }
    }
    if (p.todo.empty()) {
      p.status = "skipped";
      ++progress.skipped;
    }
  }

  std::printf("sweep %s: %lld of %lld points (shard %s), db %s%s\n", sweep.c_str(),
              static_cast<long long>(plans.size()), static_cast<long long>(grid.size()),
              a.shard.c_str(), db.c_str(), a.resume ? ", resuming" : "");
  if (a.dry_run) {
    std::printf("%5s  %-9s  %-20s  %s\n", "point", "completed", "to run", "overrides");
    for (const PointPlan& p : plans) {
      const auto done = std::count(p.completed.begin(), p.completed.end(), true);
      const std::string completed =
          std::to_string(done) + "/" + std::to_string(p.config.modes.size());
      std::printf("%5lld  %-9s  %-20s  %s%s\n", static_cast<long long>(p.point.index),
                  completed.c_str(), ModeList(p.todo).c_str(),
                  JoinOverrides(p.point.overrides).c_str(), SharedRuns(p, plans).c_str());
    }
    return 0;
  }
  std::fflush(stdout);

  InstallInterruptHandlers();
  ProgressLine line(a.jobs);
  auto finish = [&](PointPlan& p, const Status& s) {
    p.status = s.ok() ? "done" : "failed";
    p.error = s.ok() ? "" : s.message();
    ++(s.ok() ? progress.done : progress.failed);
    line.Message("point " + std::to_string(p.point.index) + " " + p.status + ": " +
                 JoinOverrides(p.point.overrides) + (s.ok() ? "" : ": " + p.error));
  };
  if (a.jobs == 1) {
    // One memo for every point: a prompt's prefill is computed by the first run that needs it.
    StatusOr<std::unique_ptr<engine::PrefillMemo>> memo = MakeMemo(a.memo);
    if (!memo.ok()) return fail(memo.status().message(), 2);
    for (PointPlan& p : plans) {
      if (p.status == "skipped") continue;
      if (InterruptSignal() != 0) break;
      line.Draw(progress, /*keep=*/true);
      line.Message("point " + std::to_string(p.point.index) + ": " +
                   JoinOverrides(p.point.overrides));
      StatusOr<RunOutcome> outcome =
          RunExperiment(RestrictModes(p.config, p.todo), db, sweep, /*dry_run=*/false,
                        /*record_signals=*/"",
                        MemoServes(a.memo, p.config.workload.kind) ? memo->get() : nullptr);
      finish(p, outcome.status());
    }
  } else {
    std::map<pid_t, Child> children;
    std::vector<bool> started(plans.size(), false);
    // The next point to start: the first not started whose shared runs' points have finished
    // (their outputs are in the database); plans.size() when none can start now.
    auto next_ready = [&]() {
      for (size_t i = 0; i < plans.size(); ++i) {
        if (started[i] || plans[i].status == "skipped") continue;
        bool ready = true;
        for (int64_t owner : plans[i].same_as) {
          if (owner >= 0 && plans[owner].status == "pending") ready = false;
        }
        if (ready) return i;
      }
      return plans.size();
    };
    bool forwarded = false;  // The first signal only: a second one ends the children at once.
    while (true) {
      while (static_cast<int64_t>(children.size()) < a.jobs && InterruptSignal() == 0) {
        const size_t index = next_ready();
        if (index == plans.size()) break;
        started[index] = true;
        PointPlan& p = plans[index];
        StatusOr<Child> child = StartChild(a, db, sweep, p, index);
        if (!child.ok()) {
          finish(p, child.status());
          continue;
        }
        ++progress.running;
        children.emplace(child->pid, std::move(*child));
      }
      if (children.empty()) break;
      line.Draw(progress, /*keep=*/false);
      int wait_status = 0;
      pid_t pid = 0;
      // Polls, so a signal to this process alone reaches the children (each then finishes its
      // step and marks its run interrupted).
      while ((pid = waitpid(-1, &wait_status, WNOHANG)) == 0) {
        if (InterruptSignal() != 0 && !forwarded) {
          for (const auto& [child_pid, child] : children) kill(child_pid, InterruptSignal());
          forwarded = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid < 0) return fail("waitpid failed while sweep children run", 1);
      auto it = children.find(pid);
      if (it == children.end()) continue;
      --progress.running;
      const bool ok = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
      finish(plans[it->second.plan],
             ok ? Status::Ok() : InternalError(ChildError(it->second.log_path, wait_status)));
      std::filesystem::remove(it->second.log_path);
      children.erase(it);
    }
  }
  line.Draw(progress, /*keep=*/true);
  if (InterruptSignal() != 0) {
    std::fprintf(stderr, "vtoken-cli: sweep %s interrupted by %s; `sweep --resume` continues it\n",
                 sweep.c_str(), InterruptSignalName());
    return InterruptExitCode();
  }

  // The runs each point has now, from the database (children wrote them).
  std::printf("\n%5s  %-7s  %-14s  %s\n", "point", "status", "runs", "overrides");
  for (const PointPlan& p : plans) {
    std::string runs;
    for (const std::string& hash : p.hashes) {
      StatusOr<std::optional<int64_t>> found = store->FindCompleted(hash, sweep);
      std::string id = found.ok() && found->has_value() ? std::to_string(**found) : "-";
      runs += (runs.empty() ? "" : " ") + id;
    }
    std::printf("%5lld  %-7s  %-14s  %s\n", static_cast<long long>(p.point.index), p.status.c_str(),
                runs.c_str(), JoinOverrides(p.point.overrides).c_str());
    if (!p.error.empty()) std::printf("%5s  error: %s\n", "", p.error.c_str());
  }
  std::printf("sweep %s: done %lld, skipped %lld, failed %lld of %lld points in %s\n",
              sweep.c_str(), static_cast<long long>(progress.done),
              static_cast<long long>(progress.skipped), static_cast<long long>(progress.failed),
              static_cast<long long>(progress.total), FormatDuration(line.elapsed_s()).c_str());
  return progress.failed > 0 ? 1 : 0;
}

CLI::App* SetupSweep(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  CLI::App* cmd = app.add_subcommand("sweep", "Run the grid of a config's [sweep.grid] table");
  cmd->add_option("config", a->config, "Experiment TOML file with a [sweep] table")->required();
  cmd->add_option("--set", a->sets, "Override a config key for every point (repeatable)");
  cmd->add_option("--db", a->db, "Result database (default: the config's db)");
  cmd->add_flag("--resume", a->resume,
                "Skip the modes of points already completed in the database for this sweep");
  cmd->add_option("--shard", a->shard, "Run only points with index % N == I (0-based)")
      ->capture_default_str();
  cmd->add_option("--jobs", a->jobs, "Points run in parallel, as child processes")
      ->capture_default_str();
  cmd->add_flag("--dry-run", a->dry_run,
                "Validate the grid and list its points and what would run; run nothing");
  AddMemoFlags(*cmd, a->memo);
  cmd->callback([a] { SetExitCode(RunSweep(*a)); });
  return cmd;
}

}  // namespace

VTOKEN_REGISTER_COMMAND("sweep", SetupSweep);

}  // namespace vtoken::cli
