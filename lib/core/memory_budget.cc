#include "lib/core/memory_budget.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

namespace vtoken {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// MemAvailable in bytes, or -1.
int64_t MemInfoAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return SaturatingMul(kib, 1024);
  }
  return -1;
}

// A cgroup v2 limit minus current usage, or -1 when there is none.
int64_t CgroupAvailable() {
  std::ifstream max_in("/sys/fs/cgroup/memory.max"), cur_in("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (!(max_in >> max_text) || max_text == "max" || !(cur_in >> current)) return -1;
  try {
    const int64_t limit = std::stoll(max_text);
    return limit > current ? limit - current : 0;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int64_t SaturatingMul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kMax / b ? kMax : a * b;
}

int64_t SaturatingAdd(int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; }

int64_t AvailableMemoryBytes() {
  // lib/core uses the standard library only: without a readable /proc the limit is unknown,
  // and nothing is refused for memory (the allocator still reports a real shortage).
  int64_t available = MemInfoAvailable();
  if (available < 0) available = kMax;
  const int64_t cgroup = CgroupAvailable();
  if (cgroup >= 0 && cgroup < available) available = cgroup;
  return available;
}

int64_t PoolMetadataBytes(int64_t num_blocks, int64_t block_size) {
  // Per block: its state, a free-list entry, the token-table entry of the sequence holding it
  // (about 32 bytes). Per slot: a 16-bit reference count and a token-table entry (16 bytes).
  const int64_t per_block = 64, per_slot = 18;
  return SaturatingAdd(SaturatingMul(num_blocks, per_block),
                       SaturatingMul(SaturatingMul(num_blocks, block_size), per_slot));
}

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f TiB", b / (1024.0 * 1024 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

Status CheckMemory(int64_t bytes, const std::string& what, int64_t available) {
  if (available < 0) available = AvailableMemoryBytes();
  if (bytes <= available) return Status::Ok();
  return ResourceExhaustedError(what + " needs " + FormatBytes(bytes) + ", more than the " +
                                FormatBytes(available) + " of memory available");
}

}  // namespace vtoken
