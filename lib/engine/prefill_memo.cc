#include "lib/engine/prefill_memo.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string_view>
#include <type_traits>

namespace vtoken::engine {
namespace {

uint64_t KeyHash(const std::string& partition, int64_t parent, const std::vector<int32_t>& tokens) {
  const uint64_t seed =
      XXH3_64bits_withSeed(partition.data(), partition.size(), static_cast<uint64_t>(parent));
  return XXH3_64bits_withSeed(tokens.data(), tokens.size() * sizeof(int32_t), seed);
}

bool IsGreedy(double temperature) { return temperature <= 0.0; }

// A persistent memo's index: the magic, then records of [u32 payload length][u64 XXH3 of the
// payload][payload]; a payload starts with its type.
constexpr std::string_view kIndexMagic = "VTMEMO1\n";
constexpr uint8_t kEntryRecord = 1;
constexpr uint8_t kOutputRecord = 2;
constexpr size_t kRecordHeader = sizeof(uint32_t) + sizeof(uint64_t);

// Little helpers for a record's fields (host byte order: a memo is read on the host that wrote
// it; its partition names the host).
class RecordWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void PutString(const std::string& v) {
    Put<uint64_t>(v.size());
    out_.append(v);
  }
  std::string Framed() const {
    std::string framed;
    const uint32_t length = static_cast<uint32_t>(out_.size());
    const uint64_t hash = XXH3_64bits(out_.data(), out_.size());
    framed.append(reinterpret_cast<const char*>(&length), sizeof(length));
    framed.append(reinterpret_cast<const char*>(&hash), sizeof(hash));
    return framed + out_;
  }

 private:
  std::string out_;
};

class RecordReader {
 public:
  explicit RecordReader(std::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T v{};
    if (in_.size() < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const uint64_t n = Get<uint64_t>();
    if (!ok_ || n > in_.size() / sizeof(T)) {
      ok_ = false;
      return {};
    }
    std::vector<T> v(n);
    std::memcpy(v.data(), in_.data(), n * sizeof(T));
    in_.remove_prefix(n * sizeof(T));
    return v;
  }
  std::string GetString() {
    const uint64_t n = Get<uint64_t>();
    if (!ok_ || n > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string v(in_.substr(0, n));
    in_.remove_prefix(n);
    return v;
  }
  // Every field read and nothing left over.
  bool Done() const { return ok_ && in_.empty(); }
  bool ok() const { return ok_; }

 private:
  std::string_view in_;
  bool ok_ = true;
};

bool WriteAll(int fd, const void* data, int64_t size, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  for (int64_t done = 0; done < size;) {
    const ssize_t n =
        pwrite(fd, p + done, static_cast<size_t>(size - done), static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

int64_t FileSize(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

}  // namespace

StatusOr<uint64_t> PrefillMemo::HashFiles(const std::vector<std::string>& paths) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(size_t{1} << 20);
  for (const std::string& path : paths) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      XXH3_freeState(state);
      return NotFoundError("prefill memo: cannot read " + path + ": " + std::strerror(errno));
    }
    int64_t total = 0;
    for (;;) {
      const ssize_t n = read(fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        close(fd);
        XXH3_freeState(state);
        return NotFoundError("prefill memo: cannot read " + path + ": " + std::strerror(err));
      }
      if (n == 0) break;
      XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(n));
      total += n;
    }
    close(fd);
    XXH3_64bits_update(state, &total, sizeof(total));  // where one file ends
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

StatusOr<std::unique_ptr<PrefillMemo>> PrefillMemo::Create(const std::string& dir,
                                                           int64_t max_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string path = (std::filesystem::path(dir) / "vtoken-prefill-memo-XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return NotFoundError("prefill memo: cannot create a file in " + dir + ": " +
                         std::strerror(errno));
  }
  unlink(path.c_str());  // Gone with the process, however it ends.
  return std::unique_ptr<PrefillMemo>(new PrefillMemo(fd, max_bytes, dir));
}

StatusOr<std::unique_ptr<PrefillMemo>> PrefillMemo::OpenPersistent(const std::string& dir,
                                                                   int64_t max_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path d(dir);
  auto open_file = [&](const char* name) -> StatusOr<int> {
    const std::string path = (d / name).string();
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return NotFoundError("prefill memo: cannot open " + path + ": " + std::strerror(errno));
    }
    return fd;
  };
  VTOKEN_ASSIGN_OR_RETURN(const int lock, open_file("lock"));
  if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
    close(lock);
    return FailedPreconditionError("prefill memo " + dir + " is in use by another process");
  }
  StatusOr<int> kv = open_file("kv");
  if (!kv.ok()) {
    close(lock);
    return kv.status();
  }
  std::unique_ptr<PrefillMemo> memo(new PrefillMemo(*kv, max_bytes, dir));
  memo->lock_fd_ = lock;
  VTOKEN_ASSIGN_OR_RETURN(memo->index_fd_, open_file("index"));
  VTOKEN_RETURN_IF_ERROR(memo->Load());
  return memo;
}

Status PrefillMemo::Load() {
  const std::string index_path = (std::filesystem::path(dir_) / "index").string();
  const int64_t size = FileSize(index_fd_);
  const int64_t kv_size = FileSize(fd_);
  if (size < 0 || kv_size < 0) {
    return NotFoundError("prefill memo: cannot read " + dir_ + ": " + std::strerror(errno));
  }
  std::string index(static_cast<size_t>(size), '\0');
  for (int64_t done = 0; done < size;) {
    const ssize_t n = pread(index_fd_, index.data() + done, static_cast<size_t>(size - done),
                            static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NotFoundError("prefill memo: cannot read " + index_path);
    done += n;
  }
  if (size == 0) {  // New: the magic, and no KV bytes without a record.
    if (!WriteAll(index_fd_, kIndexMagic.data(), static_cast<int64_t>(kIndexMagic.size()), 0) ||
        fdatasync(index_fd_) != 0 || ftruncate(fd_, 0) != 0) {
      return NotFoundError("prefill memo: cannot write " + index_path + ": " +
                           std::strerror(errno));
    }
    index_bytes_ = static_cast<int64_t>(kIndexMagic.size());
    return Status::Ok();
  }
  if (!std::string_view(index).starts_with(kIndexMagic)) {
    return DataLossError(index_path + " is not a vtoken prefill memo's index; remove " + dir_ +
                         " or name another --prefill-memo-cache");
  }
  size_t pos = kIndexMagic.size();
  int64_t kv_end = 0;
  while (pos < index.size()) {
    if (index.size() - pos < kRecordHeader) break;
    uint32_t length = 0;
    uint64_t hash = 0;
    std::memcpy(&length, index.data() + pos, sizeof(length));
    std::memcpy(&hash, index.data() + pos + sizeof(length), sizeof(hash));
    if (index.size() - pos - kRecordHeader < length) break;
    const std::string_view payload(index.data() + pos + kRecordHeader, length);
    if (XXH3_64bits(payload.data(), payload.size()) != hash) break;
    RecordReader r(payload);
    const uint8_t type = r.Get<uint8_t>();
    if (type == kEntryRecord) {
      Entry e;
      e.partition = r.GetString();
      e.parent = r.Get<int64_t>();
      e.tokens = r.GetVector<int32_t>();
      e.kv_offset = r.Get<int64_t>();
      e.kv_bytes = r.Get<int64_t>();
      e.kv_hash = r.Get<uint64_t>();
      e.verified = false;
      const int64_t id = static_cast<int64_t>(entries_.size());
      if (!r.Done() || e.parent < -1 || e.parent >= id || e.kv_offset != kv_end || e.kv_bytes < 0 ||
          e.kv_offset + e.kv_bytes > kv_size) {
        break;
      }
      kv_end += e.kv_bytes;
      index_.emplace(KeyHash(e.partition, e.parent, e.tokens), id);
      entries_.push_back(std::move(e));
    } else if (type == kOutputRecord) {
      const int64_t id = r.Get<int64_t>();
      Output o;
      o.sample = r.Get<uint8_t>() != 0;
      o.score_token = r.Get<int32_t>();
      o.signals = r.Get<uint8_t>() != 0;
      o.obs_window = r.Get<int32_t>();
      o.out.next_token = r.Get<int32_t>();
      o.out.score_logprob = r.Get<double>();
      o.out.attn = r.GetVector<float>();
      o.out.key_norm = r.GetVector<float>();
      if (!r.Done() || id < 0 || id >= static_cast<int64_t>(entries_.size())) break;
      entries_[id].outputs.push_back(std::move(o));
    } else {
      break;
    }
    pos += kRecordHeader + length;
  }
  if (pos < index.size()) {
    std::fprintf(stderr,
                 "vtoken: prefill memo %s: its index is damaged after %zu chunks (a write cut "
                 "short?); the rest is dropped\n",
                 dir_.c_str(), entries_.size());
  }
  // Drop what no kept record names: a damaged tail, and the KV bytes of a chunk whose record was
  // never written.
  if ((pos < index.size() && ftruncate(index_fd_, static_cast<off_t>(pos)) != 0) ||
      (kv_size > kv_end && ftruncate(fd_, kv_end) != 0)) {
    return NotFoundError("prefill memo: cannot write " + dir_ + ": " + std::strerror(errno));
  }
  index_bytes_ = static_cast<int64_t>(pos);
  stats_.bytes_stored = kv_end;
  stats_.chunks_loaded = static_cast<int64_t>(entries_.size());
  stats_.bytes_loaded = kv_end;
  return Status::Ok();
}

bool PrefillMemo::AppendRecord(const std::string& record) {
  if (full_) return false;
  if (!WriteAll(index_fd_, record.data(), static_cast<int64_t>(record.size()), index_bytes_) ||
      fdatasync(index_fd_) != 0) {
    full_ = true;
    std::fprintf(stderr,
                 "vtoken: prefill memo %s: writing its index failed (%s): later prompts are "
                 "computed as usual\n",
                 dir_.c_str(), std::strerror(errno));
    return false;
  }
  index_bytes_ += static_cast<int64_t>(record.size());
  return true;
}

void PrefillMemo::AddOutput(int64_t id, Output output) {
  if (persistent()) {
    RecordWriter w;
    w.Put(kOutputRecord);
    w.Put<int64_t>(id);
    w.Put<uint8_t>(output.sample ? 1 : 0);
    w.Put<int32_t>(output.score_token);
    w.Put<uint8_t>(output.signals ? 1 : 0);
    w.Put<int32_t>(output.obs_window);
    w.Put<int32_t>(output.out.next_token);
    w.Put<double>(output.out.score_logprob);
    w.PutVector(output.out.attn);
    w.PutVector(output.out.key_norm);
    AppendRecord(w.Framed());
  }
  entries_[id].outputs.push_back(std::move(output));
}

PrefillMemo::~PrefillMemo() {
  close(fd_);
  if (index_fd_ >= 0) close(index_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock
}

int64_t PrefillMemo::Find(const std::string& partition, int64_t parent,
                          const std::vector<int32_t>& tokens) const {
  const auto [begin, end] = index_.equal_range(KeyHash(partition, parent, tokens));
  for (auto it = begin; it != end; ++it) {
    const Entry& e = entries_[it->second];
    if (e.parent == parent && e.tokens == tokens && e.partition == partition) return it->second;
  }
  return -1;
}

int64_t PrefillMemo::Add(const std::string& partition, int64_t parent, std::vector<int32_t> tokens,
                         const std::vector<std::byte>& kv) {
  if (full_) return -1;
  const int64_t size = static_cast<int64_t>(kv.size());
  if (stats_.bytes_stored + size > max_bytes_) {
    full_ = true;
    std::fprintf(stderr,
                 "vtoken: prefill memo full (%.1f GiB of KV): later prompts are computed as "
                 "usual\n",
                 static_cast<double>(stats_.bytes_stored) / (1 << 30));
    return -1;
  }
  const int64_t offset = stats_.bytes_stored;
  errno = 0;
  if (!WriteAll(fd_, kv.data(), size, offset) || (persistent() && fdatasync(fd_) != 0)) {
    full_ = true;
    std::fprintf(stderr,
                 "vtoken: prefill memo: writing its file failed (%s): later prompts are "
                 "computed as usual\n",
                 errno != 0 ? std::strerror(errno) : "no space");
    return -1;
  }
  const uint64_t kv_hash = XXH3_64bits(kv.data(), kv.size());
  if (persistent()) {  // The record after its bytes are on disk.
    RecordWriter w;
    w.Put(kEntryRecord);
    w.PutString(partition);
    w.Put<int64_t>(parent);
    w.PutVector(tokens);
    w.Put<int64_t>(offset);
    w.Put<int64_t>(size);
    w.Put<uint64_t>(kv_hash);
    if (!AppendRecord(w.Framed())) return -1;
  }
  stats_.bytes_stored += size;
  const int64_t id = static_cast<int64_t>(entries_.size());
  index_.emplace(KeyHash(partition, parent, tokens), id);
  entries_.push_back(Entry{.partition = partition,
                           .parent = parent,
                           .tokens = std::move(tokens),
                           .kv_offset = offset,
                           .kv_bytes = size,
                           .outputs = {},
                           .kv_hash = kv_hash,
                           .verified = true});
  return id;
}

PrefillMemo::KvView::~KvView() {
  if (base_ != nullptr) munmap(base_, length_);
}

StatusOr<PrefillMemo::KvView> PrefillMemo::MapKv(Entry& e) const {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t start = e.kv_offset / page * page;
  const size_t length = static_cast<size_t>(e.kv_offset + e.kv_bytes - start);
  void* base = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(start));
  if (base == MAP_FAILED) {
    return DataLossError(std::string("prefill memo: mapping its file failed: ") +
                         std::strerror(errno));
  }
  KvView view(base, length, static_cast<size_t>(e.kv_offset - start),
              static_cast<size_t>(e.kv_bytes));
  if (!e.verified) {
    if (XXH3_64bits(view.bytes().data(), view.bytes().size()) != e.kv_hash) {
      return DataLossError("prefill memo " + dir_ +
                           ": a stored chunk's KV bytes do not match their checksum (the file "
                           "was changed or damaged); remove " +
                           dir_ + " or run with --no-prefill-memo");
    }
    e.verified = true;
  }
  return view;
}

bool MemoRunner::Eligible(const model::RunnerInput& in, int64_t* parent) {
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  auto leave = [&] {
    track_.erase(in.request);
    return false;
  };
  // A step that keeps query statistics needs the model's queries, which the memo does not hold.
  if (n == 0 || in.positions.size() != in.tokens.size() || in.prefix_request >= 0 ||
      in.keep_query_moments) {
    return leave();
  }
  const int64_t start = in.positions.front();
  for (int64_t i = 1; i < n; ++i) {
    if (in.positions[i] != start + i) return leave();
  }
  // One new token past position 0 is a decode step (or a prompt's 1-token tail): not kept.
  if (n < 2 && start != 0) return leave();
  if (in.sample && in.score_token < 0 && !IsGreedy(in.sampling.temperature)) return leave();
  if (start == 0) {
    *parent = -1;
  } else {
    const auto it = track_.find(in.request);
    if (it == track_.end() || it->second.next != start || it->second.entry < 0) return leave();
    *parent = it->second.entry;
  }
  const int32_t groups = inner_.num_kv_groups();
  if (!model::ValidContextOffsets(in, groups) ||
      in.write_slots.size() != static_cast<size_t>(groups) * static_cast<size_t>(n)) {
    return leave();
  }
  for (int32_t g = 0; g < groups; ++g) {  // Every earlier token live: nothing evicted yet.
    const auto [begin, end] = model::ContextRange(in, g);
    if (end - begin != start) return leave();
    if (start > 0 &&
        (in.context_positions[begin] != 0 || in.context_positions[end - 1] != start - 1)) {
      return leave();
    }
  }
  return true;
}

std::optional<model::RunnerOutput> MemoRunner::StoredOutput(const PrefillMemo::Entry& e,
                                                            const model::RunnerInput& in) const {
  if (!in.sample && !in.want_signals) return model::RunnerOutput{};
  for (const PrefillMemo::Output& o : e.outputs) {
    if (o.sample != in.sample || o.score_token != in.score_token) continue;
    if (in.want_signals && (!o.signals || o.obs_window != in.obs_window)) continue;
    model::RunnerOutput out;
    out.next_token = o.out.next_token;
    out.score_logprob = o.out.score_logprob;
    if (in.want_signals) {  // Full length, a signal not asked for at zero.
      out.attn = o.out.attn;
      out.key_norm = o.out.key_norm;
      if (!(in.signals & kAttnSignal)) std::fill(out.attn.begin(), out.attn.end(), 0.0f);
      if (!(in.signals & kKeyNormSignal)) {
        std::fill(out.key_norm.begin(), out.key_norm.end(), 0.0f);
      }
    }
    return out;
  }
  return std::nullopt;
}

StatusOr<std::vector<model::RunnerOutput>> MemoRunner::Forward(
    const std::vector<model::RunnerInput>& inputs) {
  enum class Plan { kPass, kStore, kAddOutput };
  std::vector<model::RunnerOutput> results(inputs.size());
  std::vector<Plan> plan(inputs.size(), Plan::kPass);
  std::vector<int64_t> key(inputs.size(), -1);  // kStore: the parent; kAddOutput: the entry
  std::vector<size_t> computed;                 // indices into inputs, in order
  std::vector<std::byte> kv;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const model::RunnerInput& in = inputs[i];
    int64_t parent = -1;
    if (!Eligible(in, &parent)) {
      computed.push_back(i);
      continue;
    }
    const int64_t id = memo_.Find(partition_, parent, in.tokens);
    if (id < 0) {
      plan[i] = Plan::kStore;
      key[i] = parent;
      computed.push_back(i);
      continue;
    }
    PrefillMemo::Entry& e = memo_.entries_[id];
    std::optional<model::RunnerOutput> out = StoredOutput(e, in);
    if (!out) {
      plan[i] = Plan::kAddOutput;
      key[i] = id;
      computed.push_back(i);
      continue;
    }
    VTOKEN_ASSIGN_OR_RETURN(const PrefillMemo::KvView view, memo_.MapKv(e));
    VTOKEN_RETURN_IF_ERROR(inner_.WriteKv(in.write_slots, view.bytes()));
    results[i] = *std::move(out);
    track_[in.request] = {.entry = id,
                          .next = in.positions.front() + static_cast<int64_t>(in.tokens.size())};
    ++memo_.stats_.chunks_restored;
    memo_.stats_.tokens_restored += static_cast<int64_t>(in.tokens.size());
  }
  if (computed.empty()) return results;

  // The rest in one batch, in the step's order; a kept chunk that samples is computed with both
  // signals, so any later request finds its output.
  std::vector<model::RunnerOutput> outs;
  if (computed.size() == inputs.size() &&
      std::all_of(plan.begin(), plan.end(), [](Plan p) { return p == Plan::kPass; })) {
    VTOKEN_ASSIGN_OR_RETURN(outs, inner_.Forward(inputs));
  } else {
    std::vector<model::RunnerInput> batch;
    batch.reserve(computed.size());
    for (size_t i : computed) {
      model::RunnerInput& in = batch.emplace_back(inputs[i]);
      if (plan[i] != Plan::kPass && in.sample) {
        in.want_signals = true;
        in.signals = kAttnSignal | kKeyNormSignal;
      }
    }
    VTOKEN_ASSIGN_OR_RETURN(outs, inner_.Forward(batch));
  }
  for (size_t k = 0; k < computed.size(); ++k) {
    const size_t i = computed[k];
    const model::RunnerInput& in = inputs[i];
    if (plan[i] == Plan::kPass) {
      results[i] = std::move(outs[k]);
      continue;
    }
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    ++memo_.stats_.chunks_computed;
    memo_.stats_.tokens_computed += n;
    kv.clear();
    VTOKEN_RETURN_IF_ERROR(inner_.ReadKv(in.write_slots, kv));
    int64_t id = key[i];
    if (plan[i] == Plan::kStore) {
      id = memo_.Add(partition_, key[i], in.tokens, kv);
    } else {
      VTOKEN_ASSIGN_OR_RETURN(const PrefillMemo::KvView view, memo_.MapKv(memo_.entries_[id]));
      const std::span<const std::byte> stored = view.bytes();
      if (stored.size() != kv.size() || !std::equal(stored.begin(), stored.end(), kv.begin())) {
        ++memo_.stats_.kv_mismatches;
      }
    }
    if (id < 0) {  // Not kept (the memo is full): the output as computed, the path left.
      track_.erase(in.request);
      results[i] = std::move(outs[k]);
      continue;
    }
    if (in.sample) {
      memo_.AddOutput(id, {.sample = true,
                           .score_token = in.score_token,
                           .signals = true,
                           .obs_window = in.obs_window,
                           .out = std::move(outs[k])});
    }
    const PrefillMemo::Entry& e = memo_.entries_[id];
    // What a later run is served, given to this one too: both see the same output.
    std::optional<model::RunnerOutput> out = StoredOutput(e, in);
    if (!out) return InternalError("prefill memo: a stored output does not serve its own input");
    results[i] = *std::move(out);
    track_[in.request] = {.entry = id, .next = in.positions.front() + n};
  }
  return results;
}

void MemoRunner::ForgetRequest(int64_t request) {
  track_.erase(request);
  inner_.ForgetRequest(request);
}

}  // namespace vtoken::engine
