#include "lib/engine/result_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

// Runs one statement on the file directly (bypassing the store) and returns the first column of
// the first row as text.
std::string RawQuery(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql;
  std::string out;
  if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0) != nullptr) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

RunRecord MakeRun(const std::string& hash, const std::string& sweep = "") {
  RunRecord r;
  r.git_sha = "abc123";
  r.config_toml = "[run]\nmode = \"vtoken\"\n";
  r.config_hash = hash;
  r.sweep = sweep;
  r.model = "synthetic:llama-3.1-8b";
  r.mode = "vtoken";
  r.policy = "h2o";
  r.budget = 512;
  r.block_size = 16;
  r.num_blocks = 4096;
  r.workload = "sharegpt_like";
  r.seed = 0xFEDCBA9876543210ull;  // above INT64_MAX: stored bit-cast
  return r;
}

std::vector<StepRecord> MakeSteps(int64_t first, int count) {
  std::vector<StepRecord> steps;
  for (int i = 0; i < count; ++i) {
    StepRecord s;
    s.step = first + i;
    s.time_s = 0.5 * static_cast<double>(s.step);
    s.num_running = 3;
    s.num_waiting = 1;
    s.free_blocks = static_cast<int32_t>(100 - s.step);
    s.allocated_blocks = static_cast<int32_t>(28 + s.step);
    s.live_slots = 400;
    s.waste_ratio = 0.125;
    s.held_blocks = 27;
    s.ideal_blocks = 25;
    s.hist[0] = 1;
    s.hist[1] = 2;
    s.hist[2] = 3;
    s.hist[3] = static_cast<int32_t>(22 + s.step);
    s.moves = 7;
    s.fence_waits = 1;
    steps.push_back(s);
  }
  return steps;
}

RequestRecord MakeRequest(int64_t id) {
  RequestRecord r;
  r.request_id = id;
  r.prompt_tokens = 230;
  r.output_tokens = 200;
  r.arrival_s = 0.25;
  r.first_token_s = 0.5;
  r.finish_s = 4.5;
  r.ttft_s = 0.25;
  r.tpot_s = 0.02;
  r.e2e_s = 4.25;
  r.preemptions = 1;
  r.blocks_mean = 20.5;
  r.blocks_final = 27;
  r.ideal_blocks_final = 25;
  return r;
}

class ResultStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_result_store_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Merging `bad` into a new database fails with kDataLoss naming `bad`, not the target, and
  // copies nothing.
  void ExpectMergeNamesSource(const std::string& bad) {
    auto store = ResultStore::Open(Path("into.db"));
    ASSERT_TRUE(store.ok());
    Status s = store->MergeInto({bad});
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_EQ(s.message().rfind("result db " + bad + ": ", 0), 0u) << s.message();
    EXPECT_EQ(s.message().find("into.db"), std::string::npos) << s.message();
    EXPECT_TRUE(store->ListRuns()->empty());
  }

  fs::path dir_;
};

TEST_F(ResultStoreTest, CreatesSchemaWithVersionAndWal) {
  const std::string path = Path("sub/dir/results.db");  // parent directories are created
  {
    auto store = ResultStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->path(), path);
  }
  EXPECT_EQ(RawQuery(path, "PRAGMA user_version"), std::to_string(kResultSchemaVersion));
  EXPECT_EQ(RawQuery(path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawQuery(path,
                     "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_master "
                     "WHERE type = 'table' ORDER BY name)"),
            "outputs,requests,runs,steps,summary,summary_text");
  // Reopening an existing database keeps it.
  auto again = ResultStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(ResultStoreTest, RoundTrip) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const RunRecord in = MakeRun("hash1", "sweepA");
  auto id = store->BeginRun(in);
  ASSERT_TRUE(id.ok()) << id.status().ToString();

  auto running = store->GetRun(*id);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->status, "running");
  EXPECT_EQ(running->pid, ::getpid());
  EXPECT_EQ(running->finished, "");
  EXPECT_TRUE(std::regex_match(running->created, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << running->created;

  ASSERT_TRUE(store->AppendSteps(*id, MakeSteps(0, 3)).ok());
  ASSERT_TRUE(store->AppendSteps(*id, MakeSteps(3, 2)).ok());
  RequestRecord unfinished = MakeRequest(1);
  unfinished.ttft_s = std::nan("");  // never produced a token
  ASSERT_TRUE(store->AppendRequests(*id, {MakeRequest(0), unfinished}).ok());
  ASSERT_TRUE(store->AppendOutputs(*id, {{0, "In the beginning", {1, 2, 2047}}, {1, "", {}}}).ok());
  ASSERT_TRUE(
      store->FinishRun(*id, {{"throughput_tok_s", 1234.5}, {"p95_e2e_s", 4.25}}, {{"note", "ok"}})
          .ok());

  auto out = store->GetRun(*id);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->id, *id);
  EXPECT_EQ(out->git_sha, in.git_sha);
  EXPECT_EQ(out->config_toml, in.config_toml);
  EXPECT_EQ(out->config_hash, "hash1");
  EXPECT_EQ(out->sweep, "sweepA");
  EXPECT_EQ(out->model, in.model);
  EXPECT_EQ(out->mode, "vtoken");
  EXPECT_EQ(out->policy, "h2o");
  EXPECT_EQ(out->budget, 512.0);
  EXPECT_EQ(out->block_size, 16);
  EXPECT_EQ(out->num_blocks, 4096);
  EXPECT_EQ(out->workload, "sharegpt_like");
  EXPECT_EQ(out->seed, 0xFEDCBA9876543210ull);
  EXPECT_EQ(out->status, "completed");
  EXPECT_EQ(out->error, "");
  EXPECT_FALSE(out->finished.empty());

  auto steps = store->GetSteps(*id);
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const StepRecord& s = (*steps)[i];
    const StepRecord want = MakeSteps(i, 1)[0];
    EXPECT_EQ(s.step, i);
    EXPECT_EQ(s.time_s, want.time_s);
    EXPECT_EQ(s.free_blocks, want.free_blocks);
    EXPECT_EQ(s.allocated_blocks, want.allocated_blocks);
    EXPECT_EQ(s.live_slots, 400);
    EXPECT_EQ(s.waste_ratio, 0.125);
    EXPECT_EQ(s.held_blocks, 27);
    EXPECT_EQ(s.ideal_blocks, 25);
    EXPECT_EQ(s.hist[0], 1);
    EXPECT_EQ(s.hist[3], want.hist[3]);
    EXPECT_EQ(s.moves, 7);
    EXPECT_EQ(s.fence_waits, 1);
  }

  auto requests = store->GetRequests(*id);
  ASSERT_TRUE(requests.ok());
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].e2e_s, 4.25);
  EXPECT_EQ((*requests)[0].blocks_mean, 20.5);
  EXPECT_EQ((*requests)[0].preemptions, 1);
  EXPECT_EQ((*requests)[0].ideal_blocks_final, 25);
  EXPECT_TRUE(std::isnan((*requests)[1].ttft_s));  // NaN survives as NULL -> NaN

  auto outputs = store->GetOutputs(*id);
  ASSERT_TRUE(outputs.ok());
  ASSERT_EQ(outputs->size(), 2u);
  EXPECT_EQ((*outputs)[0].text, "In the beginning");
  EXPECT_EQ((*outputs)[0].token_ids, (std::vector<int32_t>{1, 2, 2047}));
  EXPECT_TRUE((*outputs)[1].token_ids.empty());

  auto summary = store->GetSummary(*id);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->values,
            (std::map<std::string, double>{{"p95_e2e_s", 4.25}, {"throughput_tok_s", 1234.5}}));
  EXPECT_EQ(summary->text, (std::map<std::string, std::string>{{"note", "ok"}}));
}

TEST_F(ResultStoreTest, BatchWithDuplicateIsRejectedWhole) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  auto id = store->BeginRun(MakeRun("h"));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store->AppendSteps(*id, MakeSteps(0, 2)).ok());
  // Steps 2 and 3 insert, then step 1 collides with the first batch.
  std::vector<StepRecord> batch = MakeSteps(2, 2);
  batch.push_back(MakeSteps(1, 1)[0]);
  const Status dup = store->AppendSteps(*id, batch);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument) << dup.ToString();
  EXPECT_NE(dup.message().find(Path("r.db")), std::string::npos) << dup.message();
  EXPECT_NE(dup.message().find("INSERT INTO steps"), std::string::npos) << dup.message();
  auto steps = store->GetSteps(*id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps->size(), 2u);  // steps 2 and 3 of the failed batch were rolled back
}

TEST_F(ResultStoreTest, WritesNeedARunningRun) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->AppendSteps(99, MakeSteps(0, 1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->GetRun(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->GetSteps(99).status().code(), StatusCode::kNotFound);
  auto id = store->BeginRun(MakeRun("h"));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store->FinishRun(*id, {{"x", 1}}).ok());
  const Status again = store->FinishRun(*id, {{"x", 2}});
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("is completed, not running"), std::string::npos);
  EXPECT_EQ(store->AppendRequests(*id, {MakeRequest(0)}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->FailRun(*id, "late").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->GetSummary(*id)->values.at("x"), 1.0);
}

TEST_F(ResultStoreTest, FailedRunHasNoSummary) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  auto id = store->BeginRun(MakeRun("h"));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store->AppendSteps(*id, MakeSteps(0, 4)).ok());
  ASSERT_TRUE(store->FailRun(*id, "out of blocks at step 4").ok());
  auto run = store->GetRun(*id);
  EXPECT_EQ(run->status, "failed");
  EXPECT_EQ(run->error, "out of blocks at step 4");
  EXPECT_FALSE(run->finished.empty());
  EXPECT_EQ(store->FinishRun(*id, {{"x", 1}}).code(), StatusCode::kFailedPrecondition);
  auto summary = store->GetSummary(*id);
  ASSERT_TRUE(summary.ok());
  EXPECT_TRUE(summary->values.empty());
  EXPECT_TRUE(summary->text.empty());
  EXPECT_TRUE(store->GetSteps(*id)->empty());  // a failed run keeps no partial rows
}

TEST_F(ResultStoreTest, InterruptedRunKeepsNoRows) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  const int64_t id = store->BeginRun(MakeRun("h")).value();
  ASSERT_TRUE(store->AppendSteps(id, MakeSteps(0, 3)).ok());
  ASSERT_TRUE(store->AppendOutputs(id, {{.request_id = 0, .text = "a", .token_ids = {1}}}).ok());
  ASSERT_TRUE(store->InterruptRun(id, "interrupted by SIGINT").ok());
  auto run = store->GetRun(id);
  EXPECT_EQ(run->status, "interrupted");
  EXPECT_EQ(run->error, "interrupted by SIGINT");
  EXPECT_TRUE(store->GetSteps(id)->empty());
  EXPECT_TRUE(store->GetOutputs(id)->empty());
  EXPECT_EQ(store->InterruptRun(id, "again").code(), StatusCode::kFailedPrecondition);
}

TEST_F(ResultStoreTest, CompleteRunWritesEverythingInOneTransaction) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  const int64_t id = store->BeginRun(MakeRun("h")).value();
  RunRows rows{.steps = MakeSteps(0, 5),
               .requests = {{{.request_id = 0, .prompt_tokens = 3}}, {{.request_id = 0}}},
               .outputs = {{.request_id = 0, .text = "a", .token_ids = {1}}}};
  // A duplicate request id fails half-way: nothing of the run may be left behind.
  EXPECT_FALSE(store->CompleteRun(id, rows, {{"x", 1}}).ok());
  EXPECT_EQ(store->GetRun(id)->status, "running");
  EXPECT_TRUE(store->GetSteps(id)->empty());
  EXPECT_TRUE(store->GetSummary(id)->values.empty());
  rows.requests.pop_back();
  ASSERT_TRUE(store->CompleteRun(id, rows, {{"x", 1}}, {{"experiment", "e"}}).ok());
  EXPECT_EQ(store->GetRun(id)->status, "completed");
  EXPECT_EQ(store->GetSteps(id)->size(), 5u);
  EXPECT_EQ(store->GetRequests(id)->size(), 1u);
  EXPECT_EQ(store->GetOutputs(id)->size(), 1u);
  EXPECT_EQ(store->GetSummary(id)->values.at("x"), 1);
}

TEST_F(ResultStoreTest, MergeOfACorruptSourceNamesTheSource) {
  const std::string bad = Path("corrupt.db");
  std::ofstream(bad) << std::string(4096, 'x');
  ExpectMergeNamesSource(bad);
}

TEST_F(ResultStoreTest, RunOfALiveProcessStaysRunning) {
  const std::string path = Path("r.db");
  int64_t id = 0;
  {
    auto store = ResultStore::Open(path);
    ASSERT_TRUE(store.ok());
    id = store->BeginRun(MakeRun("h")).value();
  }
  auto store = ResultStore::Open(path);  // this process is alive
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->GetRun(id)->status, "running");
}

TEST_F(ResultStoreTest, ProcessKilledMidRunIsMarkedInterrupted) {
  const std::string path = Path("r.db");
  constexpr int kBatch = 50;
  int pipe_fd[2];
  ASSERT_EQ(::pipe(pipe_fd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: record a run and keep appending until killed. Never returns into gtest.
    ::close(pipe_fd[0]);
    auto store = ResultStore::Open(path);
    if (!store.ok()) ::_exit(2);
    auto id = store->BeginRun(MakeRun("killed"));
    if (!id.ok()) ::_exit(3);
    for (int64_t step = 0;; step += kBatch) {
      if (!store->AppendSteps(*id, MakeSteps(step, kBatch)).ok()) ::_exit(4);
      if (step == 2 * kBatch) {  // three batches committed: tell the parent the run id
        if (::write(pipe_fd[1], &id.value(), sizeof(int64_t)) != sizeof(int64_t)) ::_exit(5);
      }
    }
  }
  ::close(pipe_fd[1]);
  int64_t id = 0;
  ASSERT_EQ(::read(pipe_fd[0], &id, sizeof id), static_cast<ssize_t>(sizeof id));
  ::close(pipe_fd[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);  // reaped: its pid no longer names a process
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);

  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(RawQuery(path, "PRAGMA integrity_check"), "ok");
  auto run = store->GetRun(id);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->status, "interrupted");
  EXPECT_EQ(run->error, "process " + std::to_string(child) + " exited without finishing the run");
  auto steps = store->GetSteps(id);
  ASSERT_TRUE(steps.ok());
  EXPECT_GE(steps->size(), 3u * kBatch);
  EXPECT_EQ(steps->size() % kBatch, 0u);  // whole batches only
  for (size_t i = 0; i < steps->size(); ++i) ASSERT_EQ((*steps)[i].step, static_cast<int64_t>(i));
  EXPECT_TRUE(store->GetSummary(id)->values.empty());
  EXPECT_EQ(store->FinishRun(id, {{"x", 1}}).code(), StatusCode::kFailedPrecondition);
}

// Forks a child that opens `path`, begins a run and blocks until killed; returns its pid and,
// through `id`, the run's id once the run is recorded.
pid_t ChildWriter(const std::string& path, const std::string& hash, int64_t* id) {
  int fd[2];
  EXPECT_EQ(::pipe(fd), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fd[0]);
    auto store = ResultStore::Open(path);
    if (!store.ok()) ::_exit(2);
    auto run = store->BeginRun(MakeRun(hash));
    if (!run.ok() || ::write(fd[1], &run.value(), sizeof(int64_t)) != sizeof(int64_t)) {
      ::_exit(3);
    }
    while (true) ::pause();
  }
  ::close(fd[1]);
  EXPECT_EQ(::read(fd[0], id, sizeof *id), static_cast<ssize_t>(sizeof *id));
  ::close(fd[0]);
  return child;
}

TEST_F(ResultStoreTest, RunsOfTwoLiveWritersAreLeftAlone) {
  const std::string path = Path("r.db");
  int64_t a = 0, b = 0;
  const pid_t writer_a = ChildWriter(path, "a", &a);
  const pid_t writer_b = ChildWriter(path, "b", &b);
  {
    auto store = ResultStore::Open(path);  // a third process opens while both are at it
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->GetRun(a)->status, "running");
    EXPECT_EQ(store->GetRun(b)->status, "running");
    EXPECT_EQ(ResultStore::OpenReadOnly(path)->GetRun(b)->status, "running");
  }
  // Killed, and left unreaped: a zombie keeps its pid (kill(pid, 0) succeeds) but not its lock.
  ASSERT_EQ(::kill(writer_a, SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(writer_a), &info, WEXITED | WNOWAIT), 0);
  {
    auto store = ResultStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ(store->GetRun(a)->status, "interrupted");
    EXPECT_EQ(store->GetRun(b)->status, "running");
  }
  ASSERT_EQ(::kill(writer_b, SIGKILL), 0);
  ASSERT_EQ(::waitpid(writer_a, nullptr, 0), writer_a);
  ASSERT_EQ(::waitpid(writer_b, nullptr, 0), writer_b);
  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->GetRun(b)->status, "interrupted");
  EXPECT_EQ(store->GetRun(b)->error,
            "process " + std::to_string(writer_b) + " exited without finishing the run");
}

TEST_F(ResultStoreTest, RunGivenUpByItsLiveWriterIsMarkedOnTheNextOpen) {
  // FailRun gives the run up even when its transaction fails (a full disk, a corrupt page):
  // the next Open marks it, though its process lives on.
  const std::string path = Path("r.db");
  auto store = ResultStore::Open(path);
  ASSERT_TRUE(store.ok());
  const int64_t id = store->BeginRun(MakeRun("h")).value();
  // A trigger makes every write to the run fail, as a full disk would.
  RawQuery(path,
           "CREATE TRIGGER full BEFORE UPDATE ON runs BEGIN SELECT RAISE(ABORT, "
           "'database or disk is full'); END");
  EXPECT_FALSE(store->FailRun(id, "out of memory").ok());
  RawQuery(path, "DROP TRIGGER full");
  auto again = ResultStore::Open(path);  // same live process, but the run is no one's now
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->GetRun(id)->status, "interrupted");
  EXPECT_EQ(again->GetRun(id)->error, "process " + std::to_string(::getpid()) +
                                          " stopped writing the run without finishing it");
}

TEST_F(ResultStoreTest, MergeOfASourceWithACorruptPageNamesTheSource) {
  const std::string bad = Path("bad.db");
  {
    auto src = ResultStore::Open(bad);
    ASSERT_TRUE(src.ok());
    const int64_t id = src->BeginRun(MakeRun("h")).value();
    ASSERT_TRUE(src->AppendSteps(id, MakeSteps(0, 2000)).ok());
    ASSERT_TRUE(src->FinishRun(id, {{"x", 1}}).ok());
  }
  ASSERT_EQ(RawQuery(bad, "PRAGMA wal_checkpoint(TRUNCATE)"), "0");
  {
    // Overwrite page 5 (of the steps table's b-tree) with garbage; the header stays valid.
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4 * 4096);
    const std::string garbage(4096, '\x5a');
    f.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  ExpectMergeNamesSource(bad);
}

TEST_F(ResultStoreTest, ReadOnlyOpenReadsAndNeverWrites) {
  const std::string missing = Path("sub/missing.db");
  auto none = ResultStore::OpenReadOnly(missing);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(), "result db " + missing + " not found");
  EXPECT_FALSE(fs::exists(Path("sub")));  // neither the file nor its directory is created

  const std::string path = Path("r.db");
  int64_t id = 0;
  {
    auto store = ResultStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_FALSE(store->read_only());
    id = store->BeginRun(MakeRun("h")).value();
    ASSERT_TRUE(store->AppendSteps(id, MakeSteps(0, 3)).ok());
    ASSERT_TRUE(store->FinishRun(id, {{"throughput_tok_s", 12.5}}).ok());
  }
  auto store = ResultStore::OpenReadOnly(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_TRUE(store->read_only());
  EXPECT_EQ(store->GetRun(id)->status, "completed");
  EXPECT_EQ(store->GetSummary(id)->values.at("throughput_tok_s"), 12.5);
  EXPECT_EQ(store->GetSteps(id)->size(), 3u);
  EXPECT_EQ(store->BeginRun(MakeRun("h2")).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->FailRun(id, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->MergeInto({path}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(RawQuery(path, "SELECT count(*) FROM runs"), "1");
}

TEST_F(ResultStoreTest, ReadOnlyOpenShowsADeadRunAsInterruptedWithoutMarkingIt) {
  const std::string path = Path("r.db");
  // A child begins a run, waits while the parent records a newer one, and exits without ending
  // its run: its lock and its pid are gone.
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = ResultStore::Open(path);
    if (!store.ok()) ::_exit(2);
    auto id = store->BeginRun(MakeRun("dead"));
    if (!id.ok() || ::write(to_parent[1], &id.value(), sizeof(int64_t)) != sizeof(int64_t)) {
      ::_exit(3);
    }
    char c;
    ::close(to_child[1]);
    ::_exit(::read(to_child[0], &c, 1) == 0 ? 0 : 4);  // until the parent closes its end
  }
  ::close(to_child[0]);
  int64_t dead = 0, done = 0;
  ASSERT_EQ(::read(to_parent[0], &dead, sizeof dead), static_cast<ssize_t>(sizeof dead));
  {
    auto store = ResultStore::Open(path);
    ASSERT_TRUE(store.ok());
    done = store->BeginRun(MakeRun("done")).value();
    ASSERT_TRUE(store->FinishRun(done, {}).ok());
  }
  ::close(to_child[1]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);  // reaped: its pid names no process
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  ::close(to_parent[0]);
  ::close(to_parent[1]);
  EXPECT_EQ(RawQuery(path, "SELECT status FROM runs WHERE id = " + std::to_string(dead)),
            "running");
  {
    auto store = ResultStore::OpenReadOnly(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto run = store->GetRun(dead);
    ASSERT_TRUE(run.ok());
    EXPECT_EQ(run->status, "interrupted");
    EXPECT_EQ(run->error, "process " + std::to_string(child) + " exited without finishing the run");
    auto interrupted = store->ListRuns({.ids = {}, .sweep = "", .status = "interrupted"});
    ASSERT_TRUE(interrupted.ok());
    ASSERT_EQ(interrupted->size(), 1u);
    EXPECT_EQ((*interrupted)[0].id, dead);
    EXPECT_TRUE(store->ListRuns({.ids = {}, .sweep = "", .status = "running"})->empty());
    auto last = store->ListRuns({.ids = {}, .sweep = "", .status = "interrupted", .last = 1});
    ASSERT_EQ(last->size(), 1u);  // `last` counts matches, not rows: the newest row is `done`
    EXPECT_EQ((*last)[0].id, dead);
  }
  EXPECT_EQ(RawQuery(path, "SELECT status FROM runs WHERE id = " + std::to_string(dead)),
            "running");
  ASSERT_TRUE(ResultStore::Open(path).ok());  // a writer marks it
  EXPECT_EQ(RawQuery(path, "SELECT status FROM runs WHERE id = " + std::to_string(dead)),
            "interrupted");
}

TEST_F(ResultStoreTest, ReadOnlyOpenRefusesFilesThatAreNotResultDatabases) {
  const std::string empty = Path("empty.db");
  RawQuery(empty, "CREATE TABLE t (x)");
  auto store = ResultStore::OpenReadOnly(empty);
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.status().message(), "result db " + empty + ": schema version 0, expected 1.." +
                                          std::to_string(kResultSchemaVersion) +
                                          " (not a vtoken result database)");
  const std::string text = Path("text.db");
  { std::ofstream(text) << "this is a text file, not a database, and it is long enough\n"; }
  EXPECT_EQ(ResultStore::OpenReadOnly(text).status().code(), StatusCode::kDataLoss);
}

TEST_F(ResultStoreTest, ListRunsFilters) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(store->BeginRun(MakeRun("h" + std::to_string(i), i % 2 ? "odd" : "")).value());
  }
  ASSERT_TRUE(store->FinishRun(ids[3], {}).ok());
  auto id_list = [](const std::vector<RunRecord>& runs) {
    std::vector<int64_t> out;
    for (const RunRecord& r : runs) out.push_back(r.id);
    return out;
  };
  EXPECT_EQ(id_list(store->ListRuns().value()), ids);
  EXPECT_EQ(id_list(store->ListRuns({.last = 2}).value()), (std::vector<int64_t>{ids[3], ids[4]}));
  EXPECT_EQ(id_list(store->ListRuns({.ids = {ids[4], ids[0]}}).value()),
            (std::vector<int64_t>{ids[0], ids[4]}));
  EXPECT_EQ(id_list(store->ListRuns({.sweep = "odd"}).value()),
            (std::vector<int64_t>{ids[1], ids[3]}));
  EXPECT_EQ(id_list(store->ListRuns({.sweep = "odd", .status = "running"}).value()),
            (std::vector<int64_t>{ids[1]}));
  EXPECT_EQ(id_list(store->ListRuns({.sweep = "odd", .last = 1}).value()),
            (std::vector<int64_t>{ids[3]}));
}

TEST_F(ResultStoreTest, FindCompleted) {
  auto store = ResultStore::Open(Path("r.db"));
  ASSERT_TRUE(store.ok());
  const int64_t failed = store->BeginRun(MakeRun("h1", "s")).value();
  ASSERT_TRUE(store->FailRun(failed, "boom").ok());
  EXPECT_EQ(store->FindCompleted("h1", "s").value(), std::nullopt);
  const int64_t done = store->BeginRun(MakeRun("h1", "s")).value();
  ASSERT_TRUE(store->FinishRun(done, {{"x", 1}}).ok());
  store->BeginRun(MakeRun("h1", "s")).value();  // a later, still running attempt
  EXPECT_EQ(store->FindCompleted("h1", "s").value(), std::optional<int64_t>(done));
  EXPECT_EQ(store->FindCompleted("h1", "other").value(), std::nullopt);
  EXPECT_EQ(store->FindCompleted("h2", "s").value(), std::nullopt);
}

TEST_F(ResultStoreTest, MergeIntoCopiesCompletedRunsUnderNewIds) {
  const std::string source_path = Path("shard1.db");
  int64_t src_h1 = 0;
  {
    auto src = ResultStore::Open(source_path);
    ASSERT_TRUE(src.ok());
    const int64_t failed = src->BeginRun(MakeRun("h3", "s")).value();
    ASSERT_TRUE(src->AppendSteps(failed, MakeSteps(0, 2)).ok());
    ASSERT_TRUE(src->FailRun(failed, "boom").ok());
    src_h1 = src->BeginRun(MakeRun("h1", "s")).value();
    ASSERT_TRUE(src->AppendSteps(src_h1, MakeSteps(0, 3)).ok());
    ASSERT_TRUE(src->AppendRequests(src_h1, {MakeRequest(0), MakeRequest(1)}).ok());
    ASSERT_TRUE(src->AppendOutputs(src_h1, {{0, "amen", {5, 6}}}).ok());
    ASSERT_TRUE(src->FinishRun(src_h1, {{"x", 1.5}}, {{"t", "v"}}).ok());
    const int64_t src_h2 = src->BeginRun(MakeRun("h2", "s")).value();
    ASSERT_TRUE(src->FinishRun(src_h2, {{"x", 9}}).ok());
    const int64_t unhashed = src->BeginRun(MakeRun("", "")).value();
    ASSERT_TRUE(src->FinishRun(unhashed, {{"x", 3}}).ok());
  }
  auto dst = ResultStore::Open(Path("all.db"));
  ASSERT_TRUE(dst.ok());
  const int64_t dst_h2 = dst->BeginRun(MakeRun("h2", "s")).value();
  ASSERT_TRUE(dst->FinishRun(dst_h2, {{"x", 2}}).ok());

  MergeStats stats;
  const Status merged = dst->MergeInto({source_path}, &stats);
  ASSERT_TRUE(merged.ok()) << merged.ToString();
  EXPECT_EQ(stats.runs_copied, 2);   // h1 and the unhashed run
  EXPECT_EQ(stats.runs_skipped, 1);  // h2 is already completed here
  const std::vector<RunRecord> runs = dst->ListRuns().value();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].config_hash, "h1");
  EXPECT_EQ(runs[1].status, "completed");
  EXPECT_EQ(runs[2].config_hash, "");
  const int64_t h1 = runs[1].id;
  EXPECT_NE(h1, dst_h2);
  EXPECT_EQ(dst->GetSteps(h1)->size(), 3u);
  EXPECT_EQ(dst->GetRequests(h1)->size(), 2u);
  EXPECT_EQ(dst->GetOutputs(h1)->at(0).token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(dst->GetSummary(h1)->values.at("x"), 1.5);
  EXPECT_EQ(dst->GetSummary(h1)->text.at("t"), "v");
  EXPECT_EQ(dst->GetSummary(dst_h2)->values.at("x"), 2.0);  // the target's own run is kept
  EXPECT_EQ(dst->FindCompleted("h3", "s").value(), std::nullopt);

  // Merging the same shard again copies nothing it can recognize.
  ASSERT_TRUE(dst->MergeInto({source_path}, &stats).ok());
  EXPECT_EQ(stats.runs_skipped, 2);
  // The source is unchanged.
  EXPECT_EQ(RawQuery(source_path, "SELECT count(*) FROM runs"), "4");
}

TEST_F(ResultStoreTest, MergeErrors) {
  auto dst = ResultStore::Open(Path("all.db"));
  ASSERT_TRUE(dst.ok());
  const Status missing = dst->MergeInto({Path("nope.db")});
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(Path("nope.db")), std::string::npos);
  EXPECT_EQ(dst->MergeInto({Path("all.db")}).code(), StatusCode::kFailedPrecondition);
  { std::ofstream(Path("empty.db")) << ""; }  // an empty file is an empty SQLite database
  const Status foreign = dst->MergeInto({Path("empty.db")});
  EXPECT_EQ(foreign.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(foreign.message().find("schema version 0, expected 1"), std::string::npos)
      << foreign.message();
}

TEST_F(ResultStoreTest, NewerSchemaIsRefused) {
  const std::string path = Path("r.db");
  ASSERT_TRUE(ResultStore::Open(path).ok());
  const std::string newer = std::to_string(kResultSchemaVersion + 1);
  RawQuery(path, "PRAGMA user_version = " + newer);
  auto store = ResultStore::Open(path);
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.status().message(),
            "result db " + path + ": schema version " + newer + " is newer than this build's " +
                std::to_string(kResultSchemaVersion) + "; use a newer vtoken");
}

TEST_F(ResultStoreTest, NotADatabase) {
  const std::string path = Path("r.db");
  { std::ofstream(path) << "this is a text file, not a database, and it is long enough\n"; }
  auto store = ResultStore::Open(path);
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find(path), std::string::npos);
}

TEST_F(ResultStoreTest, DirectoryThatCannotBeCreated) {
  { std::ofstream(Path("file")) << "x"; }
  const std::string path = Path("file/sub/r.db");  // a parent is a regular file
  auto store = ResultStore::Open(path);
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store.status().message().rfind(
                "result db " + path + ": cannot create directory " + Path("file/sub") + ": ", 0),
            0u)
      << store.status().message();
}

TEST_F(ResultStoreTest, UnwritableDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  fs::create_directories(Path("ro"));
  fs::permissions(Path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  auto store = ResultStore::Open(Path("ro/r.db"));
  fs::permissions(Path("ro"), fs::perms::owner_all);
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound);
  EXPECT_NE(store.status().message().find(Path("ro/r.db")), std::string::npos);
  EXPECT_NE(store.status().message().find("is the directory writable?"), std::string::npos);
}

}  // namespace
}  // namespace vtoken::engine
