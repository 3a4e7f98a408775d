#include "autograd/value_and_grad.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "autograd/tape.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"

namespace shardmap {

Value LossSeed(const Value& loss) {
  RankContext& ctx = RankContext::Get("value_and_grad");
  const Mesh& mesh = ctx.mesh();
  bool one = true;
  SpmdType st(mesh.num_axes());
  st.set_mesh_id(mesh.id());
  for (int i = 0; i < mesh.num_axes(); ++i) {
    AxisType t = loss.type[i];
    switch (t.kind) {
      case AxisKind::kR:
        if (ctx.coord(i) != 0) one = false;
        st[i] = AxisType::P();
        break;
      case AxisKind::kI:
        st[i] = AxisType::I();
        break;
      case AxisKind::kP:
        st[i] = AxisType::R();
        break;
      case AxisKind::kV:
        if (ctx.checked()) {
          OpFail("value_and_grad: the loss ", loss.ToString(), " varies (V) over axis '",
                 mesh.axis_names()[i], "', so its gradient is ambiguous. Fix: reduce it first, "
                 "e.g. all_reduce(loss, \"", mesh.axis_names()[i], "\", To::kR, "
                 "ReduceKind::kMean), or reinterpret(loss / n, \"", mesh.axis_names()[i],
                 "\") to make it P (each device's share of the global mean)");
        }
        st[i] = AxisType::R();  // erased mode: a P that was not tracked as such
        break;
    }
  }
  Tensor s = Tensor::Full(loss.shape(), one ? 1.0 : 0.0, loss.dtype(), loss.tensor.device());
  return Value(std::move(s), st);
}

namespace {

// all_reduces the gradients left as pending sums (P) on some axes.
void ReducePartialGrads(std::vector<Value>& grads) {
  RankContext& ctx = RankContext::Get("value_and_grad");
  for (Value& g : grads) {
    if (!g.defined()) continue;
    std::vector<std::string> axes = ctx.mesh().AxisNamesOf(g.type.AxesOfKind(AxisKind::kP));
    if (!axes.empty()) g = all_reduce(g, Axes(axes), To::kR);
  }
}

}  // namespace

ValueAndGrad value_and_grad(const std::function<Value(const std::vector<Value>&)>& fn,
                            const std::vector<Value>& params, bool reduce_partial_grads) {
  Tape tape;
  std::vector<Value> watched;
  watched.reserve(params.size());
  for (const Value& p : params) watched.push_back(tape.Watch(p));
  Value loss;
  {
    ScopedRecorder rec(&tape);
    loss = fn(watched);
  }
  ValueAndGrad r;
  r.grads = tape.Backward(loss, LossSeed(loss), watched);
  loss.node = -1;
  r.value = loss;
  if (reduce_partial_grads) ReducePartialGrads(r.grads);
  return r;
}


ShardMap::RankResult ShardMapValueAndGrad::Differentiate(const std::vector<Value>& in) const {
  Tape tape;
  std::vector<Value> watched;
  watched.reserve(in.size());
  for (const Value& v : in) watched.push_back(IsFloating(v.dtype()) ? tape.Watch(v) : v);
  ShardMap::RankResult r;
  {
    ScopedRecorder rec(&tape);
    r.outputs = f_.fn()(watched);
  }
  // Output types before the backward pass, so a wrong output is reported as such.
  f_.CheckOutputs(r.outputs);
  r.outputs_checked = true;
  r.extras = tape.Backward(r.outputs[0], LossSeed(r.outputs[0]), watched);
  for (size_t k = 0; k < in.size(); ++k) {
    if (!IsFloating(in[k].dtype())) r.extras[k] = Value();
  }
  for (Value& o : r.outputs) o.node = -1;
  return r;
}

LocalGrads ShardMapValueAndGrad::CallLocal(const std::vector<Tensor>& local_inputs,
                                           bool reduce_partial_grads) const {
  if (f_.out_specs().empty()) OpFail("value_and_grad(shard_map): output 0 must be the loss");
  ShardMap::RankResult r = f_.RunLocal(
      local_inputs, [this](const std::vector<Value>& in) { return Differentiate(in); },
      "value_and_grad(shard_map) (local view)");
  LocalGrads g{std::move(r.outputs), std::move(r.extras)};
  if (reduce_partial_grads) ReducePartialGrads(g.grads);
  return g;
}

absl::StatusOr<ShardMapGrads> ShardMapValueAndGrad::operator()(
    const std::vector<Tensor>& inputs) const {
  if (f_.out_specs().empty()) {
    return absl::InvalidArgumentError("value_and_grad(shard_map): the function needs an output "
                                      "(output 0 is the loss)");
  }
  absl::StatusOr<ShardMap::GlobalResult> r = f_.RunGlobal(
      inputs, [this](const std::vector<Value>& in) { return Differentiate(in); },
      f_.GradientSpecs());
  if (!r.ok()) return r.status();
  return ShardMapGrads{std::move(r->outputs), std::move(r->extras)};
}

}  // namespace shardmap
