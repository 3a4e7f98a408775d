// A TP scaling model ("when does TP pay"): the step time of a tensor-parallel layer on t devices
// is a compute term plus a communication term, with no overlap between them:
//
//   time(t) = LayerFlops / t / rank_flops_per_s  +  sum over the layer's collectives of
//             cost(op, t, bytes)
//
// where the collectives are the ones the layer issues per step (LayerCollectives: op and bytes
// per collective, per layer, SP variant and direction) and cost is alpha-beta: for a ring over
// links of bus bandwidth B, all_reduce = alpha + 2 (t-1)/t * S / B and all_gather /
// reduce_scatter = alpha + (t-1)/t * S / B, S the full (gathered / unreduced) tensor's bytes
// (RingCost, perfmodel/ring_cost.h, shared with the planner).
//
//   LayerCase c{Layer::kBlock, /*tp=*/8, /*sp=*/true, /*fwd_bwd=*/true, 8192, 8192};
//   c.seq_len = 4096;
//   RingLink nvlink{/*alpha_s=*/8e-6, /*busbw=*/370e9};
//   Prediction p = Predict(c, /*rank_flops_per_s=*/0.6 * 989e12, /*elem_bytes=*/2,
//                          RingCost(nvlink));
//   p.total();   // seconds
//
// On the simulated CPU devices the cost of each (op, t) is instead fitted to measurements
// (FittedCost, perfmodel/alpha_beta.h: alpha + bytes * seconds_per_byte), and rank_flops_per_s
// comes from GEMMs timed on t concurrent threads (bench/tp_model_report.cc).
#ifndef SHARDMAP_BENCH_TP_MODEL_H_
#define SHARDMAP_BENCH_TP_MODEL_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/tp_layers.h"
#include "perfmodel/alpha_beta.h"
#include "perfmodel/ring_cost.h"

namespace shardmap::bench {

// The collective costs live in perfmodel/ (below the planner and bench); named here as the TP
// model always named them.
using perfmodel::AlphaBeta;
using perfmodel::CollectiveCost;
using perfmodel::CollectiveKind;
using perfmodel::CollectiveName;
using perfmodel::FitAlphaBeta;
using perfmodel::FittedCost;
using perfmodel::FittedTable;
using perfmodel::RingCost;
using perfmodel::RingLink;

struct CollectiveCall {
  CollectiveKind kind;
  double full_bytes;  // the all_reduce buffer / the gathered output / the unreduced input
  bool backward;
};

// The collectives one step of layer c issues on each rank (over the tp group, even at t = 1).
// As this framework's autograd issues them (checked against real runs in tp_model_test):
// entering a TP region is nothing (no SP; the input gradient stays a partial sum) or all_gather
// forward + reduce_scatter backward (SP); leaving it is all_reduce forward + all_reduce backward
// (no SP) or reduce_scatter forward + all_gather backward (SP). Per MLP that is Megatron's two
// all_reduces (no SP) or two all_gathers and two reduce_scatters (SP) per fwd+bwd. kAsyncMlp's
// rings (ppermutes) are counted as the SP MLP's all_gathers and reduce_scatters (same bytes).
std::vector<CollectiveCall> LayerCollectives(const LayerCase& c, double elem_bytes);

// Bytes a rank passes to the collective (bench/timed_communicator.h's convention): the whole
// buffer for all_reduce and reduce_scatter, its 1/t block for all_gather.
double RankBytes(const CollectiveCall& call, int t);

struct Prediction {
  double compute_s = 0, comm_s = 0;
  double total() const { return compute_s + comm_s; }
};
Prediction Predict(const LayerCase& c, double rank_flops_per_s, double elem_bytes,
                   const CollectiveCost& cost);
// The same, with the attention score einsums (AttentionEinsumFlops: q k^T and p v, batched
// [seq, head_dim] x [head_dim, seq] products far smaller than the projections' GEMMs) at their
// own rate. A rate <= 0 means rank_flops_per_s.
Prediction Predict(const LayerCase& c, double rank_flops_per_s, double attention_flops_per_s,
                   double elem_bytes, const CollectiveCost& cost);

// FLOPs of the attention score einsums of the whole layer (part of LayerFlops; 0 for layers
// without attention): forward 2 x 2 tokens seq d (q k^T and p v over all heads), backward twice
// that.
double AttentionEinsumFlops(const LayerCase& c);

// Elements of the attention scores [batch, heads, seq, seq] of the whole layer (0 for layers
// without attention): the scale, causal mask and softmax work on each, forward and backward,
// split over tp with the heads. Matmul FLOPs do not see this work.
double AttentionScoreElements(const LayerCase& c);

// Parallel efficiency of t devices against one: time(1) / (t * time(t)).
double Efficiency(double time_1, double time_t, int t);

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_TP_MODEL_H_
