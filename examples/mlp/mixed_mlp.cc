#include "examples/mlp/mixed_mlp.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"

namespace shardmap {
namespace {

// Only rank 0 records, so the trace is written by one thread.
void Record(MlpTrace* trace, const char* name, const Value& v) {
  if (trace == nullptr) return;
  RankContext* ctx = RankContext::Current();
  if (ctx != nullptr && ctx->rank() != 0) return;
  trace->types.emplace_back(name, v.ToString());
}

// Marks the collectives issued in its scope as backward ones.
class BackwardPhase {
 public:
  explicit BackwardPhase(RankContext& ctx) : ctx_(ctx), prev_(ctx.in_backward()) {
    ctx_.set_in_backward(true);
  }
  ~BackwardPhase() { ctx_.set_in_backward(prev_); }

 private:
  RankContext& ctx_;
  bool prev_;
};

}  // namespace

Value MixedMegatronMlp(const Value& x, const Value& w1, const Value& b1, const Value& w2,
                       const Value& b2, const std::string& tp_axis, const PrecisionPolicy& policy,
                       MlpTrace* trace) {
  Value xc = ToCompute(x, policy);
  Record(trace, "x (cast to compute)", xc);
  Value w1c = ToCompute(w1, policy);
  Record(trace, "w1 (master -> compute)", w1c);
  Value h = xc.matmul(w1c) + ToCompute(b1, policy);  // column-parallel: S1 on tp
  Record(trace, "h = x@w1 + b1", h);
  Value a = gelu(h);
  Record(trace, "a = gelu(h)", a);
  Value yp = a.matmul(ToCompute(w2, policy));         // row-parallel: P on tp
  Record(trace, "yp = a@w2", yp);
  Value y = (tp_axis.empty() ? yp : ReduceActivation(yp, tp_axis, policy)) +
            ToCompute(b2, policy);
  Record(trace, "y = all_reduce(yp, tp) + b2", y);
  return y;
}

Value MixedMseLossShare(const Value& y, const Value& target, int64_t total_count,
                        const PrecisionPolicy& policy, MlpTrace* trace) {
  Value d = ToLoss(y, policy) - ToLoss(target, policy);
  Value loss = sum_partial(d * d, {}) / static_cast<double>(total_count);
  Record(trace, "loss = sum_partial((f32(y)-t)^2)/n", loss);
  return loss;
}

std::vector<NamedTensor> MlpNamed(const MlpParams& p) {
  return {{"w1", p.w1}, {"b1", p.b1}, {"w2", p.w2}, {"b2", p.b2}};
}

MlpParams MlpFromNamed(const std::vector<NamedTensor>& named) {
  MlpParams p;
  for (const NamedTensor& t : named) {
    if (t.name == "w1") p.w1 = t.tensor;
    if (t.name == "b1") p.b1 = t.tensor;
    if (t.name == "w2") p.w2 = t.tensor;
    if (t.name == "b2") p.b2 = t.tensor;
  }
  return p;
}

absl::StatusOr<MixedStep> MixedTrainStep(const Mesh& mesh, const MlpParams& p,
                                         const MlpBatch& batch, const PrecisionPolicy& policy,
                                         const MixedStepOptions& options) {
  for (const NamedTensor& t : MlpNamed(p)) {
    if (t.tensor.dtype() != policy.param) {
      return absl::InvalidArgumentError(
          absl::StrCat("MixedTrainStep: master weight '", t.name, "' is ",
                       t.tensor.ShapeString(), ", the policy keeps masters in ",
                       DTypeName(policy.param)));
    }
  }
  const std::vector<PartitionSpec> specs = MlpInSpecs();  // x, target, w1, b1, w2, b2
  const int64_t count = batch.target.numel();
  MixedStep step;
  // Outputs: the loss (each rank's share of the mean: P on dp, R on tp), then the reduced
  // gradients, typed like their parameters (R where reduced, S where sharded).
  std::vector<PartitionSpec> out_specs = {P().Unreduced({"dp"})};
  out_specs.insert(out_specs.end(), specs.begin() + 2, specs.end());
  ShardMapOptions so;
  so.check = options.check;
  so.collective_log = &step.log;
  so.input_names = {"x", "target", "w1", "b1", "w2", "b2"};
  so.output_names = {"loss", "grad w1", "grad b1", "grad w2", "grad b2"};
  ShardMap f(
      [&](const std::vector<Value>& in) -> std::vector<Value> {
        const Value& x = in[0];
        const Value& target = in[1];
        std::vector<Value> params(in.begin() + 2, in.end());
        Value loss;
        ValueAndGrad vg = value_and_grad(
            [&](const std::vector<Value>& w) {
              Value y = MixedMegatronMlp(x, w[0], w[1], w[2], w[3], "tp", policy, options.trace);
              loss = MixedMseLossShare(y, target, count, policy, options.trace);
              return options.loss_scale == 1.0 ? loss : loss * options.loss_scale;
            },
            params);
        std::vector<Value> out = {loss};
        {
          BackwardPhase bwd(RankContext::Get("MixedTrainStep"));
          for (Value& g : ReduceGradients(vg.grads, params, policy)) out.push_back(std::move(g));
        }
        return out;
      },
      mesh, specs, out_specs, so);
  absl::StatusOr<std::vector<Tensor>> out = f({batch.x, batch.target, p.w1, p.b1, p.w2, p.b2});
  if (!out.ok()) return out.status();
  step.loss = (*out)[0].item();
  step.grads = MlpParams{(*out)[1], (*out)[2], (*out)[3], (*out)[4]};
  return step;
}

std::string SummarizeCollectiveBytes(const Mesh& mesh, const std::vector<CollectiveRecord>& log) {
  std::string out;
  for (bool backward : {false, true}) {
    struct Group {
      std::string key;
      int count;
      int64_t bytes;
    };
    std::vector<Group> seen;
    for (const CollectiveRecord& r : log) {
      if (r.backward != backward) continue;
      std::string key = absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")");
      bool found = false;
      for (Group& g : seen) {
        if (g.key == key) {
          ++g.count;
          g.bytes += r.bytes;
          found = true;
        }
      }
      if (!found) seen.push_back({key, 1, r.bytes});
    }
    absl::StrAppend(&out, backward ? " | bwd: " : "fwd: ");
    if (seen.empty()) absl::StrAppend(&out, "none");
    for (size_t i = 0; i < seen.size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", seen[i].key, " x", seen[i].count, " ",
                      seen[i].bytes, "B");
    }
  }
  return out;
}

}  // namespace shardmap
