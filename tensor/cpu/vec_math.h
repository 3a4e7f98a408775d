// Vectorized f32 kernels for the CPU tensor ops (exp, log, tanh, sigmoid, silu, GELU and their
// gradients, fused bias epilogues, softmax and norm row passes, 32-bit transposes), on SLEEF's
// vector math (Debian libsleef-dev: 1.0-ulp exp, 3.5-ulp log, which is 2.2x faster than its
// 1.0-ulp log), glibc libmvec's tanh (1.4 ulp measured, 1.15-1.6x faster than SLEEF's 3.5-ulp
// one on every ISA) and our own erfc for GELU (an inline exp(-x^2 / 2) times a fitted erfcx
// polynomial, sharing the exp with the gradient's Gaussian term; internal/vec_kernels_inl.h), with runtime
// dispatch: one binary runs on any x86-64 and picks AVX-512F, AVX2+FMA or the SSE2 baseline by
// the CPU it finds (once).
//
//   const cpu::VecKernels& k = cpu::Vec();
//   k.gelu_tanh(x, y, n);                       // y[i] = gelu_tanh(x[i]), n floats
//   double s = k.exp_shift_sum(row, mx, out, v);  // out = exp(row - mx), s = sum(out)
//
// Plain pointers, contiguous, any length (vector tails included); outputs may alias inputs
// exactly, never partially. The formulas keep the CPU ops' IEEE special values (NaN in -> NaN
// out, gelu(-inf) = NaN as 0.5 * x * (1 + tanh(u)) gives) and are rearranged only where that
// removes cancellation: gelu = x / (1 + exp(-2u)) and 0.5 x erfc(-x / sqrt 2). f64 stays on the
// scalar libm loops in tensor/ops (full f64 accuracy); bf16/f16 compute in f32 and round once.
//
// Accuracy (vec_math_test checks it on every ISA): exp, sigmoid, silu within 3 ulp of the exact
// value, log within 4, tanh within 2; GELU and the gradients within 4 ulp of the exact value at an
// input within 2 ulp of x (the f32-rounded inner argument of exp/erfc), gradients also within 4 ulp
// of their largest term; results below 2^-110 in magnitude may flush to zero (SLEEF's f32 exp does
// not return subnormals; GELU-erf flushes for |x| > 13.24, where it is below 2^-127). With AVX2 or
// AVX-512 (fused multiply-add) GELU-erf also holds at x itself: within 5 ulp for x >= -4 and 16
// ulp below (its negative tail), its gradient within 5 ulp of its largest term.
#ifndef SHARDMAP_TENSOR_CPU_VEC_MATH_H_
#define SHARDMAP_TENSOR_CPU_VEC_MATH_H_

#include <cstdint>

namespace shardmap::cpu {

using VecUnaryFn = void (*)(const float* x, float* y, int64_t n);
using VecGradFn = void (*)(const float* x, const float* dy, float* dx, int64_t n);
// pre[r, :] = x[r, :] + bias (in place over x), y = gelu(pre); rows x cols, row-major.
using VecBiasGeluFn = void (*)(float* x_pre, const float* bias, float* y, int64_t rows,
                               int64_t cols);
// dx = dy * gelu'(pre) and dbias[j] += sum over rows of dx[:, j] (f64 accumulation).
using VecGeluGradBiasFn = void (*)(const float* pre, const float* dy, float* dx, double* dbias,
                                   int64_t rows, int64_t cols);

struct VecKernels {
  const char* isa;  // "avx512", "avx2" or "sse2"
  VecUnaryFn exp, log, tanh, sigmoid, silu, gelu_erf, gelu_tanh;
  VecGradFn gelu_erf_grad, gelu_tanh_grad, silu_grad;
  VecBiasGeluFn bias_gelu_erf, bias_gelu_tanh;
  VecGeluGradBiasFn gelu_erf_grad_bias, gelu_tanh_grad_bias;
  // The largest of x[0, n); NaN if any element is NaN; -inf for n = 0.
  float (*max)(const float* x, int64_t n);
  // y = exp(x - shift) when y is not null; returns the sum of exp(x - shift), added in f64 per
  // block of lanes (so long rows keep f64-grade sums).
  double (*exp_shift_sum)(const float* x, float shift, float* y, int64_t n);
  // Row reductions: sum x runs chains of 8 f32 registers, then f64 (error at most 8 f32 ulp of
  // sum |x|, as PyTorch's f32 cascade sum); sum x*y runs chains of 4 f32 multiply-adds, then f64
  // (5 ulp of sum |x y|); both plus f64 rounding. sum (x - c)^2 is all f64 (each float widened
  // exactly): the variance of a layer norm.
  double (*sum)(const float* x, int64_t n);
  double (*dot)(const float* x, const float* y, int64_t n);
  double (*sum_sq_diff)(const float* x, double c, int64_t n);
  // Layer/RMS norm backward over `rows` consecutive rows of n (row-major x and dy), xhat = (x -
  // mean[r]) * rstd[r] (mean null: 0, RMS norm), dxhat = dy * g (g null: 1). Pass 1: dg += dy *
  // xhat, db += dy (db may be null), in row order and four rows per read of dg / db; sums[2r],
  // sums[2r + 1] = sum dxhat, sum dxhat * xhat of row r, in f32 lanes over blocks of 8
  // registers, then f64.
  void (*norm_bwd_sums)(const float* x, const float* dy, const float* g, const float* mean,
                        const float* rstd, float* dg, float* db, int64_t n, int64_t rows,
                        double* sums);
  // Pass 2: dx = rstd * (dxhat - a - xhat * c) (a = mean dxhat, c = mean dxhat * xhat).
  void (*norm_bwd_dx)(const float* x, const float* dy, const float* g, float mean, float rstd,
                      float a, float c, float* dx, int64_t n);
  // y = x * s and y = x + c (softmax's scale, log_softmax's shift).
  void (*scale)(const float* x, float s, float* y, int64_t n);
  void (*shift)(const float* x, float c, float* y, int64_t n);
  // Layer/RMS norm forward epilogue: y = (x - mean) * rstd * g + b; g, b may be null (1, 0).
  void (*norm_affine)(const float* x, float mean, float rstd, const float* g, const float* b,
                      float* y, int64_t n);
  // Softmax backward of one row given acc = sum(dy * y): dx = y * (dy - acc); log-softmax
  // backward given acc = sum(dy): dx = dy - exp(y) * acc.
  void (*softmax_bwd)(const float* y, const float* dy, float acc, float* dx, int64_t n);
  void (*log_softmax_bwd)(const float* y, const float* dy, float acc, float* dx, int64_t n);
  // 32-bit elements of any dtype (bits copied): out[r * os + c] = in[c * is + r] for r < rows,
  // c < cols, in register-sized squares. `stream`: the caller's output is far larger than the
  // caches, so write it with non-temporal stores (where out is 64-byte aligned and os a multiple
  // of 16; ordered before return).
  void (*transpose32)(const void* in, int64_t is, void* out, int64_t os, int64_t rows,
                      int64_t cols, bool stream);
  // z = x + y, x - y, x * y, x / y: IEEE-exact, so the same bits as any scalar loop.
  VecGradFn add, sub, mul, div;
  // acc[j] += x[j] in f64 (each float widened exactly), j < n.
  void (*accumulate_f64)(const float* x, double* acc, int64_t n);
};

enum class VecIsa : uint8_t { kSse2, kAvx2, kAvx512 };

// The best kernels this CPU runs (chosen on first use).
const VecKernels& Vec();
// The kernels of one ISA, or nullptr where this CPU (or OS) lacks it. Tests run every one.
const VecKernels* VecFor(VecIsa isa);

}  // namespace shardmap::cpu

#endif  // SHARDMAP_TENSOR_CPU_VEC_MATH_H_
