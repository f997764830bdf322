// PrefillMemo: a prompt's prefill computed once per sweep. Policies observe a sequence only when
// its whole prompt is in the cache (engine.h: nothing is evicted during a chunked prefill), so
// every configuration of a sweep computes the same prefill chunks from the same tokens: the same
// K and V rows, the same first token and the same signals. The memo keeps what the first run
// computed and MemoRunner restores it in the runs that follow: the chunk's K/V bytes are written
// into the slots the engine reserved, and the forward's output is returned as computed, so the
// cache, the pool and every policy decision are those of a run that computed it.
//
// A chunk is served only when it continues, token for token, a chunk chain the memo holds from
// position 0, with every earlier token still live in every KV group (no eviction yet), no prefix
// fork, greedy or no sampling, and no query statistics kept (RunnerInput::keep_query_moments: the
// memo holds no queries). Anything else passes through to the model. A chunk is keyed by
// its tokens, its start and its predecessor's entry, so equal keys are equal inputs, compared in
// full (no hash is trusted).
//
// The outputs: a chunk that samples keeps one output per (score_token, signals asked); a miss that
// asks for signals or samples is computed with both signals (attention and key norms), and a later
// request gets the ones it asked for, the others left at zero (model_runner.h's contract). When an
// output is missing for a chunk whose K/V the memo holds, the chunk is recomputed and its K/V
// compared with the stored bytes: a difference (the model is not batch-invariant) is counted in
// stats().kv_mismatches.
//
// KV bytes live in an unlinked file in the directory given (the page cache keeps the hot part in
// memory); outputs in memory. Past max_bytes nothing new is stored: chunks are computed as usual.
// Not thread-safe: one run at a time uses a memo (the sweep's runs are sequential).
//
// A persistent memo (OpenPersistent) keeps its chunks in a directory across invocations: `kv`
// (the KV bytes, appended) and `index` (a record per chunk and per output, each with its length
// and checksum), locked by one process at a time (`lock`). A chunk's KV bytes are on disk
// (fdatasync) before its record is, so a crash leaves at most a torn last record, which the next
// open drops. Each chunk's KV bytes carry a checksum, checked on its first restore in a process
// (a mismatch is a one-line DataLoss error naming the directory). What decides whether a stored
// chunk is valid in a later invocation (the binary, the model file, the host) is the caller's
// partition (MemoRunner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/core/status.h"
#include "lib/runner/model_runner.h"

namespace vtoken::engine {

struct PrefillMemoStats {
  int64_t chunks_restored = 0;  // served from the memo
  int64_t tokens_restored = 0;
  int64_t chunks_computed = 0;  // eligible chunks the model computed (then stored when room)
  int64_t tokens_computed = 0;
  int64_t kv_mismatches = 0;  // recomputed chunks whose K/V differ from the stored bytes
  int64_t bytes_stored = 0;   // KV bytes in the file
  // A persistent memo: the chunks and KV bytes it held when opened (from earlier invocations).
  int64_t chunks_loaded = 0;
  int64_t bytes_loaded = 0;
};

class PrefillMemo {
 public:
  // Creates the memo's file in `dir` (created if missing; unlinked at once, so nothing remains
  // after the process). NotFound when the directory cannot be made or written.
  static StatusOr<std::unique_ptr<PrefillMemo>> Create(const std::string& dir, int64_t max_bytes);
  // Opens (creating it if missing) the persistent memo in `dir`, with what earlier invocations
  // stored; it keeps at most `max_bytes` of KV in all. A damaged tail of its index (a crash while
  // writing) is dropped with a note on stderr. FailedPrecondition when another process holds it;
  // NotFound when it cannot be made or read; DataLoss when its files are not a memo's.
  static StatusOr<std::unique_ptr<PrefillMemo>> OpenPersistent(const std::string& dir,
                                                               int64_t max_bytes);
  ~PrefillMemo();
  PrefillMemo(const PrefillMemo&) = delete;
  PrefillMemo& operator=(const PrefillMemo&) = delete;

  const PrefillMemoStats& stats() const { return stats_; }
  int64_t max_bytes() const { return max_bytes_; }
  bool persistent() const { return index_fd_ >= 0; }
  const std::string& dir() const { return dir_; }

  // A checksum of the contents of the files at `paths`, in order (for a persistent memo's
  // partition: the binary, the model's files). NotFound naming a file that cannot be read.
  static StatusOr<uint64_t> HashFiles(const std::vector<std::string>& paths);

 private:
  friend class MemoRunner;
  struct Output {
    bool sample = false;
    int32_t score_token = -1;
    bool signals = false;     // computed with both signals
    int32_t obs_window = 0;   // their window, when `signals`
    model::RunnerOutput out;  // as computed, both signals full length when `signals`
  };
  struct Entry {
    std::string partition;
    int64_t parent = -1;  // the chunk before, -1: the chunk starts at position 0
    std::vector<int32_t> tokens;
    int64_t kv_offset = 0;  // in the file
    int64_t kv_bytes = 0;
    std::vector<Output> outputs;
    uint64_t kv_hash = 0;  // XXH3 of the KV bytes
    bool verified = true;  // false: loaded from disk, its KV bytes not yet checked
  };
  PrefillMemo(int fd, int64_t max_bytes, std::string dir)
      : fd_(fd), max_bytes_(max_bytes), dir_(std::move(dir)) {}
  // A persistent memo: reads the index, drops a damaged tail, truncates both files to the
  // records kept.
  Status Load();
  // Appends one index record (persistent memos); false when the write failed (reported once,
  // then nothing more is stored).
  bool AppendRecord(const std::string& payload);
  // Adds an output to entry `id` (and its record, when persistent).
  void AddOutput(int64_t id, Output output);
  // The entry for (partition, parent, tokens), or -1.
  int64_t Find(const std::string& partition, int64_t parent,
               const std::vector<int32_t>& tokens) const;
  // Stores an entry with its KV bytes; -1 when the memo is full or the write failed (reported once
  // on stderr, the memo then stores nothing more).
  int64_t Add(const std::string& partition, int64_t parent, std::vector<int32_t> tokens,
              const std::vector<std::byte>& kv);
  // A read-only view of an entry's KV bytes in the file (mapped; unmapped with the view).
  class KvView {
   public:
    KvView(void* base, size_t length, size_t skip, size_t size)
        : base_(base), length_(length), bytes_(static_cast<std::byte*>(base) + skip, size) {}
    KvView(KvView&& o) noexcept : base_(o.base_), length_(o.length_), bytes_(o.bytes_) {
      o.base_ = nullptr;
    }
    KvView(const KvView&) = delete;
    KvView& operator=(const KvView&) = delete;
    KvView& operator=(KvView&&) = delete;
    ~KvView();
    std::span<const std::byte> bytes() const { return bytes_; }

   private:
    void* base_;
    size_t length_;
    std::span<const std::byte> bytes_;
  };
  // The entry's KV bytes, mapped; checked against its checksum the first time (loaded entries).
  StatusOr<KvView> MapKv(Entry& e) const;

  int fd_;
  int64_t max_bytes_;
  std::string dir_;
  int index_fd_ = -1;  // persistent memos: the index file, and the lock held
  int lock_fd_ = -1;
  int64_t index_bytes_ = 0;
  bool full_ = false;
  std::vector<Entry> entries_;
  std::unordered_multimap<uint64_t, int64_t> index_;  // key hash -> entry
  PrefillMemoStats stats_;
};

// The runner a run uses with a memo: forwards to `inner`, serving the prefill chunks the memo
// holds and storing the ones it computes. `partition` names everything besides a chunk's input
// that decides what the model computes (the model, its weights' seed, dtype, device, KV-group
// granularity, threads): entries serve only their own partition.
class MemoRunner final : public model::ForwardingRunner {
 public:
  MemoRunner(model::ModelRunner& inner, PrefillMemo& memo, std::string partition)
      : ForwardingRunner(inner), memo_(memo), partition_(std::move(partition)) {}

  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override;
  void ForgetRequest(int64_t request) override;

 private:
  // Where a request's prefill stands in the memo: the entry of its last chunk (-1: none yet) and
  // the position its next chunk must start at; -1: the request left the memo's path.
  struct Track {
    int64_t entry = -1;
    int64_t next = -1;
  };
  // Whether `in` may be served or stored, with the entry of its predecessor in *parent.
  bool Eligible(const model::RunnerInput& in, int64_t* parent);
  // The output stored for `in` (signals reduced to the ones asked), or nullopt.
  std::optional<model::RunnerOutput> StoredOutput(const PrefillMemo::Entry& e,
                                                  const model::RunnerInput& in) const;

  PrefillMemo& memo_;
  std::string partition_;
  std::unordered_map<int64_t, Track> track_;
};

}  // namespace vtoken::engine
