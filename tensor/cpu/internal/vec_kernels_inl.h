// The kernels of tensor/cpu/vec_math.h, written once over an ISA description and compiled once
// per ISA (vec_sse2.cc, vec_avx2.cc, vec_avx512.cc, each with its own -m flags). Include it only
// inside an anonymous namespace, after defining
//
//   struct Isa {
//     typedef float V __attribute__((vector_size(64)));  // one SIMD register of floats
//     typedef float H __attribute__((vector_size(32)));   // half of it
//     typedef double D __attribute__((vector_size(64)));  // H widened to f64
//     static constexpr int kLanes = 16;
//     static V Exp(V), Log(V), Tanh(V);  // SLEEF's (exp, log) / libmvec's (tanh) for the ISA
//     static V Min(V a, V b);  // a < b ? a : b (b where either is NaN): one min instruction
//     static V Fma(V a, V b, V c);  // a * b + c, rounded once where the ISA has FMA
//     // dst[m * ds + k] = src[k * ss + m] for k, m < kLanes: one register-sized square of
//     // 32-bit elements transposed in registers (intrinsics: the shuffles are per ISA); with
//     // kStream, non-temporal stores to 16-byte aligned dst rows, ordered by StreamFence().
//     template <bool kStream> static void Transpose(const void* src, int64_t ss, void* dst,
//                                                   int64_t ds);
//     static void StreamFence();
//   };
//
// so nothing here gets external linkage: an AVX-512 copy of an inline function must never be
// picked by the linker for code that runs on a CPU without AVX-512. No #include for that reason.
// Arithmetic uses GCC vector extensions, so the same text becomes SSE2, AVX2 or AVX-512 code.

template <class I>
inline typename I::V Load(const float* p) {
  typename I::V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class I>
inline void Store(float* p, typename I::V v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// y[i] = f(x[i]); the tail goes through a zero-padded block of one register.
template <class I, class F>
inline void Map1(const float* x, float* y, int64_t n, F f) {
  constexpr int W = I::kLanes;
  int64_t i = 0;
  for (; i + W <= n; i += W) Store<I>(y + i, f(Load<I>(x + i)));
  if (i < n) {
    float bx[W] = {}, by[W];
    __builtin_memcpy(bx, x + i, (n - i) * sizeof(float));
    Store<I>(by, f(Load<I>(bx)));
    __builtin_memcpy(y + i, by, (n - i) * sizeof(float));
  }
}

// z[i] = f(x[i], y[i]).
template <class I, class F>
inline void Map2(const float* x, const float* y, float* z, int64_t n, F f) {
  constexpr int W = I::kLanes;
  int64_t i = 0;
  for (; i + W <= n; i += W) Store<I>(z + i, f(Load<I>(x + i), Load<I>(y + i)));
  if (i < n) {
    float bx[W] = {}, by[W] = {}, bz[W];
    __builtin_memcpy(bx, x + i, (n - i) * sizeof(float));
    __builtin_memcpy(by, y + i, (n - i) * sizeof(float));
    Store<I>(bz, f(Load<I>(bx), Load<I>(by)));
    __builtin_memcpy(z + i, bz, (n - i) * sizeof(float));
  }
}

template <class I>
struct Math {
  using V = typename I::V;
  static constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  static constexpr float kInvSqrt2 = 0.70710678118654752440f;
  static constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  static constexpr float kGeluC = 0.044715f;

  static V Sigmoid(V x) { return 1.0f / (1.0f + I::Exp(-x)); }
  static V Silu(V x) { return x / (1.0f + I::Exp(-x)); }
  // 0.5 x (1 + tanh(u)) = x sigmoid(2u): no cancellation for negative x.
  static V GeluTanhU(V x) { return kSqrt2OverPi * (x + kGeluC * x * x * x); }
  static V GeluTanh(V x) { return x / (1.0f + I::Exp(-2.0f * GeluTanhU(x))); }
  // GELU with erf on our own erfc, one formula for every lane (no per-range branches): for
  // a = |x| / sqrt 2, erfc(a) = exp(-a^2) erfcx(a), and erfcx(a) = exp(a^2) erfc(a), smooth and
  // falling from 1 to about 1 / (a sqrt(pi)), is a degree-10 polynomial in t = (a - 1.5) / (a +
  // 1.5) in [-1, 0.72] (our Chebyshev interpolation, printed by `bazel run
  // //tensor/cpu:fit_erfcx`; kept halved here, so q below is erfc(a) / 2 without the power of 2).
  // t takes a true division: the divider runs beside the FMA ports, and a reciprocal estimate
  // with Newton steps (rcp14 + 1, rcp + 2) measured no faster on AVX-512 (0.56 ns per element
  // forward either way, 0.67 against 0.62 for the gradient) and 11% slower on AVX2. exp(-a^2) =
  // exp(-x^2 / 2) = 2^k exp(u / 2) with k = round(-x^2 / (2 ln 2)) and u = -x^2 - 2 k ln 2 formed
  // in one fused multiply-add, so x^2 enters unrounded (no input slack needed where the ISA has
  // FMA), and exp(u / 2) a degree-6 polynomial (|u / 2| <= ln 2 / 2, fitted by the same tool,
  // 0.8 ulp). 2^k is built from the exponent bits and multiplied in last, so results down in the
  // subnormals are rounded once. |x| is clamped to 13.25, where k reaches -127 and 2^k reads 0:
  // the tail flushes to 0 for |x| > 13.24 (below 2^-127), every intermediate stays finite, and
  // infinities and NaN come out of the final operations with x as the textbook formula gives.
  // Per 16 lanes (AVX-512): 36 vector instructions; SLEEF's exp call it replaced cost 0.57 ns
  // per element alone here, about the whole kernel now (0.55, in cache).
  typedef int32_t U __attribute__((vector_size(sizeof(V))));
  static constexpr float kErfcXMax = 13.25f;  // k = round(-13.25^2 / (2 ln 2)) = -127
  struct HalfErfc {
    V q;   // erfc(a) / 2 / s
    V m;   // exp(-a^2) / s
    V s;   // 2^k (0 for |x| > 13.24)
    V ax;  // |x|, clamped
  };
  static HalfErfc Erfc2(V x) {
    const V ax = I::Min((V)((U)x & 0x7fffffff), V{} + kErfcXMax);  // NaN -> the clamp too
    // k: the nearest integer to -a^2 log2(e), in the low bits of kk (1.5 * 2^23 + 127 + k).
    const V kk = (ax * ax) * -0.72134752044448170f + 12583039.0f;
    const V k = kk - 12583039.0f;
    // u = 2 r = -x^2 - 2 k ln 2: x^2 unrounded inside the fused multiply-add, and k 2 ln2_hi
    // exact; exp(r) = exp(u / 2), the polynomial's coefficients scaled by powers of 2.
    V u = I::Fma(-ax, ax, -(k * 1.38629150390625f));
    u = u - k * 2.857213640618834464e-6f;  // 2 (ln 2 - ln2_hi)
    V m = u * (1.392691862e-03f / 64) + (8.363766596e-03f / 32);
    m = m * u + (4.166654870e-02f / 16);
    m = m * u + (1.666657329e-01f / 8);
    m = m * u + 0.125f;
    m = m * u + 0.5f;
    m = m * u + 1.0f;
    const V s = (V)((U)kk << 23);
    const V t = (ax * kInvSqrt2 - 1.5f) / (ax * kInvSqrt2 + 1.5f);
    V p = t * -2.448407394e-05f + -1.200569459e-04f;
    p = p * t + -1.378970628e-04f;
    p = p * t + 4.129073059e-04f;
    p = p * t + 1.432861784e-03f;
    p = p * t + -2.201415191e-04f;
    p = p * t + -9.312452748e-03f;
    p = p * t + -4.642474000e-03f;
    p = p * t + 9.724511950e-02f;
    p = p * t + -2.454343736e-01f;
    p = p * t + 1.607927084e-01f;
    return {m * p, m, s, ax};
  }
  // 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x) = max(x, 0) - |x| Phi(-|x|), Phi(-|x|) = erfc(a) / 2:
  // one fused multiply-add, so one rounding, into the subnormals too. max(x, 0) is taken as x -
  // min(x, 0), NaN at -inf as the textbook -inf * 0 (and NaN for NaN).
  static V GeluErf(V x) {
    const HalfErfc e = Erfc2(x);
    return (x - I::Min(x, V{})) - (e.ax * e.q) * e.s;
  }

  // gelu_tanh' = s + 2 x s (1 - s) u' with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u); written
  // s (1 + 2 x (e s) u'), as 1 - s = e s has no cancellation when s is near 1. Where s is 0 (e
  // overflowed) or e s is 0 the other factors may overflow (x^3 for |x| > 1e13): use the limit
  // (x * 0 keeps +-inf inputs NaN, as the unrearranged formula gives).
  static V GeluTanhDer(V x) {
    const V e = I::Exp(-2.0f * GeluTanhU(x));
    const V s = 1.0f / (1.0f + e);
    const V oms = e * s;
    const V du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
    const V zero = x * 0.0f;
    const V term = oms == 0.0f ? zero : 2.0f * x * oms * du;
    return s == 0.0f ? zero : s * (1.0f + term);
  }
  // gelu_erf' = Phi(x) + x phi(x), Phi(x) = erfc(-x / sqrt 2) / 2, phi = exp(-x^2 / 2) / sqrt(2 pi)
  // (the exp the erfc took), the power of 2 multiplied in last on the negative side.
  static V GeluErfDer(V x) {
    const HalfErfc e = Erfc2(x);
    const V xphi = x * kInvSqrt2Pi * e.m;  // x phi(x) / s
    const V neg = (e.q + xphi) * e.s;
    const V pos = (1.0f - e.q * e.s) + xphi * e.s;
    return x <= 0.0f ? neg : pos;
  }
  // silu' = s (1 + x (1 - s)) with s = 1 / (1 + e), e = exp(-x), 1 - s = e s (no cancellation);
  // s = 0 (e overflowed) gives the limit x * 0.
  static V SiluDer(V x) {
    const V e = I::Exp(-x);
    const V s = 1.0f / (1.0f + e);
    return s == 0.0f ? x * 0.0f : s * (1.0f + x * (e * s));
  }
};

template <class I>
void ExpK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return I::Exp(v); });
}
template <class I>
void LogK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return I::Log(v); });
}
template <class I>
void TanhK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return I::Tanh(v); });
}
template <class I>
void SigmoidK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return Math<I>::Sigmoid(v); });
}
template <class I>
void SiluK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return Math<I>::Silu(v); });
}
template <class I>
void GeluErfK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return Math<I>::GeluErf(v); });
}
template <class I>
void GeluTanhK(const float* x, float* y, int64_t n) {
  Map1<I>(x, y, n, [](auto v) { return Math<I>::GeluTanh(v); });
}
template <class I>
void GeluErfGradK(const float* x, const float* dy, float* dx, int64_t n) {
  Map2<I>(x, dy, dx, n, [](auto v, auto g) { return g * Math<I>::GeluErfDer(v); });
}
template <class I>
void GeluTanhGradK(const float* x, const float* dy, float* dx, int64_t n) {
  Map2<I>(x, dy, dx, n, [](auto v, auto g) { return g * Math<I>::GeluTanhDer(v); });
}
template <class I>
void SiluGradK(const float* x, const float* dy, float* dx, int64_t n) {
  Map2<I>(x, dy, dx, n, [](auto v, auto g) { return g * Math<I>::SiluDer(v); });
}

// One pass per row: pre = x + bias written back, y = gelu(pre).
template <class I, bool kTanh>
void BiasGeluK(float* x_pre, const float* bias, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* pre = x_pre + r * cols;
    float* out = y + r * cols;
    Map2<I>(pre, bias, pre, cols, [](auto v, auto b) { return v + b; });
    Map1<I>(pre, out, cols, [](auto v) {
      return kTanh ? Math<I>::GeluTanh(v) : Math<I>::GeluErf(v);
    });
  }
}

// Per row: dx = dy * gelu'(pre), then the row (still in L1) added into the f64 bias gradient.
template <class I, bool kTanh>
void GeluGradBiasK(const float* pre, const float* dy, float* dx, double* dbias, int64_t rows,
                   int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dx + r * cols;
    Map2<I>(pre + r * cols, dy + r * cols, out, cols, [](auto v, auto g) {
      return g * (kTanh ? Math<I>::GeluTanhDer(v) : Math<I>::GeluErfDer(v));
    });
    for (int64_t j = 0; j < cols; ++j) dbias[j] += out[j];
  }
}

// NaN-propagating max, the exact way: a lane that saw a NaN keeps it (two compares and a blend
// per register).
template <class I>
float MaxExact(const float* x, int64_t n) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  V m = V{} - __builtin_inff(), m2 = m;  // all lanes -inf; two chains hide the latency
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V v = Load<I>(x + i), v2 = Load<I>(x + i + W);
    m = (v > m) | (v != v) ? v : m;
    m2 = (v2 > m2) | (v2 != v2) ? v2 : m2;
  }
  for (; i + W <= n; i += W) {
    const V v = Load<I>(x + i);
    m = (v > m) | (v != v) ? v : m;
  }
  m = (m2 > m) | (m2 != m2) ? m2 : m;
  float lanes[W];
  Store<I>(lanes, m);
  float best = -__builtin_inff();
  for (int k = 0; k < W; ++k) best = lanes[k] > best || lanes[k] != lanes[k] ? lanes[k] : best;
  for (; i < n; ++i) best = x[i] > best || x[i] != x[i] ? x[i] : best;
  return best;
}

// The max on finite rows at half the instructions: a plain max per register (one max
// instruction, which drops NaNs) and a probe sum of x * 0, which is NaN exactly when the row
// holds a NaN or an infinity; such rows are redone by MaxExact.
template <class I>
float MaxK(const float* x, int64_t n) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  V m0 = V{} - __builtin_inff(), m1 = m0, m2 = m0, m3 = m0;  // four chains hide the latency
  V probe = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const V a = Load<I>(x + i), b = Load<I>(x + i + W);
    const V c = Load<I>(x + i + 2 * W), d = Load<I>(x + i + 3 * W);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
    m2 = c > m2 ? c : m2;
    m3 = d > m3 ? d : m3;
    probe += (a + b + c + d) * 0.0f;
  }
  for (; i + W <= n; i += W) {
    const V a = Load<I>(x + i);
    m0 = a > m0 ? a : m0;
    probe += a * 0.0f;
  }
  m0 = m1 > m0 ? m1 : m0;
  m2 = m3 > m2 ? m3 : m2;
  m0 = m2 > m0 ? m2 : m0;
  float lanes[W], probes[W];
  Store<I>(lanes, m0);
  Store<I>(probes, probe);
  float best = -__builtin_inff(), p = 0;
  for (int k = 0; k < W; ++k) {
    best = lanes[k] > best ? lanes[k] : best;
    p += probes[k];
  }
  for (; i < n; ++i) {
    best = x[i] > best ? x[i] : best;
    p += x[i] * 0.0f;
  }
  return p == 0.0f ? best : MaxExact<I>(x, n);
}

// Reductions in f64: each register is converted as two halves (I::H floats -> I::D doubles).
template <class I, class F>
double SumF64(const float* x, const float* y, int64_t n, F term) {
  constexpr int W = I::kLanes, Hw = W / 2;
  using H = typename I::H;
  using D = typename I::D;
  D a0 = {}, a1 = {}, b0 = {}, b1 = {};  // four chains hide the add latency
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    H x0, x1, x2, x3, y0 = {}, y1 = {}, y2 = {}, y3 = {};
    __builtin_memcpy(&x0, x + i, sizeof x0);
    __builtin_memcpy(&x1, x + i + Hw, sizeof x1);
    __builtin_memcpy(&x2, x + i + W, sizeof x2);
    __builtin_memcpy(&x3, x + i + W + Hw, sizeof x3);
    if (y) {
      __builtin_memcpy(&y0, y + i, sizeof y0);
      __builtin_memcpy(&y1, y + i + Hw, sizeof y1);
      __builtin_memcpy(&y2, y + i + W, sizeof y2);
      __builtin_memcpy(&y3, y + i + W + Hw, sizeof y3);
    }
    a0 += term(__builtin_convertvector(x0, D), __builtin_convertvector(y0, D));
    a1 += term(__builtin_convertvector(x1, D), __builtin_convertvector(y1, D));
    b0 += term(__builtin_convertvector(x2, D), __builtin_convertvector(y2, D));
    b1 += term(__builtin_convertvector(x3, D), __builtin_convertvector(y3, D));
  }
  a0 += b0;
  a1 += b1;
  for (; i + W <= n; i += W) {
    H x0, x1, y0 = {}, y1 = {};
    __builtin_memcpy(&x0, x + i, sizeof x0);
    __builtin_memcpy(&x1, x + i + Hw, sizeof x1);
    if (y) {
      __builtin_memcpy(&y0, y + i, sizeof y0);
      __builtin_memcpy(&y1, y + i + Hw, sizeof y1);
    }
    a0 += term(__builtin_convertvector(x0, D), __builtin_convertvector(y0, D));
    a1 += term(__builtin_convertvector(x1, D), __builtin_convertvector(y1, D));
  }
  a0 += a1;
  double total = 0;
  for (int k = 0; k < Hw; ++k) total += a0[k];
  for (; i < n; ++i) {
    D xs = {}, ys = {};
    xs[0] = x[i];
    ys[0] = y ? y[i] : 0.0f;
    total += term(xs, ys)[0];
  }
  return total;
}

// Row sum: four f32 chains of kSumChain registers each, added in pairs, each pair's sum widened
// and added in f64. Every element passes through at most kSumChain f32 additions, so the error is
// at most kSumChain f32 ulp of sum |x| (plus f64 rounding); PyTorch's f32 cascade sum has a
// similar bound. Rows of [4096,1024] f32 (mostly out of L3): 0.92-1.0x PyTorch's time with
// chains of 8, 0.85-0.9x with groups of 4 widened each time (2 ulp), whose converts cost.
constexpr int kSumChain = 8;
template <class I>
double SumK(const float* x, int64_t n) {
  constexpr int W = I::kLanes, Hw = W / 2;
  using V = typename I::V;
  using H = typename I::H;
  using D = typename I::D;
  auto widen_add = [](V t, D& lo_acc, D& hi_acc) {
    H lo, hi;
    __builtin_memcpy(&lo, &t, sizeof lo);
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&t) + sizeof lo, sizeof hi);
    lo_acc += __builtin_convertvector(lo, D);
    hi_acc += __builtin_convertvector(hi, D);
  };
  auto at = [&](int64_t i) { return Load<I>(x + i); };
  D a0 = {}, a1 = {}, b0 = {}, b1 = {};  // two pairs of f64 chains hide the add latency
  int64_t i = 0;
  constexpr int64_t kStep = 4 * W;  // one register of each f32 chain
  while (i + kSumChain * kStep <= n) {
    V s0 = at(i), s1 = at(i + W), s2 = at(i + 2 * W), s3 = at(i + 3 * W);
    i += kStep;
    for (int k = 1; k < kSumChain; ++k, i += kStep) {
      s0 += at(i), s1 += at(i + W), s2 += at(i + 2 * W), s3 += at(i + 3 * W);
    }
    widen_add(s0 + s1, a0, a1);
    widen_add(s2 + s3, b0, b1);
  }
  for (; i + W <= n; i += W) widen_add(at(i), a0, a1);
  a0 += b0;
  a1 += b1;
  a0 += a1;
  double total = 0;
  for (int k = 0; k < Hw; ++k) total += a0[k];
  for (; i < n; ++i) total += x[i];
  return total;
}

// Dot products: two f32 chains of x * y per block of kDotBlock registers (one multiply-add per
// register), each block's lanes then added in f64: error at most kDotBlock / 2 + 1 f32 ulp of
// sum |x y| (plus f64 rounding). A dot is a softmax backward's reduction pass, where the widening
// tree SumK uses measured 10-15% slower (softmax_backward [4096,1024]: 1.9-2.1 -> 1.6-1.9
// ms).
constexpr int kDotBlock = 8;
template <class I>
double DotK(const float* x, const float* y, int64_t n) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  double total = 0;
  int64_t i = 0;
  while (i + 2 * W <= n) {
    V a = {}, b = {};
    for (int k = 0; k < kDotBlock && i + 2 * W <= n; k += 2, i += 2 * W) {
      a += Load<I>(x + i) * Load<I>(y + i);
      b += Load<I>(x + i + W) * Load<I>(y + i + W);
    }
    float la[W], lb[W];
    Store<I>(la, a);
    Store<I>(lb, b);
    for (int k = 0; k < W; ++k) total += static_cast<double>(la[k]) + lb[k];
  }
  for (; i < n; ++i) total += static_cast<double>(x[i]) * y[i];
  return total;
}
template <class I>
double SumSqDiffK(const float* x, double c, int64_t n) {
  return SumF64<I>(x, nullptr, n, [c](auto v, auto) { return (v - c) * (v - c); });
}

template <class I>
double ExpShiftSumK(const float* x, float shift, float* y, int64_t n) {
  constexpr int W = I::kLanes;
  constexpr int kBlock = 16;  // registers summed in f32 before the f64 total
  using V = typename I::V;
  double total = 0;
  int64_t i = 0;
  while (i + W <= n) {
    V acc = {};
    for (int b = 0; b < kBlock && i + W <= n; ++b, i += W) {
      const V e = I::Exp(Load<I>(x + i) - shift);
      if (y) Store<I>(y + i, e);
      acc += e;
    }
    float lanes[W];
    Store<I>(lanes, acc);
    for (int k = 0; k < W; ++k) total += lanes[k];
  }
  if (i < n) {
    float bx[W], be[W];
    for (int k = 0; k < W; ++k) bx[k] = i + k < n ? x[i + k] - shift : -__builtin_inff();
    Store<I>(be, I::Exp(Load<I>(bx)));
    for (int k = 0; i + k < n; ++k) {
      if (y) y[i + k] = be[k];
      total += be[k];
    }
  }
  return total;
}

// Norm backward pass 1 over R consecutive rows of n (xhat = (x - mean) * rstd, dxhat = dy * g, g
// null meaning 1, mean null meaning 0): adds dy * xhat into dg and dy into db (db may be null),
// row by row in order, so each dg element sees the same f32 additions as one row at a time, but
// dg and db are read and written once per R rows; returns sums[2r] = sum(dxhat) and sums[2r + 1] =
// sum(dxhat * xhat) of row r: f32 lanes within blocks of kNormBlock registers, then f64. The tail
// runs on padded lanes with dy = 0 and x = mean, so they add exactly nothing.
constexpr int kNormBlock = 8;
constexpr int kNormRows = 4;
template <class I, int R>
void NormBwdSumsRows(const float* x, const float* dy, const float* g, const float* mean,
                     const float* rstd, float* dg, float* db, int64_t n, double* sums) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  double s1[R] = {}, s2[R] = {};
  float m[R];
  for (int r = 0; r < R; ++r) m[r] = mean ? mean[r] : 0.0f;
  // One register of columns: xs(r) / ds(r) give row r's x / dy at these columns.
  auto step = [&](auto xs, auto ds, const float* gp, float* dgp, float* dbp, V* a1, V* a2) {
    const V gv = gp ? Load<I>(gp) : V{} + 1.0f;
    V dgv = Load<I>(dgp), dbv = dbp ? Load<I>(dbp) : V{};
    for (int r = 0; r < R; ++r) {
      const V xhat = (xs(r) - m[r]) * rstd[r];
      const V d = ds(r);
      const V dxhat = gp ? d * gv : d;
      a1[r] += dxhat;
      a2[r] += dxhat * xhat;
      dgv += d * xhat;
      dbv += d;
    }
    Store<I>(dgp, dgv);
    if (dbp) Store<I>(dbp, dbv);
  };
  auto flush = [&](const V* a1, const V* a2) {
    for (int r = 0; r < R; ++r) {
      float l1[W], l2[W];
      Store<I>(l1, a1[r]);
      Store<I>(l2, a2[r]);
      for (int k = 0; k < W; ++k) s1[r] += l1[k], s2[r] += l2[k];
    }
  };
  int64_t i = 0;
  while (i + W <= n) {
    V a1[R] = {}, a2[R] = {};
    for (int b = 0; b < kNormBlock && i + W <= n; ++b, i += W) {
      step([&](int r) { return Load<I>(x + r * n + i); },
           [&](int r) { return Load<I>(dy + r * n + i); }, g ? g + i : nullptr, dg + i,
           db ? db + i : nullptr, a1, a2);
    }
    flush(a1, a2);
  }
  if (i < n) {
    const int64_t t = n - i;
    float bx[R][W], bdy[R][W] = {}, bg[W] = {}, bdg[W] = {}, bdb[W] = {};
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < W; ++k) bx[r][k] = m[r];
      __builtin_memcpy(bx[r], x + r * n + i, t * sizeof(float));
      __builtin_memcpy(bdy[r], dy + r * n + i, t * sizeof(float));
    }
    if (g) __builtin_memcpy(bg, g + i, t * sizeof(float));
    __builtin_memcpy(bdg, dg + i, t * sizeof(float));
    if (db) __builtin_memcpy(bdb, db + i, t * sizeof(float));
    V a1[R] = {}, a2[R] = {};
    step([&](int r) { return Load<I>(bx[r]); }, [&](int r) { return Load<I>(bdy[r]); },
         g ? bg : nullptr, bdg, db ? bdb : nullptr, a1, a2);
    flush(a1, a2);
    __builtin_memcpy(dg + i, bdg, t * sizeof(float));
    if (db) __builtin_memcpy(db + i, bdb, t * sizeof(float));
  }
  for (int r = 0; r < R; ++r) {
    sums[2 * r] = s1[r];
    sums[2 * r + 1] = s2[r];
  }
}
template <class I>
void NormBwdSumsK(const float* x, const float* dy, const float* g, const float* mean,
                  const float* rstd, float* dg, float* db, int64_t n, int64_t rows,
                  double* sums) {
  int64_t r = 0;
  for (; r + kNormRows <= rows; r += kNormRows) {
    NormBwdSumsRows<I, kNormRows>(x + r * n, dy + r * n, g, mean ? mean + r : nullptr, rstd + r,
                                  dg, db, n, sums + 2 * r);
  }
  for (; r < rows; ++r) {
    NormBwdSumsRows<I, 1>(x + r * n, dy + r * n, g, mean ? mean + r : nullptr, rstd + r, dg, db,
                          n, sums + 2 * r);
  }
}

// Norm backward pass 2: dx = rstd * (dxhat - a - xhat * c).
template <class I>
void NormBwdDxK(const float* x, const float* dy, const float* g, float mean, float rstd, float a,
                float c, float* dx, int64_t n) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  auto f = [&](V xv, V d, V gv) {
    const V xhat = (xv - mean) * rstd;
    return rstd * (d * gv - a - xhat * c);
  };
  const V one = V{} + 1.0f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    Store<I>(dx + i, f(Load<I>(x + i), Load<I>(dy + i), g ? Load<I>(g + i) : one));
  }
  if (i < n) {
    const int64_t t = n - i;
    float bx[W] = {}, bdy[W] = {}, bg[W], bdx[W];
    for (int k = 0; k < W; ++k) bg[k] = 1.0f;
    __builtin_memcpy(bx, x + i, t * sizeof(float));
    __builtin_memcpy(bdy, dy + i, t * sizeof(float));
    if (g) __builtin_memcpy(bg, g + i, t * sizeof(float));
    Store<I>(bdx, f(Load<I>(bx), Load<I>(bdy), Load<I>(bg)));
    __builtin_memcpy(dx + i, bdx, t * sizeof(float));
  }
}

// z = x op y elementwise (IEEE-exact ops: the same bits as a scalar loop).
template <class I>
void AddK(const float* x, const float* y, float* z, int64_t n) {
  Map2<I>(x, y, z, n, [](auto a, auto b) { return a + b; });
}
template <class I>
void SubK(const float* x, const float* y, float* z, int64_t n) {
  Map2<I>(x, y, z, n, [](auto a, auto b) { return a - b; });
}
template <class I>
void MulK(const float* x, const float* y, float* z, int64_t n) {
  Map2<I>(x, y, z, n, [](auto a, auto b) { return a * b; });
}
template <class I>
void DivK(const float* x, const float* y, float* z, int64_t n) {
  Map2<I>(x, y, z, n, [](auto a, auto b) { return a / b; });
}

// acc[j] += x[j] in f64 (each float widened exactly): column sums over rows, e.g. a bias gradient.
template <class I>
void AccumulateF64K(const float* x, double* acc, int64_t n) {
  constexpr int W = I::kLanes, Hw = W / 2;
  using H = typename I::H;
  using D = typename I::D;
  int64_t i = 0;
  for (; i + Hw <= n; i += Hw) {
    H h;
    D a;
    __builtin_memcpy(&h, x + i, sizeof h);
    __builtin_memcpy(&a, acc + i, sizeof a);
    a += __builtin_convertvector(h, D);
    __builtin_memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) acc[i] += x[i];
}

// y = x * s.
template <class I>
void ScaleK(const float* x, float s, float* y, int64_t n) {
  Map1<I>(x, y, n, [s](auto v) { return v * s; });
}
// y = x + c.
template <class I>
void ShiftK(const float* x, float c, float* y, int64_t n) {
  Map1<I>(x, y, n, [c](auto v) { return v + c; });
}

// y = (x - mean) * rstd * g + b, g and b optional (null: 1 and 0); the layer/RMS norm epilogue.
template <class I>
void NormAffineK(const float* x, float mean, float rstd, const float* g, const float* b, float* y,
                 int64_t n) {
  constexpr int W = I::kLanes;
  using V = typename I::V;
  auto f = [&](V xv, const float* gp, const float* bp) {
    V v = (xv - mean) * rstd;
    if (gp) v *= Load<I>(gp);
    if (bp) v += Load<I>(bp);
    return v;
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    Store<I>(y + i, f(Load<I>(x + i), g ? g + i : nullptr, b ? b + i : nullptr));
  }
  if (i < n) {
    const int64_t t = n - i;
    float bx[W] = {}, bg[W] = {}, bb[W] = {}, by[W];
    __builtin_memcpy(bx, x + i, t * sizeof(float));
    if (g) __builtin_memcpy(bg, g + i, t * sizeof(float));
    if (b) __builtin_memcpy(bb, b + i, t * sizeof(float));
    Store<I>(by, f(Load<I>(bx), g ? bg : nullptr, b ? bb : nullptr));
    __builtin_memcpy(y + i, by, t * sizeof(float));
  }
}

// Softmax backward over one row, given acc = sum(dy * y): dx = y * (dy - acc).
template <class I>
void SoftmaxBwdK(const float* y, const float* dy, float acc, float* dx, int64_t n) {
  Map2<I>(y, dy, dx, n, [acc](auto v, auto g) { return v * (g - acc); });
}
// Log-softmax backward over one row, given acc = sum(dy): dx = dy - exp(y) * acc.
template <class I>
void LogSoftmaxBwdK(const float* y, const float* dy, float acc, float* dx, int64_t n) {
  Map2<I>(y, dy, dx, n, [acc](auto v, auto g) { return g - I::Exp(v) * acc; });
}

// out[r * os + c] = in[c * is + r] for r < rows, c < cols (32-bit elements, bits moved
// unchanged), in register-sized squares (I::Transpose) with scalar edges.
//   - With `stream` (the caller's whole output is far larger than the caches), outputs whose
//     64-byte lines the squares fill whole are written with streaming stores, walking strips of
//     one line's worth of input rows along r: the reads are 16 sequential streams the
//     prefetchers follow, and no output line is read for ownership. Measured on f32
//     [4096,1024]: 0.25 of a memcpy blocked with plain stores, 0.65-0.8 this way.
//   - Otherwise (cache-resident outputs) blocks of kTransposeBlock squared with plain stores.
constexpr int64_t kTransposeBlock = 64;
// On the streaming path the hardware prefetchers still lag 16 streams at once: a software
// prefetch 32 floats ahead on each row made [4096,1024] and [512,8192] 7-10% faster here
// (0.64-0.86 of a memcpy; 16 and 48 ahead were no better). A prefetch past a row never faults.
constexpr int64_t kAhead = 32;
template <class I>
void Transpose32K(const void* in_v, int64_t is, void* out_v, int64_t os, int64_t rows,
                  int64_t cols, bool stream) {
  constexpr int W = I::kLanes;
  constexpr int kLine = 16;  // 32-bit elements per 64-byte line
  const uint32_t* in = static_cast<const uint32_t*>(in_v);
  uint32_t* out = static_cast<uint32_t*>(out_v);
  auto edges = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) out[r * os + c] = in[c * is + r];
    }
  };
  if (stream && os % kLine == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0) {
    const int64_t full_r = rows / W * W, full_c = cols / kLine * kLine;
    for (int64_t c = 0; c < full_c; c += kLine) {
      for (int64_t r = 0; r < full_r; r += W) {
        if (r % kLine == 0) {
          for (int k = 0; k < kLine; ++k) __builtin_prefetch(in + (c + k) * is + r + kAhead);
        }
        for (int k = 0; k < kLine; k += W) {  // the squares that fill these output lines
          I::template Transpose<true>(in + (c + k) * is + r, is, out + r * os + c + k, os);
        }
      }
    }
    I::StreamFence();  // order the streaming stores before the tensor is handed out
    edges(0, full_r, full_c, cols);
    edges(full_r, rows, 0, cols);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kTransposeBlock) {
    const int64_t r1 = r0 + kTransposeBlock < rows ? r0 + kTransposeBlock : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTransposeBlock) {
      const int64_t c1 = c0 + kTransposeBlock < cols ? c0 + kTransposeBlock : cols;
      int64_t r = r0;
      for (; r + W <= r1; r += W) {
        int64_t c = c0;
        for (; c + W <= c1; c += W) {
          I::template Transpose<false>(in + c * is + r, is, out + r * os + c, os);
        }
        edges(r, r + W, c, c1);
      }
      edges(r, r1, c0, c1);
    }
  }
}

template <class I>
constexpr VecKernels MakeKernels(const char* isa) {
  return VecKernels{isa,
                    &ExpK<I>,
                    &LogK<I>,
                    &TanhK<I>,
                    &SigmoidK<I>,
                    &SiluK<I>,
                    &GeluErfK<I>,
                    &GeluTanhK<I>,
                    &GeluErfGradK<I>,
                    &GeluTanhGradK<I>,
                    &SiluGradK<I>,
                    &BiasGeluK<I, false>,
                    &BiasGeluK<I, true>,
                    &GeluGradBiasK<I, false>,
                    &GeluGradBiasK<I, true>,
                    &MaxK<I>,
                    &ExpShiftSumK<I>,
                    &SumK<I>,
                    &DotK<I>,
                    &SumSqDiffK<I>,
                    &NormBwdSumsK<I>,
                    &NormBwdDxK<I>,
                    &ScaleK<I>,
                    &ShiftK<I>,
                    &NormAffineK<I>,
                    &SoftmaxBwdK<I>,
                    &LogSoftmaxBwdK<I>,
                    &Transpose32K<I>,
                    &AddK<I>,
                    &SubK<I>,
                    &MulK<I>,
                    &DivK<I>,
                    &AccumulateF64K<I>};
}
