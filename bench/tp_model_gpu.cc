#include "bench/tp_model_gpu.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace shardmap::bench {
namespace {

bool ParseDType(absl::string_view s, DType* out) {
  if (s == "f32") *out = DType::kF32;
  else if (s == "bf16") *out = DType::kBF16;
  else return false;
  return true;
}

bool ParseKind(absl::string_view s, CollectiveKind* out) {
  for (CollectiveKind k :
       {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    if (s == CollectiveName(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string GemmShape::ToString() const {
  const std::string mkn = absl::StrCat(m, "x", k, "x", n);
  return batch == 1 ? mkn : absl::StrCat(batch, " x ", mkn);
}

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

std::string GemmLine(DType dtype, const GemmShape& s, double seconds) {
  return absl::StrFormat("gemm %s %d %d %d %d %.9g", DTypeName(dtype), s.batch, s.m, s.k, s.n,
                         seconds);
}
std::string CollectiveLine(CollectiveKind kind, DType dtype, int t, double full_bytes,
                           double seconds) {
  return absl::StrFormat("collective %s %s %d %.0f %.9g", CollectiveName(kind), DTypeName(dtype),
                         t, full_bytes, seconds);
}
std::string LinkLine(CollectiveKind kind, int t, double full_bytes, double seconds) {
  return absl::StrFormat("link %s %d %.0f %.9g", CollectiveName(kind), t, full_bytes, seconds);
}
std::string LayerLine(const std::string& name, double seconds, double fenced_seconds) {
  return absl::StrFormat("layer %s %.9g %.9g", name, seconds, fenced_seconds);
}

absl::StatusOr<GpuProfile> ParseGpuProfile(std::string_view text) {
  GpuProfile p;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    absl::string_view line = raw.substr(0, raw.find('#'));
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](const char* want) {
      return absl::InvalidArgumentError(absl::StrCat("GPU profile line ", line_no, ": \"",
                                                     absl::StripAsciiWhitespace(raw),
                                                     "\": expected ", want));
    };
    auto positive = [](double x) { return x > 0 && x < 1e30; };
    if (f[0] == "device") {
      absl::string_view rest = absl::StripAsciiWhitespace(line.substr(line.find("device") + 6));
      p.device = std::string(rest);
    } else if (f[0] == "gemm") {
      DType dt;
      GemmShape s;
      double sec;
      if (f.size() != 7 || !ParseDType(f[1], &dt) || !absl::SimpleAtoi(f[2], &s.batch) ||
          !absl::SimpleAtoi(f[3], &s.m) || !absl::SimpleAtoi(f[4], &s.k) ||
          !absl::SimpleAtoi(f[5], &s.n) || !absl::SimpleAtod(f[6], &sec) || s.batch < 1 ||
          s.m < 1 || s.k < 1 || s.n < 1 || !positive(sec)) {
        return bad("gemm <f32|bf16> <batch> <m> <k> <n> <seconds> (sizes >= 1, seconds > 0)");
      }
      p.gemm_s[{dt, s}] = sec;
    } else if (f[0] == "collective") {
      CollectiveKind k;
      DType dt;
      int t;
      double bytes, sec;
      if (f.size() != 6 || !ParseKind(f[1], &k) || !ParseDType(f[2], &dt) ||
          !absl::SimpleAtoi(f[3], &t) || !absl::SimpleAtod(f[4], &bytes) ||
          !absl::SimpleAtod(f[5], &sec) || t < 1 || !positive(bytes) || !positive(sec)) {
        return bad("collective <all_reduce|all_gather|reduce_scatter> <f32|bf16> <t> <bytes> "
                   "<seconds> (t >= 1, bytes and seconds > 0)");
      }
      p.collective_s[{k, dt, t, bytes}] = sec;
    } else if (f[0] == "link") {
      CollectiveKind k;
      int t;
      double bytes, sec;
      if (f.size() != 5 || !ParseKind(f[1], &k) || !absl::SimpleAtoi(f[2], &t) ||
          !absl::SimpleAtod(f[3], &bytes) || !absl::SimpleAtod(f[4], &sec) || t < 2 ||
          !positive(bytes) || !positive(sec)) {
        return bad("link <all_reduce|all_gather|reduce_scatter> <t> <bytes> <seconds> (t >= 2, "
                   "bytes and seconds > 0)");
      }
      p.link_s[{k, t, bytes}] = sec;
    } else if (f[0] == "layer") {
      GpuProfile::Layer l;
      if (f.size() != 4 || !absl::SimpleAtod(f[2], &l.seconds) ||
          !absl::SimpleAtod(f[3], &l.fenced_seconds) || !positive(l.seconds) ||
          !positive(l.fenced_seconds)) {
        return bad("layer <name> <seconds> <fenced_seconds> (seconds > 0)");
      }
      p.layers[std::string(f[1])] = l;
    } else {
      return bad("a record starting with device, gemm, collective, link or layer");
    }
  }
  return p;
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

ClusterLinks StatedLinks() {
  ClusterLinks l;
  l.intra = {/*alpha_s=*/10e-6, /*busbw=*/450e9};
  l.inter = {/*alpha_s=*/20e-6, /*busbw=*/50e9};
  l.intra_source =
      "stated: NVLink 4, 900 GB/s bidirectional per H100/H200 SXM GPU (NVIDIA H100 and H200 "
      "datasheets) = 450 GB/s each way, taken as the ring's bus bandwidth; alpha 10 us (assumed)";
  l.inter_source =
      "stated: InfiniBand NDR, 400 Gb/s = 50 GB/s per GPU with one ConnectX-7 NIC per GPU "
      "(NVIDIA DGX H100 user guide: 8 x 400 Gb/s compute NICs); alpha 20 us (assumed)";
  return l;
}

ClusterLinks LinksFromProfile(const GpuProfile& p) {
  ClusterLinks l = StatedLinks();
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> by_t;
  for (const auto& [key, sec] : p.link_s) {
    const auto& [kind, t, bytes] = key;
    if (kind != CollectiveKind::kAllReduce) continue;
    by_t[t].first.push_back(bytes);
    by_t[t].second.push_back(sec);
  }
  for (auto it = by_t.rbegin(); it != by_t.rend(); ++it) {
    if (it->second.first.size() < 2) continue;
    const AlphaBeta ab = FitAlphaBeta(it->second.first, it->second.second);
    if (ab.seconds_per_byte <= 0) continue;
    const int t = it->first;
    l.intra = {std::max(0.0, ab.alpha_s), 2.0 * (t - 1) / t / ab.seconds_per_byte};
    l.intra_source = absl::StrFormat(
        "measured: all_reduce over %d GPUs of this machine (tp_bench --placement=per_gpu, "
        "in-process device collectives, not NCCL), fitted alpha %.1f us, bus bandwidth %.0f "
        "GB/s",
        t, 1e6 * l.intra.alpha_s, l.intra.busbw / 1e9);
    break;
  }
  return l;
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
