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
  FakeRunner fake_;
};

class RunVerifierTest : public ::testing::Test {
 protected:
  HashRunner runner_;
  EngineResult result_;
  RunVerifier verifier_{runner_, result_};

  // Runs `rel` through the verifier as the reclaimer would, the copy leaving `copied` in the
  // runner's slots.
  void Relocate(const Relocation& rel, const std::map<SlotIndex, uint64_t>& copied) {
    verifier_.BeforeCopy(rel);
    for (const auto& [slot, hash] : copied) runner_.hashes[slot] = hash;
    verifier_.AfterCopy(rel);
  }
};

Relocation Moves(SeqId seq, const std::vector<Move>& moves) {
  Relocation rel;
  rel.seqs.push_back({.seq = seq, .moves = moves});
  return rel;
}

TEST_F(RunVerifierTest, AMoveThatCarriedItsBytesIsACheck) {
  runner_.hashes = {{3, 30}, {4, 40}};
  const Relocation rel =
      Moves(0, {{.token = 5, .src = 3, .dst = 9}, {.token = 6, .src = 4, .dst = 10}});
  Relocate(rel, {{9, 30}, {10, 40}});
  EXPECT_EQ(result_.hash_checks, 2);
  EXPECT_EQ(result_.violations, 0);
  EXPECT_TRUE(result_.first_violations.empty());
}

TEST_F(RunVerifierTest, AMoveThatLostItsBytesIsAViolationThatNamesIt) {
  runner_.hashes = {{3, 30}};
  const Relocation rel = Moves(2, {{.token = 5, .src = 3, .dst = 9}});
  Relocate(rel, {{9, 31}});
  EXPECT_EQ(result_.hash_checks, 1);
  EXPECT_EQ(result_.violations, 1);
  ASSERT_EQ(result_.first_violations.size(), 1u);
  EXPECT_EQ(result_.first_violations[0], "hash mismatch: token 5 of sequence 2 moved 3 -> 9");
}

TEST_F(RunVerifierTest, TooFewHashesAreAViolationAndNoCheck) {
  runner_.drop_one = true;
  const Relocation rel =
      Moves(0, {{.token = 5, .src = 3, .dst = 9}, {.token = 6, .src = 4, .dst = 10}});
  Relocate(rel, {});
  EXPECT_EQ(result_.hash_checks, 0);
  EXPECT_EQ(result_.violations, 2);
  ASSERT_EQ(result_.first_violations.size(), 2u);
  EXPECT_EQ(result_.first_violations[0], "the runner returned 1 KV hashes for 2 slots");
}

TEST_F(RunVerifierTest, KeepsTheFirstTenDescriptionsAndCountsEveryViolation) {
  for (SlotIndex s = 0; s < 12; ++s) runner_.hashes[s] = 100 + static_cast<uint64_t>(s);
  std::vector<Move> moves;
  for (SlotIndex s = 0; s < 12; ++s) moves.push_back({.token = s, .src = s, .dst = 20 + s});
  const Relocation rel = Moves(0, moves);
  Relocate(rel, {});  // The destinations keep hashing to 0.
  EXPECT_EQ(result_.hash_checks, 12);
  EXPECT_EQ(result_.violations, 12);
  EXPECT_EQ(result_.first_violations.size(), RunVerifier::kMaxDescribed);
}

TEST_F(RunVerifierTest, CountsEveryInvariantCheckOfAConsistentCache) {
  VirtualKvCache cache(CacheOptions{
      .mode = Mode::kVtoken, .pool = {.num_blocks = 8, .block_size = 4, .headroom_blocks = 1}});
  const SeqId seq = cache.AddSequence();
  ASSERT_TRUE(cache.SyncNewTokens(seq, 6).ok());
  verifier_.CheckCache(cache);
  verifier_.CheckCache(cache);
  EXPECT_EQ(result_.invariant_checks, 2);
  EXPECT_EQ(result_.violations, 0);
}

}  // namespace
}  // namespace vtoken::engine
