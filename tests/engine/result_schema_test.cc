// The column tables against the files: a new database has exactly the declared columns, a file
// written by schema 1 (tests/fixtures/results_v1.db, made by c87a9c5) opens, reads, migrates and
// takes new rows, and the Python reader holds no copy of the column lists.
#include "lib/engine/result_schema.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "lib/engine/result_store.h"

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

fs::path SourceDir() {
  const char* dir = std::getenv("VTOKEN_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path(".");
}

// The column names of `table` in the file, in order, run_id excepted.
std::vector<std::string> FileColumns(const std::string& path, const std::string& table) {
  auto store = ResultStore::OpenReadOnly(path);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  sqlite3* db = nullptr;
  auto opened = sql::OpenFile(path, /*create=*/false, 1000);
  EXPECT_TRUE(opened.ok());
  db = *opened;
  std::vector<std::string> out;
  {  // The statement is finalized before the file closes (sqlite3_close refuses otherwise).
    auto s = sql::Stmt::Prepare(db, path, "SELECT name FROM pragma_table_info('" + table + "')");
    EXPECT_TRUE(s.ok());
    while (*s->Step()) {
      if (s->Text(0) != "run_id") out.push_back(s->Text(0));
    }
  }
  sql::CloseFile(db);
  return out;
}

// Equal values, a NaN equal to a NaN (a stored NULL figure).
bool Same(const sql::Value& a, const sql::Value& b) {
  const auto* x = std::get_if<double>(&a);
  const auto* y = std::get_if<double>(&b);
  if (x != nullptr && y != nullptr && std::isnan(*x) && std::isnan(*y)) return true;
  return a == b;
}

template <typename Record>
std::vector<std::string> Declared(const Table<Record>& table, int version) {
  std::vector<std::string> out;
  for (const auto& c : table.columns) {
    if (c.since <= version) out.emplace_back(c.name);
  }
  return out;
}

// What a file holds of some runs: their records, requests and steps.
struct Rows {
  std::vector<RunRecord> runs;
  std::vector<std::vector<RequestRecord>> requests;  // per run in `runs`
  std::vector<std::vector<StepRecord>> steps;
};

Rows ReadRows(const ResultStore& store, const std::vector<int64_t>& ids) {
  Rows rows;
  for (int64_t id : ids) {
    rows.runs.push_back(store.GetRun(id).value());
    rows.requests.push_back(store.GetRequests(id).value());
    rows.steps.push_back(store.GetSteps(id).value());
  }
  return rows;
}

// Every declared column of every row the same (NaN equal to NaN, a NULL to a NULL).
void ExpectSameRows(const Rows& a, const Rows& b) {
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); ++i) {
    for (const auto& c : kRunTable.columns) {
      EXPECT_TRUE(Same(c.get(a.runs[i]), c.get(b.runs[i]))) << "run " << i << " " << c.name;
    }
    ASSERT_EQ(a.requests[i].size(), b.requests[i].size());
    for (size_t q = 0; q < a.requests[i].size(); ++q) {
      for (const auto& c : kRequestTable.columns) {
        EXPECT_TRUE(Same(c.get(a.requests[i][q]), c.get(b.requests[i][q]))) << c.name;
      }
    }
    ASSERT_EQ(a.steps[i].size(), b.steps[i].size());
    for (size_t k = 0; k < a.steps[i].size(); ++k) {
      for (const auto& c : kStepTable.columns) {
        EXPECT_TRUE(Same(c.get(a.steps[i][k]), c.get(b.steps[i][k]))) << c.name;
      }
    }
  }
}

class ResultSchemaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_result_schema_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // A copy of the schema-1 fixture (opening the committed file would change it).
  std::string V1Copy() const { return FixtureCopy("results_v1.db"); }

  // A copy of tests/fixtures/NAME in the scratch directory.
  std::string FixtureCopy(const std::string& name) const {
    const std::string path = Path(name);
    fs::copy_file(SourceDir() / "tests/fixtures" / name, path);
    return path;
  }

  fs::path dir_;
};

TEST_F(ResultSchemaTest, NewFileHasTheDeclaredColumns) {
  const std::string path = Path("new.db");
  ASSERT_TRUE(ResultStore::Open(path).ok());
  EXPECT_EQ(FileColumns(path, "runs"), Declared(kRunTable, kResultSchemaVersion));
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, kResultSchemaVersion));
  EXPECT_EQ(FileColumns(path, "steps"), Declared(kStepTable, kResultSchemaVersion));
  EXPECT_EQ(FileColumns(path, "outputs"), Declared(kOutputTable, kResultSchemaVersion));
}

TEST_F(ResultSchemaTest, EveryColumnRoundTripsThroughItsGetAndSet) {
  RequestRecord r;
  r.request_id = 7;
  r.tpot_s = 0.25;
  r.task = "passkey";
  r.depth = 0.5;
  for (const auto& c : kRequestTable.columns) {
    RequestRecord back;
    ASSERT_TRUE(c.set(back, c.get(r))) << c.name;
    EXPECT_EQ(c.get(back), c.get(r)) << c.name;
  }
  RequestRecord none;
  EXPECT_TRUE(kRequestTable.columns.back().set(none, sql::Value()));
  OutputRecord o;
  EXPECT_FALSE(kOutputTable.columns[2].set(o, sql::Value(std::string("[1, \"x\"]"))));
  EXPECT_FALSE(kOutputTable.columns[2].set(o, sql::Value(std::string("{}"))));
}

TEST_F(ResultSchemaTest, SchemaOneFileOpensMigratesAndTakesNewRows) {
  const std::string path = V1Copy();
  // Read-only: read as it is, the later columns NULL, the file untouched.
  std::vector<RunRecord> runs_before;
  Rows rows_before;
  {
    auto store = ResultStore::OpenReadOnly(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->schema_version(), 1);
    runs_before = store->ListRuns().value();
    ASSERT_EQ(runs_before.size(), 3u);
    EXPECT_EQ(runs_before[0].status, "completed");
    EXPECT_EQ(runs_before[0].seed, 0xFEDCBA9876543210ull);
    EXPECT_EQ(runs_before[2].status, "failed");
    EXPECT_EQ(runs_before[2].error, "out of blocks");
    EXPECT_FALSE(runs_before[0].run_lock.has_value());
    rows_before = ReadRows(*store, {1, 2});
    ASSERT_EQ(rows_before.requests[0].size(), 2u);
    EXPECT_EQ(rows_before.requests[0][1].prompt_tokens, 231);
    EXPECT_TRUE(std::isnan(rows_before.requests[0][1].tpot_s));  // stored NaN reads NaN
    EXPECT_FALSE(rows_before.requests[0][0].task.has_value());
    EXPECT_EQ(store->GetOutputs(2)->at(1).token_ids, (std::vector<int32_t>{1, 2, 3, 1}));
    EXPECT_EQ(store->GetSummary(2)->values.at("throughput_tok_s"), 101);
  }
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, 1));

  // A writer migrates it: same rows, the new columns appended, new rows with task values.
  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->schema_version(), kResultSchemaVersion);
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, kResultSchemaVersion));
  EXPECT_EQ(FileColumns(path, "runs"), Declared(kRunTable, kResultSchemaVersion));
  const std::vector<RunRecord> runs_after = store->ListRuns().value();
  ASSERT_EQ(runs_after.size(), runs_before.size());
  for (size_t i = 0; i < runs_after.size(); ++i) {
    for (const auto& c : kRunTable.columns) {
      EXPECT_TRUE(Same(c.get(runs_after[i]), c.get(runs_before[i])))
          << "run " << i << " " << c.name;
    }
  }
  ExpectSameRows(ReadRows(*store, {1, 2}), rows_before);
  RunRecord run = runs_before[1];
  run.config_hash = "hash-new";
  const int64_t id = store->BeginRun(run).value();
  EXPECT_EQ(id, 4);
  RequestRecord q;
  q.request_id = 0;
  q.task = "passkey";
  q.context_tokens = 4096;
  q.depth = 0.25;
  q.expected = R"(["68314"])";
  ASSERT_TRUE(store->CompleteRun(id, {.steps = {}, .requests = {q}, .outputs = {}}, {}).ok());
  const RequestRecord back = store->GetRequests(id)->at(0);
  EXPECT_EQ(back.task, "passkey");
  EXPECT_EQ(back.context_tokens, 4096);
  EXPECT_EQ(back.depth, 0.25);
  EXPECT_EQ(back.expected, R"(["68314"])");
  EXPECT_EQ(store->GetRun(id)->run_lock, 1);
}

// tests/fixtures/results_v3.db: `vtoken-cli run` of sim:llama-3.1-8b at layer granularity (64
// blocks, budget_tokens 48, 3 requests, native and vtoken) written by the schema-3 build of
// 83bbb10, before requests.score_partial: a writer adds the column and every stored value reads
// back the same.
TEST_F(ResultSchemaTest, SchemaThreeFileOpensMigratesAndKeepsItsRows) {
  const std::string path = FixtureCopy("results_v3.db");
  Rows before;
  {
    auto store = ResultStore::OpenReadOnly(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->schema_version(), 3);
    before = ReadRows(*store, {1, 2});
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(before.runs[i].status, "completed");
    ASSERT_EQ(before.requests[i].size(), 3u);
    EXPECT_FALSE(before.steps[i].empty());
    EXPECT_TRUE(before.requests[i][0].live_per_group.has_value());  // schema 3's column
    EXPECT_FALSE(before.requests[i][0].score_partial.has_value());
  }
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, 3));

  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->schema_version(), kResultSchemaVersion);
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, kResultSchemaVersion));
  EXPECT_EQ(store->ListRuns()->size(), 2u);
  ExpectSameRows(ReadRows(*store, {1, 2}), before);
  RunRecord run = before.runs[1];
  run.config_hash = "hash-new";
  const int64_t id = store->BeginRun(run).value();
  RequestRecord q;
  q.request_id = 0;
  q.score = 0;
  q.score_partial = 0.8;
  ASSERT_TRUE(store->CompleteRun(id, {.steps = {}, .requests = {q}, .outputs = {}}, {}).ok());
  EXPECT_EQ(store->GetRequests(id)->at(0).score_partial, 0.8);
}

// tests/fixtures/results_v4.db: `vtoken-cli run` of vt-tiny on 3 passkey requests of 200
// tokens (h2o at keep ratio 0.5; native, naive, vtoken) written by the schema-4 build of cafdb08,
// before the requests' ROUGE-L columns: a writer adds them (NULL in the old rows) and every
// stored value reads back the same.
TEST_F(ResultSchemaTest, SchemaFourFileOpensMigratesAndKeepsItsRows) {
  const std::string path = FixtureCopy("results_v4.db");
  Rows before;
  {
    auto store = ResultStore::OpenReadOnly(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->schema_version(), 4);
    before = ReadRows(*store, {1, 2, 3});
    EXPECT_NEAR(store->GetSummary(2)->values.at("rouge_l_vs_native"), 0.6124, 1e-4);
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(before.runs[i].status, "completed");
    ASSERT_EQ(before.requests[i].size(), 3u);
    EXPECT_TRUE(before.requests[i][0].score_partial.has_value());  // schema 4's column
    EXPECT_FALSE(before.requests[i][0].rouge_l_vs_native.has_value());
  }
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, 4));

  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->schema_version(), kResultSchemaVersion);
  EXPECT_EQ(FileColumns(path, "requests"), Declared(kRequestTable, kResultSchemaVersion));
  ExpectSameRows(ReadRows(*store, {1, 2, 3}), before);
  RunRecord run = before.runs[1];
  run.config_hash = "hash-new";
  const int64_t id = store->BeginRun(run).value();
  RequestRecord q;
  q.request_id = 0;
  q.rouge_l_vs_native = 0.5;
  q.rouge_l_vs_reference = 0.25;
  ASSERT_TRUE(store->CompleteRun(id, {.steps = {}, .requests = {q}, .outputs = {}}, {}).ok());
  const RequestRecord back = store->GetRequests(id)->at(0);
  EXPECT_EQ(back.rouge_l_vs_native, 0.5);
  EXPECT_FALSE(back.rouge_l_vs_naive.has_value());
  EXPECT_EQ(back.rouge_l_vs_reference, 0.25);
}

TEST(PerRequestFigures, NameRequestColumnsAndReadTheirValues) {
  RequestRecord q;
  q.score = 1.0;
  q.rouge_l_vs_naive = 0.5;
  for (const PerRequestFigure& f : kPerRequestFigures) {
    const bool declared = std::any_of(kRequestTable.columns.begin(), kRequestTable.columns.end(),
                                      [&](const auto& c) { return c.name == f.column; });
    EXPECT_TRUE(declared) << f.column;
  }
  EXPECT_EQ(RequestColumnValue(q, "score"), 1.0);
  EXPECT_EQ(RequestColumnValue(q, "rouge_l_vs_naive"), 0.5);
  EXPECT_FALSE(RequestColumnValue(q, "rouge_l_vs_native").has_value());  // NULL
  EXPECT_EQ(RequestColumnValue(q, "output_tokens"), 0.0);
  EXPECT_FALSE(RequestColumnValue(q, "task").has_value());  // not numeric
  EXPECT_FALSE(RequestColumnValue(q, "no_such_column").has_value());
}

// experiments/sweep_points.py repeats kPerRequestFigures (plot.py draws those intervals over
// the requests): the two agree.
TEST(PerRequestFigures, PlotScriptsTableEqualsTheSchemas) {
  std::ifstream in(SourceDir() / "experiments/sweep_points.py");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string py = text.str();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(py, m, std::regex("\\nPER_REQUEST = \\{([^}]*)\\}")));
  std::vector<std::pair<std::string, std::string>> found;
  const std::string body = m[1];
  const std::regex pair("\"(\\w+)\": \"(\\w+)\"");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), pair); it != std::sregex_iterator();
       ++it) {
    found.emplace_back((*it)[1], (*it)[2]);
  }
  std::vector<std::pair<std::string, std::string>> declared;
  for (const PerRequestFigure& f : kPerRequestFigures) {
    declared.emplace_back(std::string(f.summary), std::string(f.column));
  }
  EXPECT_EQ(found, declared);
}

TEST_F(ResultSchemaTest, SchemaOneFileMergesIntoANewOne) {
  const std::string source = V1Copy();
  auto store = ResultStore::Open(Path("all.db"));
  ASSERT_TRUE(store.ok());
  MergeStats stats;
  ASSERT_TRUE(store->MergeInto({source}, &stats).ok());
  EXPECT_EQ(stats.runs_copied, 2);
  EXPECT_EQ(store->GetRequests(2)->at(1).ideal_blocks_final, 13);
  EXPECT_FALSE(store->GetRequests(2)->at(1).task.has_value());
  EXPECT_EQ(store->GetSteps(1)->size(), 3u);
  // The source was opened as an attached database, never migrated.
  auto again = ResultStore::OpenReadOnly(source);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->schema_version(), 1);
}

TEST_F(ResultSchemaTest, PythonReaderTakesColumnsFromTheFile) {
  std::ifstream in(SourceDir() / "python/vtoken/results.py");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string py = text.str();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(py, m, std::regex("\\nSCHEMA_VERSION = (\\d+)\\n")));
  EXPECT_EQ(std::stoi(m[1]), kResultSchemaVersion);
  // No hand-kept list of the requests or steps columns to drift from the tables.
  for (const auto& c : kRequestTable.columns) {
    if (c.name == "request_id") continue;  // also a key the reader joins outputs on
    // Computed from the outputs for files older than schema 5, which lack them.
    if (c.name.starts_with("rouge_l_vs_")) continue;
    EXPECT_EQ(py.find("\"" + std::string(c.name) + "\""), std::string::npos) << c.name;
  }
  for (const auto& c : kStepTable.columns) {
    EXPECT_EQ(py.find("\"" + std::string(c.name) + "\""), std::string::npos) << c.name;
  }
}

}  // namespace
}  // namespace vtoken::engine
