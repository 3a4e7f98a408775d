// Prints the coefficients of the erfcx polynomial in vec_kernels_inl.h (Math::Erfc), so they can
// be checked and refitted: erfcx(a) = exp(a^2) erfc(a) as a polynomial of degree kDegree in
// t = (a - kK) / (a + kK), by Chebyshev interpolation in long double on a in [0, kAMax] (t in
// [-1, t(kAMax)]), converted to monomials in t and rounded to f32.
//
//   bazel run //tensor/cpu:fit_erfcx
//
// It also prints the largest error of the f32 evaluation (t rounded, Horner) against long double
// erfcx on grids of a in [0, 3] and [3, 9]. It grows with a, where t's rounding is amplified, but
// so does the GELU bound's allowance: a 2-ulp move of the input moves exp(-a^2) by 4 a^2 ulp.
#include <cmath>
#include <cstdio>
#include <vector>

namespace {

using LD = long double;
constexpr int kDegree = 10;
constexpr LD kK = 1.5L, kAMax = 10.5L;

LD Erfcx(LD a) { return expl(a * a) * erfcl(a); }

}  // namespace

int main() {
  const int m = kDegree + 1;
  const LD tmin = -1, tmax = (kAMax - kK) / (kAMax + kK);
  const LD c = (tmax + tmin) / 2, h = (tmax - tmin) / 2;  // t = c + h u, u in [-1, 1]
  std::vector<LD> f(m), cheb(m, 0);
  for (int j = 0; j < m; ++j) {
    const LD t = c + h * cosl(M_PIl * (j + 0.5L) / m);
    f[j] = Erfcx(kK * (1 + t) / (1 - t));
  }
  for (int k = 0; k < m; ++k) {
    for (int j = 0; j < m; ++j) cheb[k] += f[j] * cosl(M_PIl * k * (j + 0.5L) / m);
    cheb[k] *= (k == 0 ? 1.0L : 2.0L) / m;
  }
  // Chebyshev series in u -> monomials in u (T_k by the recurrence) -> monomials in t.
  std::vector<std::vector<LD>> T(m, std::vector<LD>(m, 0));
  T[0][0] = 1;
  T[1][1] = 1;
  for (int k = 2; k < m; ++k) {
    for (int i = 0; i < m; ++i) T[k][i] = (i > 0 ? 2 * T[k - 1][i - 1] : 0) - T[k - 2][i];
  }
  std::vector<LD> in_u(m, 0), in_t(m, 0);
  for (int k = 0; k < m; ++k) {
    for (int i = 0; i < m; ++i) in_u[i] += cheb[k] * T[k][i];
  }
  for (int i = 0; i < m; ++i) {  // ((t - c) / h)^i, binomially
    LD binom = 1;
    for (int j = 0; j <= i; ++j) {
      if (j > 0) binom = binom * (i - j + 1) / j;
      in_t[j] += in_u[i] * binom * powl(-c, i - j) / powl(h, i);
    }
  }
  std::vector<float> coef(m);
  for (int i = 0; i < m; ++i) coef[i] = static_cast<float>(in_t[i]);
  double worst[2] = {0, 0};
  for (LD a = 0; a <= 9; a += 1.0L / 16384) {
    const float af = static_cast<float>(a);
    const float t = (af - static_cast<float>(kK)) / (af + static_cast<float>(kK));
    float p = coef[m - 1];
    for (int i = m - 2; i >= 0; --i) p = p * t + coef[i];
    const LD ref = Erfcx(af);
    const double err = static_cast<double>(fabsl(p - ref) / ldexpl(1, ilogbl(ref) - 23));
    double& w = worst[a <= 3 ? 0 : 1];
    if (err > w) w = err;
  }
  std::printf("erfcx(a) ~ p(t), t = (a - %.2Lf) / (a + %.2Lf), degree %d, fitted on a in [0, %.2Lf]\n",
              kK, kK, kDegree, kAMax);
  std::printf("f32 evaluation error: %.2f ulp of erfcx on a in [0, 3], %.2f on [3, 9]\n", worst[0],
              worst[1]);
  std::printf("coefficients, t^0 first:\n");
  for (float v : coef) std::printf("  %.9ef\n", v);
}
