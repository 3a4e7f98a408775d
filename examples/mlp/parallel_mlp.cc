#include "examples/mlp/parallel_mlp.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// Only rank 0 records, so the trace is written by one thread.
void Record(MlpTrace* trace, const char* name, const Value& v) {
  if (trace == nullptr) return;
  RankContext* ctx = RankContext::Current();
  if (ctx != nullptr && ctx->rank() != 0) return;
  trace->types.emplace_back(name, v.ToString());
}

// NaN when any element is NaN (std::max would drop it and report 0); +inf for other mismatches
// of infinities or shapes. Tests compare with tensor/testing/compare.h instead.
double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.at(i), y = b.at(i);
    const double d = (std::isinf(x) && x == y) ? 0 : std::fabs(x - y);
    if (!(d <= m)) m = d;  // NaN sticks
  }
  return m;
}

}  // namespace

MlpParams InitMlp(const MlpConfig& c) {
  const double s1 = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  const double s2 = 1.0 / std::sqrt(static_cast<double>(c.d_hidden));
  return {RandomNormal({c.d_model, c.d_hidden}, c.seed + 1, 0.0, s1),
          RandomNormal({c.d_hidden}, c.seed + 2, 0.0, 0.1),
          RandomNormal({c.d_hidden, c.d_model}, c.seed + 3, 0.0, s2),
          RandomNormal({c.d_model}, c.seed + 4, 0.0, 0.1)};
}

MlpBatch SyntheticBatch(const MlpConfig& c) {
  Tensor x = RandomNormal({c.batch, c.d_model}, c.seed + 10);
  Tensor teacher = RandomNormal({c.d_model, c.d_model}, c.seed + 11, 0.0,
                                1.5 / std::sqrt(static_cast<double>(c.d_model)));
  return {x, Tanh(Matmul(x, teacher))};
}

Value MegatronMlp(const Value& x, const Value& w1, const Value& b1, const Value& w2,
                  const Value& b2, const std::string& tp_axis, MlpTrace* trace) {
  Record(trace, "x", x);
  Value h = x.matmul(w1) + b1;  // column-parallel: S1 on tp, no communication
  Record(trace, "h = x@w1 + b1", h);
  Value a = gelu(h);
  Record(trace, "a = gelu(h)", a);
  Value yp = a.matmul(w2);      // row-parallel: a partial sum, P on tp
  Record(trace, "yp = a@w2", yp);
  Value y = (tp_axis.empty() ? yp : all_reduce(yp, tp_axis)) + b2;  // P -> R on tp
  Record(trace, "y = all_reduce(yp, tp) + b2", y);
  return y;
}

Value MseLossShare(const Value& y, const Value& target, int64_t total_count, MlpTrace* trace) {
  Value d = y - target;
  // Rows are S0 on dp: the local sum is P on dp; / global count makes it a share of the mean.
  Value loss = sum_partial(d * d, {}) / static_cast<double>(total_count);
  Record(trace, "loss = sum_partial((y-t)^2)/n", loss);
  return loss;
}

std::vector<PartitionSpec> MlpInSpecs() {
  return {P("dp", None), P("dp", None), P(None, "tp"), P("tp"), P("tp", None), P()};
}

absl::StatusOr<ShardedStep> ShardedTrainStep(const Mesh& mesh, const MlpParams& p,
                                             const MlpBatch& batch, MlpTrace* trace) {
  const int64_t count = batch.target.numel();
  ShardFn fn = [count, trace](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = MegatronMlp(in[0], in[2], in[3], in[4], in[5], "tp", trace);
    return {MseLossShare(y, in[1], count, trace)};
  };
  ShardedStep step;
  ShardMapOptions opts;
  opts.collective_log = &step.log;
  opts.input_names = {"x", "target", "w1", "b1", "w2", "b2"};
  opts.output_names = {"loss"};
  ShardMap f = shard_map(fn, mesh, MlpInSpecs(), {P().Unreduced({"dp"})}, opts);
  absl::StatusOr<ShardMapGrads> r =
      value_and_grad(f)({batch.x, batch.target, p.w1, p.b1, p.w2, p.b2});
  if (!r.ok()) return r.status();
  step.loss = r->outputs[0].item();
  step.grads = {r->grads[2], r->grads[3], r->grads[4], r->grads[5]};
  return step;
}

ReferenceStep ReferenceTrainStep(const MlpParams& p, const MlpBatch& batch) {
  const double n = static_cast<double>(batch.target.numel());
  Tensor h = Add(Matmul(batch.x, p.w1), p.b1);
  Tensor a = Gelu(h);
  Tensor y = Add(Matmul(a, p.w2), p.b2);
  Tensor d = Sub(y, batch.target);
  ReferenceStep r;
  r.loss = Sum(Mul(d, d), {}).item() / n;
  // Backward by hand: dL/dy = 2 (y - t) / n.
  Tensor dy = MulScalar(d, 2.0 / n);
  Tensor da = Matmul(dy, p.w2, false, true);
  Tensor dh = GeluGrad(h, da);
  r.grads = {Matmul(batch.x, dh, true, false), Sum(dh, {0}), Matmul(a, dy, true, false),
             Sum(dy, {0})};
  return r;
}

void SgdUpdate(MlpParams& p, const MlpParams& g, double lr) {
  p.w1 = Sub(p.w1, MulScalar(g.w1, lr));
  p.b1 = Sub(p.b1, MulScalar(g.b1, lr));
  p.w2 = Sub(p.w2, MulScalar(g.w2, lr));
  p.b2 = Sub(p.b2, MulScalar(g.b2, lr));
}

std::string SummarizeCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log) {
  std::string out;
  for (bool backward : {false, true}) {
    // (op, axes) in order of first appearance, with counts.
    std::vector<std::pair<std::string, int>> seen;
    for (const CollectiveRecord& r : log) {
      if (r.backward != backward) continue;
      std::string key = absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")");
      bool found = false;
      for (auto& [k, n] : seen) {
        if (k == key) { ++n; found = true; }
      }
      if (!found) seen.emplace_back(key, 1);
    }
    absl::StrAppend(&out, backward ? " | bwd: " : "fwd: ");
    if (seen.empty()) absl::StrAppend(&out, "none");
    for (size_t i = 0; i < seen.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", seen[i].first, " x", seen[i].second);
    }
  }
  return out;
}

int CountCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                     const std::string& op, const std::string& axes, bool backward) {
  int n = 0;
  for (const CollectiveRecord& r : log) {
    n += (op == r.op && r.backward == backward && mesh.MaskToString(r.axes) == axes) ? 1 : 0;
  }
  return n;
}

double MaxParamDiff(const MlpParams& a, const MlpParams& b) {
  double m = 0;
  for (double d : {MaxAbsDiff(a.w1, b.w1), MaxAbsDiff(a.b1, b.b1), MaxAbsDiff(a.w2, b.w2),
                   MaxAbsDiff(a.b2, b.b2)}) {
    if (!(d <= m)) m = d;  // NaN sticks
  }
  return m;
}

}  // namespace shardmap
