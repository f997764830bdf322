#include "lib/model/cpu_blas_gemm.h"

#include <dlfcn.h>

#include <algorithm>

namespace vtoken::model {
namespace {

// The Fortran BLAS interface, as torch itself calls it: column-major, arguments by pointer.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n,
                         const int* k, const float* alpha, const float* a, const int* lda,
                         const float* b, const int* ldb, const float* beta, float* c,
                         const int* ldc);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

struct OpenBlas {
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_threads = nullptr;
  GetThreadsFn get_threads = nullptr;
};

const OpenBlas& Blas() {
  static const OpenBlas blas = [] {
    OpenBlas b;
    b.set_threads = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    b.get_threads = reinterpret_cast<GetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (b.set_threads != nullptr && b.get_threads != nullptr) {
      b.sgemm = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
    }
    return b;
  }();
  return blas;
}

}  // namespace

bool PoolSgemmAvailable() { return Blas().sgemm != nullptr; }

OneBlasThread::OneBlasThread() {
  if (!PoolSgemmAvailable()) return;
  before_ = Blas().get_threads();
  if (before_ != 1) Blas().set_threads(1);
}

OneBlasThread::~OneBlasThread() {
  if (before_ != 1) Blas().set_threads(before_);
}

void Sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc) {
  // Row-major c = a op(b) is, column-major, c^T = op(b)^T a^T: b first.
  const int mm = static_cast<int>(n), nn = static_cast<int>(m), kk = static_cast<int>(k);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  Blas().sgemm(b_transposed ? "T" : "N", "N", &mm, &nn, &kk, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

void PoolSgemm(const CpuLinearArgs& a, CpuPool& pool) {
  OneBlasThread one;
  const int64_t calls = (a.rows + kPoolSgemmRows - 1) / kPoolSgemmRows;
  pool.ParallelFor(calls, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const int64_t r_begin = c * kPoolSgemmRows,
                    r_end = std::min(a.rows, r_begin + kPoolSgemmRows);
      float* y = a.y + r_begin * a.out_features;
      Sgemm(r_end - r_begin, a.out_features, a.in_features, 1.0F, a.x + r_begin * a.in_features,
            a.in_features, a.w, a.in_features, /*b_transposed=*/true, a.accumulate ? 1.0F : 0.0F, y,
            a.out_features);
      if (a.bias == nullptr) continue;
      for (int64_t r = r_begin; r < r_end; ++r, y += a.out_features) {
        for (int64_t o = 0; o < a.out_features; ++o) y[o] += a.bias[o];
      }
    }
  });
}

}  // namespace vtoken::model
