// `vtoken-cli compare` and `vtoken-cli runs` on databases written through the ResultStore API:
// compare's rows for the config keys that differ between runs and its column separation; both
// commands open the database read-only.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

std::string Config(const std::string& mode, const std::string& keep_ratio) {
  return "name = \"t\"\nmodes = [\"" + mode + "\"]\nseed = 0\n[engine]\nmax_num_seqs = 4\n" +
         "[policy]\nname = \"ema_attention\"\nkeep_ratio = " + keep_ratio + "\n";
}

// The cells of a table line: text separated by two or more spaces.
std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i == line.size()) break;
    size_t end = line.find("  ", i);
    if (end == std::string::npos) end = line.size();
    out.push_back(line.substr(i, end - i));
    i = end;
  }
  return out;
}

// The line of `text` whose first cell is `label`, as cells; empty when there is none.
std::vector<std::string> Row(const std::string& text, const std::string& label) {
  for (const std::string& line : Lines(text)) {
    std::vector<std::string> cells = Cells(line);
    if (!cells.empty() && cells[0] == label) return cells;
  }
  return {};
}

class ReadCommandsTest : public CliTest {
 protected:
  // Completes a run with a few summary figures.
  static void Finish(engine::ResultStore& store, int64_t id, double throughput) {
    ASSERT_TRUE(store.FinishRun(id, {{"requests", 48}, {"throughput_tok_s", throughput}}).ok());
  }
};

TEST_F(ReadCommandsTest, CompareShowsTheConfigKeysThatDifferAndKeepsColumnsApart) {
  const std::string db = Path("r.db");
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    Finish(*store, BeginRun(*store, Config("naive", "0.25"), "naive", "ema_attention", ""), 600);
    Finish(*store, BeginRun(*store, Config("vtoken", "0.5"), "vtoken", "ema_attention", ""), 660);
  }
  CliResult r = Cli({"compare", "--db", db, "1", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Row(r.out, "policy.keep_ratio"),
            (std::vector<std::string>{"policy.keep_ratio", "0.25", "0.5"}))
      << r.out;
  // 21 and 22 characters: wider than the default column, still apart.
  EXPECT_EQ(Row(r.out, "mode / policy"),
            (std::vector<std::string>{"mode / policy", "naive / ema_attention",
                                      "vtoken / ema_attention"}))
      << r.out;
  EXPECT_EQ(Row(r.out, "throughput (tok/s)"),
            (std::vector<std::string>{"throughput (tok/s)", "600.0", "660.0 (1.10x)"}));
  EXPECT_TRUE(Row(r.out, "modes").empty()) << "the mode has its own row";
  EXPECT_TRUE(Row(r.out, "engine.max_num_seqs").empty()) << "the same in both runs";
  for (const std::string& line : Lines(r.out)) EXPECT_EQ(Cells(line).size(), 3u) << line;
}

TEST_F(ReadCommandsTest, CompareOfTheModesOfOneRunHasNoConfigRows) {
  const std::string db = Path("r.db");
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    Finish(*store, BeginRun(*store, Config("native", "0.25"), "native", "", ""), 400);
    Finish(*store, BeginRun(*store, Config("naive", "0.25"), "naive", "h2o", ""), 600);
    Finish(*store, BeginRun(*store, Config("vtoken", "0.25"), "vtoken", "h2o", ""), 650);
  }
  CliResult r = Cli({"compare", "--db", db, "--last", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& line : Lines(r.out)) {
    const std::vector<std::string> cells = Cells(line);
    ASSERT_EQ(cells.size(), 4u) << line;
    EXPECT_EQ(cells[0].find('.'), std::string::npos) << "a config row: " << line;
  }
  EXPECT_EQ(Row(r.out, "run"), (std::vector<std::string>{"run", "1", "2", "3"}));
}

// compare --sweep NAME: the sweep's completed runs in id order (--last N: its last N); a sweep with
// none is one error line; run ids and --sweep together are a usage error.
TEST_F(ReadCommandsTest, CompareOfASweepTakesItsCompletedRuns) {
  const std::string db = Path("r.db");
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    Finish(*store, BeginRun(*store, Config("naive", "0.25"), "naive", "h2o", "a"), 600);
    Finish(*store, BeginRun(*store, Config("naive", "0.5"), "naive", "h2o", "b"), 610);
    Finish(*store, BeginRun(*store, Config("vtoken", "0.25"), "vtoken", "h2o", "a"), 620);
    BeginRun(*store, Config("vtoken", "0.5"), "vtoken", "h2o", "a");  // Still running.
    Finish(*store, BeginRun(*store, Config("vtoken", "0.5"), "vtoken", "h2o", "b"), 640);
  }
  CliResult all = Cli({"compare", "--db", db, "--sweep", "a"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(Row(all.out, "run"), (std::vector<std::string>{"run", "1", "3"})) << all.out;
  CliResult last = Cli({"compare", "--db", db, "--sweep", "b", "--last", "1"});
  ASSERT_EQ(last.exit_code, 0) << last.err;
  EXPECT_EQ(Row(last.out, "run"), (std::vector<std::string>{"run", "5"})) << last.out;
  CliResult none = Cli({"compare", "--db", db, "--sweep", "c"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(none.err, "vtoken-cli: error: sweep 'c' has no completed run in " + db + "\n");
  CliResult both = Cli({"compare", "--db", db, "--sweep", "a", "1"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(both.err, "vtoken-cli: error: give run ids, or --last N and/or --sweep NAME\n");
}

TEST_F(ReadCommandsTest, CompareCutsLongCellsKeepingTheirTail) {
  const std::string db = Path("r.db");
  const std::string model = "/data/checkpoints/2025-01-31/llama-family/vt-tiny-finetuned-kjv";
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    for (const char* mode : {"naive", "vtoken"}) {
      engine::RunRecord rec;
      rec.config_toml = Config(mode, "0.25");
      rec.model = model;
      rec.mode = mode;
      rec.policy = "h2o";
      StatusOr<int64_t> id = store->BeginRun(rec);
      ASSERT_TRUE(id.ok());
      Finish(*store, *id, 1);
    }
  }
  CliResult r = Cli({"compare", "--db", db, "1", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> row = Row(r.out, "model");
  ASSERT_EQ(row.size(), 3u) << r.out;
  EXPECT_EQ(row[1], row[2]);
  EXPECT_EQ(row[1].substr(0, 3), "...");
  EXPECT_LT(row[1].size(), model.size());
  EXPECT_EQ(model.substr(model.size() - (row[1].size() - 3)), row[1].substr(3));
}

TEST_F(ReadCommandsTest, RunsShowsADeadRunAsInterruptedAndWritesNothing) {
  const std::string db = Path("r.db");
  ASSERT_TRUE(engine::ResultStore::Open(db).ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // Begins a run and dies without finishing it. Never returns into gtest.
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    if (!store.ok() || !store->BeginRun(engine::RunRecord{.mode = "vtoken"}).ok()) ::_exit(1);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string db_bytes = ReadFile(db), wal_bytes = ReadFile(db + "-wal");

  CliResult r = Cli({"runs", "--db", db});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_NE(lines[1].find("interrupted"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("process " + std::to_string(child) + " exited without finishing"),
            std::string::npos)
      << lines[1];
  EXPECT_EQ(ReadFile(db), db_bytes);
  EXPECT_EQ(ReadFile(db + "-wal"), wal_bytes);
}

TEST_F(ReadCommandsTest, MissingDatabaseIsOneErrorLineAndIsNotCreated) {
  const std::string db = Path("none/r.db");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"compare", "--db", db, "1"},
        std::vector<std::string>{"compare", "--db", db, "--last", "2"},
        std::vector<std::string>{"runs", "--db", db},
        std::vector<std::string>{"report", "--db", db, "--sweep", "s", "--no-figures"}}) {
    CliResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_EQ(r.err, "vtoken-cli: error: result db " + db + " not found\n") << args[0];
  }
  EXPECT_FALSE(std::filesystem::exists(Path("none")));
}

// Runs that differ only in `seed` and `workload.seed` are one point: report prints its mean and
// the half-width of the 95% confidence interval, t(0.975, n - 1) * s / sqrt(n).
TEST_F(ReadCommandsTest, ReportAveragesSeedsIntoPointsWithConfidenceIntervals) {
  const std::string db = Path("r.db");
  auto config = [](const std::string& mode, const std::string& keep, int seed) {
    return "name = \"t\"\nmodes = [\"" + mode + "\"]\nseed = " + std::to_string(seed) +
           "\n[workload]\nseed = " + std::to_string(seed) + "\n[policy]\nname = \"h2o\"\n" +
           "keep_ratio = " + keep + "\n";
  };
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    // keep_ratio 0.25 at seeds 1, 2, 3: throughput 10, 12, 17 (mean 13, s = sqrt(13),
    // t(0.975, 2) = 4.303: half-width 4.303 * sqrt(13 / 3) = 8.957); keep_ratio 0.5, one seed.
    const double tput[] = {10, 12, 17};
    for (int seed = 1; seed <= 3; ++seed) {
      Finish(*store, BeginRun(*store, config("vtoken", "0.25", seed), "vtoken", "h2o", "s"),
             tput[seed - 1]);
    }
    Finish(*store, BeginRun(*store, config("vtoken", "0.5", 1), "vtoken", "h2o", "s"), 20);
  }
  CliResult r = Cli({"report", "--db", db, "--sweep", "s", "--no-figures"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("4 completed runs (2 points over their seeds: mean ± 95% CI)"),
            std::string::npos)
      << r.out;
  // The seed keys are not grid keys; keep_ratio is.
  EXPECT_NE(r.out.find("grid keys: policy.keep_ratio."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 1 2 3 | 3 | vtoken | h2o | token | uniform | 0.25 | 13.0 ± 9.0 |"),
            std::string::npos)
      << r.out;
  // One seed: no interval.
  EXPECT_NE(r.out.find("| 4 | 1 | vtoken | h2o | token | uniform | 0.5 | 20.0 |"),
            std::string::npos)
      << r.out;
}

// Accuracy and ROUGE-L are means over requests (engine::kPerRequestFigures): report takes their
// interval over the requests of all a point's seeds, pooled, also for a single run; a run whose
// requests store no ROUGE-L (a file older than schema 5) keeps the interval over the seeds.
TEST_F(ReadCommandsTest, ReportTakesRougeAndAccuracyIntervalsOverTheRequests) {
  const std::string db = Path("q.db");
  auto config = [](const std::string& keep, int seed) {
    return "name = \"t\"\nmodes = [\"naive\"]\nseed = " + std::to_string(seed) +
           "\n[workload]\nseed = " + std::to_string(seed) + "\n[policy]\nname = \"h2o\"\n" +
           "keep_ratio = " + keep + "\n";
  };
  {
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
    ASSERT_TRUE(store.ok());
    // keep_ratio 0.25, seeds 1 and 2, two requests each: ROUGE-L 0.6, 0.4 and 0.5, 0.5 (mean
    // 0.5, s = sqrt(0.02 / 3), t(0.975, 3) = 3.182: half-width 0.1299; over the two seeds' equal
    // means it would be 0); scores 1, 0 and 0, 1 (0.5 ± 3.182 * sqrt(1 / 3) / 2 = 0.919).
    const double rouge[2][2] = {{0.6, 0.4}, {0.5, 0.5}};
    const double score[2][2] = {{1, 0}, {0, 1}};
    for (int seed = 1; seed <= 2; ++seed) {
      const int64_t id = BeginRun(*store, config("0.25", seed), "naive", "h2o", "s");
      std::vector<engine::RequestRecord> requests(2);
      for (int i = 0; i < 2; ++i) {
        requests[i].request_id = i;
        requests[i].rouge_l_vs_native = rouge[seed - 1][i];
        requests[i].score = score[seed - 1][i];
      }
      ASSERT_TRUE(store->AppendRequests(id, requests).ok());
      ASSERT_TRUE(
          store
              ->FinishRun(id, {{"rouge_l_vs_native", 0.5},
                               {"task_accuracy", (score[seed - 1][0] + score[seed - 1][1]) / 2}})
              .ok());
    }
    // keep_ratio 0.5: seeds whose requests store no ROUGE-L (0.3 and 0.7: 0.5 ± 2.541).
    for (int seed = 1; seed <= 2; ++seed) {
      const int64_t id = BeginRun(*store, config("0.5", seed), "naive", "h2o", "s");
      ASSERT_TRUE(store->FinishRun(id, {{"rouge_l_vs_native", seed == 1 ? 0.3 : 0.7}}).ok());
    }
  }
  CliResult r = Cli({"report", "--db", db, "--sweep", "s", "--no-figures"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| 1 2 | 2 | naive | h2o | token | uniform | 0.25 | - | - | - | - | "
                       "0.500 ± 0.919 | 0.5000 ± 0.1299 |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| 3 4 | 2 | naive | h2o | token | uniform | 0.5 | - | - | - | - | - | "
                       "0.5000 ± 2.5412 |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Accuracy and ROUGE-L: the mean over the requests ± the 95% interval"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace vtoken::cli
