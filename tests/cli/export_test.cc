// `vtoken-cli export` on a database written through the ResultStore API: the columns and values
// of the runs, requests and steps tables in CSV and JSON lines, CSV quoting, the selection
// options, and errors (one line on stderr, non-zero exit, nothing created).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/engine/result_store.h"
#include "lib/engine/sqlite_db.h"
#include "tests/cli/cli_test_util.h"

namespace vtoken::cli {
namespace {

// The requests columns added after schema 1 (the task columns, empty in these runs), each as
// ",NAME" and as the empty cells ",".
// Up to schema `version`.
std::string LaterRequestColumns(int version = engine::kResultSchemaVersion) {
  std::string out;
  for (const auto& c : engine::kRequestTable.columns) {
    if (c.since > 1 && c.since <= version) out += "," + std::string(c.name);
  }
  return out;
}
std::string LaterRequestCells(int version = engine::kResultSchemaVersion) {
  std::string out;
  for (const auto& c : engine::kRequestTable.columns) {
    out += c.since > 1 && c.since <= version ? "," : "";
  }
  return out;
}

// Makes the file at `path` one that a schema-4 build wrote: without the columns added since
// (the requests' ROUGE-L), its user_version 4.
void MakeSchemaFour(const std::string& path) {
  StatusOr<sqlite3*> db = engine::sql::OpenFile(path, /*create=*/true, 1000);  // read-write
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  for (const auto& c : engine::kRequestTable.columns) {
    if (c.since <= 4) continue;
    const Status s =
        engine::sql::Exec(*db, path, "ALTER TABLE requests DROP COLUMN " + std::string(c.name));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_TRUE(engine::sql::Exec(*db, path, "PRAGMA user_version = 4").ok());
  engine::sql::CloseFile(*db);
}

std::string Config(const std::string& mode, const std::string& keep_ratio) {
  return "name = \"t\"\nmodes = [\"" + mode + "\"]\nseed = 0\n[engine]\nmax_num_seqs = 4\n" +
         "[policy]\nname = \"h2o\"\nkeep_ratio = " + keep_ratio + "\n";
}

engine::RequestRecord Request(int64_t id, double e2e, int32_t blocks_final) {
  engine::RequestRecord r;
  r.request_id = id;
  r.prompt_tokens = 640 + id;
  r.output_tokens = 96;
  r.arrival_s = 0;
  r.first_token_s = 0.5;
  r.finish_s = e2e;
  r.ttft_s = 0.5;
  r.tpot_s = 0.125;
  r.e2e_s = e2e;
  r.preemptions = 0;
  r.blocks_mean = 20.5;
  r.blocks_final = blocks_final;
  r.ideal_blocks_final = 12;
  return r;
}

class ExportTest : public CliTest {
 protected:
  // Sweep "grid": 1 native and 2 vtoken at keep_ratio 0.25 (the same point), 3 vtoken at 0.5.
  // Run 4 belongs to sweep "other"; run 5 failed with an error that needs CSV quoting.
  void SetUp() override {
    CliTest::SetUp();
    db_ = Path("r.db");
    StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const int64_t native = BeginRun(*store, Config("native", "0.25"), "native", "", "grid");
    ASSERT_TRUE(store->AppendRequests(native, {Request(0, 4.0, 40), Request(1, 5.0, 41)}).ok());
    ASSERT_TRUE(store
                    ->AppendOutputs(
                        native, {{0, "a b c d", {1, 2, 3, 4}}, {1, "in the beginning", {5, 6, 7}}})
                    .ok());
    engine::StepRecord step;
    step.step = 0;
    step.time_s = 0.25;
    step.num_running = 2;
    step.allocated_blocks = 81;
    step.live_slots = 1280;
    step.waste_ratio = 0.012345678901234567;
    step.hist[0] = 1;
    step.hist[3] = 80;
    ASSERT_TRUE(store->AppendSteps(native, {step}).ok());
    ASSERT_TRUE(store->FinishRun(native, {{"throughput_tok_s", 100}, {"e2e_p95", 2.5}}).ok());

    const int64_t vtoken = BeginRun(*store, Config("vtoken", "0.25"), "vtoken", "h2o", "grid");
    ASSERT_TRUE(store->AppendRequests(vtoken, {Request(0, 3.0, 14), Request(1, 3.5, 15)}).ok());
    ASSERT_TRUE(store
                    ->AppendOutputs(
                        vtoken, {{0, "a b x d", {1, 2, 9, 4}}, {1, "in the beginning", {5, 6, 7}}})
                    .ok());
    step.step = 0;
    step.moves = 12;
    ASSERT_TRUE(store->AppendSteps(vtoken, {step}).ok());
    step.step = 1;
    step.waste_ratio = 0.5;
    ASSERT_TRUE(store->AppendSteps(vtoken, {step}).ok());
    ASSERT_TRUE(store
                    ->FinishRun(vtoken, {{"throughput_tok_s", 150.25},
                                         {"rouge_l_vs_native", 0.875},
                                         {"e2e_p95", std::numeric_limits<double>::quiet_NaN()}})
                    .ok());

    const int64_t half = BeginRun(*store, Config("vtoken", "0.5"), "vtoken", "h2o", "grid");
    ASSERT_TRUE(store->AppendRequests(half, {Request(0, 3.0, 20)}).ok());
    ASSERT_TRUE(store->AppendOutputs(half, {{0, "a b c d", {1, 2, 3, 4}}}).ok());
    ASSERT_TRUE(store->FinishRun(half, {{"throughput_tok_s", 140}}).ok());

    const int64_t other = BeginRun(*store, Config("naive", "0.25"), "naive", "h2o", "other");
    ASSERT_TRUE(store->FinishRun(other, {{"throughput_tok_s", 1}}).ok());
    const int64_t failed = BeginRun(*store, Config("naive", "0.25"), "naive", "h2o", "");
    ASSERT_TRUE(store->FailRun(failed, "pool too small: \"384\" blocks, need\n500").ok());
    ASSERT_EQ(failed, 5);
  }

  std::string db_;
};

// [sweep] seeds: runs that differ only in seed and workload.seed are one point.
TEST_F(ExportTest, PointsTableAveragesSeedsWithAConfidenceInterval) {
  const std::string db = Path("seeds.db");
  StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const double blocks[] = {10, 12, 14};
  for (int seed = 1; seed <= 3; ++seed) {
    const std::string config =
        "name = \"t\"\nmodes = [\"vtoken\"]\nseed = " + std::to_string(seed) +
        "\n[workload]\nseed = " + std::to_string(seed) + "\n[policy]\nname = \"h2o\"\n";
    const int64_t id = BeginRun(*store, config, "vtoken", "h2o", "s");
    // ROUGE-L per request: 0.5 and 0.7 (seed 1), 0.6 and 0.6 (2), 0.4 and 0.8 (3).
    std::vector<engine::RequestRecord> requests = {Request(0, 3.0, 14), Request(1, 3.0, 14)};
    const double rouge[3][2] = {{0.5, 0.7}, {0.6, 0.6}, {0.4, 0.8}};
    for (int i = 0; i < 2; ++i) requests[i].rouge_l_vs_native = rouge[seed - 1][i];
    ASSERT_TRUE(store->AppendRequests(id, requests).ok());
    ASSERT_TRUE(
        store->FinishRun(id, {{"blocks_mean", blocks[seed - 1]}, {"rouge_l_vs_native", 0.6}}).ok());
  }
  // Another point (tova) with one seed: no interval.
  const int64_t tova = BeginRun(*store,
                                "name = \"t\"\nmodes = [\"vtoken\"]\nseed = 1\n[workload]\n"
                                "seed = 1\n[policy]\nname = \"tova\"\n",
                                "vtoken", "tova", "s");
  ASSERT_TRUE(store->FinishRun(tova, {{"blocks_mean", 7}}).ok());
  CliResult r = Cli({"export", "--db", db, "--table", "points", "--format", "jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  const nlohmann::json h2o = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(h2o["policy"], "h2o");
  EXPECT_FALSE(h2o.contains("policy.name"));  // The policy column is the key's one column.
  EXPECT_EQ(h2o["seeds"], 3);
  EXPECT_EQ(h2o["seed_values"], "1 2 3");
  EXPECT_EQ(h2o["run_ids"], "1 2 3");
  EXPECT_DOUBLE_EQ(h2o["blocks_mean"].get<double>(), 12.0);
  // sd 2, t(0.975, 2) = 4.303: 4.303 * 2 / sqrt(3).
  EXPECT_NEAR(h2o["blocks_mean_ci95"].get<double>(), 4.303 * 2 / std::sqrt(3.0), 1e-9);
  // ROUGE-L over the 6 requests of the 3 seeds (over the seeds' equal means it would be 0):
  // sd sqrt(0.1 / 5), t(0.975, 5) = 2.571.
  EXPECT_NEAR(h2o["rouge_l_vs_native"].get<double>(), 0.6, 1e-12);
  EXPECT_NEAR(h2o["rouge_l_vs_native_ci95"].get<double>(),
              2.571 * std::sqrt(0.1 / 5) / std::sqrt(6.0), 1e-9);
  const nlohmann::json one = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(one["seeds"], 1);
  EXPECT_DOUBLE_EQ(one["blocks_mean"].get<double>(), 7.0);
  EXPECT_TRUE(one["blocks_mean_ci95"].is_null());
}

TEST_F(ExportTest, RunsTableHasTheRecordTheVaryingConfigKeysAndEverySummaryFigure) {
  CliResult r = Cli({"export", "--db", db_, "--sweep", "grid", "--table", "runs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  // Only policy.keep_ratio varies (modes has the mode column); figures sorted by name.
  EXPECT_EQ(lines[0],
            "run_id,status,mode,policy,model,workload,sweep,created,finished,git_sha,error,"
            "policy.keep_ratio,e2e_p95,rouge_l_vs_native,throughput_tok_s");
  // No field of these rows needs quoting: split on commas.
  auto fields = [](const std::string& line) {
    std::vector<std::string> out(1);
    for (char c : line) {
      if (c == ',') {
        out.emplace_back();
      } else {
        out.back().push_back(c);
      }
    }
    return out;
  };
  const std::vector<std::string> native = fields(lines[1]);
  ASSERT_EQ(native.size(), 15u) << lines[1];
  EXPECT_EQ(std::vector<std::string>(native.begin(), native.begin() + 7),
            (std::vector<std::string>{"1", "completed", "native", "", "models/vt-tiny",
                                      "longbench_like", "grid"}));
  EXPECT_EQ(native[7].size(), 20u) << native[7];  // created: 2025-01-31T12:00:00Z
  EXPECT_EQ(native[8].size(), 20u) << native[8];  // finished
  EXPECT_EQ(std::vector<std::string>(native.begin() + 9, native.end()),
            (std::vector<std::string>{"", "", "0.25", "2.5", "", "100"}));
  const std::vector<std::string> vtoken = fields(lines[2]);
  ASSERT_EQ(vtoken.size(), 15u) << lines[2];
  EXPECT_EQ(vtoken[0] + " " + vtoken[2] + " " + vtoken[3], "2 vtoken h2o");
  // A NaN figure (e2e_p95) is an empty field.
  EXPECT_EQ(std::vector<std::string>(vtoken.begin() + 11, vtoken.end()),
            (std::vector<std::string>{"0.25", "", "0.875", "150.25"}));
  const std::vector<std::string> half = fields(lines[3]);
  ASSERT_EQ(half.size(), 15u) << lines[3];
  EXPECT_EQ(std::vector<std::string>(half.begin() + 11, half.end()),
            (std::vector<std::string>{"0.5", "", "", "140"}));
}

TEST_F(ExportTest, ConfigColumnsAreTheKeysThatVaryAmongTheSelectedRuns) {
  // Runs 1 and 2 differ only in the mode: no config column.
  CliResult r = Cli({"export", "--db", db_, "--runs", "1,2", "--table", "runs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(r.out)[0],
            "run_id,status,mode,policy,model,workload,sweep,created,finished,git_sha,error,"
            "e2e_p95,rouge_l_vs_native,throughput_tok_s");
  // All runs: the sweep varies too (in the record only), keep_ratio still.
  r = Cli({"export", "--db", db_, "--table", "runs", "--format", "jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  const auto first = nlohmann::ordered_json::parse(lines[0]);
  EXPECT_EQ(first["run_id"], 1);
  EXPECT_EQ(first["mode"], "native");
  EXPECT_EQ(first["policy.keep_ratio"], 0.25);  // a number, not text
  EXPECT_EQ(first["throughput_tok_s"], 100.0);
  EXPECT_TRUE(first["rouge_l_vs_native"].is_null());
  const auto failed = nlohmann::ordered_json::parse(lines[4]);
  EXPECT_EQ(failed["status"], "failed");
  EXPECT_EQ(failed["error"], "pool too small: \"384\" blocks, need\n500");
  EXPECT_TRUE(failed["throughput_tok_s"].is_null());
  std::vector<std::string> keys;
  for (const auto& [k, v] : first.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"run_id", "status", "mode", "policy", "model",
                                            "workload", "sweep", "created", "finished", "git_sha",
                                            "error", "policy.keep_ratio", "e2e_p95",
                                            "rouge_l_vs_native", "throughput_tok_s"}));
}

TEST_F(ExportTest, CsvQuotesFieldsWithCommasQuotesAndLineBreaks) {
  CliResult r = Cli({"export", "--db", db_, "--runs", "5", "--table", "runs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(",\"pool too small: \"\"384\"\" blocks, need\n500\"\n"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.substr(0, 19), "run_id,status,mode,");
  EXPECT_NE(r.out.find("\n5,failed,naive,h2o,"), std::string::npos) << r.out;
}

// A run stores each request's ROUGE-L (schema 5): export writes the stored values.
TEST_F(ExportTest, RequestsTableHasTheStoredRougeL) {
  const std::string db = Path("rouge.db");
  StatusOr<engine::ResultStore> store = engine::ResultStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const int64_t id = BeginRun(*store, Config("vtoken", "0.25"), "vtoken", "h2o", "s");
  engine::RequestRecord q = Request(0, 3.0, 14);
  q.rouge_l_vs_native = 0.75;
  q.rouge_l_vs_naive = 1.0;
  ASSERT_TRUE(store->AppendRequests(id, {q, Request(1, 3.5, 15)}).ok());
  ASSERT_TRUE(store->FinishRun(id, {{"rouge_l_vs_native", 0.75}}).ok());
  CliResult r = Cli({"export", "--db", db, "--table", "requests", "--format", "jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["rouge_l_vs_native"], 0.75);
  EXPECT_EQ(first["rouge_l_vs_naive"], 1.0);
  EXPECT_TRUE(first["rouge_l_vs_reference"].is_null());
  EXPECT_TRUE(nlohmann::json::parse(lines[1])["rouge_l_vs_native"].is_null());
}

// A file older than schema 5 stores no per-request ROUGE-L: export computes it from the outputs
// of each run's native (and for vtoken, naive) counterpart.
TEST_F(ExportTest, AnOlderFilesRequestsAreScoredAgainstTheirNativeRun) {
  MakeSchemaFour(db_);
  CliResult r = Cli({"export", "--db", db_, "--sweep", "grid", "--table", "requests"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  const std::string later = LaterRequestCells(4);
  EXPECT_EQ(lines[0],
            "run_id,request_id,prompt_tokens,output_tokens,arrival_s,first_token_s,finish_s,"
            "ttft_s,tpot_s,e2e_s,preemptions,blocks_mean,blocks_final,ideal_blocks_final" +
                LaterRequestColumns(4) + ",rouge_l_vs_native,rouge_l_vs_naive");
  // native vs itself
  EXPECT_EQ(lines[1], "1,0,640,96,0,0.5,4,0.5,0.125,4,0,20.5,40,12" + later + ",1,");
  EXPECT_EQ(lines[2], "1,1,641,96,0,0.5,5,0.5,0.125,5,0,20.5,41,12" + later + ",1,");
  // "a b x d" against "a b c d": LCS 3 of 4 and 4 tokens, F1 0.75. No naive run of the point.
  EXPECT_EQ(lines[3], "2,0,640,96,0,0.5,3,0.5,0.125,3,0,20.5,14,12" + later + ",0.75,");
  EXPECT_EQ(lines[4], "2,1,641,96,0,0.5,3.5,0.5,0.125,3.5,0,20.5,15,12" + later + ",1,");
  // Native does not read [policy]: the native run (whose config, as in older databases, still
  // records keep_ratio 0.25) is the keep_ratio 0.5 point's baseline too.
  EXPECT_EQ(lines[5], "3,0,640,96,0,0.5,3,0.5,0.125,3,0,20.5,20,12" + later + ",1,");
}

TEST_F(ExportTest, StepsTableAsJsonLinesToAFile) {
  const std::string out = Path("steps.jsonl");
  CliResult r = Cli({"export", "--db", db_, "--runs", "2,1", "--table", "steps", "--format",
                     "jsonl", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  const std::vector<std::string> lines = Lines(ReadFile(out));
  ASSERT_EQ(lines.size(), 3u);
  const auto first = nlohmann::ordered_json::parse(lines[0]);
  std::vector<std::string> keys;
  for (const auto& [k, v] : first.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "run_id", "step", "time_s", "num_running", "num_waiting", "free_blocks",
                      "allocated_blocks", "live_slots", "waste_ratio", "held_blocks",
                      "ideal_blocks", "hist0", "hist1", "hist2", "hist3", "moves", "fence_waits"}));
  EXPECT_EQ(first["run_id"], 1);  // run order is id order, whatever order --runs gives
  EXPECT_EQ(first["live_slots"], 1280);
  EXPECT_EQ(first["waste_ratio"], 0.012345678901234567);  // every digit survives
  EXPECT_EQ(first["hist3"], 80);
  const auto last = nlohmann::ordered_json::parse(lines[2]);
  EXPECT_EQ(last["run_id"], 2);
  EXPECT_EQ(last["step"], 1);
  EXPECT_EQ(last["moves"], 12);
  EXPECT_EQ(last["waste_ratio"], 0.5);
}

TEST_F(ExportTest, LeavesTheDatabaseUntouched) {
  const std::string before = ReadFile(db_);
  for (const char* table : {"runs", "requests", "steps"}) {
    ASSERT_EQ(Cli({"export", "--db", db_, "--table", table}).exit_code, 0) << table;
  }
  EXPECT_EQ(ReadFile(db_), before);
  // A WAL database's reader may leave an empty log behind, never one with writes in it.
  EXPECT_EQ(ReadFile(db_ + "-wal"), "");
}

TEST_F(ExportTest, ErrorsAreOneLineAndANonZeroExit) {
  auto expect_error = [&](const std::vector<std::string>& args, const std::string& message) {
    CliResult r = Cli(args);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  };
  const std::string missing = Path("missing/none.db");
  expect_error({"export", "--db", missing, "--table", "runs"},
               "vtoken-cli: error: result db " + missing + " not found");
  EXPECT_FALSE(std::filesystem::exists(Path("missing")));
  expect_error({"export", "--db", db_, "--sweep", "nope", "--table", "runs"},
               "has no runs of sweep 'nope' (sweeps: grid, other)");
  expect_error({"export", "--db", db_, "--runs", "2,9,7", "--table", "runs"}, "no run 7, 9");
  expect_error({"export", "--db", db_, "--table", "blocks"}, "--table");
  expect_error({"export", "--db", db_, "--table", "runs", "--format", "xml"}, "--format");
  expect_error({"export", "--db", db_, "--table", "runs", "--sweep", "grid", "--runs", "1"},
               "excludes");
  const std::string out = Path("no/such/dir/x.csv");
  expect_error({"export", "--db", db_, "--table", "runs", "--out", out}, "cannot write " + out);
}

}  // namespace
}  // namespace vtoken::cli
