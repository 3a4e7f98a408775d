#include "perfmodel/gpu_profile.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "perfmodel/alpha_beta.h"

namespace shardmap::perfmodel {
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

}  // namespace shardmap::perfmodel
