// PrefillMemo / MemoRunner with a scripted runner whose KV bytes encode (token, position, a hash
// of everything the token attended to): a restored chunk that is not exactly what the model would
// have computed changes every later output. Runs through the memo must equal runs without it
// (outputs, memory figures), and the runs after the first must compute no prompt token.
#include "lib/engine/prefill_memo.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/core/host_kv_store.h"
#include "lib/engine/engine.h"

namespace vtoken::engine {
namespace {

constexpr int64_t kSlotBytes = 24;

class KvRunner final : public model::ModelRunner {
 public:
  explicit KvRunner(int64_t num_slots) : store_(1, num_slots, kSlotBytes), engine_(store_) {}

  int64_t vocab_size() const override { return 100; }
  int64_t max_context() const override { return 1 << 20; }
  std::optional<int32_t> bos_token_id() const override { return std::nullopt; }
  const std::vector<int64_t>& eos_token_ids() const override { return eos_; }
  int64_t kv_bytes_per_token() const override { return kSlotBytes; }
  int64_t num_slots() const override { return store_.num_slots(); }
  CopyEngine& copy_engine() override { return engine_; }
  uint64_t TokenKvHash(SlotIndex slot) override { return vtoken::TokenKvHash(store_, slot); }
  void ForgetRequest(int64_t) override {}
  Status ReadKv(std::span<const SlotIndex> slots, std::vector<std::byte>& out) override {
    for (SlotIndex s : slots) {
      std::span<const std::byte> b = store_.Token(0, s);
      out.insert(out.end(), b.begin(), b.end());
    }
    return Status::Ok();
  }
  Status WriteKv(std::span<const SlotIndex> slots, std::span<const std::byte> bytes) override {
    if (bytes.size() != slots.size() * kSlotBytes) return InvalidArgumentError("size");
    for (size_t i = 0; i < slots.size(); ++i) {
      std::memcpy(store_.Token(0, slots[i]).data(), bytes.data() + i * kSlotBytes, kSlotBytes);
    }
    return Status::Ok();
  }

  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override {
    std::vector<model::RunnerOutput> outs;
    for (const model::RunnerInput& in : inputs) {
      uint64_t h = drift_;
      std::vector<int64_t> positions;
      for (SlotIndex slot : in.context_slots) {
        int64_t v[3];
        std::memcpy(v, store_.Token(0, slot).data(), sizeof(v));
        h = Mix(h, v[0], v[1], v[2]);
        positions.push_back(v[1]);
      }
      for (size_t i = 0; i < in.tokens.size(); ++i) {
        h = Mix(h, in.tokens[i], in.positions[i], 0);
        const int64_t v[3] = {in.tokens[i], in.positions[i], static_cast<int64_t>(h)};
        std::memcpy(store_.Token(0, in.write_slots[i]).data(), v, sizeof(v));
        positions.push_back(in.positions[i]);
      }
      forwarded_tokens += static_cast<int64_t>(in.tokens.size());
      model::RunnerOutput out;
      out.next_token = in.sample ? static_cast<int32_t>(h % 100) : -1;
      if (in.want_signals) {
        for (int64_t p : positions) {
          out.attn.push_back(in.signals & kAttnSignal ? 1.0f / static_cast<float>(1 + p % 9)
                                                      : 0.0f);
          out.key_norm.push_back(in.signals & kKeyNormSignal ? 1.0f + static_cast<float>(p % 4)
                                                             : 0.0f);
        }
      }
      outs.push_back(std::move(out));
    }
    return outs;
  }

  int64_t forwarded_tokens = 0;
  uint64_t drift_ = 0;  // A model that is not deterministic across calls, when changed.

 private:
  static uint64_t Mix(uint64_t h, int64_t a, int64_t b, int64_t c) {
    h ^= static_cast<uint64_t>(a + 7) * 0x9e3779b97f4a7c15ULL;
    h = (h << 13 | h >> 51) * 0xc2b2ae3d27d4eb4fULL;
    h ^= static_cast<uint64_t>(b + 1) * 0x165667b19e3779f9ULL + static_cast<uint64_t>(c);
    return h;
  }

  HostKvStore store_;
  SyncHostCopyEngine engine_;
  std::vector<int64_t> eos_;
};

std::vector<Request> Prompts(int n, int64_t length) {
  std::vector<Request> out;
  uint64_t state = 11;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.id = i;
    for (int64_t t = 0; t < length + 13 * i; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      r.prompt_tokens.push_back(static_cast<int32_t>((state >> 33) % 100));
    }
    r.max_tokens = 12;
    out.push_back(std::move(r));
  }
  return out;
}

EngineOptions Options(Mode mode, const std::string& policy, int32_t num_blocks) {
  EngineOptions o;
  o.mode = mode;
  o.pool = {.num_blocks = num_blocks, .block_size = 16, .headroom_blocks = 4};
  o.policy = policy;
  o.evictor = {.keep_ratio = 0.3, .num_sink = 4, .num_recent = 16};
  o.max_prefill_chunk = 48;
  o.max_num_seqs = 3;
  o.verify = true;
  return o;
}

std::string MemoDir() {
  return (std::filesystem::temp_directory_path() / "vtoken-prefill-memo-test").string();
}

void ExpectSameRun(const EngineResult& a, const EngineResult& b, const std::string& what) {
  ASSERT_EQ(a.requests.size(), b.requests.size()) << what;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const RequestResult& x = a.requests[i];
    const RequestResult& y = b.requests[i];
    EXPECT_EQ(x.output_tokens, y.output_tokens) << what << " request " << i;
    EXPECT_EQ(x.blocks_mean, y.blocks_mean) << what << " request " << i;
    EXPECT_EQ(x.preemptions, y.preemptions) << what << " request " << i;
  }
  EXPECT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t s = 0; s < std::min(a.steps.size(), b.steps.size()); ++s) {
    EXPECT_EQ(a.steps[s].allocated_blocks, b.steps[s].allocated_blocks) << what << " step " << s;
    EXPECT_EQ(a.steps[s].num_running, b.steps[s].num_running) << what << " step " << s;
  }
}

// A sweep's order: native first, then every policy in naive and vtoken mode, one memo for all.
TEST(PrefillMemoTest, RunsThroughTheMemoEqualSeparateRunsAndComputeEachPromptOnce) {
  const std::vector<Request> requests = Prompts(5, 150);
  int64_t prompt_tokens = 0;
  for (const Request& r : requests) prompt_tokens += static_cast<int64_t>(r.prompt_tokens.size());
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::Create(MemoDir(), int64_t{1} << 30);
  ASSERT_TRUE(memo.ok()) << memo.status().ToString();
  struct Config {
    Mode mode;
    std::string policy;
  };
  const Config configs[] = {{Mode::kNative, "h2o"},         {Mode::kNaive, "h2o"},
                            {Mode::kVtoken, "h2o"},         {Mode::kNaive, "knorm"},
                            {Mode::kVtoken, "snapkv"},      {Mode::kNaive, "streaming_llm"},
                            {Mode::kVtoken, "scissorhands"}};
  for (size_t c = 0; c < std::size(configs); ++c) {
    const EngineOptions o = Options(configs[c].mode, configs[c].policy, 60);
    const std::string what = std::string(ModeName(o.mode)) + " " + o.policy;
    KvRunner plain(int64_t{o.pool.num_blocks} * o.pool.block_size);
    StatusOr<EngineResult> separate = RunEngine(o, plain, requests);
    ASSERT_TRUE(separate.ok()) << what << ": " << separate.status().ToString();

    KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
    MemoRunner runner(inner, **memo, "fake");
    const PrefillMemoStats before = (*memo)->stats();
    StatusOr<EngineResult> memoized = RunEngine(o, runner, requests);
    ASSERT_TRUE(memoized.ok()) << what << ": " << memoized.status().ToString();
    ExpectSameRun(*separate, *memoized, what);
    const PrefillMemoStats& after = (*memo)->stats();
    if (c == 0) {
      EXPECT_EQ(after.tokens_computed, prompt_tokens);
      EXPECT_EQ(after.tokens_restored, 0);
    } else {  // Every prompt token restored; only the decode steps reach the model.
      EXPECT_EQ(after.tokens_restored - before.tokens_restored, prompt_tokens) << what;
      EXPECT_EQ(inner.forwarded_tokens, plain.forwarded_tokens - prompt_tokens) << what;
    }
  }
  EXPECT_EQ((*memo)->stats().kv_mismatches, 0);
  EXPECT_EQ((*memo)->stats().bytes_stored, prompt_tokens * kSlotBytes);
}

TEST(PrefillMemoTest, PreemptedRequestsAndAFullMemoStillEqualSeparateRuns) {
  std::vector<Request> requests = Prompts(4, 200);
  for (Request& r : requests) r.max_tokens = 60;
  for (const int64_t max_bytes : {int64_t{1} << 30, int64_t{2000}}) {
    StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::Create(MemoDir(), max_bytes);
    ASSERT_TRUE(memo.ok());
    for (const Mode mode : {Mode::kNative, Mode::kNaive, Mode::kNative}) {
      // 34 blocks: the running requests outgrow the pool, so the newest are preempted.
      EngineOptions o = Options(mode, "h2o", 34);
      o.evictor.keep_ratio = 0.9;
      o.admission = EngineOptions::Admission::kGreedy;
      KvRunner plain(int64_t{o.pool.num_blocks} * o.pool.block_size);
      StatusOr<EngineResult> separate = RunEngine(o, plain, requests);
      ASSERT_TRUE(separate.ok()) << separate.status().ToString();
      KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
      MemoRunner runner(inner, **memo, "fake");
      StatusOr<EngineResult> memoized = RunEngine(o, runner, requests);
      ASSERT_TRUE(memoized.ok()) << memoized.status().ToString();
      ExpectSameRun(*separate, *memoized,
                    std::string(ModeName(mode)) + " max_bytes " + std::to_string(max_bytes));
      if (mode == Mode::kNative) EXPECT_GT(separate->preemptions, 0);
    }
    EXPECT_LE((*memo)->stats().bytes_stored, max_bytes);
    // A full memo keeps the first chunk only (48 tokens of 24 bytes) and serves just that.
    if (max_bytes == 2000) EXPECT_EQ((*memo)->stats().bytes_stored, 48 * kSlotBytes);
  }
}

TEST(PrefillMemoTest, SampledPromptsAndOtherPartitionsPassThrough) {
  const std::vector<Request> requests = Prompts(3, 100);
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::Create(MemoDir(), int64_t{1} << 30);
  ASSERT_TRUE(memo.ok());
  EngineOptions sampled = Options(Mode::kNative, "h2o", 60);
  sampled.sampling = {.temperature = 0.8, .top_p = 1.0, .seed = 5};
  for (int i = 0; i < 2; ++i) {
    KvRunner inner(int64_t{sampled.pool.num_blocks} * sampled.pool.block_size);
    MemoRunner runner(inner, **memo, "sampled");
    ASSERT_TRUE(RunEngine(sampled, runner, requests).ok());
  }
  // Only the chunks that do not sample are kept and restored; the last one is always computed.
  const PrefillMemoStats& s = (*memo)->stats();
  EXPECT_GT(s.tokens_restored, 0);
  EXPECT_EQ(s.chunks_restored, s.chunks_computed);

  const std::vector<Request> greedy = Prompts(3, 100);
  const EngineOptions o = Options(Mode::kNative, "h2o", 60);
  StatusOr<std::unique_ptr<PrefillMemo>> other = PrefillMemo::Create(MemoDir(), int64_t{1} << 30);
  ASSERT_TRUE(other.ok());
  for (const char* partition : {"model A", "model B"}) {
    KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
    MemoRunner runner(inner, **other, partition);
    ASSERT_TRUE(RunEngine(o, runner, greedy).ok());
  }
  EXPECT_EQ((*other)->stats().tokens_restored, 0);  // B never reads A's entries
}

TEST(PrefillMemoTest, ARecomputedChunkThatDiffersIsCounted) {
  const std::vector<Request> requests = Prompts(2, 100);
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::Create(MemoDir(), int64_t{1} << 30);
  ASSERT_TRUE(memo.ok());
  // A native run keeps the prompts; a run with a policy asks for signals with another window,
  // so each last chunk is recomputed, by a model that now computes something else.
  EngineOptions o = Options(Mode::kNative, "h2o", 60);
  {
    KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
    MemoRunner runner(inner, **memo, "fake");
    ASSERT_TRUE(RunEngine(o, runner, requests).ok());
  }
  o.mode = Mode::kNaive;
  o.obs_window = 8;
  KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
  inner.drift_ = 1;
  MemoRunner runner(inner, **memo, "fake");
  ASSERT_TRUE(RunEngine(o, runner, requests).ok());
  EXPECT_EQ((*memo)->stats().kv_mismatches, 2);  // one last chunk per request
}

TEST(PrefillMemoTest, AnUnwritableDirectoryIsAOneLineError) {
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::Create("/proc/none/memo", 1 << 20);
  ASSERT_FALSE(memo.ok());
  EXPECT_NE(memo.status().message().find("/proc/none/memo"), std::string::npos);
}

// A fresh directory for a persistent memo.
std::string CacheDir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() /
      ("vtoken-prefill-memo-cache-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(d);
  return d.string();
}

// Runs `configs` through a memo in order (as a sweep would), each checked against a run without
// it; returns the prompt tokens the model computed over all of them.
int64_t RunThrough(PrefillMemo& memo, const std::vector<Request>& requests,
                   const std::vector<std::pair<Mode, std::string>>& configs) {
  int64_t computed = 0;
  for (const auto& [mode, policy] : configs) {
    const EngineOptions o = Options(mode, policy, 60);
    const std::string what = std::string(ModeName(mode)) + " " + policy;
    KvRunner plain(int64_t{o.pool.num_blocks} * o.pool.block_size);
    StatusOr<EngineResult> separate = RunEngine(o, plain, requests);
    EXPECT_TRUE(separate.ok()) << what << ": " << separate.status().ToString();
    KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
    MemoRunner runner(inner, memo, "fake");
    const int64_t before = memo.stats().tokens_computed;
    StatusOr<EngineResult> memoized = RunEngine(o, runner, requests);
    EXPECT_TRUE(memoized.ok()) << what << ": " << memoized.status().ToString();
    if (separate.ok() && memoized.ok()) ExpectSameRun(*separate, *memoized, what);
    computed += memo.stats().tokens_computed - before;
  }
  return computed;
}

// A persistent memo serves a later invocation: every prompt of the second one is restored from
// what the first stored, and its runs equal separate runs.
TEST(PrefillMemoTest, APersistentMemoServesALaterInvocation) {
  const std::vector<Request> requests = Prompts(4, 150);
  int64_t prompt_tokens = 0;
  for (const Request& r : requests) prompt_tokens += static_cast<int64_t>(r.prompt_tokens.size());
  const std::string dir = CacheDir("later");
  const std::vector<std::pair<Mode, std::string>> first = {{Mode::kNative, "h2o"},
                                                           {Mode::kNaive, "h2o"}};
  const std::vector<std::pair<Mode, std::string>> second = {
      {Mode::kVtoken, "snapkv"}, {Mode::kNaive, "knorm"}, {Mode::kNative, "h2o"}};
  {
    StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
    ASSERT_TRUE(memo.ok()) << memo.status().ToString();
    EXPECT_TRUE((*memo)->persistent());
    EXPECT_EQ((*memo)->stats().chunks_loaded, 0);
    EXPECT_EQ(RunThrough(**memo, requests, first), prompt_tokens);
    // Held by this process: another one gets a one-line refusal.
    StatusOr<std::unique_ptr<PrefillMemo>> busy = PrefillMemo::OpenPersistent(dir, 1 << 30);
    ASSERT_FALSE(busy.ok());
    EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(busy.status().message().find(dir + " is in use"), std::string::npos);
  }
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
  ASSERT_TRUE(memo.ok()) << memo.status().ToString();
  EXPECT_GT((*memo)->stats().chunks_loaded, 0);
  EXPECT_EQ((*memo)->stats().bytes_loaded, prompt_tokens * kSlotBytes);
  EXPECT_EQ(RunThrough(**memo, requests, second), 0);  // nothing computed again
  EXPECT_EQ((*memo)->stats().tokens_restored, prompt_tokens * 3);
  EXPECT_EQ((*memo)->stats().kv_mismatches, 0);
  std::filesystem::remove_all(dir);
}

// A write cut short leaves a torn last record: the next open drops it (and the chunks after it)
// and computes those again; a chunk whose KV bytes changed on disk is a one-line DataLoss error;
// files that are not a memo's are refused.
TEST(PrefillMemoTest, APersistentMemoDropsATornTailAndRefusesChangedBytes) {
  const std::vector<Request> requests = Prompts(3, 150);
  const std::string dir = CacheDir("torn");
  const std::filesystem::path index = std::filesystem::path(dir) / "index";
  const std::filesystem::path kv = std::filesystem::path(dir) / "kv";
  int64_t kept_records = 0;
  {
    StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
    ASSERT_TRUE(memo.ok()) << memo.status().ToString();
    RunThrough(**memo, requests, {{Mode::kNative, "h2o"}});
    kept_records = (*memo)->stats().chunks_computed;
  }
  std::filesystem::resize_file(index, std::filesystem::file_size(index) - 5);
  {
    testing::internal::CaptureStderr();
    StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
    const std::string note = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(memo.ok()) << memo.status().ToString();
    EXPECT_NE(note.find("prefill memo " + dir + ": its index is damaged after"), std::string::npos)
        << note;
    // The last record was an output or the last chunk: at most one chunk fewer.
    EXPECT_GE((*memo)->stats().chunks_loaded, kept_records - 1);
    EXPECT_LE((*memo)->stats().chunks_loaded, kept_records);
    const int64_t computed = RunThrough(**memo, requests, {{Mode::kNaive, "h2o"}});
    EXPECT_LT(computed, 150);  // at most the torn chunk's prompt part, computed again
  }
  {  // Change one KV byte: the run that restores it fails, naming the directory.
    std::fstream f(kv, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(7);
    f.put('\x5a');
  }
  {
    StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
    ASSERT_TRUE(memo.ok()) << memo.status().ToString();
    const EngineOptions o = Options(Mode::kNative, "h2o", 60);
    KvRunner inner(int64_t{o.pool.num_blocks} * o.pool.block_size);
    MemoRunner runner(inner, **memo, "fake");
    StatusOr<EngineResult> r = RunEngine(o, runner, requests);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("prefill memo " + dir), std::string::npos);
  }
  {
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f << "not a memo";
  }
  StatusOr<std::unique_ptr<PrefillMemo>> memo = PrefillMemo::OpenPersistent(dir, 1 << 30);
  ASSERT_FALSE(memo.ok());
  EXPECT_EQ(memo.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(memo.status().message().find("not a vtoken prefill memo"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(PrefillMemoTest, HashFilesFollowsTheContents) {
  const std::string dir = CacheDir("hash");
  std::filesystem::create_directories(dir);
  const std::string a = dir + "/a", b = dir + "/b";
  std::ofstream(a) << "weights";
  std::ofstream(b) << "tokenizer";
  StatusOr<uint64_t> ab = PrefillMemo::HashFiles({a, b});
  ASSERT_TRUE(ab.ok());
  EXPECT_EQ(*PrefillMemo::HashFiles({a, b}), *ab);
  EXPECT_NE(*PrefillMemo::HashFiles({b, a}), *ab);
  std::ofstream(a) << "weightz";
  EXPECT_NE(*PrefillMemo::HashFiles({a, b}), *ab);
  StatusOr<uint64_t> missing = PrefillMemo::HashFiles({dir + "/none"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/none"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vtoken::engine
