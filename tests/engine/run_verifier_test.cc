// RunVerifier against relocations built by hand and a runner whose per-slot hashes the test sets:
// a move that carried its bytes is a check, one that did not is a violation that names it.
#include "lib/engine/run_verifier.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/engine/fake_runner.h"

namespace vtoken::engine {
namespace {

// A runner whose TokenKvHash is what the test put in `hashes`; `drop_one` returns one hash less.
class HashRunner final : public model::ForwardingRunner {
 public:
  HashRunner() : ForwardingRunner(fake_), fake_(64, false) {}
  uint64_t TokenKvHash(SlotIndex slot) override { return hashes[slot]; }
  std::vector<uint64_t> TokenKvHashes(std::span<const SlotIndex> slots) override {
    std::vector<uint64_t> out = ModelRunner::TokenKvHashes(slots);
    if (drop_one && !out.empty()) out.pop_back();
    return out;
  }
  std::map<SlotIndex, uint64_t> hashes;
  bool drop_one = false;

 private:
  testing::FakeRunner fake_;
};

Relocation Moves(SeqId seq, const std::vector<Move>& moves) {
  Relocation rel;
  rel.seqs.push_back({.seq = seq, .moves = moves});
  return rel;
}

TEST(RunVerifierTest, AMoveThatCarriedItsBytesIsACheck) {
  HashRunner runner;
  EngineResult result;
  RunVerifier verifier(runner, result);
  runner.hashes = {{3, 30}, {4, 40}};
  const Relocation rel =
      Moves(0, {{.token = 5, .src = 3, .dst = 9}, {.token = 6, .src = 4, .dst = 10}});
  verifier.BeforeCopy(rel);
  runner.hashes[9] = 30;
  runner.hashes[10] = 40;
  verifier.AfterCopy(rel);
  EXPECT_EQ(result.hash_checks, 2);
  EXPECT_EQ(result.violations, 0);
  EXPECT_TRUE(result.first_violations.empty());
}

TEST(RunVerifierTest, AMoveThatLostItsBytesIsAViolationThatNamesIt) {
  HashRunner runner;
  EngineResult result;
  RunVerifier verifier(runner, result);
  runner.hashes = {{3, 30}};
  const Relocation rel = Moves(2, {{.token = 5, .src = 3, .dst = 9}});
  verifier.BeforeCopy(rel);
  runner.hashes[9] = 31;
  verifier.AfterCopy(rel);
  EXPECT_EQ(result.hash_checks, 1);
  EXPECT_EQ(result.violations, 1);
  ASSERT_EQ(result.first_violations.size(), 1u);
  EXPECT_EQ(result.first_violations[0], "hash mismatch: token 5 of sequence 2 moved 3 -> 9");
}

TEST(RunVerifierTest, TooFewHashesAreAViolationAndNoCheck) {
  HashRunner runner;
  EngineResult result;
  RunVerifier verifier(runner, result);
  runner.drop_one = true;
  const Relocation rel =
      Moves(0, {{.token = 5, .src = 3, .dst = 9}, {.token = 6, .src = 4, .dst = 10}});
  verifier.BeforeCopy(rel);
  verifier.AfterCopy(rel);
  EXPECT_EQ(result.hash_checks, 0);
  EXPECT_EQ(result.violations, 2);
  ASSERT_EQ(result.first_violations.size(), 2u);
  EXPECT_EQ(result.first_violations[0], "the runner returned 1 KV hashes for 2 slots");
}

TEST(RunVerifierTest, KeepsTheFirstTenDescriptionsAndCountsEveryViolation) {
  HashRunner runner;
  EngineResult result;
  RunVerifier verifier(runner, result);
  for (SlotIndex s = 0; s < 12; ++s) runner.hashes[s] = 100 + static_cast<uint64_t>(s);
  std::vector<Move> moves;
  for (SlotIndex s = 0; s < 12; ++s) moves.push_back({.token = s, .src = s, .dst = 20 + s});
  const Relocation rel = Moves(0, moves);
  verifier.BeforeCopy(rel);  // The destinations keep hashing to 0.
  verifier.AfterCopy(rel);
  EXPECT_EQ(result.hash_checks, 12);
  EXPECT_EQ(result.violations, 12);
  EXPECT_EQ(result.first_violations.size(), RunVerifier::kMaxDescribed);
}

TEST(RunVerifierTest, CountsEveryInvariantCheckOfAConsistentCache) {
  HashRunner runner;
  EngineResult result;
  RunVerifier verifier(runner, result);
  VirtualKvCache cache(CacheOptions{
      .mode = Mode::kVtoken, .pool = {.num_blocks = 8, .block_size = 4, .headroom_blocks = 1}});
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 6).ok());
  verifier.CheckCache(cache);
  verifier.CheckCache(cache);
  EXPECT_EQ(result.invariant_checks, 2);
  EXPECT_EQ(result.violations, 0);
}

}  // namespace
}  // namespace vtoken::engine
