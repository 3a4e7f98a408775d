#include "tensor/ops/nn.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::ExpectGradMatchesFiniteDiff;
using testing::ExpectOpError;
using testing::RandomTensor;
using testing::Unflatten;

// Naive softmax along dim d by multi-index.
std::vector<double> RefSoftmax(const Tensor& x, int d, bool log) {
  std::vector<double> out(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = Unflatten(x.shape(), i);
    double mx = -INFINITY;
    std::vector<double> lane;
    for (int64_t j = 0; j < x.shape()[d]; ++j) {
      idx[d] = j;
      int64_t f = 0;
      for (int k = 0; k < x.rank(); ++k) f = f * x.shape()[k] + idx[k];
      lane.push_back(x.at(f));
      mx = std::max(mx, lane.back());
    }
    double s = 0;
    for (double v : lane) s += std::exp(v - mx);
    const double xi = x.at(i);
    out[i] = log ? xi - mx - std::log(s) : std::exp(xi - mx) / s;
  }
  return out;
}

TEST(NnTest, SoftmaxAndLogSoftmaxEveryDim) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    const Tensor x = RandomTensor({3, 4, 5}, dt, 1, -5, 5);
    for (int d : {0, 1, 2, -1}) {
      const int nd = d < 0 ? d + 3 : d;
      const double tol = dt == DType::kF64 ? 1e-14 : 2e-6;
      ExpectAllClose(Softmax(x, d), RefSoftmax(x, nd, false), tol, tol, "softmax");
      ExpectAllClose(LogSoftmax(x, d), RefSoftmax(x, nd, true), tol, tol, "log_softmax");
    }
  }
  // Large logits do not overflow.
  const Tensor big = Tensor::FromVector<float>({1, 3}, {1000, 1001, 1002});
  ExpectAllClose(Softmax(big, 1), RefSoftmax(big, 1, false), 1e-6, 1e-7, "big");
  // bf16 computes in f32 and rounds once.
  const Tensor h = RandomTensor({2, 9}, DType::kBF16, 2);
  const Tensor y = Softmax(h, 1);
  const auto ref = RefSoftmax(h, 1, false);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.at(i), ref[i], ref[i] * 8e-3);
  ExpectOpError([] { Softmax(Tensor::Zeros({2}, DType::kI64), 0); },
                {"softmax", "i64[2]", "floating"});
}

TEST(NnTest, SoftmaxBackwardsMatchFiniteDifferences) {
  const Tensor x = RandomTensor({3, 4, 5}, DType::kF64, 3);
  for (int d : {0, 1, -1}) {
    ExpectGradMatchesFiniteDiff(
        x, [d](const Tensor& t) { return Softmax(t, d); },
        [d](const Tensor& t, const Tensor& dy) { return SoftmaxBackward(Softmax(t, d), dy, d); });
    ExpectGradMatchesFiniteDiff(
        x, [d](const Tensor& t) { return LogSoftmax(t, d); },
        [d](const Tensor& t, const Tensor& dy) {
          return LogSoftmaxBackward(LogSoftmax(t, d), dy, d);
        });
  }
  ExpectOpError(
      [&] {
        SoftmaxBackward(x, Tensor::Zeros({3, 4}, DType::kF64), 0);
      },
      {"softmax_backward", "shape mismatch"});
}

TEST(NnTest, LayerNormForwardAndBackward) {
  const int64_t h = 7;
  const Tensor x = RandomTensor({2, 3, h}, DType::kF64, 4);
  const Tensor g = RandomTensor({h}, DType::kF64, 5, 0.5, 1.5);
  const Tensor b = RandomTensor({h}, DType::kF64, 6);
  const double eps = 1e-5;
  const LayerNormResult r = LayerNorm(x, g, b, eps);
  ASSERT_EQ(r.mean.shape(), (Shape{2, 3}));
  std::vector<double> want(x.numel());
  for (int64_t row = 0; row < 6; ++row) {
    double m = 0, v = 0;
    for (int j = 0; j < h; ++j) m += x.at(row * h + j) / h;
    for (int j = 0; j < h; ++j) v += (x.at(row * h + j) - m) * (x.at(row * h + j) - m) / h;
    EXPECT_NEAR(r.mean.at(row), m, 1e-14);
    EXPECT_NEAR(r.rstd.at(row), 1 / std::sqrt(v + eps), 1e-12);
    for (int j = 0; j < h; ++j) {
      want[row * h + j] = (x.at(row * h + j) - m) / std::sqrt(v + eps) * g.at(j) + b.at(j);
    }
  }
  ExpectAllClose(r.y, want, 1e-13, 1e-13, "layer_norm");

  auto fwd = [&](const Tensor& xx, const Tensor& gg, const Tensor& bb) {
    return LayerNorm(xx, gg, bb, eps).y;
  };
  auto grads = [&](const Tensor& xx, const Tensor& gg, const Tensor& dy) {
    const LayerNormResult rr = LayerNorm(xx, gg, b, eps);
    return LayerNormBackward(xx, gg, rr.mean, rr.rstd, dy);
  };
  ExpectGradMatchesFiniteDiff(
      x, [&](const Tensor& t) { return fwd(t, g, b); },
      [&](const Tensor& t, const Tensor& dy) { return grads(t, g, dy).dx; });
  ExpectGradMatchesFiniteDiff(
      g, [&](const Tensor& t) { return fwd(x, t, b); },
      [&](const Tensor& t, const Tensor& dy) { return grads(x, t, dy).dgamma; });
  ExpectGradMatchesFiniteDiff(
      b, [&](const Tensor& t) { return fwd(x, g, t); },
      [&](const Tensor& t, const Tensor& dy) { return grads(x, g, dy).dbeta; });
  // No affine part.
  ExpectGradMatchesFiniteDiff(
      x, [&](const Tensor& t) { return LayerNorm(t, Tensor(), Tensor(), eps).y; },
      [&](const Tensor& t, const Tensor& dy) {
        const LayerNormResult rr = LayerNorm(t, Tensor(), Tensor(), eps);
        const LayerNormGrads gr = LayerNormBackward(t, Tensor(), rr.mean, rr.rstd, dy);
        EXPECT_FALSE(gr.dgamma.defined());
        return gr.dx;
      });
  // f32 and bf16 inputs give f32 statistics and output of the input dtype.
  const LayerNormResult rb = LayerNorm(Cast(x, DType::kBF16), Cast(g, DType::kBF16), Tensor(), eps);
  EXPECT_EQ(rb.y.dtype(), DType::kBF16);
  EXPECT_EQ(rb.mean.dtype(), DType::kF32);

  ExpectOpError([&] { LayerNorm(x, Tensor::Ones({h + 1}, DType::kF64), b, eps); },
                {"layer_norm", "gamma", "f64[8]", "f64[2,3,7]", "[7]"});
  ExpectOpError([&] { LayerNormBackward(x, g, r.rstd.Reshape({6}), r.rstd, x); },
                {"layer_norm_backward", "mean", "[2,3]"});
  ExpectOpError([&] { LayerNorm(Tensor::Scalar(1), Tensor(), Tensor(), eps); },
                {"layer_norm", "rank >= 1"});
}

TEST(NnTest, RmsNormForwardAndBackward) {
  const int64_t h = 6;
  const Tensor x = RandomTensor({5, h}, DType::kF64, 7);
  const Tensor g = RandomTensor({h}, DType::kF64, 8, 0.5, 1.5);
  const double eps = 1e-6;
  const RmsNormResult r = RmsNorm(x, g, eps);
  std::vector<double> want(x.numel());
  for (int row = 0; row < 5; ++row) {
    double ms = 0;
    for (int j = 0; j < h; ++j) ms += x.at(row * h + j) * x.at(row * h + j) / h;
    for (int j = 0; j < h; ++j)
      want[row * h + j] = x.at(row * h + j) / std::sqrt(ms + eps) * g.at(j);
  }
  ExpectAllClose(r.y, want, 1e-13, 1e-13, "rms_norm");
  for (bool affine : {true, false}) {
    const Tensor gg = affine ? g : Tensor();
    ExpectGradMatchesFiniteDiff(
        x, [&](const Tensor& t) { return RmsNorm(t, gg, eps).y; },
        [&](const Tensor& t, const Tensor& dy) {
          return RmsNormBackward(t, gg, RmsNorm(t, gg, eps).rstd, dy).dx;
        });
  }
  ExpectGradMatchesFiniteDiff(
      g, [&](const Tensor& t) { return RmsNorm(x, t, eps).y; },
      [&](const Tensor& t, const Tensor& dy) {
        return RmsNormBackward(x, t, RmsNorm(x, t, eps).rstd, dy).dgamma;
      });
  ExpectOpError(
      [&] {
        RmsNormBackward(x, g, r.rstd, Tensor::Zeros({5, h}));
      },
      {"rms_norm_backward", "dtype mismatch", "f32[5,6]"});
}

// Rows of width 0 (x [3,0]) still have a mean and an rstd each (0 and 1/sqrt(eps)); their
// backward gives empty gradients, and statistics of the wrong shape are still refused. No rows
// (x [0,8]) give empty statistics.
TEST(NnTest, NormsOfRowsOfWidthZeroAndOfNoRows) {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    const std::string name = DTypeName(dt);
    const Tensor x = Tensor::Zeros({3, 0}, dt), gamma = Tensor::Zeros({0}, dt);
    const double eps = 1e-4;
    const LayerNormResult ln = LayerNorm(x, gamma, gamma, eps);
    EXPECT_EQ(ln.y.shape(), (Shape{3, 0})) << name;
    ASSERT_EQ(ln.mean.shape(), (Shape{3})) << name;
    ASSERT_EQ(ln.rstd.shape(), (Shape{3})) << name;
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(ln.mean.at(i), 0.0) << name;
      EXPECT_NEAR(ln.rstd.at(i), 100.0, 1e-4) << name;
    }
    const LayerNormGrads lg = LayerNormBackward(x, gamma, ln.mean, ln.rstd, x);
    EXPECT_EQ(lg.dx.shape(), (Shape{3, 0})) << name;
    EXPECT_EQ(lg.dgamma.shape(), (Shape{0})) << name;
    EXPECT_EQ(lg.dbeta.shape(), (Shape{0})) << name;
    const RmsNormResult rn = RmsNorm(x, gamma, eps);
    ASSERT_EQ(rn.rstd.shape(), (Shape{3})) << name;
    EXPECT_NEAR(rn.rstd.at(0), 100.0, 1e-4) << name;
    const RmsNormGrads rg = RmsNormBackward(x, gamma, rn.rstd, x);
    EXPECT_EQ(rg.dx.shape(), (Shape{3, 0})) << name;
    EXPECT_EQ(rg.dgamma.shape(), (Shape{0})) << name;
    const RmsNormGrads rg_plain = RmsNormBackward(x, Tensor(), rn.rstd, x);
    EXPECT_EQ(rg_plain.dx.shape(), (Shape{3, 0})) << name;
    EXPECT_FALSE(rg_plain.dgamma.defined()) << name;
    ExpectOpError([&] { LayerNormBackward(x, gamma, ln.mean.SliceRows(0, 2), ln.rstd, x); },
                  {"layer_norm_backward", "mean", "[2]", "[3,0]", "expected shape [3]"});
    ExpectOpError([&] { RmsNormBackward(x, gamma, Tensor::Zeros({3, 1}, DType::kF32), x); },
                  {"rms_norm_backward", "rstd", "[3,1]", "[3,0]"});

    const Tensor none = Tensor::Zeros({0, 8}, dt);
    const LayerNormResult n = LayerNorm(none, Tensor(), Tensor(), eps);
    EXPECT_EQ(n.y.shape(), (Shape{0, 8})) << name;
    EXPECT_EQ(n.mean.shape(), (Shape{0})) << name;
    const LayerNormGrads ng = LayerNormBackward(none, Tensor::Ones({8}, dt), n.mean, n.rstd, none);
    EXPECT_EQ(ng.dx.shape(), (Shape{0, 8})) << name;
    ExpectAllClose(ng.dgamma, std::vector<double>(8, 0.0), 0, 0, name + " dgamma of no rows");
    ExpectAllClose(ng.dbeta, std::vector<double>(8, 0.0), 0, 0, name + " dbeta of no rows");
  }
}

TEST(NnTest, EmbeddingAndScatterAddBackward) {
  const Tensor table = RandomTensor({5, 3}, DType::kF64, 9);
  for (DType it : {DType::kI64, DType::kI32}) {
    const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {4, 0, 4, 2, 2, 4}, it);
    const Tensor e = Embedding(table, ids);
    ASSERT_EQ(e.shape(), (Shape{2, 3, 3}));
    for (int64_t i = 0; i < 6; ++i) {
      for (int j = 0; j < 3; ++j) {
        ASSERT_EQ(e.at(i * 3 + j), table.at(static_cast<int64_t>(ids.at(i)) * 3 + j));
      }
    }
    ExpectGradMatchesFiniteDiff(
        table, [&](const Tensor& t) { return Embedding(t, ids); },
        [&](const Tensor&, const Tensor& dy) { return EmbeddingBackward(ids, dy, 5); });
  }
  const Tensor bad = Tensor::FromVector<int64_t>({2, 2}, {0, 1, 5, 2});
  ExpectOpError([&] { Embedding(table, bad); },
                {"embedding", "id 5", "[1,0]", "i64[2,2]", "f64[5,3]", "0 <= id < 5"});
  ExpectOpError([&] { Embedding(table, Tensor::Zeros({2})); }, {"embedding", "integer"});
  ExpectOpError(
      [&] {
        EmbeddingBackward(bad, Tensor::Zeros({2, 2, 3}), 5);
      },
      {"embedding_backward", "id 5"});
  ExpectOpError(
      [&] {
        EmbeddingBackward(bad, Tensor::Zeros({2, 3}), 6);
      },
      {"embedding_backward", "f32[2,3]", "ids.shape + [features]"});
}

TEST(NnTest, CrossEntropyForwardBackwardAndIgnoreIndex) {
  const int64_t n = 5, v = 7;
  const Tensor logits = RandomTensor({n, v}, DType::kF64, 10, -3, 3);
  const Tensor targets = Tensor::FromVector<int64_t>({n}, {3, -100, 0, 6, 3});
  const Tensor loss = CrossEntropy(logits, targets);
  ASSERT_EQ(loss.shape(), (Shape{n}));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(targets.at(i));
    if (t == -100) {
      EXPECT_EQ(loss.at(i), 0.0);
      continue;
    }
    double s = 0;
    for (int j = 0; j < v; ++j) s += std::exp(logits.at(i * v + j));
    EXPECT_NEAR(loss.at(i), std::log(s) - logits.at(i * v + t), 1e-13);
  }
  ExpectGradMatchesFiniteDiff(
      logits, [&](const Tensor& t) { return CrossEntropy(t, targets); },
      [&](const Tensor& t, const Tensor& dl) { return CrossEntropyBackward(t, targets, dl); });
  // Custom ignore_index; f32 logits give an f32 loss.
  const Tensor t2 = Tensor::FromVector<int32_t>({n}, {1, 2, 3, 4, 0});
  const Tensor l32 = CrossEntropy(Cast(logits, DType::kF32), t2, /*ignore_index=*/4);
  EXPECT_EQ(l32.dtype(), DType::kF32);
  EXPECT_EQ(l32.at(3), 0.0);
  EXPECT_NEAR(l32.at(0), CrossEntropy(logits, t2).at(0), 1e-5);

  const Tensor bad = Tensor::FromVector<int64_t>({n}, {0, 1, 7, 0, 0});
  ExpectOpError([&] { CrossEntropy(logits, bad); },
                {"cross_entropy", "target 7", "[2]", "i64[5]", "0 <= target < 7"});
  ExpectOpError([&] { CrossEntropy(logits, Tensor::Zeros({4}, DType::kI64)); },
                {"cross_entropy", "f64[5,7]", "i64[4]"});
  ExpectOpError([&] { CrossEntropyBackward(logits, targets, Tensor::Ones({4})); },
                {"cross_entropy_backward", "dloss"});
}

TEST(NnTest, CausalMask) {
  const Tensor s = RandomTensor({2, 3, 5}, DType::kF32, 11);
  for (int64_t offset : {0, 2, -1, 10}) {
    const Tensor m = CausalMask(s, offset);
    for (int64_t i = 0; i < s.numel(); ++i) {
      const auto idx = Unflatten(s.shape(), i);
      if (idx[2] > idx[1] + offset) {
        ASSERT_TRUE(std::isinf(m.at(i)) && m.at(i) < 0) << i;
      } else {
        ASSERT_EQ(m.at(i), s.at(i)) << i;
      }
    }
  }
  EXPECT_EQ(CausalMask(s, 0, -1e4).at(1), static_cast<float>(-1e4));
  EXPECT_FALSE(CausalMask(s).SharesStorageWith(s));
  ExpectOpError([] { CausalMask(Tensor::Zeros({4})); }, {"causal_mask", "f32[4]", "rank >= 2"});
}

TEST(NnTest, CausalSoftmaxMatchesSoftmaxOfCausalMask) {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{1, 9, 9}, Shape{3, 1, 17}}) {
      const Tensor s = RandomTensor(shape, dt, 13, -6, 6);
      for (int64_t offset : {0, 1, 3, 100}) {  // every row has a visible key
        const Tensor want = Softmax(CausalMask(s, offset), -1);
        const Tensor got = CausalSoftmax(s, offset);
        ASSERT_EQ(got.dtype(), dt);
        const double tol = dt == DType::kF64 ? 1e-15 : dt == DType::kF32 ? 1e-6 : 1e-2;
        for (int64_t i = 0; i < s.numel(); ++i) {
          ASSERT_NEAR(got.at(i), want.at(i), tol) << DTypeName(dt) << " offset " << offset << " " << i;
          if (Unflatten(s.shape(), i).back() > Unflatten(s.shape(), i)[s.rank() - 2] + offset) {
            ASSERT_EQ(got.at(i), 0.0) << i;  // masked: exactly zero
          }
        }
      }
    }
  }
  // Rows with no visible key (i + offset < 0) are zero; the others are the softmax of their prefix.
  const Tensor s = RandomTensor({4, 3}, DType::kF32, 14);
  const Tensor p = CausalSoftmax(s, -2);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(p.at(j), 0.0f);
    EXPECT_EQ(p.at(3 + j), 0.0f);
    EXPECT_EQ(p.at(6 + j), j == 0 ? 1.0f : 0.0f);
  }
  EXPECT_EQ(CausalSoftmax(s, -100).at(11), 0.0f);
  EXPECT_EQ(CausalSoftmax(Tensor::Zeros({2, 0, 3})).numel(), 0);
  ExpectOpError([] { CausalSoftmax(Tensor::Zeros({4})); },
                {"causal_softmax", "f32[4]", "rank >= 2"});
  ExpectOpError([] { CausalSoftmax(Tensor::Zeros({2, 2}, DType::kI64)); }, {"causal_softmax"});
}

}  // namespace
}  // namespace shardmap
