#include "lib/core/check_harness.h"

#include <algorithm>
#include <cstring>

#include "lib/core/eviction_driver.h"

namespace vtoken {

void FillContent(uint64_t content, int32_t layer, std::span<std::byte> out) {
  uint64_t state = content * 0x100000001b3ULL + static_cast<uint64_t>(layer);
  size_t i = 0;
  while (i < out.size()) {
    const uint64_t word = SplitMix64(state);
    const size_t n = std::min(sizeof(word), out.size() - i);
    std::memcpy(out.data() + i, &word, n);
    i += n;
  }
}

Status ValidateCheckOptions(const CheckOptions& o) {
  VTOKEN_RETURN_IF_ERROR(ValidateBlockPoolOptions(o.pool));
  VTOKEN_RETURN_IF_ERROR(ValidateReclaimOptions(o.reclaim));
  if (o.steps < 0) return InvalidArgumentError("steps must be >= 0");
  if (o.num_layers < 1) return InvalidArgumentError("num_layers must be >= 1");
  if (o.bytes_per_token < 1) return InvalidArgumentError("bytes_per_token must be >= 1");
  if (o.max_seqs < 1) return InvalidArgumentError("max_seqs must be >= 1");
  if (o.max_prompt_tokens < 1) return InvalidArgumentError("max_prompt_tokens must be >= 1");
  if (o.copy_delay_us < 0) return InvalidArgumentError("copy_delay_us must be >= 0");
  if (o.num_groups < 1 || o.num_groups > kMaxKvGroups) {
    return InvalidArgumentError("num_groups must be in [1, " + std::to_string(kMaxKvGroups) + "]");
  }
  return Status::Ok();
}

namespace {

std::unique_ptr<CopyEngine> MakeEngine(const CheckOptions& o, HostKvStore& store) {
  if (o.async_copies) return std::make_unique<AsyncHostCopyEngine>(store, o.copy_delay_us);
  return std::make_unique<SyncHostCopyEngine>(store);
}

}  // namespace

CheckHarness::CheckHarness(const CheckOptions& options)
    : options_(options),
      cache_(CacheOptions{
          .mode = options.mode, .pool = options.pool, .num_groups = options.num_groups}),
      store_(options.num_layers, int64_t{options.pool.num_blocks} * options.pool.block_size,
             options.bytes_per_token),
      engine_(MakeEngine(options, store_)),
      reclaimer_(cache_, *engine_, options.reclaim, options.num_layers * options.bytes_per_token) {
  reclaimer_.set_observer(this);
}

CheckHarness::~CheckHarness() { reclaimer_.Drain().IgnoreError(); }

void CheckHarness::Violation(const std::string& message) {
  ++report_.violations;
  if (report_.first_violations.size() < 10) report_.first_violations.push_back(message);
}

SeqId CheckHarness::PickSeq(uint64_t arg) const {
  if (reference_.empty()) return kNoSeq;
  auto it = reference_.begin();
  std::advance(it, static_cast<long>(arg % reference_.size()));
  return it->first;
}

void CheckHarness::Step(uint64_t op_word, uint64_t arg1, uint64_t arg2) {
  ++report_.steps;
  const uint32_t op = static_cast<uint32_t>(op_word % 100);
  const SeqId seq = PickSeq(arg1);
  if (seq == kNoSeq || (op < 5 && static_cast<int32_t>(reference_.size()) < options_.max_seqs)) {
    AddSequence(arg2);
  } else if (op < 8) {
    ForkSequence(arg1, arg2);
  } else if (op < 11) {
    FreeSequence(seq);
  } else if (op < 45) {
    Append(seq, 1 + static_cast<int64_t>(arg2 % 4));
  } else if (op < 75) {
    Evict(seq, arg2);
  } else if (op < 88) {
    Reclaim();
  } else if (op < 93) {
    Status s = reclaimer_.Poll();
    if (!s.ok()) Violation("poll: " + s.ToString());
  } else {
    Read(seq);
  }
  if (options_.verify_every_op) Verify(/*fence_all=*/false);
}

void CheckHarness::AddSequence(uint64_t arg) {
  if (static_cast<int32_t>(reference_.size()) >= options_.max_seqs) return;
  const SeqId seq = cache_.AddSequence();
  reference_[seq].resize(static_cast<size_t>(options_.num_groups));
  evicted_from_[seq] = false;
  Append(seq, 1 + static_cast<int64_t>(arg % options_.max_prompt_tokens));
}

void CheckHarness::ForkSequence(uint64_t arg1, uint64_t arg2) {
  if (static_cast<int32_t>(reference_.size()) >= options_.max_seqs) return;
  const SeqId parent = PickSeq(arg1);
  if (options_.fork_only_fresh && evicted_from_[parent]) return;
  const int64_t n = static_cast<int64_t>(arg2 % (cache_.num_tokens(parent) + 1));
  StatusOr<ForkResult> fork = cache_.ForkSequence(parent, n);
  if (!fork.ok()) {
    if (fork.status().code() != StatusCode::kResourceExhausted) {
      Violation("fork: " + fork.status().ToString());
    }
    return;
  }
  ++report_.forks;
  if (!fork->copies.empty()) engine_->Wait(engine_->Submit(fork->copies));
  auto& ref = reference_[fork->child];
  ref.resize(static_cast<size_t>(options_.num_groups));
  for (int32_t g = 0; g < options_.num_groups; ++g) {
    for (const auto& [token, content] : reference_[parent][g]) {
      if (token < n) ref[g][token] = content;
    }
  }
  evicted_from_[fork->child] = evicted_from_[parent];
}

void CheckHarness::FreeSequence(SeqId seq) {
  Status s = cache_.FreeSequence(seq);
  if (!s.ok()) Violation("free: " + s.ToString());
  reference_.erase(seq);
  evicted_from_.erase(seq);
  if (driver_ != nullptr) driver_->ForgetSequence(seq);
}

void CheckHarness::Append(SeqId seq, int64_t n) {
  const TokenId first = cache_.num_tokens(seq);
  StatusOr<std::vector<SlotIndex>> slots = cache_.SyncNewTokens(seq, n);
  if (!slots.ok()) {
    if (slots.status().code() != StatusCode::kResourceExhausted) {
      Violation("append: " + slots.status().ToString());
    }
    // Out of blocks: preempt the sequence, as an engine would.
    ++report_.pool_exhausted;
    FreeSequence(seq);
    return;
  }
  auto& ref = reference_[seq];
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t content = next_content_++;
    for (int32_t g = 0; g < options_.num_groups; ++g) {
      for (int32_t layer = 0; layer < options_.num_layers; ++layer) {
        FillContent(content, g * options_.num_layers + layer,
                    store_.Token(layer, (*slots)[g * n + i]));
      }
      ref[g][first + i] = content;
    }
  }
  report_.appended_tokens += n;
}

void CheckHarness::Evict(SeqId seq, uint64_t arg) {
  if (cache_.mode() == Mode::kNative) return;
  auto& ref = reference_[seq];
  std::vector<std::vector<TokenId>> victims(static_cast<size_t>(options_.num_groups));
  if (driver_ != nullptr) {
    victims = driver_->ChooseVictims(cache_, seq, arg);
  } else {
    uint64_t state = arg;
    // One group draws no group (the token-granularity sequence of draws stays as it was).
    const int32_t g = options_.num_groups == 1
                          ? 0
                          : static_cast<int32_t>(SplitMix64(state) % options_.num_groups);
    const int64_t count = 1 + static_cast<int64_t>(SplitMix64(state) % 6);
    for (int64_t i = 0; i < count && i < static_cast<int64_t>(ref[g].size()); ++i) {
      auto it = ref[g].begin();
      std::advance(it, static_cast<long>(SplitMix64(state) % ref[g].size()));
      victims[g].push_back(it->first);
      // Erase now so the same token is not drawn twice; re-checked against the cache below.
      ref[g].erase(it);
    }
  }
  bool any = false;
  for (int32_t g = 0; g < static_cast<int32_t>(victims.size()); ++g) {
    for (TokenId t : victims[g]) {
      Status s = cache_.EvictToken(seq, g, t);
      if (!s.ok()) Violation("evict: " + s.ToString());
      ref[g].erase(t);
      ++report_.evictions;
      any = true;
    }
  }
  if (any) evicted_from_[seq] = true;
}

void CheckHarness::Reclaim() {
  if (cache_.mode() != Mode::kVtoken) return;
  StatusOr<int64_t> moved = reclaimer_.Step();
  if (!moved.ok()) Violation("reclaim: " + moved.status().ToString());
}

void CheckHarness::ReclaimFully() {
  if (cache_.mode() != Mode::kVtoken) return;
  while (true) {
    StatusOr<int64_t> moved = reclaimer_.Step();
    if (!moved.ok()) Violation("reclaim: " + moved.status().ToString());
    Status s = reclaimer_.Drain();
    if (!s.ok()) Violation("drain: " + s.ToString());
    if (!moved.ok() || *moved == 0) break;
  }
}

void CheckHarness::Read(SeqId seq) {
  StatusOr<bool> waited = reclaimer_.FenceForRead(seq);
  if (!waited.ok()) {
    Violation("fence: " + waited.status().ToString());
    return;
  }
  VerifySeq(seq, /*require_no_pending=*/true);
}

void CheckHarness::VerifySeq(SeqId seq, bool require_no_pending) {
  const std::string name = "sequence " + std::to_string(seq);
  std::vector<std::byte> expected(options_.bytes_per_token);
  for (int32_t g = 0; g < options_.num_groups; ++g) {
    const auto& ref = reference_.at(seq)[g];
    const TokenTable& table = cache_.table(seq, g);
    const std::string where = options_.num_groups > 1 ? name + " group " + std::to_string(g) : name;
    if (table.num_live() != static_cast<int64_t>(ref.size())) {
      Violation(where + " has " + std::to_string(table.num_live()) +
                " live tokens, reference has " + std::to_string(ref.size()));
      return;
    }
    for (const auto& [token, content] : ref) {
      const TokenTable::Entry& e = table.entry(token);
      if (!e.live) {
        Violation("token " + std::to_string(token) + " of " + where +
                  " is dead but the reference holds it");
        continue;
      }
      if (cache_.IsSlotPending(e.slot)) {
        if (require_no_pending) {
          Violation("read-after-copy: slot " + std::to_string(e.slot) + " read while pending");
        }
        continue;
      }
      for (int32_t layer = 0; layer < options_.num_layers; ++layer) {
        FillContent(content, g * options_.num_layers + layer, expected);
        std::span<const std::byte> got = store_.Token(layer, e.slot);
        if (std::memcmp(got.data(), expected.data(), expected.size()) != 0) {
          Violation("token " + std::to_string(token) + " of " + where +
                    " holds wrong bytes in row " + std::to_string(layer) + " at slot " +
                    std::to_string(e.slot));
          break;
        }
      }
      ++report_.tokens_verified;
    }
  }
}

void CheckHarness::Verify(bool fence_all) {
  ++report_.invariant_checks;
  Status s = cache_.CheckInvariants();
  if (!s.ok()) Violation("invariant: " + s.ToString());
  for (const auto& [seq, ref] : reference_) {
    if (fence_all) {
      StatusOr<bool> waited = reclaimer_.FenceForRead(seq);
      if (!waited.ok()) Violation("fence: " + waited.status().ToString());
    }
    VerifySeq(seq, fence_all);
  }
}

void CheckHarness::BeforeCopy(const Relocation& relocation) {
  for (const SeqRelocation& s : relocation.seqs) {
    for (const Move& m : s.moves) hashes_before_[m.dst] = TokenKvHash(store_, m.src);
  }
}

void CheckHarness::AfterCopy(const Relocation& relocation) {
  for (const SeqRelocation& s : relocation.seqs) {
    for (const Move& m : s.moves) {
      auto it = hashes_before_.find(m.dst);
      const uint64_t after = TokenKvHash(store_, m.dst);
      ++report_.hash_checks;
      if (it == hashes_before_.end() || it->second != after) {
        Violation("hash mismatch: token " + std::to_string(m.token) + " of sequence " +
                  std::to_string(s.seq) + " moved " + std::to_string(m.src) + " -> " +
                  std::to_string(m.dst));
      }
      if (it != hashes_before_.end()) hashes_before_.erase(it);
    }
  }
}

void CheckHarness::Finish() {
  Verify(/*fence_all=*/true);
  Status s = reclaimer_.Drain();
  if (!s.ok()) Violation("drain: " + s.ToString());
  while (!reference_.empty()) FreeSequence(reference_.begin()->first);
  s = cache_.CheckInvariants();
  if (!s.ok()) Violation("invariant after finish: " + s.ToString());
  if (cache_.pool().num_free_blocks() != cache_.pool().num_blocks()) {
    Violation("blocks leaked: " +
              std::to_string(cache_.pool().num_blocks() - cache_.pool().num_free_blocks()) +
              " not free after every sequence was freed");
  }
}

const CheckReport& CheckHarness::report() {
  const ReclaimStats& rs = reclaimer_.stats();
  report_.relocations = rs.plans;
  report_.tokens_moved = rs.moves;
  report_.blocks_reclaimed = rs.blocks_freed;
  report_.fence_waits = rs.fence_waits;
  return report_;
}

StatusOr<CheckReport> RunCheck(const CheckOptions& options, EvictionDriver* driver) {
  VTOKEN_RETURN_IF_ERROR(ValidateCheckOptions(options));
  CheckHarness harness(options);
  harness.set_eviction_driver(driver);
  uint64_t state = options.seed;
  for (int64_t i = 0; i < options.steps; ++i) {
    const uint64_t a = SplitMix64(state);
    const uint64_t b = SplitMix64(state);
    const uint64_t c = SplitMix64(state);
    harness.Step(a, b, c);
  }
  harness.Finish();
  return harness.report();
}

}  // namespace vtoken
