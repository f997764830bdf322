#include "lib/engine/prefill_memo.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

namespace vtoken::engine {
namespace {

uint64_t KeyHash(const std::string& partition, int64_t parent, const std::vector<int32_t>& tokens) {
  const uint64_t seed =
      XXH3_64bits_withSeed(partition.data(), partition.size(), static_cast<uint64_t>(parent));
  return XXH3_64bits_withSeed(tokens.data(), tokens.size() * sizeof(int32_t), seed);
}

bool IsGreedy(double temperature) { return temperature <= 0.0; }

}  // namespace

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
  return std::unique_ptr<PrefillMemo>(new PrefillMemo(fd, max_bytes));
}

PrefillMemo::~PrefillMemo() { close(fd_); }

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
  for (int64_t done = 0; done < size;) {
    const ssize_t n = pwrite(fd_, kv.data() + done, static_cast<size_t>(size - done),
                             static_cast<off_t>(offset + done));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      full_ = true;
      std::fprintf(stderr,
                   "vtoken: prefill memo: writing its file failed (%s): later prompts are "
                   "computed as usual\n",
                   n < 0 ? std::strerror(errno) : "no space");
      return -1;
    }
    done += n;
  }
  stats_.bytes_stored += size;
  const int64_t id = static_cast<int64_t>(entries_.size());
  index_.emplace(KeyHash(partition, parent, tokens), id);
  entries_.push_back(Entry{.partition = partition,
                           .parent = parent,
                           .tokens = std::move(tokens),
                           .kv_offset = offset,
                           .kv_bytes = size,
                           .outputs = {}});
  return id;
}

PrefillMemo::KvView::~KvView() {
  if (base_ != nullptr) munmap(base_, length_);
}

StatusOr<PrefillMemo::KvView> PrefillMemo::MapKv(const Entry& e) const {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t start = e.kv_offset / page * page;
  const size_t length = static_cast<size_t>(e.kv_offset + e.kv_bytes - start);
  void* base = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(start));
  if (base == MAP_FAILED) {
    return DataLossError(std::string("prefill memo: mapping its file failed: ") +
                         std::strerror(errno));
  }
  return KvView(base, length, static_cast<size_t>(e.kv_offset - start),
                static_cast<size_t>(e.kv_bytes));
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
    const PrefillMemo::Entry& e = memo_.entries_[id];
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
    PrefillMemo::Entry& e = memo_.entries_[id];
    if (in.sample) {
      e.outputs.push_back({.sample = true,
                           .score_token = in.score_token,
                           .signals = true,
                           .obs_window = in.obs_window,
                           .out = std::move(outs[k])});
    }
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
