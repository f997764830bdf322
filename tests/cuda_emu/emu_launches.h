// The CUDA emulator's launch count, declared apart from cuda_emu.h (whose CUDA-language macros
// must not reach torch or gtest headers) for tests that drive the emulated kernels through
// lib/model, e.g. llama_cuda_attention_emu_test (docs/CUDA.md, "CPU emulation of the kernels").
#pragma once

#include <cstddef>

namespace vtoken_emu {

// Kernel launches since the previous call (or since the start), and resets the count.
size_t TakeLaunchCount();

}  // namespace vtoken_emu
