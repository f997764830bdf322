// The emulator's scheduler (cuda_emu.h): blocks one after another, a block's threads as fibers
// on the calling OS thread, switched only at synchronization points.
#include "tests/cuda_emu/cuda_emu.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu_launches.h"

#if !defined(__x86_64__) || defined(VTOKEN_EMU_UCONTEXT)
#include <ucontext.h>
#define VTOKEN_EMU_USE_UCONTEXT 1
#endif

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace vtoken_emu {
namespace {

// Fiber context switches. On x86-64 a switch saves the callee-saved registers on the old stack
// and pops them from the new one (a few nanoseconds); glibc's swapcontext also saves the signal
// mask with a system call per switch (about 0.5 us here), which the shuffles of a 128-thread
// block would pay thousands of times per key chunk. The x87 / SSE control words are not
// switched: no kernel changes them. Other architectures use ucontext.
#if VTOKEN_EMU_USE_UCONTEXT
struct Context {
  ucontext_t uc;
};
void PrepareContext(Context& context, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&context.uc);
  context.uc.uc_stack.ss_sp = stack;
  context.uc.uc_stack.ss_size = bytes;
  context.uc.uc_link = nullptr;
  makecontext(&context.uc, entry, 0);
}
void SwitchContext(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#else
struct Context {
  void* sp = nullptr;
};
extern "C" void vtoken_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl vtoken_emu_switch
  .hidden vtoken_emu_switch
  .type vtoken_emu_switch, @function
vtoken_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size vtoken_emu_switch, .-vtoken_emu_switch
)");
// A fresh stack that vtoken_emu_switch "returns" into `entry` from, with the stack aligned as
// after a call (rsp = 8 mod 16 at entry) and zeroed callee-saved registers.
void PrepareContext(Context& context, char* stack, size_t bytes, void (*entry)()) {
  void** sp = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15});
  *--sp = nullptr;  // entry's return address: entry never returns.
  *--sp = reinterpret_cast<void*>(entry);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  context.sp = sp;
}
void SwitchContext(Context& from, Context& to) { vtoken_emu_switch(&from.sp, to.sp); }
#endif

constexpr size_t kStackBytes = 256 << 10;  // Virtual: only the pages a kernel touches are used.
constexpr size_t kGuardBytes = 4096;       // Below each stack: an overflow faults.
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicSharedBytes = 48 << 10;  // Without a cudaFuncSetAttribute opt-in.

enum class State : uint8_t { kReady, kAtBarrier, kInWarpOp, kFailed, kDone };

struct Fiber {
  Context context;
  char* stack = nullptr;  // kStackBytes above the guard page.
  State state = State::kReady;
  uint3 index{};
};

struct WarpState {
  uint32_t arrived = 0;  // Lanes waiting in the current exchange.
  uint32_t mask = 0;     // The current exchange's mask.
  uint64_t generation = 0;
  // Double-buffered by generation: exchange g + 2 cannot start before every lane has left g.
  uint64_t values[2][32] = {};
};

struct SharedArray {
  void* data;
  size_t bytes;
  bool floating;
};

void Poison(void* data, size_t bytes, bool floating) {
  if (!floating) {
    std::memset(data, 0x5a, bytes);  // Integers: large values, which index far out of bounds.
    return;
  }
  const uint32_t nan = 0x7fc00000u;  // Floats: NaN, which propagates into every result.
  for (size_t offset = 0; offset + 4 <= bytes; offset += 4) {
    std::memcpy(static_cast<char*>(data) + offset, &nan, 4);
  }
}

class Emulator {
 public:
  static Emulator& Get() {
    static Emulator emulator;
    return emulator;
  }

  void SetSchedule(Schedule schedule, uint64_t seed) {
    schedule_ = schedule;
    rng_.seed(seed);
  }

  void RunGrid(const LaunchConfig& config, void (*body)(void*), void* context) {
    log_.push_back({config.grid, config.block, config.dynamic_shared_bytes});
    if (std::string error = ConfigError(config); !error.empty()) {
      Fail(config.dynamic_shared_bytes > kMaxDynamicSharedBytes ? cudaErrorInvalidValue
                                                                : cudaErrorInvalidConfiguration,
           error);
      return;
    }
    body_ = body;
    context_ = context;
    gridDim = config.grid;
    blockDim = config.block;
    threads_ = static_cast<int>(config.block.x * config.block.y * config.block.z);
    while (static_cast<int>(fibers_.size()) < threads_) fibers_.push_back(NewFiber());
    warps_.assign(static_cast<size_t>((threads_ + 31) / 32), WarpState{});
    dynamic_shared_.assign((config.dynamic_shared_bytes + 15) / 16, uint4{});
    order_.resize(static_cast<size_t>(threads_));
    const uint64_t blocks = uint64_t{config.grid.x} * config.grid.y * config.grid.z;
    std::vector<uint64_t> block_order;
    if (schedule_ == Schedule::kShuffled) {
      block_order.resize(blocks);
      std::iota(block_order.begin(), block_order.end(), uint64_t{0});
      std::shuffle(block_order.begin(), block_order.end(), rng_);
    }
    for (uint64_t i = 0; i < blocks; ++i) {
      const uint64_t b = schedule_ == Schedule::kForward   ? i
                         : schedule_ == Schedule::kReverse ? blocks - 1 - i
                                                           : block_order[i];
      blockIdx = {static_cast<unsigned>(b % config.grid.x),
                  static_cast<unsigned>(b / config.grid.x % config.grid.y),
                  static_cast<unsigned>(b / config.grid.x / config.grid.y)};
      if (!RunBlock()) return;
    }
  }

  void Barrier() {
    Fiber& fiber = fibers_[current_];
    fiber.state = State::kAtBarrier;
    if (++barrier_arrived_ == threads_) {
      barrier_arrived_ = 0;
      for (int t = 0; t < threads_; ++t) fibers_[t].state = State::kReady;
    }
    Yield();
  }

  uint64_t WarpExchange(uint32_t mask, uint64_t bits, int lane_mask, int width) {
    const int warp = current_ / 32, lane = current_ % 32;
    const int lanes = std::min(32, threads_ - 32 * warp);
    const uint32_t present = lanes == 32 ? ~0u : (1u << lanes) - 1;
    WarpState& w = warps_[warp];
    if ((mask >> lane & 1u) == 0) return FailInKernel("lane not in its own shuffle mask");
    if ((mask & ~present) != 0) return FailInKernel("shuffle mask names lanes the block lacks");
    if (width < 1 || width > 32 || !std::has_single_bit(static_cast<unsigned>(width))) {
      return FailInKernel("shuffle width " + std::to_string(width) + " not a power of 2 <= 32");
    }
    if (w.arrived != 0 && w.mask != mask) return FailInKernel("lanes disagree on a shuffle mask");
    w.mask = mask;
    const uint64_t generation = w.generation;
    w.values[generation & 1][lane] = bits;
    w.arrived |= 1u << lane;
    fibers_[current_].state = State::kInWarpOp;
    if (w.arrived == mask) {
      for (int l = 0; l < 32; ++l) {
        if (mask >> l & 1u) fibers_[32 * warp + l].state = State::kReady;
      }
      w.arrived = 0;
      ++w.generation;
    }
    Yield();
    int src = lane ^ lane_mask;
    if (src >= (lane / width + 1) * width) src = lane;
    if ((mask >> src & 1u) == 0) return FailInKernel("shuffle reads a lane outside its mask");
    return w.values[generation & 1][src];
  }

  void* DynamicShared() { return dynamic_shared_.data(); }

  void RegisterShared(void* data, size_t bytes, bool floating) {
    shared_.push_back({data, bytes, floating});
    Poison(data, bytes, floating);
  }

  cudaError_t TakeError() { return std::exchange(last_error_, cudaSuccess); }
  std::string TakeFailure() { return std::exchange(failure_, std::string()); }
  const std::string& failure_text() const { return failure_text_; }
  std::vector<LaunchRecord> TakeLog() { return std::exchange(log_, {}); }

 private:
  static void FiberEntry() {
    Emulator& e = Get();
    e.body_(e.context_);
    e.fibers_[e.current_].state = State::kDone;
    e.Yield();
    std::abort();  // A finished fiber is never resumed.
  }

  static Fiber NewFiber() {
    void* region = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED || mprotect(region, kGuardBytes, PROT_NONE) != 0) {
      std::perror("vtoken_emu: fiber stack");
      std::abort();
    }
    Fiber fiber;
    fiber.stack = static_cast<char*>(region) + kGuardBytes;
    return fiber;
  }

  static std::string ConfigError(const LaunchConfig& c) {
    const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
    if (c.block.x < 1 || c.block.y < 1 || c.block.z < 1 || c.block.z > 64 ||
        threads > kMaxThreadsPerBlock) {
      return "block (" + std::to_string(c.block.x) + ", " + std::to_string(c.block.y) + ", " +
             std::to_string(c.block.z) + ") outside the limits (1024 threads, z <= 64)";
    }
    if (c.grid.x < 1 || c.grid.x > 0x7fffffffu || c.grid.y < 1 || c.grid.y > 65535 ||
        c.grid.z < 1 || c.grid.z > 65535) {
      return "grid (" + std::to_string(c.grid.x) + ", " + std::to_string(c.grid.y) + ", " +
             std::to_string(c.grid.z) + ") outside the limits (x < 2^31, y and z <= 65535)";
    }
    if (c.dynamic_shared_bytes > kMaxDynamicSharedBytes) {
      return std::to_string(c.dynamic_shared_bytes) + " bytes of dynamic shared memory, past " +
             std::to_string(kMaxDynamicSharedBytes);
    }
    return "";
  }

  // Runs the current block to completion; false (failure recorded) when it cannot complete.
  bool RunBlock() {
    for (const SharedArray& a : shared_) Poison(a.data, a.bytes, a.floating);
    if (!dynamic_shared_.empty()) {
      std::memset(dynamic_shared_.data(), 0xff, dynamic_shared_.size() * sizeof(uint4));
    }
    for (int t = 0; t < threads_; ++t) {
      Fiber& f = fibers_[t];
      f.state = State::kReady;
      f.index = {static_cast<unsigned>(t) % blockDim.x,
                 static_cast<unsigned>(t) / blockDim.x % blockDim.y,
                 static_cast<unsigned>(t) / blockDim.x / blockDim.y};
      PrepareContext(f.context, f.stack, kStackBytes, &FiberEntry);
    }
    for (WarpState& w : warps_) w = WarpState{};
    barrier_arrived_ = 0;
    std::iota(order_.begin(), order_.end(), 0);
    if (schedule_ == Schedule::kReverse) std::reverse(order_.begin(), order_.end());
    int done = 0;
    while (done < threads_) {
      if (schedule_ == Schedule::kShuffled) std::shuffle(order_.begin(), order_.end(), rng_);
      bool ran = false;
      for (int t : order_) {
        Fiber& f = fibers_[t];
        if (f.state != State::kReady) continue;
        current_ = t;
        threadIdx = f.index;
        SwitchContext(scheduler_, f.context);
        ran = true;
        if (f.state == State::kFailed) return false;
        if (f.state == State::kDone) ++done;
      }
      if (!ran) {
        Fail(cudaErrorLaunchFailure, BlockName() + ": no thread can run: " + Census());
        return false;
      }
    }
    return true;
  }

  std::string BlockName() const {
    return "block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) + ", " +
           std::to_string(blockIdx.z) + ") of " + std::to_string(threads_) + " threads";
  }

  // Where the block's threads are: "64 at __syncthreads, 64 returned, warp 2: 31 of 32 lanes in
  // a shuffle".
  std::string Census() const {
    int at_barrier = 0, returned = 0;
    for (int t = 0; t < threads_; ++t) {
      at_barrier += fibers_[t].state == State::kAtBarrier;
      returned += fibers_[t].state == State::kDone;
    }
    std::string text =
        std::to_string(at_barrier) + " at __syncthreads, " + std::to_string(returned) + " returned";
    for (size_t w = 0; w < warps_.size(); ++w) {
      if (warps_[w].arrived == 0) continue;
      text += ", warp " + std::to_string(w) + ": " +
              std::to_string(std::popcount(warps_[w].arrived)) + " of " +
              std::to_string(std::popcount(warps_[w].mask)) + " lanes in a shuffle";
    }
    return text;
  }

  void Fail(cudaError_t error, const std::string& message) {
    last_error_ = error;
    failure_ = message;
    failure_text_ = message;
  }

  // Fails the launch from inside a kernel: the fiber is parked for good.
  uint64_t FailInKernel(const std::string& what) {
    Fail(cudaErrorLaunchFailure,
         BlockName() + ", thread " + std::to_string(current_) + ": " + what);
    fibers_[current_].state = State::kFailed;
    Yield();
    std::abort();  // A failed fiber is never resumed.
  }

  void Yield() { SwitchContext(fibers_[current_].context, scheduler_); }

  Schedule schedule_ = Schedule::kForward;
  std::mt19937_64 rng_;
  void (*body_)(void*) = nullptr;
  void* context_ = nullptr;
  int threads_ = 0;
  int current_ = 0;
  int barrier_arrived_ = 0;
  Context scheduler_;
  std::vector<Fiber> fibers_;  // The pool, grown to the largest block; stacks are never freed.
  std::vector<WarpState> warps_;
  std::vector<int> order_;
  std::vector<uint4> dynamic_shared_;
  std::vector<SharedArray> shared_;
  cudaError_t last_error_ = cudaSuccess;
  std::string failure_, failure_text_;
  std::vector<LaunchRecord> log_;
};

}  // namespace

void SetSchedule(Schedule schedule, uint64_t seed) { Emulator::Get().SetSchedule(schedule, seed); }
std::string TakeLastFailure() { return Emulator::Get().TakeFailure(); }
std::vector<LaunchRecord> TakeLaunchLog() { return Emulator::Get().TakeLog(); }

size_t TakeLaunchCount() { return TakeLaunchLog().size(); }

namespace internal {
void RunGrid(const LaunchConfig& config, void (*body)(void*), void* context) {
  Emulator::Get().RunGrid(config, body, context);
}
void* DynamicSharedMemory() { return Emulator::Get().DynamicShared(); }
void RegisterShared(void* data, size_t bytes, bool floating) {
  Emulator::Get().RegisterShared(data, bytes, floating);
}
uint64_t WarpExchange(uint32_t mask, uint64_t bits, int lane_mask, int width) {
  return Emulator::Get().WarpExchange(mask, bits, lane_mask, width);
}
}  // namespace internal

}  // namespace vtoken_emu

void __syncthreads() { vtoken_emu::Emulator::Get().Barrier(); }

cudaError_t cudaGetLastError() { return vtoken_emu::Emulator::Get().TakeError(); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchFailure:
      return vtoken_emu::Emulator::Get().failure_text().c_str();
    case cudaErrorMemoryAllocation:
      return "out of memory";
  }
  return "unknown error";
}

float __half2float(__half h) {
  const uint32_t sign = uint32_t{h.__x & 0x8000u} << 16;
  const uint32_t exponent = (h.__x >> 10) & 0x1fu;
  const uint32_t mantissa = h.__x & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);
  if (exponent != 0) return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
  // Subnormal or zero: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

__half __float2half_rn(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>(u >> 16 & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return {0x7fff};                                  // NaN: canonical.
  if (magnitude >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520.
  const uint32_t exponent = magnitude >> 23;
  // Rounds `value` shifted right by `shift` bits to nearest even.
  auto round_shift = [](uint32_t value, uint32_t shift) {
    const uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1),
                   half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1u)) ? 1u : 0u);
  };
  if (exponent >= 113) {  // Normal half: rebias 127 -> 15, keep 10 of 23 mantissa bits.
    return {static_cast<uint16_t>(sign | round_shift(magnitude - (112u << 23), 13))};
  }
  // Subnormal half (or zero): round(|f| * 2^24) = mantissa_with_1 * 2^(exponent - 126).
  if (exponent < 102) return {sign};  // |f| < 2^-25: rounds to zero.
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  return {static_cast<uint16_t>(sign | round_shift(mantissa, 126 - exponent))};
}
