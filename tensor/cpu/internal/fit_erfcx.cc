// Prints the coefficients of the two polynomials behind GELU with erf in vec_kernels_inl.h
// (Math::Erfc2), so they can be checked and refitted:
//   - erfcx(a) = exp(a^2) erfc(a) as a polynomial of degree kDegree in t = (a - kK) / (a + kK),
//     by Chebyshev interpolation in long double on a in [0, kAMax] (t in [-1, t(kAMax)]),
//     converted to monomials in t and rounded to f32 (the kernel keeps them halved: erfc / 2);
//   - exp(r) = 1 + r + r^2 g(r) on |r| <= kRMax (ln 2 / 2 and a margin), g of degree
//     kExpDegree - 2 interpolated the same way (the kernel evaluates it in u = 2r, each
//     coefficient divided by 2^i).
//
//   bazel run //tensor/cpu:fit_erfcx
//
// It also prints the largest error of each f32 evaluation (t rounded, Horner with fused
// multiply-adds) against long double: erfcx on grids of a in [0, 3] and [3, 9], where it grows
// with a (t's rounding is amplified and the sum nearly cancels), and exp on |r| <= kRMax.
// vec_math_test checks what they give together.
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

using LD = long double;
constexpr int kDegree = 10, kExpDegree = 6;
constexpr LD kK = 1.5L, kAMax = 10.5L, kRMax = 0.35L;

LD Erfcx(LD a) { return expl(a * a) * erfcl(a); }

// Chebyshev interpolation of f on [lo, hi] at `degree` + 1 nodes, as monomials in the variable.
std::vector<LD> ChebyshevMonomials(const std::function<LD(LD)>& f, LD lo, LD hi, int degree) {
  const int m = degree + 1;
  const LD c = (hi + lo) / 2, h = (hi - lo) / 2;  // v = c + h u, u in [-1, 1]
  std::vector<LD> fv(m), cheb(m, 0);
  for (int j = 0; j < m; ++j) fv[j] = f(c + h * cosl(M_PIl * (j + 0.5L) / m));
  for (int k = 0; k < m; ++k) {
    for (int j = 0; j < m; ++j) cheb[k] += fv[j] * cosl(M_PIl * k * (j + 0.5L) / m);
    cheb[k] *= (k == 0 ? 1.0L : 2.0L) / m;
  }
  // Chebyshev series in u -> monomials in u (T_k by the recurrence) -> monomials in v.
  std::vector<std::vector<LD>> T(m, std::vector<LD>(m, 0));
  T[0][0] = 1;
  if (m > 1) T[1][1] = 1;
  for (int k = 2; k < m; ++k) {
    for (int i = 0; i < m; ++i) T[k][i] = (i > 0 ? 2 * T[k - 1][i - 1] : 0) - T[k - 2][i];
  }
  std::vector<LD> in_u(m, 0), in_v(m, 0);
  for (int k = 0; k < m; ++k) {
    for (int i = 0; i < m; ++i) in_u[i] += cheb[k] * T[k][i];
  }
  for (int i = 0; i < m; ++i) {  // ((v - c) / h)^i, binomially
    LD binom = 1;
    for (int j = 0; j <= i; ++j) {
      if (j > 0) binom = binom * (i - j + 1) / j;
      in_v[j] += in_u[i] * binom * powl(-c, i - j) / powl(h, i);
    }
  }
  return in_v;
}

float Horner(const std::vector<float>& coef, float v) {
  float p = coef.back();
  for (int i = static_cast<int>(coef.size()) - 2; i >= 0; --i) p = std::fma(p, v, coef[i]);
  return p;
}

double UlpErr(LD got, LD ref) { return static_cast<double>(fabsl(got - ref) / ldexpl(1, ilogbl(ref) - 23)); }

}  // namespace

int main() {
  const LD tmax = (kAMax - kK) / (kAMax + kK);
  std::vector<float> coef;
  for (LD v : ChebyshevMonomials([](LD t) { return Erfcx(kK * (1 + t) / (1 - t)); }, -1, tmax,
                                 kDegree)) {
    coef.push_back(static_cast<float>(v));
  }
  double worst[2] = {0, 0};
  for (LD a = 0; a <= 9; a += 1.0L / 16384) {
    const float af = static_cast<float>(a);
    const float t = (af - static_cast<float>(kK)) / (af + static_cast<float>(kK));
    const double err = UlpErr(Horner(coef, t), Erfcx(af));
    double& w = worst[a <= 3 ? 0 : 1];
    if (err > w) w = err;
  }
  std::printf("erfcx(a) ~ p(t), t = (a - %.2Lf) / (a + %.2Lf), degree %d, fitted on a in [0, %.2Lf]\n",
              kK, kK, kDegree, kAMax);
  std::printf("f32 evaluation error: %.2f ulp of erfcx on a in [0, 3], %.2f on [3, 9]\n", worst[0],
              worst[1]);
  std::printf("coefficients, t^0 first (the kernel's are these halved):\n");
  for (float v : coef) std::printf("  %.9ef\n", v);

  std::vector<float> ecoef = {1.0f, 1.0f};
  for (LD v : ChebyshevMonomials(
           [](LD r) { return fabsl(r) < 1e-5L ? 0.5L + r / 6 : (expl(r) - 1 - r) / (r * r); },
           -kRMax, kRMax, kExpDegree - 2)) {
    ecoef.push_back(static_cast<float>(v));
  }
  double eworst = 0;
  for (LD r = -kRMax; r <= kRMax; r += kRMax / 65536) {
    const float rf = static_cast<float>(r);
    eworst = std::max(eworst, UlpErr(Horner(ecoef, rf), expl(rf)));
  }
  std::printf("exp(r) ~ 1 + r + r^2 g(r), degree %d, on |r| <= %.2Lf: f32 evaluation error %.2f ulp\n",
              kExpDegree, kRMax, eworst);
  std::printf("coefficients, r^0 first (the kernel's: divided by 2^i, for u = 2r):\n");
  for (float v : ecoef) std::printf("  %.9ef\n", v);
}
