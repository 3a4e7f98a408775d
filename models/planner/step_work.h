// What one rank role does in one training step, reduced to what the planner's cost model reads:
// its GEMM shapes, its other ops' FLOPs and bytes, its collectives in program order, and its
// memory. models/train/step_profile.h's StepProfile (the shape-only run of that role's per-device
// program) converts to it (planner/shape_only_source.h); tests build it by hand.
//
//   RoleWork w;
//   w.role = "all ranks";
//   w.gemms.push_back({.batch = 1, .m = 4096, .n = 3 * 4096, .k = 4096, .dtype = DType::kBF16});
//   w.collectives.push_back({.op = "all_gather", .axes = {"dp_shard"}, .group_size = 8,
//                            .bytes = 32e6, .backward = false, .phase = "fsdp"});
//   w.peak_bytes = 60e9;
#ifndef SHARDMAP_MODELS_PLANNER_STEP_WORK_H_
#define SHARDMAP_MODELS_PLANNER_STEP_WORK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace shardmap::planner {

// One GEMM (or `count` of them): batch x [m, k] x [k, n].
struct GemmWork {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  DType dtype = DType::kF32;
  int64_t count = 1;
  bool backward = false;
  bool trans_a = false, trans_b = false;  // the operands' layouts as the op ran them
  double flops() const { return 2.0 * batch * m * n * k * count; }
};

// One collective as the rank issues it. bytes: what this rank contributes (the framework's
// CollectiveRecord convention: the whole buffer for all_reduce / reduce_scatter / all_to_all /
// ppermute, its own block for all_gather).
// The ops of one name that are not GEMMs: bandwidth-bound (elementwise, norms, softmax), except
// fused attention, whose FLOPs run at the profile's attention rate.
struct OtherWork {
  std::string op;
  DType dtype = DType::kF32;
  double flops = 0, bytes = 0;
  bool attention = false;
};

// The op names priced by their GEMM shapes (matmul, batched matmul, linear and its fused
// backward, einsum contractions); every other op is an OtherWork.
inline bool IsGemmOpName(const std::string& op) {
  return op.find("matmul") != std::string::npos || op.find("linear") != std::string::npos ||
         op.find("einsum") != std::string::npos;
}

struct CollectiveWork {
  std::string op;                 // all_reduce, all_gather, reduce_scatter, all_to_all, ppermute
  std::vector<std::string> axes;  // mesh axes the group spans
  int group_size = 1;
  double bytes = 0;
  bool backward = false;
  // What issued it: "fsdp" (parameter all_gathers, gradient reduce-scatters over dp_shard),
  // "grad" (gradient all_reduces over the data-parallel axes), "tp", "cp", "ep", "pp", "norm",
  // "loss" or "" (anything else). The cost model overlaps "fsdp" and "grad" with compute.
  std::string phase;
  DType dtype = DType::kF32;       // the elements moved
};

struct RoleWork {
  std::string role = "all ranks";  // e.g. "stage 0 of 4"
  int ranks = 1;                   // ranks that run this role
  int pp_stage = -1;               // pipeline stage (-1: no pipeline)
  int layers = 0;                  // transformer blocks this role runs (0: unknown, taken as 1)
  // The role's pipeline stage holds the activations of this many microbatches at its peak
  // (1 without a pipeline): what recomputation's memory saving multiplies.
  int in_flight = 1;
  std::vector<GemmWork> gemms;
  std::vector<OtherWork> others;   // the ops that are not GEMMs, by name
  int64_t op_count = 0;            // ops dispatched, GEMMs included (each pays op_overhead_s)
  double forward_fraction = 1.0 / 3;  // share of the compute in forward passes
  std::vector<CollectiveWork> collectives;
  // Activation recomputation's extra work (planner/recompute.h), run in the backward: priced
  // with the rest of the compute, placed on the backward's side of forward_fraction.
  std::vector<GemmWork> recompute_gemms;
  std::vector<OtherWork> recompute_others;
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double activation_peak_bytes = 0;
  double peak_bytes = 0;           // the whole step's peak (params + grads + state + activations)
  // As the trainer's summary reports them (StepProfile): the tape's saved activations at most,
  // the FSDP-gathered parameters at most (-1: none), and whether the step's peak comes after
  // the backward (the gradient reductions and AdamW) rather than in the forward + backward.
  double saved_activation_peak_bytes = 0, gathered_peak_bytes = -1;
  bool peak_after_backward = false;
  double gemm_flops() const {
    double f = 0;
    for (const GemmWork& g : gemms) f += g.flops();
    return f;
  }
};

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_STEP_WORK_H_
