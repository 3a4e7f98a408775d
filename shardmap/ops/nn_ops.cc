#include "shardmap/ops/nn_ops.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/ops.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/routing.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

using internal::NeedsTape;
using internal::RecordOp;
using internal::TypeFail;

namespace {

Value Detached(const Value& v) { return Value(v.tensor, v.type); }

bool Checked() { return RankContext::Get("nn op").checked(); }

// The type of a weight gradient summed over the leading dims of `joined` (rank in_rank) down to
// the weight's rank: sharded leading dims give P; then R weights get P for V cotangents.
SpmdType WeightGradType(const SpmdType& joined, int in_rank, int w_rank, const SpmdType& w) {
  int off = in_rank - w_rank;
  SpmdType t = joined;
  for (int i = 0; i < t.num_axes(); ++i) {
    if (t[i].is_sharded()) t[i] = t[i].dim < off ? AxisType::P() : AxisType::Sharded(t[i].dim - off);
    if (w[i].kind == AxisKind::kR && t[i].kind == AxisKind::kV) t[i] = AxisType::P();
  }
  return t;
}

// softmax or log_softmax: a nonlinear op along dim (which must not be sharded) whose backward
// needs only its output y.
struct SoftmaxKind {
  const char* name;           // the op, as messages and the tape name it
  const char* backward_name;  // its backward, as the cotangent's type check names it
  Tensor (*forward)(const Tensor& x, int dim);
  Tensor (*backward)(const Tensor& y, const Tensor& dy, int dim);
  const char* fix;  // what to do when dim is sharded
};

constexpr SoftmaxKind kSoftmax{"softmax", "softmax_backward", Softmax, SoftmaxBackward,
                               "all_gather x along that dim first, or compute the softmax with "
                               "all_reduce(max) and all_reduce(sum) over the axis"};
constexpr SoftmaxKind kLogSoftmax{"log_softmax", "log_softmax_backward", LogSoftmax,
                                  LogSoftmaxBackward,
                                  "all_gather x along that dim first (or use a vocab-parallel "
                                  "composite with all_reduce(max) and all_reduce(sum))"};

Value RowwiseSoftmax(const SoftmaxKind& k, const Value& x, int dim) {
  SpmdType t = internal::NonlinearTypeOf(k.name, x);
  internal::CheckDimNotSharded(k.name, x, dim, k.fix);
  Value out(k.forward(x.tensor, dim), t);
  if (NeedsTape(x)) {
    Value y = Detached(out);
    RecordOp(k.name, {&x}, out, [y, dim, k](const Value& g, uint32_t, Value* d) {
      d[0] = Value(k.backward(y.tensor, g.tensor, dim),
                   internal::ElementwiseType(k.backward_name, y, g, g.shape(), true));
    });
  }
  return out;
}

}  // namespace

Value softmax(const Value& x, int dim) { return RowwiseSoftmax(kSoftmax, x, dim); }

Value log_softmax(const Value& x, int dim) { return RowwiseSoftmax(kLogSoftmax, x, dim); }

Value layer_norm(const Value& x, const Value& gamma, const Value& beta, double eps) {
  internal::CheckMesh("layer_norm", x, "x");
  internal::CheckOptionalMesh("layer_norm", gamma, "gamma");
  internal::CheckOptionalMesh("layer_norm", beta, "beta");
  SpmdType t = internal::NonlinearTypeOf("layer_norm", x);
  internal::CheckDimNotSharded("layer_norm", x, -1,
                               "all_gather the hidden dim first (norms run on whole rows)");
  Value xt(x.tensor, t);
  if (gamma.defined()) t = internal::ElementwiseType("layer_norm", xt, gamma, x.shape(), true);
  if (beta.defined()) {
    t = internal::ElementwiseType("layer_norm", Value(x.tensor, t), beta, x.shape(), false);
  }
  LayerNormResult r = LayerNorm(x.tensor, gamma.tensor, beta.tensor, eps);
  Value out(r.y, t);
  bool tape = CurrentRecorder() != nullptr &&
              (x.node >= 0 || gamma.node >= 0 || beta.node >= 0);
  if (tape) {
    Value xd = Detached(x), gd = Detached(gamma), bd = Detached(beta);
    Tensor mean = r.mean, rstd = r.rstd;
    RecordOp("layer_norm", {&x, &gamma, &beta}, out,
             [xd, gd, bd, mean, rstd](const Value& g, uint32_t need, Value* d) {
               LayerNormGrads gr = LayerNormBackward(xd.tensor, gd.tensor, mean, rstd, g.tensor);
               SpmdType gx = internal::ElementwiseType("layer_norm_backward", xd, g, g.shape(),
                                                       true);
               if (need & 1) d[0] = Value(gr.dx, gx);
               if ((need & 2) && gd.defined()) {
                 d[1] = Value(gr.dgamma, WeightGradType(gx, xd.rank(), gd.rank(), gd.type));
               }
               if ((need & 4) && bd.defined()) {
                 d[2] = Value(gr.dbeta, WeightGradType(g.type, g.rank(), bd.rank(), bd.type));
               }
             });
  }
  return out;
}

Value rms_norm(const Value& x, const Value& gamma, double eps) {
  internal::CheckMesh("rms_norm", x, "x");
  internal::CheckOptionalMesh("rms_norm", gamma, "gamma");
  SpmdType t = internal::NonlinearTypeOf("rms_norm", x);
  internal::CheckDimNotSharded("rms_norm", x, -1,
                               "all_gather the hidden dim first (norms run on whole rows)");
  if (gamma.defined()) {
    t = internal::ElementwiseType("rms_norm", Value(x.tensor, t), gamma, x.shape(), true);
  }
  RmsNormResult r = RmsNorm(x.tensor, gamma.tensor, eps);
  Value out(r.y, t);
  if (NeedsTape(x, gamma)) {
    Value xd = Detached(x), gd = Detached(gamma);
    Tensor rstd = r.rstd;
    RecordOp("rms_norm", {&x, &gamma}, out,
             [xd, gd, rstd](const Value& g, uint32_t need, Value* d) {
               RmsNormGrads gr = RmsNormBackward(xd.tensor, gd.tensor, rstd, g.tensor);
               SpmdType gx = internal::ElementwiseType("rms_norm_backward", xd, g, g.shape(),
                                                       true);
               if (need & 1) d[0] = Value(gr.dx, gx);
               if ((need & 2) && gd.defined()) {
                 d[1] = Value(gr.dgamma, WeightGradType(gx, xd.rank(), gd.rank(), gd.type));
               }
             });
  }
  return out;
}

namespace {

// Rows of ids outside [start, start + rows) are masked; returns ids - start clamped to 0.
Tensor LocalIds(const Tensor& ids, int64_t start, int64_t rows, std::vector<bool>* mask) {
  if (ids.is_meta()) {  // shape-only: no ids to read; one i64 tensor, as on the CPU
    mask->assign(ids.numel(), false);
    return Tensor::Empty(ids.shape(), DType::kI64, ids.device());
  }
  std::vector<int64_t> v = ids.ToVector<int64_t>();
  mask->assign(v.size(), false);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t l = v[i] - start;
    if (l < 0 || l >= rows) {
      (*mask)[i] = true;
      l = 0;
    }
    v[i] = l;
  }
  return Tensor::FromVector<int64_t>(ids.shape(), v).To(ids.device());
}

void ZeroRows(Tensor& t, const std::vector<bool>& mask) {
  if (t.numel() == 0 || t.is_meta()) return;  // meta: no data to zero
  if (t.is_cuda()) {  // through the host (GPU ranks; correct, not fast)
    Tensor h = t.To(Device::Cpu());
    ZeroRows(h, mask);
    t = h.To(t.device());
    return;
  }
  size_t row_bytes = t.nbytes() / mask.size();
  char* p = static_cast<char*>(t.raw_data());
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) std::memset(p + i * row_bytes, 0, row_bytes);
  }
}

}  // namespace

Value embedding(const Value& table, const Value& ids) {
  internal::CheckMesh("embedding", table);
  internal::CheckMesh("embedding", ids);
  RankContext& ctx = RankContext::Get("embedding");
  if (table.rank() != 2) OpFail("embedding: table must be [rows, hidden], got ", table.ToString());
  AxisMask vocab = 0;
  std::optional<Rejection> no;
  SpmdType t = EmbeddingRule(table.type, ids.type, ids.rank(), ctx.checked(), &vocab, no);
  if (no) TypeFail("embedding", no->axis, no->rule, no->fix, {{"table", &table}, {"ids", &ids}});
  if (!ctx.checked()) t = internal::ErasedJoin(table.type, t);
  internal::StampOrigins("embedding", t, {{"table", &table}, {"ids", &ids}},
                         "the table is sharded over this axis on its hidden dim or the ids' "
                         "layout is unknown", "all_gather the table over this axis first");
  int64_t rows = table.dim(0);
  int64_t start = vocab ? ctx.mesh().GroupIndex(ctx.rank(), vocab) * rows : 0;
  if (vocab && table.tensor.is_cuda()) {
    // GPU: the shard's local rows on the device (-1 for other shards' ids, which GatherRows
    // leaves zero and ScatterAddRows skips): no host round trip, capturable in a CUDA graph.
    const Tensor local = LocalIndices(ids.tensor, start, rows).Reshape({ids.numel()});
    Shape es = ids.shape();
    es.push_back(table.dim(1));
    Value out(GatherRows(table.tensor, local).Reshape(es), t);
    if (NeedsTape(table)) {
      RecordOp("embedding", {&table}, out,
               [local, rows, h = table.dim(1), tt = table.type](const Value& g, uint32_t,
                                                                 Value* d) {
                 d[0] = Value(ScatterAddRows(g.tensor.Reshape({local.numel(), h}), local, rows),
                              Dual(tt));
               });
    }
    return out;
  }
  std::vector<bool> mask;
  Tensor local = vocab ? LocalIds(ids.tensor, start, rows, &mask) : ids.tensor;
  Tensor e = Embedding(table.tensor, local);
  if (vocab) ZeroRows(e, mask);
  Value out(std::move(e), t);
  if (NeedsTape(table)) {
    SpmdType tt = table.type;
    RecordOp("embedding", {&table}, out,
             [local, mask, rows, tt](const Value& g, uint32_t, Value* d) {
               Tensor gm = g.tensor;
               if (!mask.empty()) {
                 gm = gm.Clone();
                 ZeroRows(gm, mask);
               }
               d[0] = Value(EmbeddingBackward(local, gm, rows), Dual(tt));
             });
  }
  return out;
}

Value cross_entropy(const Value& logits, const Value& targets, int64_t ignore_index) {
  internal::CheckMesh("cross_entropy", logits);
  internal::CheckMesh("cross_entropy", targets);
  SpmdType t = internal::NonlinearTypeOf("cross_entropy", logits);
  internal::CheckDimNotSharded("cross_entropy", logits, -1,
                               "gather the classes first, or use a vocab-parallel cross-entropy "
                               "(local max/sum-exp combined with all_reduce(max) and "
                               "all_reduce(sum))");
  if (Checked()) {
    std::optional<Rejection> no;
    t = CrossEntropyRule(logits.type, targets.type,
                         RankContext::Get("cross_entropy").mesh().axis_names(), no);
    if (no) {
      TypeFail("cross_entropy", no->axis, no->rule, no->fix,
               {{"logits", &logits}, {"targets", &targets}});
    }
  }
  Value out(CrossEntropy(logits.tensor, targets.tensor, ignore_index), t);
  if (NeedsTape(logits)) {
    Value ld = Detached(logits), td = Detached(targets);
    RecordOp("cross_entropy", {&logits}, out,
             [ld, td, ignore_index](const Value& g, uint32_t, Value* d) {
               d[0] = Value(CrossEntropyBackward(ld.tensor, td.tensor, g.tensor, ignore_index),
                            g.type);
             });
  }
  return out;
}

Value causal_mask(const Value& scores, int64_t offset) {
  internal::CheckMesh("causal_mask", scores);
  SpmdType t = internal::NonlinearTypeOf("causal_mask", scores);
  if (scores.rank() >= 2) {
    internal::CheckDimNotSharded("causal_mask", scores, -1,
                                 "the mask needs global key positions: gather the keys first");
    internal::CheckDimNotSharded("causal_mask", scores, -2,
                                 "the mask needs global query positions: gather the queries first");
  }
  Value out(CausalMask(scores.tensor, offset), t);
  if (NeedsTape(scores)) {
    RecordOp("causal_mask", {&scores}, out, [offset](const Value& g, uint32_t, Value* d) {
      d[0] = Value(CausalMask(g.tensor, offset, 0.0), g.type);
    });
  }
  return out;
}

Value causal_softmax(const Value& scores, int64_t offset) {
  internal::CheckMesh("causal_softmax", scores);
  SpmdType t = internal::NonlinearTypeOf("causal_softmax", scores);
  if (scores.rank() >= 2) {
    internal::CheckDimNotSharded("causal_softmax", scores, -1,
                                 "the mask and the softmax need every key: gather the keys first");
    internal::CheckDimNotSharded("causal_softmax", scores, -2,
                                 "the mask needs global query positions: gather the queries first");
  }
  Value out(CausalSoftmax(scores.tensor, offset), t);
  if (NeedsTape(scores)) {
    Value y = Detached(out);
    RecordOp("causal_softmax", {&scores}, out, [y](const Value& g, uint32_t, Value* d) {
      // Masked entries have y = 0, so the softmax VJP already gives them a zero gradient.
      d[0] = Value(SoftmaxBackward(y.tensor, g.tensor, -1),
                   internal::ElementwiseType("causal_softmax_backward", y, g, g.shape(), true));
    });
  }
  return out;
}

namespace {

std::vector<int> NormDims(const std::vector<int>& dims, int rank) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  for (int d : dims) out.push_back(d < 0 ? d + rank : d);
  std::sort(out.begin(), out.end());
  return out;
}

// Max-backward weights on the host, row-wise: for reduced dims forming one contiguous block
// (x viewed as [outer, count, inner], y as [outer, inner]) w = (x == y) / #ties, computed in
// f64 and rounded to T once, the same values as the generic mask / Sum / Div / Cast path
// (0/0 = NaN where a row holds a NaN, as there). Returns an undefined tensor when the layout or
// dtype does not allow it.
template <typename T>
Tensor MaxBackwardWeightsRows(const Tensor& x, const Tensor& y, int64_t outer, int64_t count,
                              int64_t inner) {
  Tensor w = Tensor::Empty(x.shape(), x.dtype());
  const T* px = x.data<T>();
  const T* py = y.data<T>();
  T* pw = w.data<T>();
  std::vector<int64_t> cnt(inner);
  for (int64_t o = 0; o < outer; ++o) {
    const T* xo = px + o * count * inner;
    const T* yo = py + o * inner;
    T* wo = pw + o * count * inner;
    std::fill(cnt.begin(), cnt.end(), 0);
    for (int64_t c = 0; c < count; ++c) {
      const T* row = xo + c * inner;
      for (int64_t i = 0; i < inner; ++i) cnt[i] += row[i] == yo[i] ? 1 : 0;
    }
    for (int64_t c = 0; c < count; ++c) {
      const T* row = xo + c * inner;
      T* wr = wo + c * inner;
      for (int64_t i = 0; i < inner; ++i) {
        const double m = row[i] == yo[i] ? 1.0 : 0.0;
        wr[i] = static_cast<T>(m / static_cast<double>(cnt[i]));
      }
    }
  }
  return w;
}

Tensor MaxBackwardWeightsFast(const Tensor& x, const Tensor& yk, const std::vector<int>& nd) {
  // Meta (shape-only): the weights' tensor as the host path allocates it, nothing computed.
  if (x.is_meta()) return Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (x.is_cuda() || yk.is_cuda() || nd.empty() || x.numel() == 0) return Tensor();
  if (x.dtype() != DType::kF32 && x.dtype() != DType::kF64) return Tensor();
  if (yk.dtype() != x.dtype()) return Tensor();
  for (size_t i = 1; i < nd.size(); ++i) {
    if (nd[i] != nd[i - 1] + 1) return Tensor();  // not one contiguous block of dims
  }
  int64_t outer = 1, count = 1, inner = 1;
  for (int d = 0; d < x.rank(); ++d) {
    if (d < nd.front()) {
      outer *= x.dim(d);
    } else if (d <= nd.back()) {
      count *= x.dim(d);
    } else {
      inner *= x.dim(d);
    }
  }
  if (x.dtype() == DType::kF64) return MaxBackwardWeightsRows<double>(x, yk, outer, count, inner);
  return MaxBackwardWeightsRows<float>(x, yk, outer, count, inner);
}

// Copies `n` elements of `es` bytes: dst[k] = src[off[k]] where off[k] >= 0 (others untouched).
void GatherBits(const void* src, void* dst, const std::vector<int64_t>& off, size_t es) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (size_t k = 0; k < off.size(); ++k) {
    if (off[k] >= 0) std::memcpy(d + k * es, s + off[k] * es, es);
  }
}

Value MaxImpl(const char* op, const Value& x, const std::vector<int>& dims, bool keepdim,
              bool local) {
  internal::CheckMesh(op, x);
  std::vector<int> nd = NormDims(dims, x.rank());
  SpmdType t = internal::NonlinearTypeOf(op, x);
  if (Checked()) {
    std::optional<Rejection> no;
    t = MaxRule(op, x.type, nd, keepdim, local, RankContext::Get(op).mesh().axis_names(), no);
    if (no) TypeFail(op, no->axis, no->rule, no->fix, {{"x", &x}});
    internal::StampOrigins(op, t, {{"x", &x}}, "per-device maxima of a sharded dim",
                           "all_reduce(m, axis, To::kR, ReduceKind::kMax) to combine them",
                           VKind::kIntended);
  } else {
    t = internal::ErasedUnary(t);
  }
  Tensor yk = Max(x.tensor, nd, /*keepdim=*/true);
  Shape ks = yk.shape();
  Value out(keepdim ? yk : yk.Reshape(Max(x.tensor, nd, false).shape()), t);
  if (NeedsTape(x)) {
    Value xd = Detached(x);
    Tensor ykd = yk;
    RecordOp(op, {&x}, out, [xd, ykd, ks, nd](const Value& g, uint32_t, Value* d) {
      // Mask of the maximal elements, normalised by their count (ties share the gradient).
      Tensor w = MaxBackwardWeightsFast(xd.tensor, ykd, nd);
      if (!w.defined()) {  // other layouts, dtypes and devices: the generic mask
        std::vector<double> xv = xd.tensor.ToVector<double>();
        Tensor yb = Add(Tensor::Zeros(xd.shape(), ykd.dtype(), ykd.device()), ykd);
        std::vector<double> yv = yb.ToVector<double>();
        std::vector<double> m(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) m[i] = xv[i] == yv[i] ? 1.0 : 0.0;
        Tensor mask = Tensor::FromVector<double>(xd.shape(), m);
        mask = mask.To(xd.tensor.device());
        Tensor cnt = Sum(mask, nd, true);
        w = Div(mask, cnt);
        if (xd.dtype() != DType::kF64) w = Cast(w, xd.dtype());
      }
      Tensor gk = g.tensor.Reshape(ks);
      Value gv(Mul(w, gk), internal::ElementwiseType(
                               "max_backward", xd, Value(gk, g.type), xd.shape(), true));
      d[0] = internal::AsCotangent(std::move(gv), xd.type);
    });
  }
  return out;
}

}  // namespace

Value max(const Value& x, const std::vector<int>& dims, bool keepdim) {
  return MaxImpl("max", x, dims, keepdim, false);
}

Value local_max(const Value& x, const std::vector<int>& dims, bool keepdim) {
  return MaxImpl("local_max", x, dims, keepdim, true);
}

Value take_along_last(const Value& x, const Value& idx) {
  internal::CheckMesh("take_along_last", x);
  internal::CheckMesh("take_along_last", idx);
  RankContext& ctx = RankContext::Get("take_along_last");
  if (x.rank() < 1 || idx.rank() != x.rank() - 1) {
    OpFail("take_along_last: idx must have x's leading dims: x=", x.ToString(),
           ", idx=", idx.ToString());
  }
  for (int d = 0; d < idx.rank(); ++d) {
    if (idx.dim(d) != x.dim(d)) {
      OpFail("take_along_last: idx ", idx.ToString(), " does not match the leading dims of ",
             x.ToString());
    }
  }
  AxisMask vocab = 0;
  std::optional<Rejection> no;
  SpmdType t = TakeAlongLastRule(x.type, x.rank(), idx.type, ctx.checked(), &vocab, no);
  if (no) TypeFail("take_along_last", no->axis, no->rule, no->fix, {{"x", &x}, {"idx", &idx}});
  if (!ctx.checked()) t = internal::ErasedJoin(x.type, t);
  internal::StampOrigins("take_along_last", t, {{"x", &x}, {"idx", &idx}},
                         "x and the indices are sharded over this axis on dims that do not line "
                         "up", "give x and the indices the same sharding on this axis");
  const int64_t v = x.dim(-1);
  const int64_t start = vocab ? ctx.mesh().GroupIndex(ctx.rank(), vocab) * v : 0;
  // GPU: the picked elements' flat positions in x computed on the device (-1: another shard's
  // index), then a row gather: no host round trip of x or of the indices.
  Tensor flat;
  std::vector<int64_t> ids, local;
  if (x.tensor.is_cuda()) {
    flat = LocalIndices(idx.tensor, start, v, /*stride=*/v, /*strict=*/!vocab, "take_along_last",
                        absl::StrCat(" for ", x.ToString()))
               .Reshape({idx.numel()});
  } else {
    ids = idx.tensor.ToVector<int64_t>();
    local.assign(ids.size(), -1);
  }
  for (size_t r = 0; r < ids.size(); ++r) {
    int64_t l = ids[r] - start;
    if (l >= 0 && l < v) {
      local[r] = l;
    } else if (!vocab) {
      OpFail("take_along_last: index ", ids[r], " at position ", r, " is out of range [0, ", v,
             ") for ", x.ToString());
    }
  }
  Tensor ot;
  if (x.tensor.is_meta()) {  // shape-only: the host path's output, nothing gathered
    ot = Tensor::Zeros(idx.shape(), x.dtype(), x.tensor.device());
  } else if (flat.defined()) {
    ot = GatherRows(x.tensor.Reshape({x.numel(), 1}), flat).Reshape(idx.shape());
  } else if (!x.tensor.is_cuda() && IsFloating(x.dtype())) {
    // Host gather of the picked elements' bits: a floating value round-tripped through f64 is
    // itself, so this equals the f64 path below without converting all of x.
    std::vector<int64_t> off(ids.size(), -1);
    for (size_t r = 0; r < ids.size(); ++r) {
      if (local[r] >= 0) off[r] = static_cast<int64_t>(r) * v + local[r];
    }
    ot = Tensor::Zeros(idx.shape(), x.dtype());
    GatherBits(x.tensor.raw_data(), ot.raw_data(), off, DTypeSize(x.dtype()));
  } else {
    std::vector<double> xv = x.tensor.ToVector<double>();
    std::vector<double> out(ids.size());
    for (size_t r = 0; r < ids.size(); ++r) {
      if (local[r] >= 0) out[r] = xv[r * v + local[r]];
    }
    ot = Tensor::FromVector<double>(idx.shape(), out);
    if (x.dtype() != DType::kF64) ot = Cast(ot, x.dtype());
    ot = ot.To(x.tensor.device());
  }
  Value y(std::move(ot), t);
  if (NeedsTape(x)) {
    Shape xs = x.shape();
    SpmdType xt = x.type;
    DType dt = x.dtype();
    RecordOp("take_along_last", {&x}, y,
             [xs, xt, dt, local, v, flat](const Value& g, uint32_t, Value* d) {
               Tensor t;
               if (g.tensor.is_meta()) {  // shape-only: the host path's zeros, nothing scattered
                 t = Tensor::Zeros(xs, dt, g.tensor.device());
               } else if (flat.defined()) {  // GPU: scatter g to the picked positions of zeros
                 t = ScatterAddRows(g.tensor.Reshape({flat.numel(), 1}), flat, NumElements(xs))
                         .Reshape(xs);
                 if (t.dtype() != dt) t = Cast(t, dt);
               } else if (!g.tensor.is_cuda() && g.dtype() == dt && IsFloating(dt)) {
                 // Host scatter of g's bits into zeros (what the f64 path below computes).
                 t = Tensor::Zeros(xs, dt);
                 const size_t es = DTypeSize(dt);
                 const char* src = static_cast<const char*>(g.tensor.raw_data());
                 char* dst = static_cast<char*>(t.raw_data());
                 for (size_t r = 0; r < local.size(); ++r) {
                   if (local[r] >= 0) std::memcpy(dst + (r * v + local[r]) * es, src + r * es, es);
                 }
               } else {
                 std::vector<double> gv = g.tensor.ToVector<double>();
                 std::vector<double> dx(NumElements(xs), 0.0);
                 for (size_t r = 0; r < local.size(); ++r) {
                   if (local[r] >= 0) dx[r * v + local[r]] = gv[r];
                 }
                 t = Tensor::FromVector<double>(xs, dx);
                 if (dt != DType::kF64) t = Cast(t, dt);
                 t = t.To(g.tensor.device());
               }
               // The scatter of g (vocab axes: g is R, dx the primal's S(last)).
               d[0] = internal::AsCotangent(Value(std::move(t), g.type), xt);
             });
  }
  return y;
}

}  // namespace shardmap
