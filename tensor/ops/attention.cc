#include "tensor/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cuda/attention/attention_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

DType AccType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// Checks q [b, tq, h, d] and k, v [b, tk, kvh, d] (kvh dividing h): floating, one dtype, one
// device.
void CheckQkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  internal::RequireFloating(op, q, "q");
  internal::RequireFloating(op, k, "k");
  internal::RequireFloating(op, v, "v");
  for (const auto& [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (t->rank() != 4) {
      OpFail(op, ": ", name, " ", t->ShapeString(),
             " must be rank 4 [batch, seq, heads, head_dim]");
    }
  }
  internal::RequireSameDType(op, q, k);
  internal::RequireSameDType(op, q, v);
  internal::RequireSameDevice(op, q, k);
  internal::RequireSameDevice(op, q, v);
  if (k.shape() != v.shape()) {
    OpFail(op, ": k ", k.ShapeString(), " and v ", v.ShapeString(), " must have the same shape");
  }
  if (q.dim(0) != k.dim(0) || q.dim(3) != k.dim(3)) {
    OpFail(op, ": q ", q.ShapeString(), " and k ", k.ShapeString(),
           " must agree on batch (dim 0) and head_dim (dim 3)");
  }
  if (k.dim(2) < 1 || q.dim(2) % k.dim(2) != 0) {
    OpFail(op, ": q ", q.ShapeString(), " has ", q.dim(2), " heads and k ", k.ShapeString(), " ",
           k.dim(2), " kv heads: grouped-query attention needs kv heads (dim 2) dividing the "
           "query heads (query head h reads kv head h / (heads / kv_heads))");
  }
  if (!std::isfinite(scale)) OpFail(op, ": scale ", scale, " must be finite");
}

// Offsets past either end mask everything or nothing; clamping keeps i + offset in range.
int64_t ClampOffset(int64_t q_offset, int64_t tq, int64_t tk) {
  return std::clamp<int64_t>(q_offset, -tq - 1, tk);
}

// [b, t, h, d] contiguous f64 views.
struct Bthd {
  const double* p;
  int64_t t, h, d;
  const double* row(int64_t b, int64_t i, int64_t hh) const { return p + ((b * t + i) * h + hh) * d; }
};
struct MutBthd {
  double* p;
  int64_t t, h, d;
  double* row(int64_t b, int64_t i, int64_t hh) const { return p + ((b * t + i) * h + hh) * d; }
};

double Dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// Visible keys of query i: [0, n).
int64_t VisibleKeys(int64_t i, int64_t off, int64_t tk) {
  return std::clamp<int64_t>(i + off + 1, 0, tk);
}

// Softmax probabilities of query row qi over keys [0, n) into p; returns the logsumexp.
double RowProbabilities(const double* qi, const Bthd& k, int64_t b, int64_t h, int64_t n,
                        double scale, std::vector<double>& p) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    p[j] = scale * Dot(qi, k.row(b, j, h), k.d);
    m = std::max(m, p[j]);  // a NaN score leaves m; exp(NaN - m) below makes the row NaN
  }
  if (std::isinf(m) && m < 0) m = 0;  // every score -inf: 0/0 below, as softmax's
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    sum += p[j];
  }
  for (int64_t j = 0; j < n; ++j) p[j] /= sum;
  return m + std::log(sum);
}

// Query-key pairs a causal mask leaves visible, per (batch, head): sum over queries i of
// clamp(i + off + 1, 0, tk), in closed form (a loop would cost O(tq) per counted op).
double VisiblePairs(int64_t tq, int64_t tk, int64_t off) {
  const int64_t c = off + 1;
  const int64_t a = std::clamp<int64_t>(-c, 0, tq);       // queries before a see nothing
  const int64_t b = std::clamp<int64_t>(tk - c, a, tq);   // queries from b on see every key
  const double ramp = static_cast<double>(b - a) * static_cast<double>(c) +
                      static_cast<double>(a + b - 1) * static_cast<double>(b - a) / 2;
  return ramp + static_cast<double>(tq - b) * static_cast<double>(tk);
}

double Bytes(const Tensor& t) { return static_cast<double>(t.nbytes()); }

// FLOPs per visible score: QK^T and PV are 2*d each forward; backward recomputes the scores and
// forms dP, dV, dQ, dK: 10*d (2.5x). Softmax (or its gradient): 5 per score.
constexpr double kSoftmaxFlopsPerScore = 5;

Tensor ToF64(const Tensor& t) { return t.dtype() == DType::kF64 ? t : Cast(t, DType::kF64); }

}  // namespace

CausalAttentionResult CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      double scale, int64_t q_offset) {
  constexpr const char* kOp = "causal_attention";
  CheckQkv(kOp, q, k, v, scale);
  const int64_t batch = q.dim(0), tq = q.dim(1), heads = q.dim(2), d = q.dim(3), tk = k.dim(1);
  const int64_t off = ClampOffset(q_offset, tq, tk);
  internal::OpScope scope;
  if (scope.counting()) {
    const double scores = VisiblePairs(tq, tk, off) * static_cast<double>(batch * heads);
    scope.Record(kOp, q.dtype(), scores * (4.0 * static_cast<double>(d) + kSoftmaxFlopsPerScore),
                 2 * Bytes(q) + Bytes(k) + Bytes(v) +
                     static_cast<double>(batch * heads * tq * DTypeSize(AccType(q.dtype()))));
  }
  if (q.is_meta()) {
    return {Tensor::Empty(q.shape(), q.dtype(), q.device()),
            Tensor::Empty({batch, heads, tq}, AccType(q.dtype()), q.device())};
  }
  if (q.is_cuda()) {
    cuda::AttentionOutputs r = cuda::CausalAttention(q, k, v, scale, off);
    return {std::move(r.out), std::move(r.lse)};
  }
  const Tensor q64 = ToF64(q), k64 = ToF64(k), v64 = ToF64(v);
  Tensor out = Tensor::Zeros(q.shape(), DType::kF64);
  Tensor lse = Tensor::Empty({batch, heads, tq}, DType::kF64);
  const int64_t kvh = k.dim(2), rep = heads / kvh;  // query head h reads kv head h / rep
  const Bthd qv{q64.data<double>(), tq, heads, d}, kv{k64.data<double>(), tk, kvh, d},
      vv{v64.data<double>(), tk, kvh, d};
  const MutBthd ov{out.data<double>(), tq, heads, d};
  double* pl = lse.data<double>();
  std::vector<double> p(static_cast<size_t>(tk));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < tq; ++i) {
        const int64_t n = VisibleKeys(i, off, tk);
        double& l = pl[(b * heads + h) * tq + i];
        if (n == 0) {
          l = -std::numeric_limits<double>::infinity();
          continue;
        }
        l = RowProbabilities(qv.row(b, i, h), kv, b, h / rep, n, scale, p);
        double* o = ov.row(b, i, h);
        for (int64_t j = 0; j < n; ++j) {
          const double* vj = vv.row(b, j, h / rep);
          for (int64_t c = 0; c < d; ++c) o[c] += p[j] * vj[c];
        }
      }
    }
  }
  return {Cast(out, q.dtype()), Cast(lse, AccType(q.dtype()))};
}

CausalAttentionGrads CausalAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse,
                                             const Tensor& dout, double scale,
                                             int64_t q_offset) {
  constexpr const char* kOp = "causal_attention_backward";
  CheckQkv(kOp, q, k, v, scale);
  internal::RequireFloating(kOp, out, "out");
  internal::RequireFloating(kOp, dout, "dout");
  internal::RequireFloating(kOp, lse, "lse");
  if (out.shape() != q.shape() || dout.shape() != q.shape()) {
    OpFail(kOp, ": out ", out.ShapeString(), " and dout ", dout.ShapeString(),
           " must have q's shape ", q.ShapeString());
  }
  internal::RequireSameDType(kOp, q, out);
  internal::RequireSameDType(kOp, q, dout);
  const int64_t batch = q.dim(0), tq = q.dim(1), heads = q.dim(2), d = q.dim(3), tk = k.dim(1);
  const Shape lse_shape = {batch, heads, tq};
  if (lse.shape() != lse_shape || lse.dtype() != AccType(q.dtype())) {
    OpFail(kOp, ": lse ", lse.ShapeString(), " must be ", DTypeName(AccType(q.dtype())),
           "[", batch, ",", heads, ",", tq, "] (the forward's logsumexp)");
  }
  for (const Tensor* t : {&out, &lse, &dout}) internal::RequireSameDevice(kOp, q, *t);
  const int64_t off = ClampOffset(q_offset, tq, tk);
  internal::OpScope scope;
  if (scope.counting()) {
    const double scores = VisiblePairs(tq, tk, off) * static_cast<double>(batch * heads);
    scope.Record(kOp, q.dtype(),
                 scores * (10.0 * static_cast<double>(d) + kSoftmaxFlopsPerScore),
                 2 * (Bytes(q) + Bytes(k) + Bytes(v)) + Bytes(out) + Bytes(lse) + Bytes(dout));
  }
  if (q.is_meta()) {
    return {Tensor::Empty(q.shape(), q.dtype(), q.device()),
            Tensor::Empty(k.shape(), k.dtype(), k.device()),
            Tensor::Empty(v.shape(), v.dtype(), v.device())};
  }
  if (q.is_cuda()) {
    cuda::AttentionGrads g = cuda::CausalAttentionBackward(q, k, v, out, lse, dout, scale, off);
    return {std::move(g.dq), std::move(g.dk), std::move(g.dv)};
  }
  const Tensor q64 = ToF64(q), k64 = ToF64(k), v64 = ToF64(v), do64 = ToF64(dout);
  Tensor dq = Tensor::Zeros(q.shape(), DType::kF64);
  Tensor dk = Tensor::Zeros(k.shape(), DType::kF64);
  Tensor dv = Tensor::Zeros(v.shape(), DType::kF64);
  // Query head h reads kv head h / rep: dk and dv sum over the rep heads of a group.
  const int64_t kvh = k.dim(2), rep = heads / kvh;
  const Bthd qv{q64.data<double>(), tq, heads, d}, kv{k64.data<double>(), tk, kvh, d},
      vv{v64.data<double>(), tk, kvh, d}, dov{do64.data<double>(), tq, heads, d};
  const MutBthd dqv{dq.data<double>(), tq, heads, d}, dkv{dk.data<double>(), tk, kvh, d},
      dvv{dv.data<double>(), tk, kvh, d};
  std::vector<double> p(static_cast<size_t>(tk)), dp(static_cast<size_t>(tk));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < tq; ++i) {
        const int64_t n = VisibleKeys(i, off, tk);
        if (n == 0) continue;
        const double* qi = qv.row(b, i, h);
        const double* doi = dov.row(b, i, h);
        const int64_t g = h / rep;
        RowProbabilities(qi, kv, b, g, n, scale, p);
        double delta = 0;  // sum_j p_j dp_j
        for (int64_t j = 0; j < n; ++j) {
          dp[j] = Dot(doi, vv.row(b, j, g), d);
          delta += p[j] * dp[j];
        }
        double* dqi = dqv.row(b, i, h);
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;
          const double* kj = kv.row(b, j, g);
          double* dkj = dkv.row(b, j, g);
          double* dvj = dvv.row(b, j, g);
          for (int64_t c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
            dvj[c] += p[j] * doi[c];
          }
        }
      }
    }
  }
  return {Cast(dq, q.dtype()), Cast(dk, k.dtype()), Cast(dv, v.dtype())};
}

}  // namespace shardmap
