#include "bench/tp_model_gpu.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardmap::bench {

std::vector<GemmShape> RankGemms(const LayerCase& c) {
  const int64_t T = c.tokens, d = c.d, f = c.ffn(), t = c.tp, s = c.seq(), hd = c.head_dim;
  const int64_t heads = d / hd;
  std::vector<GemmShape> fwd;
  auto column = [&] { fwd.push_back({1, T, d, f / t}); };
  auto row = [&] { fwd.push_back({1, T, f / t, d}); };
  auto attention = [&] {
    fwd.push_back({1, T, d, 3 * d / t});
    fwd.push_back({(T / s) * (heads / t), s, hd, s});
    fwd.push_back({(T / s) * (heads / t), s, s, hd});
    fwd.push_back({1, T, d / t, d});
  };
  switch (c.layer) {
    case Layer::kColumn: column(); break;
    case Layer::kRow: row(); break;
    case Layer::kMlp: column(); row(); break;
    case Layer::kAttention: attention(); break;
    case Layer::kBlock: attention(); column(); row(); break;
    case Layer::kAsyncMlp: return {};
  }
  if (!c.fwd_bwd) return fwd;
  std::vector<GemmShape> all = fwd;
  for (const GemmShape& g : fwd) {
    all.push_back({g.batch, g.m, g.n, g.k});  // dA = dC B^T
    all.push_back({g.batch, g.k, g.m, g.n});  // dB = A^T dC
  }
  return all;
}

absl::StatusOr<double> RankGemmSeconds(const GpuProfile& p, const LayerCase& c) {
  const std::vector<GemmShape> gemms = RankGemms(c);
  if (gemms.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("tp_model_gpu: ", c.Name(), ": no GEMM list for this layer"));
  }
  double s = 0;
  for (const GemmShape& g : gemms) {
    auto it = p.gemm_s.find({c.dtype, g});
    if (it == p.gemm_s.end()) {
      return absl::NotFoundError(absl::StrCat("tp_model_gpu: ", c.Name(), ": GEMM ",
                                              DTypeName(c.dtype), " ", g.ToString(),
                                              " was not measured in the profile"));
    }
    s += it->second;
  }
  return s;
}

absl::StatusOr<Prediction> PredictSharedGpu(const GpuProfile& p, const LayerCase& c) {
  absl::StatusOr<double> gemm = RankGemmSeconds(p, c);
  if (!gemm.ok()) return gemm.status();
  Prediction out;
  out.compute_s = c.tp * *gemm;
  for (const CollectiveCall& call : LayerCollectives(c, DTypeSize(c.dtype))) {
    auto it = p.collective_s.find({call.kind, c.dtype, c.tp, call.full_bytes});
    if (it == p.collective_s.end()) {
      return absl::NotFoundError(absl::StrFormat(
          "tp_model_gpu: %s: %s of %.0f bytes (%s) over %d virtual ranks was not measured in "
          "the profile",
          c.Name(), CollectiveName(call.kind), call.full_bytes, DTypeName(c.dtype), c.tp));
    }
    out.comm_s += it->second;
  }
  return out;
}

double RankParameters(const LayerCase& c) {
  const double d = c.d, f = c.ffn(), t = c.tp;
  const double mlp = d * f / t + f / t + f * d / t + d;
  const double attention = d * 3 * d / t + 3 * d / t + d * d / t + d;
  switch (c.layer) {
    case Layer::kColumn: return d * f / t + f / t;
    case Layer::kRow: return f * d / t + d;
    case Layer::kMlp:
    case Layer::kAsyncMlp: return mlp;
    case Layer::kAttention: return attention;
    case Layer::kBlock: return attention + mlp + 4 * d;
  }
  return 0;
}

absl::StatusOr<MultiNodeRow> PredictMultiNode(const GpuProfile& p, const LayerCase& c, int nodes,
                                              const ClusterLinks& links) {
  if (nodes < 1 || links.gpus_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_model_gpu: ", nodes, " nodes of ",
                                                   links.gpus_per_node,
                                                   " GPUs: need >= 1 of each"));
  }
  const int g = links.gpus_per_node;
  const double elem = DTypeSize(c.dtype);
  MultiNodeRow row;
  row.nodes = nodes;

  LayerCase node = c;
  node.tp = g;
  absl::StatusOr<double> gemm = RankGemmSeconds(p, node);
  if (!gemm.ok()) return gemm.status();
  row.tp_node.compute_s = *gemm;
  const CollectiveCost intra = RingCost(links.intra), inter = RingCost(links.inter);
  for (const CollectiveCall& call : LayerCollectives(node, elem)) {
    row.tp_node.comm_s += intra(call.kind, g, call.full_bytes);
  }
  if (c.fwd_bwd && nodes > 1) {
    row.dp_allreduce_s = inter(CollectiveKind::kAllReduce, nodes, RankParameters(node) * elem);
  }
  row.tokens_per_s_tp_node = nodes * static_cast<double>(c.tokens) / row.tp_node_total();

  LayerCase all = c;
  all.tp = g * nodes;
  const double rate = LayerFlops(node) / g / *gemm;  // per-rank FLOP/s at t = g
  row.tp_all.compute_s = LayerFlops(all) / all.tp / rate;
  for (const CollectiveCall& call : LayerCollectives(all, elem)) {
    row.tp_all.comm_s += (nodes > 1 ? inter : intra)(call.kind, all.tp, call.full_bytes);
  }
  row.tokens_per_s_tp_all = static_cast<double>(c.tokens) / row.tp_all.total();
  return row;
}

}  // namespace shardmap::bench
