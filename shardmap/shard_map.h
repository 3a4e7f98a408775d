// shard_map: run a per-device function over a mesh, with typed inputs and checked outputs.
//
// API at a glance: a Megatron MLP (tp = 3) forward and backward, in the global view.
//
//   #include "autograd/value_and_grad.h"    // value_and_grad(ShardMap)
//   #include "shardmap/ops/collective_ops.h"    // all_reduce, all_gather, ...
//   #include "shardmap/ops/ops.h"               // gelu, matmul, sum_partial, operators
//   #include "shardmap/shard_map.h"
//   using namespace shardmap;
//
//   Mesh mesh = *Mesh::Create({{"tp", 3}});
//   // Per-device code: x is R, w1 is S1 (column-parallel), w2 is S0 (row-parallel).
//   ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
//     const Value& x = in[0]; const Value& w1 = in[1]; const Value& w2 = in[2];
//     Value y = all_reduce(gelu(x.matmul(w1)).matmul(w2), "tp");   // one all-reduce
//     Value loss = sum(y * y, {});                                  // R on tp
//     return {loss, y};
//   };
//   ShardMap f = shard_map(mlp, mesh,
//                          /*in_specs=*/{P(), P(None, "tp"), P("tp", None)},
//                          /*out_specs=*/{P(), P()});
//   // Forward only: whole tensors in, whole tensors out.
//   absl::StatusOr<std::vector<Tensor>> out = f({x, w1, w2});
//   // Forward + backward: gradients of the whole inputs, assembled per in_specs.
//   absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});
//   //   r->outputs[0]: the loss; r->grads[1]: dloss/dw1 as a whole [d, h] tensor.
//   //   Forward issued one all_reduce over tp, backward one (the transpose of all_reduce);
//   //   x's gradient (P on tp) is summed at the boundary.
//
// Inputs: an axis named in an in_spec at dim d types the input S(d) on it; an axis not named
// gives R (or I with options.unnamed_input_type). Outputs are checked (sharding.h,
// CheckOutputType): an axis not named in the out_spec must be R or I, an unreduced axis P.
//
// Local view: inside an SPMD program already running per rank (RunSpmd, RunOnCommunicator, or a
// multi-process launcher), CallLocal takes this rank's shards, checks them against the specs and
// the mesh, types them, runs fn and checks its outputs:
//
//   RunSpmd(mesh, [&](RankContext& ctx) {
//     std::vector<Value> y = f.CallLocal({x_local, w1_local, w2_local});
//   });
//
// Errors inside fn (type errors, shape errors, collective failures) come back from the global
// call as a Status naming the rank; the failing rank poisons the world so others never hang.
//
// GPU ranks: options.placement (context.h) runs the ranks on GPUs. The global view keeps its
// host API: whole CPU tensors in, whole CPU tensors out. Each rank thread splits its block on
// the host and copies it to its device; fn runs there (kernels on the rank's stream,
// collectives on device memory); outputs (and, in value_and_grad, gradients) are copied back to
// the host by the rank thread before they are assembled:
//
//   ShardMapOptions o;
//   o.placement = DevicePlacement::SharedGpu();     // tp=3 virtual ranks on GPU 0
//   ShardMap f = shard_map(mlp, mesh, in_specs, out_specs, o);
//   absl::StatusOr<std::vector<Tensor>> out = f({x, w1, w2});   // CPU tensors, as before
//
// The local view takes shards that already live on the rank's device (ctx.device()); a shard
// on another device is an error naming both.
#ifndef SHARDMAP_SHARDMAP_SHARD_MAP_H_
#define SHARDMAP_SHARDMAP_SHARD_MAP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardmap/runtime/context.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/value.h"

namespace shardmap {

using ShardFn = std::function<std::vector<Value>(const std::vector<Value>&)>;

struct ShardMapOptions {
  TypeCheck check = TypeCheck::kOn;
  // Type of input axes not named in the in_spec: R (default, gradients stay pending sums) or I.
  AxisType unnamed_input_type = AxisType::R();
  // Indices of inputs whose unnamed axes are I whatever unnamed_input_type says (e.g. a value
  // computed redundantly by every device; its gradient is I too and is not summed).
  std::vector<int> invariant_inputs;
  // Names of the inputs and outputs for error messages ("w1" instead of "input 1").
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
  // After fn, verify at runtime that outputs typed R/I are identical across their axes.
  bool check_replication = false;
  collectives::InProcessOptions comm;
  // Where the ranks of the global view run (CPU by default); see the header comment.
  DevicePlacement placement;
  // When set, receives rank 0's log of collectives (forward and backward) of the last call.
  std::vector<CollectiveRecord>* collective_log = nullptr;
};

class ShardMap {
 public:
  // Checks the specs against the mesh once (unknown or repeated axes, invariant_inputs and the
  // names in range) and resolves each input's SPMD type; calls then only check shapes.
  static absl::StatusOr<ShardMap> Create(ShardFn fn, Mesh mesh, std::vector<PartitionSpec> in_specs,
                                         std::vector<PartitionSpec> out_specs,
                                         ShardMapOptions options = {});
  // As Create; a spec error is reported by the first call instead.
  ShardMap(ShardFn fn, Mesh mesh, std::vector<PartitionSpec> in_specs,
           std::vector<PartitionSpec> out_specs, ShardMapOptions options = {});

  // Global view: whole tensors in, whole tensors out.
  absl::StatusOr<std::vector<Tensor>> operator()(const std::vector<Tensor>& inputs) const;

  // Local view (per-device code; throws OpError): this rank's shards in, typed outputs out.
  std::vector<Value> CallLocal(const std::vector<Tensor>& local_inputs) const;

  // The options RunSpmd gets for the global view (check, comm, placement).
  SpmdOptions spmd_options() const {
    return SpmdOptions{options_.check, options_.comm, options_.placement};
  }
  // This rank's shard of global input k (a host tensor), on the rank's device.
  Tensor LocalInput(const Tensor& global, size_t k, const RankContext& ctx) const;

  const ShardFn& fn() const { return fn_; }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<PartitionSpec>& in_specs() const { return in_specs_; }
  const std::vector<PartitionSpec>& out_specs() const { return out_specs_; }
  const ShardMapOptions& options() const { return options_; }
  // "'w1'" when named in options.input_names, else "input 1" (likewise outputs).
  std::string InputName(size_t k) const;
  std::string OutputName(size_t k) const;

  // The specs value_and_grad assembles the inputs' gradients with: each input's dual type
  // written as a spec. S stays S (the same blocks); an axis where the input is R gives a
  // gradient that is P there, unreduced (each rank holds a partial sum; the global view sums
  // them); I stays I. E.g. in_specs {P(), P(None, "tp")} on a {dp, tp} mesh give
  // {P().Unreduced({"dp", "tp"}), P(None, "tp").Unreduced({"dp"})}. When the specs are invalid
  // (Create's error), the in_specs unchanged: the call reports that error.
  std::vector<PartitionSpec> GradientSpecs() const;

  // For transforms of a shard_map (value_and_grad in autograd/): run a different per-rank body
  // on the same validated, split, typed inputs, and have its extra results assembled.
  //
  // What one rank computes from its typed inputs: fn's outputs (checked against out_specs) and
  // extra results (value_and_grad: the gradients, one per input; undefined ones allowed).
  struct RankResult {
    std::vector<Value> outputs;
    std::vector<Value> extras;
    bool outputs_checked = false;  // the body called CheckOutputs already (before a backward)
  };
  using RankBody = std::function<RankResult(const std::vector<Value>& typed_inputs)>;
  struct GlobalResult {
    std::vector<Tensor> outputs;
    std::vector<Tensor> extras;
  };
  // The one runner of the global view: validate, split per rank, type, body, check outputs,
  // assemble outputs per out_specs and extras per extra_specs (types from rank 0's extras; an
  // undefined extra stays undefined).
  absl::StatusOr<GlobalResult> RunGlobal(const std::vector<Tensor>& inputs, const RankBody& body,
                                         const std::vector<PartitionSpec>& extra_specs) const;
  // The one runner of the local view (throws OpError); `what` prefixes errors.
  RankResult RunLocal(const std::vector<Tensor>& local_inputs, const RankBody& body,
                      const char* what) const;
  // Checks fn's outputs against the out_specs (count and types; runtime replication if asked);
  // throws OpError. For a body that checks them before its own work (a backward pass).
  void CheckOutputs(const std::vector<Value>& outputs) const;

 private:
  // Validates the global inputs against the in_specs.
  absl::Status ValidateGlobal(const std::vector<Tensor>& inputs) const;
  // Types this rank's inputs (shards); throws OpError on a shape that does not fit the spec.
  std::vector<Value> TypeLocalInputs(const std::vector<Tensor>& local_inputs) const;
  // Local view, checked mode: every rank's shards have the same dtype and shape.
  void CheckSameLocalShapes(RankContext& ctx, const std::vector<Tensor>& local_inputs) const;
  // Local view: throws OpError when a shard is not on the rank's device.
  void CheckLocalDevices(const RankContext& ctx, const std::vector<Tensor>& local_inputs) const;
  // The type an assembled result is read with: rank 0's, or (erased mode, where values carry
  // only a kind summary) the one the spec states.
  SpmdType AssemblyType(const SpmdType& rank0, const PartitionSpec& spec) const;

  ShardFn fn_;
  Mesh mesh_;
  std::vector<PartitionSpec> in_specs_;
  std::vector<PartitionSpec> out_specs_;
  ShardMapOptions options_;
  absl::Status spec_status_;             // Create's checks (OK when they passed)
  std::vector<SpmdType> input_types_;    // resolved once: S(d) per named axis, R/I otherwise
};

inline ShardMap shard_map(ShardFn fn, Mesh mesh, std::vector<PartitionSpec> in_specs,
                          std::vector<PartitionSpec> out_specs, ShardMapOptions options = {}) {
  return ShardMap(std::move(fn), std::move(mesh), std::move(in_specs), std::move(out_specs),
                  std::move(options));
}

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_SHARD_MAP_H_
