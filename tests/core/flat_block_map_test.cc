// FlatBlockMap against std::unordered_map under random inserts, overwrites and erases (the
// backward-shift erase is where open addressing goes wrong), over dense and spread block ids.
#include "lib/core/flat_block_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

namespace vtoken {
namespace {

TEST(FlatBlockMapTest, AgreesWithUnorderedMapUnderRandomInsertsAndErases) {
  for (const uint64_t seed : {1u, 2u, 3u, 4u}) {
    // Seeds 1-2 draw from 64 dense ids (long probe runs, many wrap-arounds at small sizes),
    // 3-4 from a million (few collisions, many rehashes).
    const BlockId universe = seed <= 2 ? 64 : 1'000'000;
    SCOPED_TRACE("seed " + std::to_string(seed) + ", ids below " + std::to_string(universe));
    std::mt19937_64 rng(seed);
    FlatBlockMap map;
    std::unordered_map<BlockId, int32_t> model;
    std::vector<BlockId> keys;  // What the model holds, for picking erase victims.
    for (int step = 0; step < 20000; ++step) {
      const int op = static_cast<int>(rng() % 8);
      if (op < 4 || keys.empty()) {
        const BlockId b = static_cast<BlockId>(rng() % static_cast<uint64_t>(universe));
        const int32_t v = static_cast<int32_t>(rng() % 1000);
        if (model.count(b)) {
          map.At(b) = v;  // Overwrite in place, as RemoveBlock's index fix-up does.
        } else {
          map.Insert(b, v);
          keys.push_back(b);
        }
        model[b] = v;
      } else {
        const size_t k = rng() % keys.size();
        const BlockId b = keys[k];
        keys[k] = keys.back();
        keys.pop_back();
        map.Erase(b);
        model.erase(b);
      }
      ASSERT_EQ(map.size(), model.size()) << "step " << step;
      ASSERT_LE(2 * map.size(), map.bucket_count()) << "step " << step;
      if (step % 97 == 0 || universe == 64) {
        for (BlockId b = 0; b < std::min<BlockId>(universe, 64); ++b) {
          const auto it = model.find(b);
          ASSERT_EQ(map.Find(b), it == model.end() ? -1 : it->second)
              << "step " << step << " block " << b;
        }
        for (const auto& [b, v] : model) ASSERT_EQ(map.Find(b), v) << "step " << step;
      }
    }
  }
}

TEST(FlatBlockMapTest, EmptyMapFindsNothingAndHoldsNoMemory) {
  FlatBlockMap map;
  EXPECT_EQ(map.Find(0), -1);
  EXPECT_FALSE(map.Contains(7));
  EXPECT_EQ(map.MemoryBytes(), 0);
  map.Insert(7, 3);
  EXPECT_EQ(map.Find(7), 3);
  EXPECT_EQ(map.bucket_count(), 8u);
  map.Erase(7);
  EXPECT_EQ(map.Find(7), -1);
  EXPECT_EQ(map.size(), 0u);
}

}  // namespace
}  // namespace vtoken
