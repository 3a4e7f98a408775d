#include "shardmap/nn_ops.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "shardmap/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops.h"
#include "tensor/error.h"
#include "tensor/ops/nn.h"

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

}  // namespace

Value softmax(const Value& x, int dim) {
  SpmdType t = internal::NonlinearTypeOf("softmax", x);
  internal::CheckDimNotSharded("softmax", x, dim,
                               "all_gather x along that dim first, or compute the softmax with "
                               "all_reduce(max) and all_reduce(sum) over the axis");
  Value out(Softmax(x.tensor, dim), t);
  if (NeedsTape(x)) {
    Value y = Detached(out);
    RecordOp("softmax", {&x}, out, [y, dim](const Value& g, uint32_t, Value* d) {
      d[0] = Value(SoftmaxBackward(y.tensor, g.tensor, dim),
                   internal::ElementwiseType("softmax_backward", y, g, g.shape(), true));
    });
  }
  return out;
}

Value log_softmax(const Value& x, int dim) {
  SpmdType t = internal::NonlinearTypeOf("log_softmax", x);
  internal::CheckDimNotSharded("log_softmax", x, dim,
                               "all_gather x along that dim first (or use a vocab-parallel "
                               "composite with all_reduce(max) and all_reduce(sum))");
  Value out(LogSoftmax(x.tensor, dim), t);
  if (NeedsTape(x)) {
    Value y = Detached(out);
    RecordOp("log_softmax", {&x}, out, [y, dim](const Value& g, uint32_t, Value* d) {
      d[0] = Value(LogSoftmaxBackward(y.tensor, g.tensor, dim),
                   internal::ElementwiseType("log_softmax_backward", y, g, g.shape(), true));
    });
  }
  return out;
}

Value layer_norm(const Value& x, const Value& gamma, const Value& beta, double eps) {
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
  return Tensor::FromVector<int64_t>(ids.shape(), v);
}

void ZeroRows(Tensor& t, const std::vector<bool>& mask) {
  if (t.numel() == 0) return;
  size_t row_bytes = t.nbytes() / mask.size();
  char* p = static_cast<char*>(t.raw_data());
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) std::memset(p + i * row_bytes, 0, row_bytes);
  }
}

}  // namespace

Value embedding(const Value& table, const Value& ids) {
  RankContext& ctx = RankContext::Get("embedding");
  const int na = table.type.num_axes();
  if (table.rank() != 2) OpFail("embedding: table must be [rows, hidden], got ", table.ToString());
  SpmdType t(na);
  AxisMask vocab = 0;
  for (int i = 0; i < na; ++i) {
    AxisType a = table.type[i], b = ids.type[i];
    if (a.kind == AxisKind::kP || b.kind == AxisKind::kP) {
      TypeFail("embedding", i, "the table or the ids are a partial sum (P)",
               "all_reduce them first", {{"table", &table}, {"ids", &ids}});
    }
    if (a.is_sharded() && a.dim == 0) {
      if (b.kind != AxisKind::kR && b.kind != AxisKind::kI && ctx.checked()) {
        TypeFail("embedding", i,
                 "the table is vocab-parallel (S0) but the ids vary: each device must look up "
                 "the same ids in its shard",
                 "all_gather the ids over that axis first", {{"table", &table}, {"ids", &ids}});
      }
      vocab |= 1u << i;
      t[i] = AxisType::P();
    } else if (a.kind == AxisKind::kR || a.kind == AxisKind::kI) {
      if (a.kind == AxisKind::kI && b.kind != AxisKind::kI && ctx.checked()) {
        TypeFail("embedding", i, "an invariant (I) table mixes with nothing else",
                 "convert(table, axis, I->R) first", {{"table", &table}, {"ids", &ids}});
      }
      t[i] = a.kind == AxisKind::kI ? AxisType::I() : b;
    } else if (a.is_sharded() && a.dim == 1) {
      if (b.kind == AxisKind::kV && ctx.checked()) {
        TypeFail("embedding", i, "a hidden-sharded table with varying ids",
                 "all_gather the ids first", {{"table", &table}, {"ids", &ids}});
      }
      t[i] = AxisType::Sharded(ids.rank());
    } else {
      t[i] = AxisType::V();
    }
  }
  if (!ctx.checked()) t = internal::ErasedJoin(table.type, t);
  int64_t rows = table.dim(0);
  int64_t start = vocab ? ctx.mesh().GroupIndex(ctx.rank(), vocab) * rows : 0;
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
  SpmdType t = internal::NonlinearTypeOf("cross_entropy", logits);
  internal::CheckDimNotSharded("cross_entropy", logits, -1,
                               "gather the classes first, or use a vocab-parallel cross-entropy "
                               "(local max/sum-exp combined with all_reduce(max) and "
                               "all_reduce(sum))");
  if (Checked()) {
    for (int i = 0; i < t.num_axes(); ++i) {
      AxisType a = logits.type[i], b = targets.type[i];
      bool ok = a.kind == b.kind || (b.kind == AxisKind::kR && a.kind != AxisKind::kV);
      if (a.is_sharded() && b.is_sharded()) ok = a.dim == b.dim;
      if (!ok) {
        TypeFail("cross_entropy", i, "logits and targets are distributed differently",
                 "shard the targets' rows like the logits' rows",
                 {{"logits", &logits}, {"targets", &targets}});
      }
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

}  // namespace shardmap
