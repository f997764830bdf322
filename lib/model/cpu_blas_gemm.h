// Prefill GEMMs of the fused CPU step on the step's own pool (llama_paged_cpu.cc).
//
// Left to itself, OpenBLAS splits a prefill chunk's GEMM over a pool of its own, whose worker
// spins (sched_yield) through everything between two GEMMs: RMSNorm, RoPE, the K/V writes and the
// attention's softmax, and takes the CPU from the step's own threads. On 2 CPUs a 2,048-token
// SmolLM2 prefill gained 1.6x from the second thread. Here the step holds the BLAS at one thread
// (OneBlasThread) and splits the work itself: PoolSgemm cuts the rows into calls of
// kPoolSgemmRows rows, which the threads of the step's CpuPool share out, and the prefill
// attention (cpu_prefill_attention.h) calls Sgemm on its own units the same way.
//
// Bits: an sgemm's kernels sum an output in an order that depends on where its row and column
// fall in the kernel's tiles (OpenBLAS's Haswell kernels: rows in tiles of 12, a shorter tile at
// the end summing otherwise), and OpenBLAS's own split over threads moves them: its 1- and
// 2-thread results differ for SmolLM2's prefill GEMMs. The calls here are cut by a fixed row count,
// never by the thread count, so each output comes from the same call with the same arguments on
// any number of threads: the thread count changes no bit (paged_prefill_attention_test; the
// fused step's thread-count test).
//
// Only where the process's BLAS is OpenBLAS (Debian's libtorch): sgemm_ and
// openblas_{get,set}_num_threads are looked up at run time. Elsewhere (MKL inside PyPI's torch,
// whose threads are OpenMP's and sleep between calls, and whose strict mode keeps the bits)
// PoolSgemmAvailable() is false and the fused step keeps torch's GEMM and attention.
#pragma once

#include <cstdint>

#include "lib/model/cpu_ops.h"
#include "lib/model/cpu_pool.h"

namespace vtoken::model {

bool PoolSgemmAvailable();

// Rows per sgemm call of PoolSgemm. Each call packs the whole weight matrix again: 256 rows of
// SmolLM2's gate projection are 0.45 GFLOP against 3.5 MB packed. A prefill chunk of 512 tokens
// plus a few decode rows still splits evenly over two threads (256 + 263 rows).
inline constexpr int64_t kPoolSgemmRows = 256;

// Holds the BLAS at one thread from construction to destruction (then restores its count).
// No-op where !PoolSgemmAvailable().
class OneBlasThread {
 public:
  OneBlasThread();
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int before_ = 1;
};

// Row-major, on the calling thread: c[m, n] = alpha * a[m, k] b^T + beta * c, with b [n, k]
// when b_transposed, else b [k, n]. lda, ldb, ldc: row strides in floats. Requires
// PoolSgemmAvailable(); callers on several threads hold OneBlasThread.
void Sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc);

// y = x W^T (+ bias), or y += x W^T (+ bias) with a.accumulate: one Sgemm per kPoolSgemmRows
// rows, on the pool's threads, under OneBlasThread. Requires PoolSgemmAvailable().
void PoolSgemm(const CpuLinearArgs& a, CpuPool& pool);

}  // namespace vtoken::model
