// The TP model (bench/tp_model.h) fed with rates measured on a GPU: the per-rank GEMMs of each
// layer timed by shape, and the collectives timed on the card, from one `tp_bench --device=cuda
// --profile_out=FILE` run (a line-based profile, below). It predicts
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
//
// Profile format (one record per line, fields separated by spaces, '#' starts a comment):
//   device <free text: the card's name>
//   gemm <f32|bf16> <batch> <m> <k> <n> <seconds>     C[m,n] = A[m,k] B[k,n], batch of them
//   collective <all_reduce|all_gather|reduce_scatter> <f32|bf16> <t> <full_bytes> <seconds>
//                                                     t virtual ranks on one GPU (in-process)
//   link <all_reduce|all_gather|reduce_scatter> <t> <full_bytes> <seconds>
//                                                     t ranks on t GPUs (several-GPU machines)
//   layer <LayerCase::Name()> <seconds> <fenced_seconds>
// full_bytes as in bench/tp_model.h (the all_reduce buffer / gathered output / unreduced input).
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

namespace shardmap::bench {

// C[m,n] = A[m,k] B[k,n], `batch` times.
struct GemmShape {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  double Flops() const { return 2.0 * batch * m * k * n; }
  std::string ToString() const;  // "32 x 128x64x128" or "4096x2048x2048"
  auto Key() const { return std::make_tuple(batch, m, k, n); }
  bool operator<(const GemmShape& o) const { return Key() < o.Key(); }
  bool operator==(const GemmShape& o) const { return Key() == o.Key(); }
};

// The matrix products one rank runs in one step of layer c at TP c.tp (c.tp = 1: the unsharded
// layer), in order: forward C = A B for each; with fwd_bwd also dA = dC B^T as (m, n, k) and
// dB = A^T dC as (k, m, n). Column: [T,d]x[d,4d/t]; row: [T,4d/t]x[4d/t,d]; attention: qkv
// [T,d]x[d,3d/t], scores (T/s)(h/t) x [s,hd]x[hd,s], p v (T/s)(h/t) x [s,s]x[s,hd], projection
// [T,d/t]x[d/t,d] (T the whole tokens: with SP after the all_gather). Their FLOPs sum to
// LayerFlops(c) / t. Unimplemented for kAsyncMlp (an empty list).
std::vector<GemmShape> RankGemms(const LayerCase& c);

struct GpuProfile {
  std::string device;
  std::map<std::pair<DType, GemmShape>, double> gemm_s;
  std::map<std::tuple<CollectiveKind, DType, int, double>, double> collective_s;
  std::map<std::tuple<CollectiveKind, int, double>, double> link_s;
  struct Layer {
    double seconds = 0, fenced_seconds = 0;
  };
  std::map<std::string, Layer> layers;  // by LayerCase::Name()
};
// InvalidArgument naming the line and what was expected on a malformed line.
absl::StatusOr<GpuProfile> ParseGpuProfile(std::string_view text);
// The profile's lines (the inverse of ParseGpuProfile), for writers and tests.
std::string GemmLine(DType dtype, const GemmShape& s, double seconds);
std::string CollectiveLine(CollectiveKind kind, DType dtype, int t, double full_bytes,
                           double seconds);
std::string LinkLine(CollectiveKind kind, int t, double full_bytes, double seconds);
std::string LayerLine(const std::string& name, double seconds, double fenced_seconds);

// One rank's GEMM seconds for one step of c on a GPU of its own (the sum over RankGemms at the
// profile's times). NotFound naming the shape and dtype when one was not measured.
absl::StatusOr<double> RankGemmSeconds(const GpuProfile& p, const LayerCase& c);

// A step of c with its c.tp virtual ranks on one GPU: compute = c.tp x RankGemmSeconds (the card
// runs every rank's GEMMs; streams running side by side are not credited), comm = the layer's
// collectives (LayerCollectives) at the profile's measured in-process cost. Elementwise work
// (GELU, LayerNorm, softmax, residuals) is not in the model. NotFound when a GEMM or collective
// was not measured.
absl::StatusOr<Prediction> PredictSharedGpu(const GpuProfile& p, const LayerCase& c);

// Link figures for the multi-node predictions, with where each came from.
struct ClusterLinks {
  RingLink intra, inter;  // inside a node (t <= gpus_per_node) / across nodes
  std::string intra_source, inter_source;
  int gpus_per_node = 8;
};
// NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU = 450 GB/s each way, taken as the
// ring's bus bandwidth, alpha 10 us; InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one NIC per
// GPU), alpha 20 us. Upper bounds: NCCL typically reaches ~80% of the link rate.
ClusterLinks StatedLinks();
// The intra-node link fitted from the profile's `link` all_reduce lines (several GPUs; the
// largest t measured, >= 2 sizes), else StatedLinks()'s; inter-node always stated.
ClusterLinks LinksFromProfile(const GpuProfile& p);

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
