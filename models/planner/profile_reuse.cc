#include "models/planner/profile_reuse.h"

#include <cmath>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardmap::planner {

namespace {

absl::Status NotAffine(const RoleWork& w, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("role '", w.role, "': ", what, " differ between the two microbatch counts"));
}

// v(n) from v(n1) and v(n1 + 1); k = n - n1.
double Step(double lo, double hi, int64_t k) { return lo + static_cast<double>(k) * (hi - lo); }

using GemmKey = std::tuple<int64_t, int64_t, int64_t, int64_t, DType, bool, bool, bool>;
GemmKey KeyOf(const GemmWork& g) {
  return {g.batch, g.m, g.n, g.k, g.dtype, g.backward, g.trans_a, g.trans_b};
}

using OtherKey = std::tuple<std::string, DType, bool>;
OtherKey KeyOf(const OtherWork& o) { return {o.op, o.dtype, o.attention}; }

using CollectiveKey =
    std::tuple<std::string, std::vector<std::string>, int, double, bool, std::string, DType>;
CollectiveKey KeyOf(const CollectiveWork& c) {
  return {c.op, c.axes, c.group_size, c.bytes, c.backward, c.phase, c.dtype};
}

// Entries of `lo` and `hi` by key, in first-seen order (hi's, then lo's own), each with its
// value at both counts: what `add` sums for one entry.
template <typename T, typename V>
struct Paired {
  std::vector<T> entries;  // one representative per key
  std::vector<V> lo, hi;
};

template <typename T, typename V, typename Add>
absl::StatusOr<Paired<T, V>> Pair(const std::vector<T>& lo, const std::vector<T>& hi,
                                  bool unique, const Add& add) {
  Paired<T, V> p;
  std::map<decltype(KeyOf(lo.front())), size_t> index;
  for (int side = 0; side < 2; ++side) {
    const std::vector<T>& list = side == 0 ? hi : lo;
    std::map<decltype(KeyOf(lo.front())), int> seen;
    for (const T& e : list) {
      const auto key = KeyOf(e);
      if (unique && ++seen[key] > 1) {
        return absl::FailedPreconditionError("an entry is listed twice");
      }
      auto [it, added] = index.try_emplace(key, p.entries.size());
      if (added) {
        p.entries.push_back(e);
        p.lo.emplace_back();
        p.hi.emplace_back();
      }
      add(side == 0 ? p.hi[it->second] : p.lo[it->second], e);
    }
  }
  return p;
}

absl::StatusOr<RoleWork> ExtrapolateRole(const RoleWork& lo, const RoleWork& hi, int64_t k) {
  if (lo.role != hi.role || lo.ranks != hi.ranks || lo.pp_stage != hi.pp_stage ||
      lo.layers != hi.layers || lo.in_flight != hi.in_flight ||
      lo.forward_fraction != hi.forward_fraction) {
    return NotAffine(lo, "the roles");
  }
  if (lo.param_bytes != hi.param_bytes || lo.grad_bytes != hi.grad_bytes ||
      lo.optimizer_bytes != hi.optimizer_bytes) {
    return NotAffine(lo, "the parameter, gradient or optimizer bytes");
  }
  if (!lo.recompute_gemms.empty() || !hi.recompute_gemms.empty() ||
      !lo.recompute_others.empty() || !hi.recompute_others.empty()) {
    return NotAffine(lo, "recomputation entries (a profile has none)");
  }
  RoleWork out = lo;
  out.gemms.clear();
  out.others.clear();
  out.collectives.clear();
  auto gemms = Pair<GemmWork, int64_t>(lo.gemms, hi.gemms, /*unique=*/false,
                                       [](int64_t& v, const GemmWork& g) { v += g.count; });
  if (!gemms.ok()) return NotAffine(lo, "the GEMMs");
  for (size_t i = 0; i < gemms->entries.size(); ++i) {
    GemmWork g = gemms->entries[i];
    const int64_t c = gemms->lo[i] + k * (gemms->hi[i] - gemms->lo[i]);
    if (c < 0) return NotAffine(lo, "the GEMM counts");
    if (c == 0) continue;
    g.count = c;
    out.gemms.push_back(g);
  }
  using FlopsBytes = std::pair<double, double>;
  auto others = Pair<OtherWork, FlopsBytes>(lo.others, hi.others, /*unique=*/true,
                                            [](FlopsBytes& v, const OtherWork& o) {
                                              v.first += o.flops;
                                              v.second += o.bytes;
                                            });
  if (!others.ok()) return NotAffine(lo, "the ops (one entry per name and dtype)");
  for (size_t i = 0; i < others->entries.size(); ++i) {
    OtherWork o = others->entries[i];
    o.flops = Step(others->lo[i].first, others->hi[i].first, k);
    o.bytes = Step(others->lo[i].second, others->hi[i].second, k);
    if (o.flops < 0 || o.bytes < 0) return NotAffine(lo, "the ops' FLOPs or bytes");
    out.others.push_back(o);
  }
  auto cols = Pair<CollectiveWork, int64_t>(lo.collectives, hi.collectives, /*unique=*/false,
                                            [](int64_t& v, const CollectiveWork&) { ++v; });
  if (!cols.ok()) return NotAffine(lo, "the collectives");
  for (size_t i = 0; i < cols->entries.size(); ++i) {
    const int64_t c = cols->lo[i] + k * (cols->hi[i] - cols->lo[i]);
    if (c < 0) return NotAffine(lo, "the collective counts");
    for (int64_t j = 0; j < c; ++j) out.collectives.push_back(cols->entries[i]);
  }
  out.op_count = lo.op_count + k * (hi.op_count - lo.op_count);
  out.activation_peak_bytes = Step(lo.activation_peak_bytes, hi.activation_peak_bytes, k);
  out.peak_bytes = Step(lo.peak_bytes, hi.peak_bytes, k);
  if (out.op_count < 0 || out.activation_peak_bytes < 0) return NotAffine(lo, "the op counts");
  return out;
}

template <typename T>
std::map<decltype(KeyOf(std::declval<T>())), double> Tally(const std::vector<T>& list) {
  std::map<decltype(KeyOf(std::declval<T>())), double> m;
  for (const T& e : list) {
    if constexpr (std::is_same_v<T, GemmWork>) {
      m[KeyOf(e)] += static_cast<double>(e.count);
    } else {
      m[KeyOf(e)] += 1;
    }
  }
  return m;
}

bool SameOthers(const std::vector<OtherWork>& a, const std::vector<OtherWork>& b) {
  std::map<OtherKey, std::pair<double, double>> x, y;
  for (const OtherWork& o : a) x[KeyOf(o)] = {x[KeyOf(o)].first + o.flops, x[KeyOf(o)].second + o.bytes};
  for (const OtherWork& o : b) y[KeyOf(o)] = {y[KeyOf(o)].first + o.flops, y[KeyOf(o)].second + o.bytes};
  return a.size() == b.size() && x == y;
}

}  // namespace

bool SameStageWork(const RoleWork& a, const RoleWork& b) {
  return a.ranks == b.ranks && a.layers == b.layers && a.in_flight == b.in_flight &&
         a.forward_fraction == b.forward_fraction && a.op_count == b.op_count &&
         a.param_bytes == b.param_bytes && a.grad_bytes == b.grad_bytes &&
         a.optimizer_bytes == b.optimizer_bytes && a.recompute_gemms.empty() &&
         b.recompute_gemms.empty() && a.recompute_others.empty() && b.recompute_others.empty() &&
         Tally(a.gemms) == Tally(b.gemms) && SameOthers(a.others, b.others) &&
         Tally(a.collectives) == Tally(b.collectives);
}

absl::StatusOr<RoleWork> StageInFlight(const RoleWork& a, int in_flight_a, const RoleWork& b,
                                       int in_flight_b, int in_flight, int stage,
                                       const std::string& role) {
  if (in_flight_a == in_flight_b || !SameStageWork(a, b)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stages '", a.role, "' and '", b.role, "' do not run the same work at ", in_flight_a,
        " and ", in_flight_b, " microbatches in flight"));
  }
  RoleWork out = a;
  out.pp_stage = stage;
  out.role = role;
  const double peak_step = (b.peak_bytes - a.peak_bytes) / (in_flight_b - in_flight_a);
  const double act_step =
      (b.activation_peak_bytes - a.activation_peak_bytes) / (in_flight_b - in_flight_a);
  // Bytes per microbatch in flight: a whole number, the same for the peak and its activations.
  if (peak_step != std::floor(peak_step) || act_step != peak_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stages '", a.role, "' and '", b.role, "': peaks ", a.peak_bytes, " and ", b.peak_bytes,
        " are not a whole number of bytes per microbatch in flight apart"));
  }
  out.peak_bytes = a.peak_bytes + (in_flight - in_flight_a) * peak_step;
  out.activation_peak_bytes = a.activation_peak_bytes + (in_flight - in_flight_a) * act_step;
  if (out.activation_peak_bytes < 0) {
    return absl::FailedPreconditionError("a negative activation peak");
  }
  return out;
}

absl::StatusOr<std::vector<RoleWork>> ExtrapolateMicrobatches(const std::vector<RoleWork>& low,
                                                              const std::vector<RoleWork>& high,
                                                              int n1, int n, int step) {
  if (n1 < 1 || step < 1 || n <= n1 + step || (n - n1) % step != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extrapolating microbatches: from ", n1, " and ", n1 + step, " to ", n,
        " (n1 >= 1, step >= 1, n > n1 + step and n - n1 a multiple of step; profile n itself "
        "otherwise)"));
  }
  if (low.size() != high.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "extrapolating microbatches: ", low.size(), " roles at ", n1, ", ", high.size(), " at ",
        n1 + step));
  }
  std::vector<RoleWork> out;
  for (size_t i = 0; i < low.size(); ++i) {
    absl::StatusOr<RoleWork> w = ExtrapolateRole(low[i], high[i], (n - n1) / step);
    if (!w.ok()) return w.status();
    out.push_back(*std::move(w));
  }
  return out;
}

}  // namespace shardmap::planner
