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
  if (reduce_partial_grads) {
    RankContext& ctx = RankContext::Get("value_and_grad");
    for (Value& g : r.grads) {
      std::vector<std::string> axes;
      for (int i = 0; i < ctx.mesh().num_axes(); ++i) {
        if (g.type[i].kind == AxisKind::kP) axes.push_back(ctx.mesh().axis_names()[i]);
      }
      if (!axes.empty()) g = all_reduce(g, Axes(axes), To::kR);
    }
  }
  return r;
}

LocalGrads ShardMapValueAndGrad::CallLocal(const std::vector<Tensor>& local_inputs,
                                           bool reduce_partial_grads) const {
  RankContext& ctx = RankContext::Get("value_and_grad(shard_map) (local view)");
  if (!(ctx.mesh() == f_.mesh())) {
    OpFail("value_and_grad(shard_map) (local view): the running program's mesh is ",
           ctx.mesh().ShortString(), " but the shard_map is over ", f_.mesh().ShortString());
  }
  if (f_.out_specs().empty()) OpFail("value_and_grad(shard_map): output 0 must be the loss");
  f_.CheckLocalDevices(ctx, local_inputs);
  std::vector<Value> in = f_.TypeLocalInputs(local_inputs);
  Tape tape;
  std::vector<Value> watched;
  for (const Value& v : in) watched.push_back(IsFloating(v.dtype()) ? tape.Watch(v) : v);
  LocalGrads r;
  {
    ScopedRecorder rec(&tape);
    r.outputs = f_.fn()(watched);
  }
  f_.CheckOutputs(r.outputs);
  r.grads = tape.Backward(r.outputs[0], LossSeed(r.outputs[0]), watched);
  for (size_t k = 0; k < in.size(); ++k) {
    if (!IsFloating(in[k].dtype())) r.grads[k] = Value();
  }
  for (Value& o : r.outputs) o.node = -1;
  if (reduce_partial_grads) {
    for (Value& g : r.grads) {
      if (!g.defined()) continue;
      std::vector<std::string> axes;
      for (int i = 0; i < ctx.mesh().num_axes(); ++i) {
        if (g.type[i].kind == AxisKind::kP) axes.push_back(ctx.mesh().axis_names()[i]);
      }
      if (!axes.empty()) g = all_reduce(g, Axes(axes), To::kR);
    }
  }
  return r;
}

absl::StatusOr<ShardMapGrads> ShardMapValueAndGrad::operator()(
    const std::vector<Tensor>& inputs) const {
  if (absl::Status s = f_.ValidateGlobal(inputs); !s.ok()) return s;
  if (f_.out_specs().empty()) {
    return absl::InvalidArgumentError("value_and_grad(shard_map): the function needs an output "
                                      "(output 0 is the loss)");
  }
  const Mesh& mesh = f_.mesh();
  const int n = mesh.size();
  const size_t nin = inputs.size();
  std::vector<std::vector<Tensor>> out_locals(n), grad_locals(n);
  std::vector<SpmdType> out_types, grad_types(nin);
  absl::Mutex mu;
  const ShardMapOptions& opts = f_.options();
  absl::Status s = RunSpmd(
      mesh,
      [&](RankContext& ctx) {
        // Host block -> the rank's device (options.placement); outputs and gradients come back
        // to the host on the rank's stream below.
        std::vector<Tensor> mine;
        for (size_t k = 0; k < nin; ++k) mine.push_back(f_.LocalInput(inputs[k], k, ctx));
        std::vector<Value> in = f_.TypeLocalInputs(mine);
        Tape tape;
        std::vector<Value> watched;
        for (const Value& v : in) watched.push_back(IsFloating(v.dtype()) ? tape.Watch(v) : v);
        std::vector<Value> outs;
        {
          ScopedRecorder rec(&tape);
          outs = f_.fn()(watched);
        }
        f_.CheckOutputs(outs);
        std::vector<Value> grads = tape.Backward(outs[0], LossSeed(outs[0]), watched);
        for (const Value& v : outs) out_locals[ctx.rank()].push_back(v.tensor.To(Device::Cpu()));
        for (size_t k = 0; k < nin; ++k) {
          grad_locals[ctx.rank()].push_back(
              IsFloating(in[k].dtype()) ? grads[k].tensor.To(Device::Cpu()) : Tensor());
        }
        if (ctx.rank() == 0) {
          absl::MutexLock lock(&mu);
          for (const Value& v : outs) out_types.push_back(v.type);
          for (size_t k = 0; k < nin; ++k) grad_types[k] = Dual(in[k].type);
          if (opts.collective_log) *opts.collective_log = ctx.collective_log();
        }
      },
      f_.spmd_options());
  if (!s.ok()) return s;
  ShardMapGrads result;
  for (size_t k = 0; k < f_.out_specs().size(); ++k) {
    std::vector<Tensor> per_rank(n);
    for (int r = 0; r < n; ++r) per_rank[r] = out_locals[r][k];
    SpmdType t = out_types[k];
    if (opts.check == TypeCheck::kErased) {
      t = SpmdType(mesh.num_axes(), AxisType::R());
      for (const std::string& a : f_.out_specs()[k].unreduced()) {
        t[mesh.AxisIndex(a)] = AxisType::P();
      }
    }
    absl::StatusOr<Tensor> g = Assemble(mesh, f_.out_specs()[k], per_rank, t);
    if (!g.ok()) return g.status();
    result.outputs.push_back(*std::move(g));
  }
  for (size_t k = 0; k < nin; ++k) {
    if (!grad_locals[0][k].defined()) {
      result.grads.push_back(Tensor());
      continue;
    }
    std::vector<Tensor> per_rank(n);
    for (int r = 0; r < n; ++r) per_rank[r] = grad_locals[r][k];
    // The dual of the input type: S stays S (blocks), R becomes P (summed), I stays I.
    absl::StatusOr<Tensor> g = Assemble(mesh, f_.in_specs()[k], per_rank, grad_types[k]);
    if (!g.ok()) {
      return absl::Status(g.status().code(), absl::StrCat("while assembling the gradient of input ",
                                                          k, ": ", g.status().message()));
    }
    result.grads.push_back(*std::move(g));
  }
  return result;
}

}  // namespace shardmap
