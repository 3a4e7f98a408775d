#include "shardmap/internal/type_rule_cases.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardmap {

const char* KindName(AxisKind k) {
  switch (k) {
    case AxisKind::kR: return "R";
    case AxisKind::kI: return "I";
    case AxisKind::kV: return "V";
    case AxisKind::kP: return "P";
  }
  return "?";
}

namespace internal {
namespace {

constexpr const char* kIMeetsOther =
    "an invariant (I) value mixes with nothing else, but here it meets a ";
constexpr const char* kIFix = "convert the I operand with convert(x, axis, I->R) first";

}  // namespace

std::string NameOf(absl::Span<const std::string> names, int axis) {
  return axis < static_cast<int>(names.size()) ? names[axis] : absl::StrCat("a", axis);
}

const char* KindWord(AxisKind k) {
  switch (k) {
    case AxisKind::kR: return "replicated (R)";
    case AxisKind::kI: return "invariant (I)";
    case AxisKind::kV: return "varying (V)";
    case AxisKind::kP: return "partial (P)";
  }
  return "?";
}

SpmdType Rejected(std::optional<Rejection>& no, int axis, std::string rule, std::string fix) {
  no = Rejection{axis, std::move(rule), std::move(fix)};
  return SpmdType();
}

SpmdType JoinedShape(const SpmdType& a, const SpmdType& b) {
  SpmdType t(a.num_axes());
  t.set_mesh_id(a.mesh_id() != 0 ? a.mesh_id() : b.mesh_id());
  return t;
}

bool InvariantCaseSlow(AxisKind kx, AxisKind ky, int i, SpmdType& t,
                                         std::optional<Rejection>& no) {
  if (kx != ky) {
    no = Rejection{i, absl::StrCat(kIMeetsOther, KindWord(kx == AxisKind::kI ? ky : kx), " value"),
                   kIFix};
  } else {
    t[i] = AxisType::I();
  }
  return true;
}

bool PartialProductCaseSlow(AxisKind kx, AxisKind ky, int i,
                                              const char* p_times_v_fix, SpmdType& t,
                                              std::optional<Rejection>& no) {
  if (kx == AxisKind::kP && ky == AxisKind::kP) {
    no = Rejection{
        i, "multiplies two partial sums (P*P): (sum_i a_i)(sum_j b_j) is not sum_i a_i b_i",
        "all_reduce one operand first"};
  } else if (kx == AxisKind::kV || ky == AxisKind::kV) {
    no = Rejection{i, "multiplies a partial sum (P) by a varying (V) value", p_times_v_fix};
  } else {
    t[i] = AxisType::P();
  }
  return true;
}

}  // namespace internal
}  // namespace shardmap
