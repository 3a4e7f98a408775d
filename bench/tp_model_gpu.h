// The TP model (bench/tp_model.h) fed with rates measured on a GPU: the per-rank GEMMs of each
// layer timed by shape, and the collectives timed on the card, from one `tp_bench --device=cuda
// --profile_out=FILE` run (a line-based profile: perfmodel/gpu_profile.h). It predicts
//   * the one-GPU measurements it can: t virtual ranks sharing one card run all t ranks' GEMMs
//     on that card, so a layer step is t x (one rank's GEMM seconds) + its collectives at their
//     measured cost (PredictSharedGpu), printed beside the measured rows;
//   * 8 GPUs per node on 2-64 nodes (PredictMultiNode): TP 8 inside each node with data
//     parallelism across nodes, or one TP group spanning all 8N GPUs, with links from measured
//     collectives where there are several GPUs, else from stated NVLink / InfiniBand figures.
//
//   absl::StatusOr<GpuProfile> p = ParseGpuProfile(text);          // errors name the line
//   LayerCase c{Layer::kMlp, 4, true, true, 4096, 2048};
//   c.backend = Backend::kSharedGpu; c.dtype = DType::kBF16;
//   absl::StatusOr<Prediction> one_gpu = PredictSharedGpu(*p, c);
//   absl::StatusOr<MultiNodeRow> row = PredictMultiNode(*p, c, /*nodes=*/4, StatedLinks());
#ifndef SHARDMAP_BENCH_TP_MODEL_GPU_H_
#define SHARDMAP_BENCH_TP_MODEL_GPU_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/tp_layers.h"
#include "bench/tp_model.h"
#include "perfmodel/gpu_profile.h"

namespace shardmap::bench {

// The profile (GpuProfile, its parser and line writers, GemmShape, ClusterLinks) lives in
// perfmodel/gpu_profile.h, below the planner and bench; named here as bench's TP model always
// named them.
using perfmodel::ClusterLinks;
using perfmodel::CollectiveLine;
using perfmodel::GemmLine;
using perfmodel::GemmShape;
using perfmodel::GpuProfile;
using perfmodel::LayerLine;
using perfmodel::LinkLine;
using perfmodel::LinksFromProfile;
using perfmodel::ParseGpuProfile;
using perfmodel::StatedLinks;

// The matrix products one rank runs in one step of layer c at TP c.tp (c.tp = 1: the unsharded
// layer), in order: forward C = A B for each; with fwd_bwd also dA = dC B^T as (m, n, k) and
// dB = A^T dC as (k, m, n). Column: [T,d]x[d,4d/t]; row: [T,4d/t]x[4d/t,d]; attention: qkv
// [T,d]x[d,3d/t], scores (T/s)(h/t) x [s,hd]x[hd,s], p v (T/s)(h/t) x [s,s]x[s,hd], projection
// [T,d/t]x[d/t,d] (T the whole tokens: with SP after the all_gather). Their FLOPs sum to
// LayerFlops(c) / t. Unimplemented for kAsyncMlp (an empty list).
std::vector<GemmShape> RankGemms(const LayerCase& c);

// One rank's GEMM seconds for one step of c on a GPU of its own (the sum over RankGemms at the
// profile's times). NotFound naming the shape and dtype when one was not measured.
absl::StatusOr<double> RankGemmSeconds(const GpuProfile& p, const LayerCase& c);

// A step of c with its c.tp virtual ranks on one GPU: compute = c.tp x RankGemmSeconds (the card
// runs every rank's GEMMs; streams running side by side are not credited), comm = the layer's
// collectives (LayerCollectives) at the profile's measured in-process cost. Elementwise work
// (GELU, LayerNorm, softmax, residuals) is not in the model. NotFound when a GEMM or collective
// was not measured.
absl::StatusOr<Prediction> PredictSharedGpu(const GpuProfile& p, const LayerCase& c);

struct MultiNodeRow {
  int nodes = 0;
  // TP gpus_per_node inside each node, data parallel across nodes: the layer's step on each GPU
  // plus the gradient all_reduce of each rank's parameters over `nodes` GPUs (one per node) on
  // the inter-node link, not overlapped.
  Prediction tp_node;
  double dp_allreduce_s = 0;
  double tp_node_total() const { return tp_node.total() + dp_allreduce_s; }
  // One TP group over all nodes x gpus_per_node GPUs: compute at the per-rank FLOP rate the
  // profile measured at t = gpus_per_node (smaller GEMMs were not measured), the layer's
  // collectives on the inter-node ring.
  Prediction tp_all;
  // Tokens per second over the whole cluster: data parallel runs `nodes` groups of c.tokens.
  double tokens_per_s_tp_node = 0, tokens_per_s_tp_all = 0;
};
// c.tp is ignored (gpus_per_node and nodes x gpus_per_node are used); c.fwd_bwd should be set
// for the gradient all_reduce to mean anything (without it dp_allreduce_s is 0). Gradients move
// in c.dtype. InvalidArgument for nodes < 1; NotFound for an unmeasured GEMM.
absl::StatusOr<MultiNodeRow> PredictMultiNode(const GpuProfile& p, const LayerCase& c, int nodes,
                                              const ClusterLinks& links);

// Parameters each rank of layer c holds at TP c.tp (sharded ones / t, replicated ones whole).
double RankParameters(const LayerCase& c);

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_TP_MODEL_GPU_H_
