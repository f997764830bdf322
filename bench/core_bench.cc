// Google Benchmark suite for lib/core. Figures and commands: docs/PERFORMANCE.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "lib/core/check_harness.h"
#include "lib/core/copy_engine.h"
#include "lib/core/host_kv_store.h"
#include "lib/core/reclaim_planner.h"
#include "lib/core/virtual_kv_cache.h"

namespace vtoken {
namespace {

// EvictToken on a sequence of N tokens (1K .. 1M: the cost must not grow with N); each iteration
// evicts one token, refilling the sequence (outside the timed region) when every token is dead.
void BM_EvictToken(benchmark::State& state) {
  const int64_t n = state.range(0);
  VirtualKvCache cache(
      {.mode = Mode::kNaive,
       .pool = {.num_blocks = static_cast<int32_t>(n / 16 + 1), .block_size = 16}});
  SeqId seq = cache.AddSequence();
  (void)cache.SyncNewTokens(seq, n);
  TokenId next = 0;
  for (auto _ : state) {
    if (next == n) {
      state.PauseTiming();
      (void)cache.FreeSequence(seq);
      seq = cache.AddSequence();
      (void)cache.SyncNewTokens(seq, n);
      next = 0;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(cache.EvictToken(seq, next));
    next += 1;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EvictToken)->RangeMultiplier(32)->Range(1 << 10, 1 << 20);

// SyncNewTokens(seq, 1) for decode: one token appended per call.
void BM_SyncNewTokensDecode(benchmark::State& state) {
  VirtualKvCache cache({.mode = Mode::kNaive, .pool = {.num_blocks = 1 << 16, .block_size = 16}});
  SeqId seq = cache.AddSequence();
  int64_t appended = 0;
  for (auto _ : state) {
    if (appended == (int64_t{1} << 20)) {
      state.PauseTiming();
      (void)cache.FreeSequence(seq);
      seq = cache.AddSequence();
      appended = 0;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(cache.SyncNewTokens(seq, 1));
    ++appended;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SyncNewTokensDecode);

// Live-slot lists for a batch of 32 sequences of 2K tokens with half the tokens evicted.
void BM_LiveSlotsBatch(benchmark::State& state) {
  VirtualKvCache cache({.mode = Mode::kNaive, .pool = {.num_blocks = 8192, .block_size = 16}});
  std::vector<SeqId> seqs;
  for (int i = 0; i < 32; ++i) {
    SeqId s = cache.AddSequence();
    (void)cache.SyncNewTokens(s, 2048);
    for (TokenId t = 1; t < 2048; t += 2) (void)cache.EvictToken(s, t);
    seqs.push_back(s);
  }
  for (auto _ : state) {
    for (SeqId s : seqs) benchmark::DoNotOptimize(cache.LiveSlots(s));
  }
  state.SetItemsProcessed(state.iterations() * 32 * 1024);
}
BENCHMARK(BM_LiveSlotsBatch);

// AppendLive (the engine's context listing, one token table per KV group) of a 4,096-token table
// keeping range(0)% of its tokens, evicted at random (seed 1), then one token appended (the next
// step's): what every step does per group.
void BM_AppendLive(benchmark::State& state) {
  VirtualKvCache cache({.mode = Mode::kNaive, .pool = {.num_blocks = 512, .block_size = 16}});
  const SeqId seq = cache.AddSequence();
  (void)cache.SyncNewTokens(seq, 4096);
  std::mt19937_64 rng(1);
  std::vector<TokenId> order(4096);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t evict = static_cast<size_t>(4096 * (100 - state.range(0)) / 100);
  for (size_t i = 0; i < evict; ++i) (void)cache.EvictToken(seq, order[i]);
  (void)cache.SyncNewTokens(seq, 1);
  std::vector<SlotIndex> slots;
  std::vector<TokenId> tokens;
  for (auto _ : state) {
    slots.clear();
    tokens.clear();
    cache.table(seq).AppendLive(slots, tokens);
    benchmark::DoNotOptimize(slots.data());
    benchmark::DoNotOptimize(tokens.data());
  }
  state.SetItemsProcessed(state.iterations() * 4097);
  state.counters["live"] = static_cast<double>(slots.size());
}
BENCHMARK(BM_AppendLive)->Arg(25)->Arg(50)->Arg(90);

// One decode step of one token table at steady state, as the engine runs it with H2O at
// evict_interval 1: append the step's token, evict one live token (random, seed 1), list the
// context. The table holds about range(0) live tokens, a quarter of the tokens it has seen; it is
// rebuilt (untimed) every 4,096 steps so that it stays that size.
void BM_DecodeStepTable(benchmark::State& state) {
  const int64_t live_target = state.range(0);
  constexpr int32_t kBs = 16;
  std::mt19937_64 rng(1);
  TokenTable table;
  std::vector<TokenId> live;  // The live ids in any order: victims are drawn from it.
  SlotIndex next_slot = 0;
  auto append = [&] {
    const SlotIndex slot = next_slot++;
    const BlockId block = static_cast<BlockId>(slot / kBs);
    if (!table.holds(block)) table.AddBlock(block);
    live.push_back(table.num_tokens());
    table.Append(slot, block);
  };
  auto evict_one = [&] {
    const size_t k = rng() % live.size();
    const TokenId t = live[k];
    live[k] = live.back();
    live.pop_back();
    const BlockId block = static_cast<BlockId>(table.entry(t).slot / kBs);
    if (table.MarkDead(t, block) == 0 && block != table.num_tokens() / kBs)
      table.RemoveBlock(block);
  };
  auto rebuild = [&] {
    table = TokenTable();
    live.clear();
    next_slot = 0;
    for (int64_t i = 0; i < 4 * live_target; ++i) append();
    while (static_cast<int64_t>(live.size()) > live_target) evict_one();
  };
  rebuild();
  std::vector<SlotIndex> slots;
  std::vector<TokenId> tokens;
  int64_t steps = 0;
  for (auto _ : state) {
    if (++steps % 4096 == 0) {
      state.PauseTiming();
      rebuild();
      state.ResumeTiming();
    }
    append();
    evict_one();
    slots.clear();
    tokens.clear();
    table.AppendLive(slots, tokens);
    benchmark::DoNotOptimize(slots.data());
    benchmark::DoNotOptimize(tokens.data());
  }
  state.counters["live"] = static_cast<double>(table.num_live());
}
BENCHMARK(BM_DecodeStepTable)->Arg(256)->Arg(1024)->Arg(4096);

// Plan() on a snapshot of a fully allocated pool of N blocks, 64 sequences, random utilization.
void BM_Plan(benchmark::State& state) {
  const int32_t num_blocks = static_cast<int32_t>(state.range(0));
  CacheSnapshot snap;
  snap.version = 1;
  snap.block_size = 16;
  snap.num_blocks = num_blocks;
  snap.num_free_blocks = num_blocks / 20;
  uint64_t rng = 42;
  const int32_t per_seq = (num_blocks - snap.num_free_blocks) / 64;
  BlockId next = 0;
  for (SeqId s = 0; s < 64; ++s) {
    SeqSnapshot seq{.seq = s, .num_live = 0, .blocks = {}};
    for (int32_t i = 0; i < per_seq; ++i) {
      const int32_t live = 1 + static_cast<int32_t>(SplitMix64(rng) % 16);
      seq.blocks.push_back({.block = next++,
                            .live = live,
                            .refcount = 1,
                            .is_tail = i == per_seq - 1,
                            .busy = false});
      seq.num_live += live;
      snap.live_slots += live;
    }
    snap.allocated_blocks += per_seq;
    snap.seqs.push_back(std::move(seq));
  }
  ReclaimPlanner planner(
      {.trigger = ReclaimOptions::Trigger::kAlways, .max_moves_per_step = int64_t{1} << 40});
  int64_t moves = 0;
  for (auto _ : state) {
    ReclaimPlan plan = planner.Plan(snap);
    moves = plan.num_moves;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["moves"] = static_cast<double>(moves);
}
BENCHMARK(BM_Plan)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMicrosecond);

// KV groups (cache.granularity): EvictToken(seq, group, token) with G groups (1: token
// granularity, 256: Llama-3.1-8B per head, 32 layers x 8 KV heads) on a sequence of 64K tokens;
// each iteration evicts one (token, group) entry, group by group as the engine evicts a step's
// victims (Arg 1 = 1: cycling over the groups instead, the cache-hostile order).
void BM_EvictTokenGroups(benchmark::State& state) {
  const int32_t groups = static_cast<int32_t>(state.range(0));
  const int64_t n = 1 << 16;
  const int32_t blocks = static_cast<int32_t>(n / 16 * groups + groups);
  VirtualKvCache cache({.mode = Mode::kNaive,
                        .pool = {.num_blocks = blocks, .block_size = 16},
                        .num_groups = groups});
  SeqId seq = cache.AddSequence();
  (void)cache.SyncNewTokens(seq, n);
  int64_t next = 0;
  for (auto _ : state) {
    if (next == n * groups) {
      state.PauseTiming();
      (void)cache.FreeSequence(seq);
      seq = cache.AddSequence();
      (void)cache.SyncNewTokens(seq, n);
      next = 0;
      state.ResumeTiming();
    }
    const bool cycle = state.range(1) != 0;
    const int64_t group = cycle ? next % groups : next / n,
                  token = cycle ? next / groups : next % n;
    benchmark::DoNotOptimize(cache.EvictToken(seq, static_cast<int32_t>(group), token));
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EvictTokenGroups)->Args({1, 0})->Args({256, 0})->Args({256, 1});

// One planning step from a real cache as the reclaimer runs it, PlanReclaim() (second argument
// 0; 1: Snapshot() alone, 2: Plan() alone on a snapshot taken once, 3: Plan(Snapshot()), the
// same plan through a snapshot) over 100K blocks (plus the reserve) of
// G groups (1 or 256), 16 sequences with every group's tokens 3/4 evicted (random per group,
// seed 7), trigger always. Also reports the token tables' memory per KV byte they describe, with
// 512 KV bytes per (token, head) slot (bf16 K and V of one 128-wide head; x G at token level).
void BM_SnapshotAndPlanGroups(benchmark::State& state) {
  const int32_t groups = static_cast<int32_t>(state.range(0));
  const int32_t seqs = 16;
  const int32_t blocks = 100000;
  const int64_t tokens = int64_t{blocks} * 16 / (int64_t{seqs} * groups);
  VirtualKvCache cache({.mode = Mode::kVtoken,
                        .pool = {.num_blocks = blocks + 4096, .block_size = 16},
                        .num_groups = groups});
  uint64_t rng = 7;
  for (int32_t i = 0; i < seqs; ++i) {
    const SeqId seq = cache.AddSequence();
    cache.ReserveTokens(seq, tokens);  // As the engine does at admission.
    (void)cache.SyncNewTokens(seq, tokens);
    for (int32_t g = 0; g < groups; ++g) {
      for (TokenId t = 0; t < tokens; ++t) {
        if (SplitMix64(rng) % 4 != 0) (void)cache.EvictToken(seq, g, t);
      }
    }
  }
  ReclaimPlanner planner({.trigger = ReclaimOptions::Trigger::kAlways, .max_moves_per_step = 4096});
  int64_t moves = 0;
  const int part = static_cast<int>(state.range(1));
  const CacheSnapshot taken = cache.Snapshot();
  for (auto _ : state) {
    if (part == 1) {
      benchmark::DoNotOptimize(cache.Snapshot());
      continue;
    }
    ReclaimPlan plan = part == 0   ? cache.PlanReclaim(planner)
                       : part == 2 ? planner.Plan(taken)
                                   : planner.Plan(cache.Snapshot());
    moves = plan.num_moves;
    benchmark::DoNotOptimize(plan);
  }
  state.counters["moves"] = static_cast<double>(moves);
  state.counters["held_blocks"] = static_cast<double>(cache.Stats().held_blocks);
  const double kv_bytes = static_cast<double>(seqs) * static_cast<double>(tokens) * 512.0 * 256;
  state.counters["table_per_kv_byte"] = static_cast<double>(cache.TableMemoryBytes()) / kv_bytes;
}
BENCHMARK(BM_SnapshotAndPlanGroups)
    ->ArgsProduct({{1, 256}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

// Host relocation of 16-token blocks at 4 KiB per token per layer: every live token of half-full
// blocks moves into dense blocks. Reported as bytes/s; compare with BM_Memcpy of the same bytes.
constexpr int64_t kBytesPerToken = 4096;
constexpr int32_t kLayers = 4;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kSrcBlocks = 64;

void BM_Relocate(benchmark::State& state) {
  const int64_t slots = int64_t{kSrcBlocks} * 2 * kBlockSize;
  HostKvStore store(kLayers, slots, kBytesPerToken);
  SyncHostCopyEngine engine(store);
  // Sources: the first half of each of 64 blocks; destinations: 32 dense blocks after them.
  std::vector<SlotCopy> copies;
  SlotIndex dst = int64_t{kSrcBlocks} * kBlockSize;
  for (int32_t b = 0; b < kSrcBlocks; ++b) {
    for (int32_t o = 0; o < kBlockSize / 2; ++o) copies.push_back({b * kBlockSize + o, dst++});
  }
  for (auto _ : state) engine.Wait(engine.Submit(copies));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(copies.size()) * kLayers *
                          kBytesPerToken);
}
BENCHMARK(BM_Relocate)->Unit(benchmark::kMicrosecond);

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = size_t{kSrcBlocks} * kBlockSize / 2 * kLayers * kBytesPerToken;
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMicrosecond);

// The relocation-to-memcpy ratio measured in one run: every iteration times one relocation of
// the BM_Relocate copies and one plain memcpy of the same number of bytes, alternating, so both
// see the same machine state. `relocate_vs_memcpy` = memcpy time / relocation time (1.0 = the
// relocation runs at memcpy bandwidth).
void BM_RelocateVsMemcpy(benchmark::State& state) {
  const int64_t slots = int64_t{kSrcBlocks} * 2 * kBlockSize;
  HostKvStore store(kLayers, slots, kBytesPerToken);
  std::vector<SlotCopy> copies;
  SlotIndex dst = int64_t{kSrcBlocks} * kBlockSize;
  for (int32_t b = 0; b < kSrcBlocks; ++b) {
    for (int32_t o = 0; o < kBlockSize / 2; ++o) copies.push_back({b * kBlockSize + o, dst++});
  }
  const size_t bytes = copies.size() * kLayers * kBytesPerToken;
  std::vector<std::byte> src_buf(bytes, std::byte{1}), dst_buf(bytes);
  double relocate_s = 0, memcpy_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    store.CopySlots(copies);
    benchmark::ClobberMemory();
    auto t1 = std::chrono::steady_clock::now();
    std::memcpy(dst_buf.data(), src_buf.data(), bytes);
    benchmark::ClobberMemory();
    auto t2 = std::chrono::steady_clock::now();
    relocate_s += std::chrono::duration<double>(t1 - t0).count();
    memcpy_s += std::chrono::duration<double>(t2 - t1).count();
  }
  state.counters["relocate_GBps"] =
      static_cast<double>(bytes) * state.iterations() / relocate_s / 1e9;
  state.counters["memcpy_GBps"] = static_cast<double>(bytes) * state.iterations() / memcpy_s / 1e9;
  state.counters["relocate_vs_memcpy"] = memcpy_s / relocate_s;
}
BENCHMARK(BM_RelocateVsMemcpy)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vtoken

BENCHMARK_MAIN();
