// Stands in for the CUDA toolkit's cuda_bf16.h in the CPU emulation of the kernels
// (tests/cuda_emu): the real header declares device code the host compiler cannot build.
#pragma once

#include "tests/cuda_emu/cuda_emu.h"
