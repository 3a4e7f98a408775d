#include "tensor/ops/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "tensor/cuda/gemm/ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

// Below this many multiply-adds a plain loop beats the BLAS call's fixed cost (dispatch,
// packing), which dominates tiny products such as 4x4.
constexpr int64_t kSmallGemmFlops = 4 * 4 * 4;

// C[m,n] = op(A) op(B), row-major; lda/ldb are the row strides of A and B as stored. The
// transposes become strides, and each output is one register accumulator: independent dot
// products overlap in the CPU, where accumulating rows in memory would chain store-to-load.
template <typename T>
void SmallGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* __restrict a,
               int64_t lda, const T* __restrict b, int64_t ldb, T* __restrict c) {
  const int64_t ai = ta ? 1 : lda, ap = ta ? lda : 1;  // A(i, p) = a[i * ai + p * ap]
  const int64_t bp = tb ? 1 : ldb, bj = tb ? ldb : 1;  // B(p, j) = b[p * bp + j * bj]
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = T(0);
      for (int64_t p = 0; p < k; ++p) acc += a[i * ai + p * ap] * b[p * bp + j * bj];
      c[i * n + j] = acc;
    }
  }
}

// SmallGemm for an untransposed B with N (a compile-time constant) columns: a row of C is N
// register accumulators (one vector register for N = 4 floats), each summed over p in the same
// order as SmallGemm's, and B's rows are loaded contiguously.
// (GCC would rather vectorize the runtime-length p loop, with shuffles to transpose; across j,
// the N accumulators form one vector. Hence no loop vectorization here, only SLP across j.)
template <typename T, int N>
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-vectorize")))
#endif
void SmallGemmRowsN(int64_t m, int64_t k, const T* __restrict a, int64_t ai, int64_t ap,
                    const T* __restrict b, T* __restrict c) {
  for (int64_t i = 0; i < m; ++i) {
    T acc[N] = {};
    for (int64_t p = 0; p < k; ++p) {
      const T x = a[i * ai + p * ap];
      for (int j = 0; j < N; ++j) acc[j] += x * b[p * N + j];
    }
    for (int j = 0; j < N; ++j) c[i * N + j] = acc[j];
  }
}

template <typename T>
void SmallGemmDispatch(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
                       int64_t lda, const T* b, int64_t ldb, T* c) {
  if (!tb) {
    const int64_t ai = ta ? 1 : lda, ap = ta ? lda : 1;
    switch (n) {
      case 1: return SmallGemmRowsN<T, 1>(m, k, a, ai, ap, b, c);
      case 2: return SmallGemmRowsN<T, 2>(m, k, a, ai, ap, b, c);
      case 3: return SmallGemmRowsN<T, 3>(m, k, a, ai, ap, b, c);
      case 4: return SmallGemmRowsN<T, 4>(m, k, a, ai, ap, b, c);
      case 8: return SmallGemmRowsN<T, 8>(m, k, a, ai, ap, b, c);
      default: break;
    }
  }
  SmallGemm(ta, tb, m, n, k, a, lda, b, ldb, c);
}

template <typename T>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  const int64_t lda = std::max<int64_t>(1, ta ? m : k);
  const int64_t ldb = std::max<int64_t>(1, tb ? k : n);
  if (m * n * k <= kSmallGemmFlops) {
    SmallGemmDispatch(ta, tb, m, n, k, a, lda, b, ldb, c);
    return;
  }
  const CBLAS_TRANSPOSE ota = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE otb = tb ? CblasTrans : CblasNoTrans;
  const int64_t ldc = std::max<int64_t>(1, n);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ota, otb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ota, otb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
  }
}

[[noreturn]] void Fail(const Tensor& a, const Tensor& b, bool ta, bool tb, const char* why) {
  OpFail("matmul: ", a.ShapeString(), ta ? "^T" : "", " @ ", b.ShapeString(), tb ? "^T" : "",
         ": ", why);
}

}  // namespace

void PinBlasToOneThread() {
  static const bool pinned = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)pinned;
}

namespace {

// The shared checks of Matmul and MatmulShape, and the GEMM geometry they imply.
struct Geometry {
  Shape out_shape;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool batched = false;
};

Geometry CheckedGeometry(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  internal::RequireFloating("matmul", a, "lhs");
  internal::RequireFloating("matmul", b, "rhs");
  if (a.dtype() != b.dtype()) Fail(a, b, trans_a, trans_b, "dtypes differ; Cast one operand");
  if (a.rank() < 2 || b.rank() < 2) {
    Fail(a, b, trans_a, trans_b, "both operands need rank >= 2");
  }
  Geometry g;
  const int64_t ka = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = trans_b ? b.dim(-1) : b.dim(-2);
  g.n = trans_b ? b.dim(-2) : b.dim(-1);
  g.k = ka;
  if (ka != kb) Fail(a, b, trans_a, trans_b, "contracted dims differ");
  if (b.rank() == 2) {
    if (a.rank() > 2 && trans_a) {
      Fail(a, b, trans_a, trans_b,
           "trans_a with a rank-2 rhs needs a rank-2 lhs (leading dims of lhs are folded)");
    }
    // Fold a's leading dims into rows: [b,s,k] @ [k,n] is one [b*s,k] @ [k,n] GEMM, no copy.
    if (trans_a || a.rank() == 2) {
      g.m = trans_a ? a.dim(-1) : a.dim(-2);
    } else {
      g.m = ka == 0 ? internal::Prod(a.shape(), 0, a.rank() - 1) : a.numel() / ka;
    }
    g.out_shape.assign(a.shape().begin(), a.shape().end() - 2);
    g.out_shape.push_back(trans_a ? a.dim(-1) : a.dim(-2));
    g.out_shape.push_back(g.n);
  } else {
    if (a.rank() != b.rank()) {
      Fail(a, b, trans_a, trans_b,
           "batched matmul needs equal ranks (or a rank-2 rhs, broadcast over lhs's leading dims)");
    }
    for (int i = 0; i < a.rank() - 2; ++i) {
      if (a.shape()[i] != b.shape()[i]) Fail(a, b, trans_a, trans_b, "batch dims differ");
      g.out_shape.push_back(a.shape()[i]);
      g.batch *= a.shape()[i];
    }
    g.m = trans_a ? a.dim(-1) : a.dim(-2);
    g.out_shape.push_back(g.m);
    g.out_shape.push_back(g.n);
    g.batched = true;
  }
  return g;
}

}  // namespace

Shape MatmulShape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return CheckedGeometry(a, b, trans_a, trans_b).out_shape;
}

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  internal::OpScope scope;
  const Geometry geo = CheckedGeometry(a, b, trans_a, trans_b);
  internal::RequireSameDevice("matmul", a, b);
  if (scope.counting()) {
    internal::RecordGemm(scope, "matmul", a.dtype(), geo.batch, geo.m, geo.n, geo.k, trans_a,
                         trans_b,
                         static_cast<double>(a.nbytes() + b.nbytes()) +
                             static_cast<double>(NumElements(geo.out_shape) *
                                                 DTypeSize(a.dtype())));
  }
  if (a.is_meta()) return Tensor::Empty(geo.out_shape, a.dtype(), a.device());
  if (a.is_cuda()) return cuda::Matmul(a, b, trans_a, trans_b);  // cuBLASLt
  if (internal::IsHalf(a.dtype())) {  // f32 compute, one rounding
    return Cast(Matmul(Cast(a, DType::kF32), Cast(b, DType::kF32), trans_a, trans_b),
                a.dtype());
  }
  PinBlasToOneThread();
  const Shape& out_shape = geo.out_shape;
  const int64_t batch = geo.batch, m = geo.m, n = geo.n, ka = geo.k;
  const bool batched = geo.batched;
  Tensor out = Tensor::Empty(out_shape, a.dtype());
  if (out.numel() == 0) return out;
  internal::DispatchF32F64(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = out.data<T>();
    if (!batched) {
      Gemm(trans_a, trans_b, m, n, ka, pa, pb, pc);
    } else {
      const int64_t sa = m * ka, sb = ka * n, sc = m * n;
      for (int64_t i = 0; i < batch; ++i) {
        Gemm(trans_a, trans_b, m, n, ka, pa + i * sa, pb + i * sb, pc + i * sc);
      }
    }
  });
  return out;
}

}  // namespace shardmap
