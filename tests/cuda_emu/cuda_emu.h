// A CPU emulation of the part of the CUDA language and runtime that lib/cuda's kernels use, so
// the kernels' unmodified sources compile with the host compiler and run in tests without a GPU
// (docs/CUDA.md, "CPU emulation of the kernels"). tests/cuda_emu/emulate_cu.py turns a .cu file
// into host C++ that includes this header first (as nvcc includes cuda_runtime.h), rewrites
// `kernel<<<grid, block, smem, stream>>>(args)` into vtoken_emu::Launch and `__shared__`
// declarations into static arrays registered with the emulator; the shim headers in
// tests/cuda_emu/include (cuda_runtime_api.h, cuda_bf16.h, cuda_fp16.h) include this one instead
// of the real CUDA headers.
//
// Execution model: a launch runs synchronously, one block at a time. Each CUDA thread of a block
// is a fiber (its own stack) on the calling OS thread; a fiber runs until it reaches a
// synchronization point (__syncthreads, a warp shuffle) or returns, then the next one runs, so
// the block's threads are concurrent in the only sense barriers need. Block barriers and warp
// shuffles complete only when every thread (lane) they name has arrived; a block in which no
// thread can run any more (a barrier some threads never reach, a thread that returned while its
// warp waits in a shuffle) fails the launch with cudaErrorLaunchFailure and a description
// (TakeLastFailure) instead of hanging. Static shared memory is poisoned before every block
// (floats NaN, integers 0x5a bytes) so that a read before any write shows.
//
// Thread safety: one launch at a time per process (tests are single-threaded).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---- Execution space and launch qualifiers: meaningless on the host. ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// ---- Vector and index types (CUDA's vector_types.h). ----
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  unsigned int x, y, z;
};
struct float2 {
  float x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

// The current thread's and block's coordinates; the emulator sets them before it resumes a
// fiber, so they are plain globals (one launch at a time).
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
inline constexpr int warpSize = 32;

// ---- Runtime API (cuda_runtime_api.h): errors and streams. ----
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
struct CUstream_st;  // Opaque, as in the real runtime; streams are accepted and ignored.
using cudaStream_t = CUstream_st*;

// Returns and clears the error of the last launch (cudaSuccess when it ran clean).
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t error);
// For cudaErrorLaunchFailure: the emulator's description of the last failed launch.
const char* cudaGetErrorString(cudaError_t error);

// ---- Synchronization and warp intrinsics (the emulator's scheduler, cuda_emu.cc). ----
void __syncthreads();

namespace vtoken_emu::internal {
// Lane `lane` of the current warp publishes `bits`, waits until every lane of `mask` has, and
// returns the bits lane `src_lane` published (its own when src_lane is outside `width`'s group).
uint64_t WarpExchange(uint32_t mask, uint64_t bits, int src_lane_xor, int width);
}  // namespace vtoken_emu::internal

// __shfl_xor_sync: the value of lane (lane ^ lane_mask); a lane whose partner lies in a later
// group of `width` lanes gets its own value (the CUDA Programming Guide's rule).
template <typename T>
T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "32- or 64-bit values only");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = vtoken_emu::internal::WarpExchange(mask, bits, lane_mask, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ---- Atomics: blocks run one at a time on one OS thread, so a plain read-modify-write is
// atomic. ----
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

// ---- Cache-hinted loads and stores (streaming): plain accesses on the host. ----
inline uint4 __ldcs(const uint4* p) { return *p; }
inline void __stcs(uint4* p, uint4 value) { *p = value; }

// ---- Bit casts and CUDA's device min(int, int). ----
inline float __uint_as_float(unsigned int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline int min(int a, int b) { return a < b ? a : b; }

// ---- bf16 / fp16 (cuda_bf16.h, cuda_fp16.h): storage types and the conversion intrinsics the
// kernels use, bit-exact with CUDA's: float -> 16 bits rounds to nearest even; a NaN becomes the
// canonical NaN (0x7fff, as CUDA returns). ----
struct __nv_bfloat16 {
  uint16_t __x;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
struct __half {
  uint16_t __x;
};
struct __half2 {
  __half x, y;
};

inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(uint32_t{h.__x} << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) {
  const uint32_t u = __float_as_uint(f);
  if (std::isnan(f)) return {0x7fff};
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) {
  return {__bfloat162float(h.x), __bfloat162float(h.y)};
}

float __half2float(__half h);
__half __float2half_rn(float f);
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }

// ---- The emulator's own interface, for the generated kernel sources and for tests. ----
namespace vtoken_emu {

// The order in which a block's runnable threads are resumed between synchronization points, and
// the order of the blocks. A missing barrier shows as a read of another thread's stale (or
// poisoned) data in at least one of the orders; results that depend on the order only through
// fp32 atomics' summation order are legitimate.
enum class Schedule { kForward, kReverse, kShuffled };
// Applies to later launches; `seed` drives kShuffled (a new thread order every round).
void SetSchedule(Schedule schedule, uint64_t seed = 0);

// Returns the description of the last failed launch since the previous call and clears it; ""
// when none failed.
std::string TakeLastFailure();

// One launch as the emulator saw it (the launch log lets tests check which kernels ran).
struct LaunchRecord {
  dim3 grid, block;
  size_t dynamic_shared_bytes = 0;
};
// Returns the launches since the previous call and clears the log.
std::vector<LaunchRecord> TakeLaunchLog();

// How a launch was configured: the <<<...>>> arguments.
struct LaunchConfig {
  LaunchConfig(dim3 grid_dim, dim3 block_dim, size_t shared_bytes = 0,
               cudaStream_t stream_handle = nullptr)
      : grid(grid_dim),
        block(block_dim),
        dynamic_shared_bytes(shared_bytes),
        stream(stream_handle) {}
  dim3 grid, block;
  size_t dynamic_shared_bytes;
  cudaStream_t stream;
};

namespace internal {
// Runs `body(context)` as every thread of every block of `config`'s grid; records a failure
// (cudaGetLastError, TakeLastFailure) for an invalid configuration or a block that deadlocks.
void RunGrid(const LaunchConfig& config, void (*body)(void*), void* context);
// The current launch's dynamic shared memory (extern __shared__), poisoned before every block.
void* DynamicSharedMemory();
// Registers a static __shared__ array, poisoned now and before every later block.
void RegisterShared(void* data, size_t bytes, bool floating);
}  // namespace internal

// kernel<<<config>>>(args...): CUDA copies the arguments at the launch, and every thread calls
// the kernel with those copies.
template <typename... Params, typename... Args>
void Launch(const LaunchConfig& config, void (*kernel)(Params...), Args&&... args) {
  struct Call {
    void (*kernel)(Params...);
    std::tuple<std::decay_t<Params>...> params;
  } call{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
  internal::RunGrid(
      config,
      [](void* context) {
        Call* c = static_cast<Call*>(context);
        std::apply(c->kernel, c->params);
      },
      &call);
}

// `extern __shared__ T name[];` becomes `T* const name = DynamicShared<T>();`.
template <typename T>
T* DynamicShared() {
  return static_cast<T*>(internal::DynamicSharedMemory());
}

// `__shared__ T a[N], b[M];` becomes static arrays and one SharedArrays(a, b) registration.
struct SharedArrays {
  template <typename... Arrays>
  explicit SharedArrays(Arrays&... arrays) {
    (internal::RegisterShared(&arrays, sizeof(arrays),
                              std::is_floating_point_v<std::remove_all_extents_t<Arrays>>),
     ...);
  }
};

}  // namespace vtoken_emu
