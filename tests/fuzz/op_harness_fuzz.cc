// libFuzzer target over the operation harness: the input bytes choose the cache geometry and every
// operation (add / fork / free / append / evict / reclaim / poll / read), so coverage-guided
// fuzzing explores op orders the seeded tests do not. Any invariant or byte violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "lib/core/check_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  vtoken::CheckOptions o;
  const int32_t sizes[] = {1, 2, 3, 4, 7, 16, 64};
  o.pool.block_size = sizes[data[0] % 7];
  o.pool.num_blocks = 4 + data[1] % 60;
  o.pool.headroom_blocks = data[2] % 4;
  o.async_copies = (data[3] & 1) != 0;
  o.mode = (data[3] & 2) != 0 ? vtoken::Mode::kNaive : vtoken::Mode::kVtoken;
  o.max_prompt_tokens = 1 + data[3] % 40;
  o.bytes_per_token = 8;
  o.reclaim.max_moves_per_step = 1 + data[2] * 4;
  vtoken::CheckHarness harness(o);
  for (size_t i = 4; i + 3 <= size; i += 3) {
    uint64_t state = (uint64_t{data[i + 1]} << 8) | data[i + 2];
    harness.Step(data[i], vtoken::SplitMix64(state), vtoken::SplitMix64(state));
  }
  harness.Finish();
  const vtoken::CheckReport& r = harness.report();
  if (r.violations != 0) {
    std::fprintf(stderr, "violation: %s\n", r.first_violations[0].c_str());
    std::abort();
  }
  return 0;
}
