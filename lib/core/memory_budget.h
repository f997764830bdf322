// Memory a run will take, computed before anything is allocated, and the check behind every
// "needs N GiB" error: a command refuses a configuration whose KV store, pool metadata or
// workload cannot fit in this machine's available memory, naming the size and the key that
// drives it, instead of dying in the allocator.
//
// Thread-safe: pure functions (AvailableMemoryBytes reads /proc).
#pragma once

#include <cstdint>
#include <string>

#include "lib/core/status.h"

namespace vtoken {

// a * b and a + b for a, b >= 0, saturating at INT64_MAX instead of overflowing.
int64_t SaturatingMul(int64_t a, int64_t b);
int64_t SaturatingAdd(int64_t a, int64_t b);

// Bytes of memory the system can give this process now: MemAvailable from /proc/meminfo,
// lowered to a cgroup v2 memory.max when one is set; INT64_MAX (unknown) when /proc is
// unreadable.
int64_t AvailableMemoryBytes();

// Bytes of the cache's own bookkeeping (BlockPool and TokenTable state) for a pool of
// num_blocks x block_size slots. Saturates.
int64_t PoolMetadataBytes(int64_t num_blocks, int64_t block_size);

// "12.3 GiB", "512.0 MiB", "800 B".
std::string FormatBytes(int64_t bytes);

// OK when `bytes` fits in `available` (AvailableMemoryBytes() when < 0); else
// kResourceExhausted "<what> needs <size>, more than the <size> of memory available".
Status CheckMemory(int64_t bytes, const std::string& what, int64_t available = -1);

}  // namespace vtoken
