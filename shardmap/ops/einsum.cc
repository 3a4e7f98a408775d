#include "shardmap/ops/einsum.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/ops.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::NeedsTape;
using internal::RecordOp;
using internal::TypeFail;

struct Spec {
  std::vector<std::string> in;
  std::string out;
};

Spec Parse(const std::string& text, int num_operands) {
  std::string s;
  for (char c : text) {
    if (c != ' ') s += c;
  }
  size_t arrow = s.find("->");
  if (arrow == std::string::npos) {
    OpFail("einsum: spec '", text, "' has no '->'; write the output letters explicitly, e.g. ",
           "\"ij,jk->ik\"");
  }
  Spec spec;
  spec.out = s.substr(arrow + 2);
  std::string lhs = s.substr(0, arrow);
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    spec.in.push_back(lhs.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(spec.in.size()) != num_operands) {
    OpFail("einsum: spec '", text, "' names ", spec.in.size(), " operand(s) but ", num_operands,
           " were given");
  }
  auto check_letters = [&](const std::string& letters, const std::string& what) {
    for (size_t i = 0; i < letters.size(); ++i) {
      char c = letters[i];
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
        OpFail("einsum: spec '", text, "': '", std::string(1, c), "' in ", what,
               " is not a letter (index letters are a-z, A-Z)");
      }
      if (letters.find(c, i + 1) != std::string::npos) {
        OpFail("einsum: spec '", text, "': letter '", std::string(1, c), "' repeats in ", what,
               " (diagonals are not supported; take them with explicit ops)");
      }
    }
  };
  for (size_t k = 0; k < spec.in.size(); ++k) check_letters(spec.in[k], absl::StrCat("operand ", k));
  check_letters(spec.out, "the output");
  for (char c : spec.out) {
    bool found = false;
    for (const std::string& in : spec.in) found |= in.find(c) != std::string::npos;
    if (!found) {
      OpFail("einsum: spec '", text, "': output letter '", std::string(1, c),
             "' appears in no operand");
    }
  }
  return spec;
}

void CheckRank(const std::string& text, const std::string& letters, const Value& v, int k) {
  if (static_cast<int>(letters.size()) != v.rank()) {
    OpFail("einsum: spec '", text, "' gives operand ", k, " ", letters.size(), " letters ('",
           letters, "') but it is ", v.ToString());
  }
}

bool Has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// Sums the dims of `x` whose letters are in neither `other` nor `out` (sum_partial: a sharded
// one gives P, as summing a sharded dim must).
Value ReduceLoneLetters(const Value& x, std::string& letters, const std::string& other,
                        const std::string& out) {
  std::vector<int> dims;
  std::string kept;
  for (size_t d = 0; d < letters.size(); ++d) {
    if (Has(other, letters[d]) || Has(out, letters[d])) {
      kept += letters[d];
    } else {
      dims.push_back(static_cast<int>(d));
    }
  }
  if (dims.empty()) return x;
  letters = kept;
  return sum_partial(x, dims);
}

// Permutes x (letters `from`) into the order `to` (same set of letters).
Value PermuteTo(const Value& x, const std::string& from, const std::string& to) {
  std::vector<int> perm;
  for (char c : to) perm.push_back(static_cast<int>(from.find(c)));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int>(i);
  return identity ? x : permute(x, perm);
}

// The type of a two-operand einsum whose letters all appear in two of {a, b, out}: the one
// contraction rule (type_rules_contraction.h), which matmul shares.
SpmdType EinsumType(const std::string& text, const Value& a, const std::string& la,
                    const Value& b, const std::string& lb, const std::string& out) {
  RankContext& ctx = RankContext::Get("einsum");
  if (!ctx.checked()) return internal::ErasedJoin(a.type, b.type);
  std::optional<Rejection> no;
  SpmdType t = ContractionRule(a.type, la, b.type, lb, out, ctx.mesh().axis_names(), no);
  if (no) {
    const std::string op = absl::StrCat("einsum(\"", text, "\")");
    TypeFail(op.c_str(), no->axis, no->rule, no->fix, {{"a", &a}, {"b", &b}});
  }
  if (internal::HasUnstampedV(t)) {
    internal::StampOrigins(absl::StrCat("einsum(\"", text, "\")"), t, {{"a", &a}, {"b", &b}},
                           "a contraction of unknown layout",
                           "all_gather the operand of unknown layout first");
  }
  return t;
}

// The letters of `l` that are in `group`, in l's order.
std::string InOrderOf(const std::string& l, const std::string& group) {
  std::string s;
  for (char c : l) {
    if (Has(group, c)) s += c;
  }
  return s;
}

}  // namespace

namespace internal {

EinsumGemmPlan PlanEinsumGemm(const std::string& la, const std::string& lb,
                              const std::string& out, const std::map<char, int64_t>& size) {
  std::string batch, m, n, k;
  for (char c : la) {
    if (Has(lb, c)) {
      (Has(out, c) ? batch : k) += c;
    } else {
      m += c;
    }
  }
  for (char c : lb) {
    if (!Has(la, c)) n += c;
  }
  auto product = [&](const std::string& letters) {
    int64_t p = 1;
    for (char c : letters) p *= size.at(c);
    return p;
  };
  const int64_t B = product(batch), M = product(m), K = product(k), N = product(n);
  // The plan depends on the letters and on B, M, K, N only: each distinct one found once per
  // thread (a shape-only step plans the same few contractions thousands of times).
  using Key = std::tuple<std::string, std::string, std::string, int64_t, int64_t, int64_t, int64_t>;
  thread_local std::map<Key, EinsumGemmPlan> plans;
  Key key{la, lb, out, B, M, K, N};
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  if (plans.size() >= 4096) plans.clear();
  EinsumGemmPlan best;
  best.copied = -1;
  for (const std::string& bo : {InOrderOf(la, batch), InOrderOf(lb, batch)}) {
    for (const std::string& ko : {InOrderOf(la, k), InOrderOf(lb, k)}) {
      for (const std::string& mo : {InOrderOf(la, m), InOrderOf(out, m)}) {
        for (const std::string& no : {InOrderOf(lb, n), InOrderOf(out, n)}) {
          EinsumGemmPlan p{bo, mo, no, ko};
          if (la == bo + mo + ko) {
          } else if (la == bo + ko + mo) {
            p.ta = true;
          } else {
            p.copied += B * M * K;
          }
          if (lb == bo + ko + no) {
          } else if (lb == bo + no + ko) {
            p.tb = true;
          } else {
            p.copied += B * K * N;
          }
          if (out == bo + mo + no) {
          } else if (out == bo + no + mo) {
            p.swap = true;
          } else {
            p.copied += B * M * N;
          }
          if (best.copied < 0 || p.copied < best.copied) best = p;
        }
      }
    }
  }
  plans.emplace(std::move(key), best);
  return best;
}

}  // namespace internal

namespace {

// The kernel: one batched matmul over [batch, m, k] x [batch, k, n], laid out by
// internal::PlanEinsumGemm. Each operand laid out as [batch, m, k] or [batch, k, m] (resp.
// [batch, k, n] or [batch, n, k]) for some order of the letters in each group goes in as it is,
// with a transpose flag; the output comes as [batch, m, n] or, by computing (ab)^T = b^T a^T, as
// [batch, n, m]. Of the orders tried, the one that copies the fewest elements wins; what still
// does not fit is permuted.
Tensor EinsumKernel(const Tensor& a, const std::string& la, const Tensor& b,
                    const std::string& lb, const std::string& out) {
  std::map<char, int64_t> size;
  for (size_t i = 0; i < la.size(); ++i) size[la[i]] = a.dim(static_cast<int>(i));
  for (size_t i = 0; i < lb.size(); ++i) size[lb[i]] = b.dim(static_cast<int>(i));
  const internal::EinsumGemmPlan p = internal::PlanEinsumGemm(la, lb, out, size);
  auto permuted = [](const Tensor& t, const std::string& from, const std::string& to) {
    std::vector<int> perm;
    bool identity = true;
    for (char c : to) {
      perm.push_back(static_cast<int>(from.find(c)));
      identity &= perm.back() == static_cast<int>(perm.size() - 1);
    }
    return identity ? t : Permute(t, perm);
  };
  auto product = [&](const std::string& letters) {
    int64_t n = 1;
    for (char c : letters) n *= size.at(c);
    return n;
  };
  const int64_t B = product(p.batch), M = product(p.m), K = product(p.k), N = product(p.n);
  Tensor a3 = permuted(a, la, p.ta ? p.batch + p.k + p.m : p.batch + p.m + p.k);
  Tensor b3 = permuted(b, lb, p.tb ? p.batch + p.n + p.k : p.batch + p.k + p.n);
  auto shape3 = [&](int64_t rows, int64_t cols) {
    return p.batch.empty() ? Shape{rows, cols} : Shape{B, rows, cols};
  };
  a3 = a3.Reshape(p.ta ? shape3(K, M) : shape3(M, K));
  b3 = b3.Reshape(p.tb ? shape3(N, K) : shape3(K, N));
  // ab, or b^T a^T = (ab)^T when the output wants [batch, n, m].
  Tensor r = p.swap ? Matmul(b3, a3, !p.tb, !p.ta) : Matmul(a3, b3, p.ta, p.tb);
  std::string natural = p.swap ? p.batch + p.n + p.m : p.batch + p.m + p.n;
  Shape shape;
  for (char c : natural) shape.push_back(size.at(c));
  return permuted(r.Reshape(shape), natural, out);
}

Value Einsum2(const std::string& text, const Value& a, const std::string& la, const Value& b,
              const std::string& lb, const std::string& out) {
  // The types first: a sharding mistake is named as such on every mesh size, before the local
  // sizes (which differ only on meshes with more than one device per axis) are compared.
  SpmdType type = EinsumType(text, a, la, b, lb, out);
  for (size_t i = 0; i < la.size(); ++i) {
    size_t j = lb.find(la[i]);
    if (j != std::string::npos && a.dim(static_cast<int>(i)) != b.dim(static_cast<int>(j))) {
      OpFail("einsum: spec '", text, "': letter '", std::string(1, la[i]), "' has size ",
             a.dim(static_cast<int>(i)), " in operand a ", a.ToString(), " but ",
             b.dim(static_cast<int>(j)), " in operand b ", b.ToString(),
             " (local shard sizes; shard the letter the same way in both)");
    }
  }
  if (a.dtype() != b.dtype()) {
    OpFail("einsum: spec '", text, "': operands have different dtypes: a ", a.ToString(), ", b ",
           b.ToString(), "; cast one of them first");
  }
  Value result(internal::WithTypes("einsum", {{"a", &a}, {"b", &b}},
                                   [&] { return EinsumKernel(a.tensor, la, b.tensor, lb, out); }),
               type);
  if (NeedsTape(a, b)) {
    Value ad(a.tensor, a.type), bd(b.tensor, b.type);
    std::string da_spec = absl::StrCat(out, ",", lb, "->", la);
    std::string db_spec = absl::StrCat(out, ",", la, "->", lb);
    RecordOp("einsum", {&a, &b}, result,
             [ad, bd, da_spec, db_spec](const Value& g, uint32_t need, Value* d) {
               if (need & 1) d[0] = internal::AsCotangent(einsum(da_spec, g, bd), ad.type);
               if (need & 2) d[1] = internal::AsCotangent(einsum(db_spec, g, ad), bd.type);
             });
  }
  return result;
}

}  // namespace

Value einsum(const std::string& text, const Value& a) {
  internal::CheckMesh("einsum", a, "a");
  Spec spec = Parse(text, 1);
  CheckRank(text, spec.in[0], a, 0);
  std::string la = spec.in[0];
  Value x = ReduceLoneLetters(a, la, "", spec.out);
  return PermuteTo(x, la, spec.out);
}

Value einsum(const std::string& text, const Value& a, const Value& b) {
  internal::CheckMesh("einsum", a, "a");
  internal::CheckMesh("einsum", b, "b");
  Spec spec = Parse(text, 2);
  CheckRank(text, spec.in[0], a, 0);
  CheckRank(text, spec.in[1], b, 1);
  std::string la = spec.in[0], lb = spec.in[1];
  Value ra = ReduceLoneLetters(a, la, lb, spec.out);
  Value rb = ReduceLoneLetters(b, lb, la, spec.out);
  return Einsum2(text, ra, la, rb, lb, spec.out);
}

}  // namespace shardmap
