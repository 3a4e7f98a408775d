#include "bench/tp_model.h"

#include <stdexcept>

namespace shardmap::bench {

const char* CollectiveName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

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

CollectiveCost RingCost(const RingLink& link) {
  return [link](CollectiveKind kind, int t, double bytes) {
    if (t <= 1) return 0.0;
    const double steps = kind == CollectiveKind::kAllReduce ? 2.0 : 1.0;
    return link.alpha_s + steps * (t - 1) / t * bytes / link.busbw;
  };
}

CollectiveCost FittedCost(FittedTable table) {
  return [table = std::move(table)](CollectiveKind kind, int t, double bytes) {
    const auto it = table.find({kind, t});
    if (it == table.end()) {
      throw std::out_of_range(std::string("FittedCost: no fit for ") + CollectiveName(kind) +
                              " over " + std::to_string(t) + " ranks; measure it first");
    }
    return it->second.alpha_s + bytes * it->second.seconds_per_byte;
  };
}

AlphaBeta FitAlphaBeta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  const size_t n = bytes.size();
  if (n < 2 || seconds.size() != n) {
    throw std::invalid_argument("FitAlphaBeta: need >= 2 (bytes, seconds) pairs of equal count");
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += bytes[i] / n;
    my += seconds[i] / n;
  }
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (bytes[i] - mx) * (bytes[i] - mx);
    sxy += (bytes[i] - mx) * (seconds[i] - my);
  }
  if (sxx == 0) throw std::invalid_argument("FitAlphaBeta: all sizes are the same");
  AlphaBeta ab;
  ab.seconds_per_byte = sxy / sxx;
  ab.alpha_s = my - ab.seconds_per_byte * mx;
  return ab;
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
