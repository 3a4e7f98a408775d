#include "models/planner/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/components/bounded_read.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "perfmodel/alpha_beta.h"
#include "perfmodel/gpu_profile.h"

namespace shardmap::planner {

// Defined by the genrule that embeds models/planner/profiles/*.txt (profiles_embedded.cc).
extern const char* const kShippedProfileNames[];
extern const char* const kShippedProfileTexts[];
extern const int kShippedProfileCount;

namespace {

absl::StatusOr<DType> DTypeOf(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    if (s == DTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", s, "' (f32, f64, bf16, f16)"));
}

double MinDim(const GemmWork& g) {
  return static_cast<double>(std::min({g.m, g.n, g.k}));
}

}  // namespace

absl::StatusOr<double> HardwareProfile::GemmSeconds(const GemmWork& g) const {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0 || g.count <= 0) return 0.0;
  if (const auto e = gemm_exact.find(GemmKey::Of(g)); e != gemm_exact.end()) {
    return g.flops() / e->second;
  }
  const auto it = gemm.find(g.dtype);
  if (it == gemm.end() || it->second.empty()) {
    return absl::NotFoundError(absl::StrCat("profile ", name, " has no GEMM rate for ",
                                            DTypeName(g.dtype), "; add 'gemm ",
                                            DTypeName(g.dtype), " <min_dim> <flop/s>' lines"));
  }
  const auto& pts = it->second;
  const double x = MinDim(g);
  double rate;
  if (x <= pts.front().first) {
    rate = pts.front().second;
  } else if (x >= pts.back().first) {
    rate = pts.back().second;
  } else {
    size_t j = 1;
    while (pts[j].first < x) ++j;
    const double f = (std::log(x) - std::log(pts[j - 1].first)) /
                     (std::log(pts[j].first) - std::log(pts[j - 1].first));
    rate = pts[j - 1].second + f * (pts[j].second - pts[j - 1].second);
  }
  return g.flops() / rate;
}

HardwareProfile HardwareProfile::ForConcurrentRanks(int k) const {
  HardwareProfile p = *this;
  p.concurrent_ranks = std::max(1, k);
  return p;
}

namespace {
// Seconds of non-GEMM ops on one rank alone.
absl::StatusOr<double> OwnOtherSeconds(const HardwareProfile& p, const OtherWork& o) {
  if (const auto r = p.op_rate.find({o.op, o.dtype}); r != p.op_rate.end()) return o.bytes / r->second;
  if (o.attention && o.flops > 0) {
    auto a = p.attention.find(o.dtype);
    double rate = a != p.attention.end() ? a->second : 0;
    if (rate <= 0) {
      const auto g = p.gemm.find(o.dtype);
      if (g == p.gemm.end() || g->second.empty()) {
        return absl::NotFoundError(absl::StrCat("profile ", p.name, " has no attention or GEMM rate for ",
                                                DTypeName(o.dtype)));
      }
      rate = g->second.back().second;
    }
    return o.flops / rate;
  }
  double s = p.memory_bandwidth > 0 ? o.bytes / p.memory_bandwidth : 0;
  if (p.vector_flops > 0) s = std::max(s, o.flops / p.vector_flops);
  return s;
}
}  // namespace

absl::StatusOr<double> HardwareProfile::OtherSeconds(const OtherWork& o) const {
  absl::StatusOr<double> alone = OwnOtherSeconds(*this, o);
  if (!alone.ok() || concurrent_ranks <= 1 || shared_op_rate_threads <= 1) return alone;
  const auto r = shared_op_rate.find({o.op, o.dtype});
  if (r == shared_op_rate.end()) return alone;
  // Ranks computing at once share the caches and the memory: between one rank alone and the
  // measured T at once, linearly in the ranks. Sharing never makes an op faster: a shared rate
  // above the lone one is the noise of the lone measurement, and the lone price stands.
  const double shared = std::max(*alone, o.bytes / r->second);
  const double t = std::min(1.0, (concurrent_ranks - 1.0) / (shared_op_rate_threads - 1.0));
  return *alone + t * (shared - *alone);
}

double HardwareProfile::OversubscribedSyncSeconds(int world) const {
  if (cores <= 0 || world <= cores || oversubscribed_sync.empty()) return 0;
  // Linear between the entries, from 0 at world = cores (nothing waits with a core each) to the
  // first entry; the last entry beyond it.
  const auto hi = oversubscribed_sync.lower_bound(world);
  if (hi == oversubscribed_sync.end()) return std::prev(hi)->second;
  if (hi->first == world) return hi->second;
  double x0 = cores, y0 = 0;
  if (hi != oversubscribed_sync.begin()) {
    x0 = std::prev(hi)->first;
    y0 = std::prev(hi)->second;
  }
  if (hi->first <= x0) return hi->second;
  const double t = (world - x0) / (hi->first - x0);
  return y0 + t * (hi->second - y0);
}

std::string HardwareProfile::ToText() const {
  std::ostringstream o;
  o << "name " << name << "\n";
  for (const std::string& s : sources) o << "source " << s << "\n";
  o << "gpus_per_node " << gpus_per_node << "\nmemory_bytes " << memory_bytes
    << "\nmemory_reserved_bytes " << memory_reserved_bytes << "\nmemory_bandwidth "
    << memory_bandwidth << "\nop_overhead_s " << op_overhead_s << "\n";
  for (const auto& [d, f] : peak_flops) o << "peak_flops " << DTypeName(d) << " " << f << "\n";
  for (const auto& [d, pts] : gemm) {
    for (const auto& [x, r] : pts) o << "gemm " << DTypeName(d) << " " << x << " " << r << "\n";
  }
  for (const auto& [g, r] : gemm_exact) {
    o << "gemm_shape " << DTypeName(g.dtype) << " " << g.batch << " " << g.m << " " << g.n << " "
      << g.k << " " << int{g.trans_a} << " " << int{g.trans_b} << " " << r << "\n";
  }
  for (const auto& [k, r] : op_rate) {
    o << "op_rate " << k.first << " " << DTypeName(k.second) << " " << r << "\n";
  }
  o << "link intra " << intra.alpha_s << " " << intra.busbw << "\n";
  if (inter.busbw > 0) o << "link inter " << inter.alpha_s << " " << inter.busbw << "\n";
  for (const auto& [k, f] : fitted) {
    o << "collective " << k.first << " " << k.second << " " << f.alpha_s << " "
      << f.seconds_per_byte << "\n";
  }
  o << "overlap " << overlap << "\ncores " << cores << "\n";
  for (const auto& [r, sec] : oversubscribed_sync) o << "oversubscribed_sync " << r << " " << sec << "\n";
  for (const auto& [k, r] : shared_op_rate) {
    o << "shared_op_rate " << shared_op_rate_threads << " " << k.first << " "
      << DTypeName(k.second) << " " << r << "\n";
  }
  return o.str();
}

absl::StatusOr<HardwareProfile> ParseHardwareProfile(std::string_view text_std) {
  const absl::string_view text(text_std.data(), text_std.size());
  HardwareProfile p;
  bool has_memory = false, has_bw = false, has_intra = false;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = raw.substr(0, raw.find('#'));
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](const std::string& want) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile line ", line_no, " '",
                                                     absl::StripAsciiWhitespace(raw),
                                                     "': expected ", want));
    };
    auto num = [&](size_t i, double* out) {
      return i < f.size() && absl::SimpleAtod(f[i], out) && std::isfinite(*out) && *out >= 0;
    };
    const std::string& key = f[0];
    double a = 0, b = 0;
    if (key == "name") {
      if (f.size() != 2) return bad("'name <word>'");
      p.name = f[1];
    } else if (key == "source") {
      p.sources.push_back(std::string(absl::StripAsciiWhitespace(line.substr(line.find("source") + 6))));
    } else if (key == "gpus_per_node") {
      if (f.size() != 2 || !num(1, &a) || a < 1 || a != std::floor(a)) {
        return bad("'gpus_per_node <integer >= 1>'");
      }
      p.gpus_per_node = static_cast<int>(a);
    } else if (key == "memory_bytes" || key == "memory_reserved_bytes" ||
               key == "memory_bandwidth" || key == "op_overhead_s" || key == "overlap" ||
               key == "vector_flops" ||
               key == "cores") {
      if (f.size() != 2 || !num(1, &a)) return bad(absl::StrCat("'", key, " <number >= 0>'"));
      if (key == "memory_bytes") p.memory_bytes = a, has_memory = a > 0;
      if (key == "memory_reserved_bytes") p.memory_reserved_bytes = a;
      if (key == "memory_bandwidth") p.memory_bandwidth = a, has_bw = a > 0;
      if (key == "op_overhead_s") p.op_overhead_s = a;
      if (key == "cores") p.cores = a;
      if (key == "vector_flops") p.vector_flops = a;
      if (key == "overlap") {
        if (a > 1) return bad("'overlap <fraction in [0, 1]>'");
        p.overlap = a;
      }
    } else if (key == "peak_flops") {
      absl::StatusOr<DType> d = f.size() == 3 ? DTypeOf(f[1]) : absl::InvalidArgumentError("");
      if (!d.ok() || !num(2, &a) || a <= 0) return bad("'peak_flops <dtype> <flop/s > 0>'");
      p.peak_flops[*d] = a;
    } else if (key == "attention") {
      absl::StatusOr<DType> d = f.size() == 3 ? DTypeOf(f[1]) : absl::InvalidArgumentError("");
      if (!d.ok() || !num(2, &a) || a <= 0) return bad("'attention <dtype> <flop/s > 0>'");
      p.attention[*d] = a;
    } else if (key == "gemm") {
      absl::StatusOr<DType> d = f.size() == 4 ? DTypeOf(f[1]) : absl::InvalidArgumentError("");
      if (!d.ok() || !num(2, &a) || a < 1 || !num(3, &b) || b <= 0) {
        return bad("'gemm <dtype> <min_dim >= 1> <flop/s > 0>'");
      }
      auto& pts = p.gemm[*d];
      pts.emplace_back(a, b);
      std::sort(pts.begin(), pts.end());
    } else if (key == "gemm_shape") {
      absl::StatusOr<DType> d = f.size() == 9 ? DTypeOf(f[1]) : absl::InvalidArgumentError("");
      double dims[6];
      bool ok = d.ok();
      for (int i = 0; ok && i < 6; ++i) {
        ok = num(2 + i, &dims[i]) && dims[i] == std::floor(dims[i]) &&
             (i < 4 ? dims[i] >= 1 : dims[i] <= 1);
      }
      if (!ok || !num(8, &a) || a <= 0) {
        return bad("'gemm_shape <dtype> <batch> <m> <n> <k> (integers >= 1) <trans_a 0|1> "
                   "<trans_b 0|1> <flop/s > 0>'");
      }
      GemmKey k{static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1]),
                static_cast<int64_t>(dims[2]), static_cast<int64_t>(dims[3]), *d,
                dims[4] == 1, dims[5] == 1};
      p.gemm_exact[k] = a;
    } else if (key == "oversubscribed_sync") {
      if (f.size() != 3 || !num(1, &a) || a < 2 || a != std::floor(a) || !num(2, &b)) {
        return bad("'oversubscribed_sync <ranks >= 2> <seconds >= 0>'");
      }
      p.oversubscribed_sync[static_cast<int>(a)] = b;
    } else if (key == "op_rate") {
      absl::StatusOr<DType> d = f.size() == 4 ? DTypeOf(f[2]) : absl::InvalidArgumentError("");
      if (!d.ok() || !num(3, &a) || a <= 0) return bad("'op_rate <op> <dtype> <bytes/s > 0>'");
      p.op_rate[{f[1], *d}] = a;
    } else if (key == "link") {
      if (f.size() != 4 || (f[1] != "intra" && f[1] != "inter") || !num(2, &a) || !num(3, &b) ||
          b <= 0) {
        return bad("'link <intra|inter> <alpha_s> <busbw bytes/s > 0>'");
      }
      (f[1] == "intra" ? p.intra : p.inter) = Link{a, b};
      has_intra = has_intra || f[1] == "intra";
    } else if (key == "collective") {
      if (f.size() != 5 || !num(2, &a) || a < 2 || !num(3, &b) || !num(4, &b)) {
        return bad("'collective <op> <group_size >= 2> <alpha_s> <seconds_per_byte>'");
      }
      double alpha = 0, spb = 0;
      (void)num(3, &alpha);
      (void)num(4, &spb);
      p.fitted[{f[1], static_cast<int>(a)}] = {alpha, spb};
    } else if (key == "shared_op_rate") {
      absl::StatusOr<DType> d = f.size() == 5 ? DTypeOf(f[3]) : absl::InvalidArgumentError("");
      if (!d.ok() || !num(1, &a) || a < 2 || a != std::floor(a) || !num(4, &b) || b <= 0 ||
          (p.shared_op_rate_threads != 0 && p.shared_op_rate_threads != a)) {
        return bad("'shared_op_rate <threads >= 2, the same on every line> <op> <dtype> "
                   "<bytes/s > 0>'");
      }
      p.shared_op_rate_threads = static_cast<int>(a);
      p.shared_op_rate[{f[2], *d}] = b;
    } else {
      return bad("a key among name, source, gpus_per_node, memory_bytes, "
                 "memory_reserved_bytes, memory_bandwidth, vector_flops, op_overhead_s, peak_flops, "
                 "attention, gemm, gemm_shape, op_rate, "
                 "link, collective, overlap, cores, oversubscribed_sync, shared_op_rate");
    }
  }
  const std::string who = p.name.empty() ? "hardware profile" : "hardware profile " + p.name;
  if (p.name.empty()) return absl::InvalidArgumentError("hardware profile: no 'name' line");
  if (!has_memory) return absl::InvalidArgumentError(who + ": no 'memory_bytes' line");
  if (p.memory_reserved_bytes >= p.memory_bytes) {
    return absl::InvalidArgumentError(who + ": memory_reserved_bytes >= memory_bytes");
  }
  if (!has_bw) return absl::InvalidArgumentError(who + ": no 'memory_bandwidth' line");
  if (p.gemm.empty()) return absl::InvalidArgumentError(who + ": no 'gemm' line");
  if (!has_intra) return absl::InvalidArgumentError(who + ": no 'link intra' line");
  return p;
}

std::vector<std::string> ShippedProfileNames() {
  return std::vector<std::string>(kShippedProfileNames,
                                  kShippedProfileNames + kShippedProfileCount);
}

absl::StatusOr<HardwareProfile> LoadHardwareProfile(const std::string& name_or_path) {
  for (int i = 0; i < kShippedProfileCount; ++i) {
    if (name_or_path == kShippedProfileNames[i]) {
      return ParseHardwareProfile(kShippedProfileTexts[i]);
    }
  }
  // A profile is a few dozen lines; 1 MiB refuses a wrong file (or /dev/zero) before parsing.
  absl::StatusOr<std::string> text =
      ReadBoundedFile(name_or_path, int64_t{1} << 20, "hardware profile");
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(
        "unknown hardware profile '", name_or_path, "': not a shipped profile (",
        absl::StrJoin(ShippedProfileNames(), ", "), ") and no such file"));
  }
  if (!text.ok()) return text.status();
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(*text);
  if (!p.ok()) {
    return absl::Status(p.status().code(),
                        absl::StrCat(name_or_path, ": ", p.status().message()));
  }
  return p;
}

absl::StatusOr<HardwareProfile> FromTpBenchProfile(const perfmodel::GpuProfile& measured,
                                                   HardwareProfile base) {
  std::map<DType, std::map<double, double>> best;  // min_dim -> best rate
  for (const auto& [key, seconds] : measured.gemm_s) {
    const auto& [dtype, shape] = key;
    if (seconds <= 0) continue;
    const double x = static_cast<double>(std::min({shape.m, shape.n, shape.k}));
    double& r = best[dtype][x];
    r = std::max(r, shape.Flops() / seconds);
  }
  if (best.empty()) {
    return absl::InvalidArgumentError(
        "tp_bench profile has no gemm lines; run tp_bench --device=cuda --profile_out=FILE");
  }
  for (const auto& [dtype, pts] : best) {
    auto& out = base.gemm[dtype];
    out.assign(pts.begin(), pts.end());
  }
  bool has_link = false;
  for (const auto& [key, s] : measured.link_s) has_link = has_link || s > 0;
  if (has_link) {
    const perfmodel::ClusterLinks links = perfmodel::LinksFromProfile(measured);
    base.intra = {links.intra.alpha_s, links.intra.busbw};
    base.sources.push_back("intra link fitted from the tp_bench profile's link lines");
  }
  base.name += "_measured";
  base.sources.push_back(absl::StrCat("GEMM rates measured by tp_bench on ", measured.device));
  return base;
}

absl::StatusOr<HardwareProfile> WithCollectivesBench(std::string_view json, HardwareProfile base) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("benchmarks") || !j["benchmarks"].is_array()) {
    return absl::InvalidArgumentError(
        "collectives_bench output: not Google Benchmark JSON (run it with "
        "--benchmark_format=json)");
  }
  std::map<std::pair<std::string, int>, std::pair<std::vector<double>, std::vector<double>>> rows;
  for (const nlohmann::json& b : j["benchmarks"]) {
    if (!b.contains("name") || !b.contains("real_time") || b.contains("error_occurred")) continue;
    const std::string name = b["name"].get<std::string>();
    std::vector<std::string> parts = absl::StrSplit(name, '/');
    if (parts.size() < 4 || parts[1] != "backend:in_process") continue;
    int n = 0;
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(absl::StripPrefix(parts[2], "world:"), &n) ||
        !absl::SimpleAtoi(absl::StripPrefix(parts[3], "bytes:"), &bytes) || n < 2) {
      continue;
    }
    const std::string unit = b.value("time_unit", "ns");
    const double scale = unit == "us" ? 1e-6 : unit == "ms" ? 1e-3 : unit == "s" ? 1.0 : 1e-9;
    const double rank_bytes = parts[0] == "all_gather" ? double(bytes) / n : double(bytes);
    auto& [xs, ys] = rows[{parts[0], n}];
    xs.push_back(rank_bytes);
    ys.push_back(b["real_time"].get<double>() * scale);
  }
  int fitted = 0;
  for (const auto& [key, xy] : rows) {
    if (xy.first.size() < 2) continue;
    const perfmodel::AlphaBeta ab = perfmodel::FitAlphaBeta(xy.first, xy.second);
    base.fitted[key] = {std::max(0.0, ab.alpha_s), std::max(0.0, ab.seconds_per_byte)};
    ++fitted;
  }
  if (fitted == 0) {
    return absl::InvalidArgumentError(
        "collectives_bench output: no in-process rows with >= 2 sizes to fit");
  }
  base.sources.push_back(
      absl::StrCat(fitted, " collective costs fitted from collectives_bench in-process rows"));
  return base;
}

}  // namespace shardmap::planner
