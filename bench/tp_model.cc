#include "bench/tp_model.h"

namespace shardmap::bench {

std::vector<CollectiveCall> LayerCollectives(const LayerCase& c, double elem_bytes) {
  const double act = static_cast<double>(c.tokens) * c.d * elem_bytes;  // one [tokens, d]
  std::vector<CollectiveCall> calls;
  // Entering a TP region (column-parallel input, [tokens, d]).
  auto enter = [&] {
    if (c.sp) {
      calls.push_back({CollectiveKind::kAllGather, act, false});
      if (c.fwd_bwd) calls.push_back({CollectiveKind::kReduceScatter, act, true});
    }
    // No SP: nothing either way; the input gradient is left a partial sum (P) for its consumer.
  };
  // Leaving it (row-parallel output, [tokens, d]).
  auto leave = [&] {
    if (c.sp) {
      calls.push_back({CollectiveKind::kReduceScatter, act, false});
      if (c.fwd_bwd) calls.push_back({CollectiveKind::kAllGather, act, true});
    } else {
      calls.push_back({CollectiveKind::kAllReduce, act, false});
      // The transpose of the P -> R all_reduce: the output gradient, all_reduced again.
      if (c.fwd_bwd) calls.push_back({CollectiveKind::kAllReduce, act, true});
    }
  };
  switch (c.layer) {
    case Layer::kColumn: enter(); break;
    case Layer::kRow: leave(); break;
    case Layer::kMlp:
    case Layer::kAttention: enter(); leave(); break;
    case Layer::kBlock: enter(); leave(); enter(); leave(); break;
    // Its rings (ppermutes of row blocks) move the bytes of SP's all_gather and reduce_scatter;
    // counted as those, with no overlap credited (an upper bound on its communication time).
    case Layer::kAsyncMlp: enter(); leave(); break;
  }
  return calls;
}

double RankBytes(const CollectiveCall& call, int t) {
  return call.kind == CollectiveKind::kAllGather ? call.full_bytes / t : call.full_bytes;
}

Prediction Predict(const LayerCase& c, double rank_flops_per_s, double elem_bytes,
                   const CollectiveCost& cost) {
  return Predict(c, rank_flops_per_s, 0, elem_bytes, cost);
}

Prediction Predict(const LayerCase& c, double rank_flops_per_s, double attention_flops_per_s,
                   double elem_bytes, const CollectiveCost& cost) {
  Prediction p;
  const double attention = attention_flops_per_s > 0 ? AttentionEinsumFlops(c) : 0;
  p.compute_s = (LayerFlops(c) - attention) / c.tp / rank_flops_per_s;
  if (attention > 0) p.compute_s += attention / c.tp / attention_flops_per_s;
  for (const CollectiveCall& call : LayerCollectives(c, elem_bytes)) {
    p.comm_s += cost(call.kind, c.tp, call.full_bytes);
  }
  return p;
}

double AttentionEinsumFlops(const LayerCase& c) {
  if (c.layer != Layer::kAttention && c.layer != Layer::kBlock) return 0;
  const double fwd = 2.0 * 2.0 * c.tokens * c.seq() * c.d;
  return c.fwd_bwd ? 3 * fwd : fwd;
}

double AttentionScoreElements(const LayerCase& c) {
  if (c.layer != Layer::kAttention && c.layer != Layer::kBlock) return 0;
  const double s = c.seq();
  return static_cast<double>(c.tokens) / s * (c.d / c.head_dim) * s * s;
}

double Efficiency(double time_1, double time_t, int t) { return time_1 / (t * time_t); }

}  // namespace shardmap::bench
