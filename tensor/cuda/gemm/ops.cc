#include "tensor/cuda/gemm/ops.h"

#include <cstdint>

#include "tensor/cuda/device_memory.h"
#include "tensor/error.h"

namespace shardmap::cuda {
namespace {

using gemm_internal::Epilogue;
using gemm_internal::GemmCall;
using gemm_internal::RunGemm;

// The GEMM behind Matmul(a, b, trans_a, trans_b) under Matmul's (already checked) rules: a rank-2
// b multiplies a's last dim with a's leading dims folded into m; equal ranks >= 3 are a strided
// batch over the leading dims.
struct Geometry {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  Shape out;
};

int64_t Prod(const Shape& s, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= s[i];
  return p;
}

Geometry GeometryOf(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  Geometry g;
  g.k = trans_a ? a.dim(-2) : a.dim(-1);
  g.n = trans_b ? b.dim(-2) : b.dim(-1);
  g.out.assign(a.shape().begin(), a.shape().end() - 2);
  if (b.rank() == 2) {
    g.m = trans_a ? a.dim(-1) : Prod(a.shape(), 0, a.rank() - 1);
  } else {
    g.batch = Prod(a.shape(), 0, a.rank() - 2);
    g.m = trans_a ? a.dim(-1) : a.dim(-2);
  }
  g.out.push_back(trans_a ? a.dim(-1) : a.dim(-2));
  g.out.push_back(g.n);
  return g;
}

GemmCall CallOf(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Geometry& geo,
                void* c, DType cd_dtype) {
  GemmCall call;
  call.device = a.device().index;
  call.ab_dtype = a.dtype();
  call.cd_dtype = cd_dtype;
  call.trans_a = trans_a;
  call.trans_b = trans_b;
  call.m = geo.m;
  call.n = geo.n;
  call.k = geo.k;
  call.batch = geo.batch;
  call.stride_a = geo.m * geo.k;
  call.stride_b = geo.k * geo.n;
  call.stride_c = geo.m * geo.n;
  call.a = a.raw_data();
  call.b = b.raw_data();
  call.c = c;
  return call;
}

void Zero(Tensor& t) {
  if (t.numel() > 0) MemsetZero(t.raw_data(), t.device().index, t.nbytes());
}

// x [..., k] as a rank-2 [rows, k] view.
Tensor Rows(const Tensor& x) {
  const int64_t cols = x.dim(-1);
  const int64_t rows = Prod(x.shape(), 0, x.rank() - 1);
  return x.Reshape({rows, cols});
}

}  // namespace

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Geometry geo = GeometryOf(a, b, trans_a, trans_b);
  Tensor out = Tensor::Empty(geo.out, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (geo.k == 0) {  // an empty sum
    Zero(out);
    return out;
  }
  RunGemm(CallOf(a, b, trans_a, trans_b, geo, out.raw_data(), a.dtype()));
  return out;
}

void MatmulAccumulate(Tensor& acc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Geometry geo = GeometryOf(a, b, trans_a, trans_b);
  if (acc.numel() == 0 || geo.k == 0) return;  // adds nothing
  GemmCall call = CallOf(a, b, trans_a, trans_b, geo, acc.raw_data(), acc.dtype());
  call.accumulate = true;
  RunGemm(call);
}

bool LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, Tensor* y,
                   Tensor* pre) {
  const Geometry geo = GeometryOf(x, w, false, false);
  // aux (pre) needs a leading dimension divisible by 8; empty products are left to the
  // composed ops.
  if (geo.m == 0 || geo.n == 0 || geo.k == 0) return false;
  if (gelu && geo.n % 8 != 0) return false;
  Tensor out = Tensor::Empty(geo.out, x.dtype(), x.device());
  Tensor aux = gelu ? Tensor::Empty(geo.out, x.dtype(), x.device()) : Tensor();
  GemmCall call = CallOf(x, w, false, false, geo, out.raw_data(), x.dtype());
  if (gelu) {
    call.epilogue = bias.defined() ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux;
    call.aux = aux.raw_data();
  } else {
    call.epilogue = bias.defined() ? Epilogue::kBias : Epilogue::kNone;
  }
  if (bias.defined()) call.bias = bias.raw_data();
  if (!RunGemm(call)) return false;
  *y = out;
  *pre = aux;
  return true;
}

bool LinearGeluBackward(const Tensor& dy, const Tensor& w, const Tensor& pre, bool bias_grad,
                        Tensor* dpre, Tensor* dbias) {
  const Geometry geo = GeometryOf(dy, w, false, true);
  if (geo.m == 0 || geo.n == 0 || geo.k == 0 || geo.n % 8 != 0) return false;
  Tensor out = Tensor::Empty(geo.out, dy.dtype(), dy.device());
  Tensor db = bias_grad ? Tensor::Empty({geo.n}, dy.dtype(), dy.device()) : Tensor();
  GemmCall call = CallOf(dy, w, false, true, geo, out.raw_data(), dy.dtype());
  call.epilogue = bias_grad ? Epilogue::kDGeluBGrad : Epilogue::kDGelu;
  // aux is read here; GemmCall has one aux slot for both directions.
  call.aux = const_cast<void*>(pre.raw_data());
  if (bias_grad) call.bias_grad = db.raw_data();
  if (!RunGemm(call)) return false;
  *dpre = out;
  *dbias = db;
  return true;
}

bool LinearWeightGrad(const Tensor& x, const Tensor& dy, bool bias_grad, Tensor* dw,
                      Tensor* db) {
  const Tensor x2 = Rows(x), dy2 = Rows(dy);
  const Geometry geo = GeometryOf(x2, dy2, true, false);
  Tensor w_out = Tensor::Empty(geo.out, x.dtype(), x.device());
  Tensor b_out = bias_grad ? Tensor::Empty({geo.n}, dy.dtype(), dy.device()) : Tensor();
  if (w_out.numel() == 0 || geo.k == 0) {  // no GEMM: no rows, or x or dy has no columns
    Zero(w_out);
    // db is dy's row sum: zero without rows, but not when only x is [..., 0].
    if (bias_grad) b_out = BiasGrad(dy);
    *dw = w_out;
    *db = b_out;
    return true;
  }
  GemmCall call = CallOf(x2, dy2, true, false, geo, w_out.raw_data(), x.dtype());
  if (bias_grad) {
    call.epilogue = Epilogue::kBGradRhs;
    call.bias_grad = b_out.raw_data();
  }
  if (!RunGemm(call)) {  // no fused algorithm: two GEMMs
    call.epilogue = Epilogue::kNone;
    call.bias_grad = nullptr;
    RunGemm(call);
    b_out = BiasGrad(dy);
  }
  *dw = w_out;
  *db = b_out;
  return true;
}

Tensor BiasGrad(const Tensor& dy) {
  const Tensor dy2 = Rows(dy);
  const int64_t rows = dy2.dim(0), n = dy2.dim(1);
  Tensor out = Tensor::Empty({n}, dy.dtype(), dy.device());
  if (n == 0) return out;
  if (rows == 0) {
    Zero(out);
    return out;
  }
  const Tensor ones = Tensor::Full({1, rows}, 1.0, dy.dtype(), dy.device());
  const Geometry geo = GeometryOf(ones, dy2, false, false);
  RunGemm(CallOf(ones, dy2, false, false, geo, out.raw_data(), dy.dtype()));
  return out;
}

GemmStats GetGemmStats() { return gemm_internal::Stats(); }

}  // namespace shardmap::cuda
