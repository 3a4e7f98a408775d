// einsum: numbers against naive loops, gradients against f64 central differences, type rules
// and their errors, and a sharded run (shard_map over tp = 2, 3) against the unsharded one.
#include "shardmap/ops/einsum.h"

#include <map>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rand;

// Naive einsum: loops over every assignment of every letter, multiplying the operands' entries
// and accumulating into the output entry (independent of the kernel's matmul lowering).
Tensor NaiveEinsum(const std::string& spec, const std::vector<Tensor>& ops) {
  size_t arrow = spec.find("->");
  std::string out = spec.substr(arrow + 2);
  std::vector<std::string> ins;
  std::string lhs = spec.substr(0, arrow);
  size_t comma = lhs.find(',');
  ins.push_back(lhs.substr(0, comma));
  if (comma != std::string::npos) ins.push_back(lhs.substr(comma + 1));
  std::map<char, int64_t> size;
  for (size_t k = 0; k < ins.size(); ++k) {
    for (size_t d = 0; d < ins[k].size(); ++d) size[ins[k][d]] = ops[k].dim(d);
  }
  std::vector<int64_t> out_shape;
  for (char c : out) out_shape.push_back(size[c]);
  std::vector<double> acc(NumElements(out_shape), 0.0);
  std::vector<char> letters;
  for (auto& [c, n] : size) letters.push_back(c);
  std::map<char, int64_t> idx;
  for (char c : letters) idx[c] = 0;
  auto flat = [&](const std::string& ls, const std::vector<int64_t>& shape) {
    int64_t f = 0;
    for (size_t d = 0; d < ls.size(); ++d) f = f * shape[d] + idx[ls[d]];
    return f;
  };
  while (true) {
    double p = 1;
    for (size_t k = 0; k < ins.size(); ++k) {
      std::vector<int64_t> sh(ops[k].shape().begin(), ops[k].shape().end());
      p *= ops[k].at(flat(ins[k], sh));
    }
    acc[flat(out, out_shape)] += p;
    size_t l = 0;
    for (; l < letters.size(); ++l) {
      if (++idx[letters[l]] < size[letters[l]]) break;
      idx[letters[l]] = 0;
    }
    if (l == letters.size()) break;
  }
  return Tensor::FromVector<double>(out_shape, acc);
}

Value Apply(const std::string& spec, const std::vector<Value>& v) {
  return v.size() == 1 ? einsum(spec, v[0]) : einsum(spec, v[0], v[1]);
}

struct Case {
  std::string spec;
  std::vector<std::vector<int64_t>> shapes;
};

std::vector<Case> Cases() {
  return {
      {"ij,jk->ik", {{3, 4}, {4, 5}}},
      {"ij,kj->ik", {{3, 4}, {5, 4}}},
      {"ji,jk->ik", {{4, 3}, {4, 5}}},
      {"bthd,bshd->bhts", {{2, 3, 2, 4}, {2, 5, 2, 4}}},
      {"bhts,bshd->bthd", {{2, 2, 3, 5}, {2, 5, 2, 4}}},
      {"btd,de->bte", {{2, 3, 4}, {4, 5}}},
      {"i,j->ij", {{3}, {4}}},
      {"ij,ij->", {{3, 4}, {3, 4}}},
      {"ijk,k->ij", {{2, 3, 4}, {4}}},
      {"ik,jl->ij", {{3, 2}, {4, 5}}},  // k and l are summed alone first
      // Layouts the kernel takes as they are (transpose flags, b^T a^T for a [n, m] output,
      // group orders taken from either operand or the output) and ones it must permute.
      {"ij,jk->ki", {{3, 4}, {4, 5}}},
      {"ji,kj->ki", {{4, 3}, {5, 4}}},
      {"bhts,bthd->bshd", {{2, 3, 4, 5}, {2, 4, 3, 2}}},
      {"bhts,bschd->bthd", {{2, 3, 4, 5}, {2, 5, 1, 3, 2}}},
      {"bhts,btchd->bschd", {{2, 3, 4, 5}, {2, 4, 1, 3, 2}}},
      {"hbij,bhjk->bhik", {{3, 2, 4, 5}, {2, 3, 5, 2}}},
      {"hbji,bhkj->hbki", {{3, 2, 5, 4}, {2, 3, 2, 5}}},
      {"abk,kc->bac", {{2, 3, 4}, {4, 5}}},
      {"xyk,zkw->yxzw", {{2, 3, 4}, {2, 4, 3}}},
      {"ij->ji", {{3, 4}}},
      {"ijk->ki", {{2, 3, 4}}},
      {"ij->", {{3, 4}}},
  };
}

class EinsumTest : public ::testing::Test {
 protected:
  EinsumTest() : one_(Mesh()) {}
  SingleRankContext one_;
};

TEST_F(EinsumTest, MatchesNaiveLoops) {
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.spec);
    std::vector<Tensor> ts;
    std::vector<Value> vs;
    for (const auto& s : c.shapes) {
      ts.push_back(Rand(s, seed++));
      vs.push_back(Value::Replicated(ts.back()));
    }
    Value got = Apply(c.spec, vs);
    EXPECT_TENSOR_NEAR(got.tensor, NaiveEinsum(c.spec, ts), 1e-12);
  }
}

TEST_F(EinsumTest, GradientsMatchCentralDifferences) {
  uint64_t seed = 100;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.spec);
    std::vector<Tensor> ts;
    for (const auto& s : c.shapes) ts.push_back(Rand(s, seed++));
    // loss = sum(einsum(...) * r) for a fixed random r: every output entry has its own weight.
    std::vector<Value> probe;
    for (const Tensor& t : ts) probe.push_back(Value::Replicated(t));
    const Shape out_shape = Apply(c.spec, probe).shape();
    Tensor r = Rand(std::vector<int64_t>(out_shape.begin(), out_shape.end()), seed++);
    auto loss = [&](const std::vector<Value>& p) {
      return sum(Apply(c.spec, p) * Value::Replicated(r), {});
    };
    std::vector<Value> params;
    for (const Tensor& t : ts) params.push_back(Value::Replicated(t));
    ValueAndGrad vg = value_and_grad(loss, params);
    const double h = 1e-6;
    for (size_t k = 0; k < ts.size(); ++k) {
      for (int64_t i = 0; i < ts[k].numel(); ++i) {
        auto eval = [&](double delta) {
          std::vector<Value> p;
          for (size_t j = 0; j < ts.size(); ++j) {
            Tensor t = ts[j].Clone();
            if (j == k) t.data<double>()[i] += delta;
            p.push_back(Value::Replicated(t));
          }
          return loss(p).item();
        };
        double fd = (eval(h) - eval(-h)) / (2 * h);
        EXPECT_NEAR(vg.grads[k].tensor.at(i), fd, 1e-7) << "operand " << k << " entry " << i;
      }
    }
  }
}

// The attention contractions of CausalSelfAttention (q, k, v as [b, t, c = 1, h, d] slices of
// qkv; scores [b, h, t, s]) and the einsums of their VJPs never copy a [b, h, t, s] tensor: the
// scores go onto the batched GEMM as they are, with a transpose flag or as the swapped output.
// What each does copy is its two [b, t, h, d] tensors (h sits between t and d in the qkv layout,
// so the batch letters b, h are not leading). Sizes are chosen so that the two amounts differ.
TEST(EinsumPlanTest, AttentionNeverCopiesTheScores) {
  const std::map<char, int64_t> size = {{'b', 2}, {'t', 96}, {'s', 96}, {'c', 1},
                                        {'h', 3}, {'d', 64}};
  const int64_t heads_tensor = 2 * 96 * 3 * 64;  // [b, t, h, d] = 36864; scores: 55296
  struct Case {
    const char *la, *lb, *out;
  };
  const Case cases[] = {
      {"btchd", "bschd", "bhts"},   // scores = q k^T
      {"bhts", "bschd", "bthd"},    // o = p v
      {"bhts", "bschd", "btchd"},   // d q = g k   (VJP of q k^T)
      {"bhts", "btchd", "bschd"},   // d k = g^T q
      {"bthd", "bschd", "bhts"},    // d p = g v^T (VJP of p v)
      {"bthd", "bhts", "bschd"},    // d v = p^T g
  };
  for (const Case& c : cases) {
    const internal::EinsumGemmPlan p = internal::PlanEinsumGemm(c.la, c.lb, c.out, size);
    EXPECT_EQ(p.copied, 2 * heads_tensor) << c.la << "," << c.lb << "->" << c.out;
  }
  // The same contractions on [b, h, t, d] operands copy nothing at all.
  EXPECT_EQ(internal::PlanEinsumGemm("bhtd", "bhsd", "bhts", size).copied, 0);
  EXPECT_EQ(internal::PlanEinsumGemm("bhts", "bhsd", "bhtd", size).copied, 0);
  // [m, k] x [n, k] -> [n, m] fits with flags and a swap; a batch letter in the middle does not.
  EXPECT_EQ(internal::PlanEinsumGemm("mk", "nk", "nm", {{'m', 3}, {'k', 4}, {'n', 5}}).copied, 0);
  EXPECT_EQ(internal::PlanEinsumGemm("mbk", "bkn", "bmn", {{'m', 3}, {'b', 2}, {'k', 4}, {'n', 5}})
                .copied,
            3 * 2 * 4);
}

// Plans are remembered per thread by their letters and B, M, K, N: the same letters at other
// sizes get their own plan, and a repeated call the same plan as the first.
TEST_F(EinsumTest, RememberedPlansAreTheFreshOnes) {
  auto same = [](const internal::EinsumGemmPlan& x, const internal::EinsumGemmPlan& y) {
    return x.batch == y.batch && x.m == y.m && x.n == y.n && x.k == y.k && x.ta == y.ta &&
           x.tb == y.tb && x.swap == y.swap && x.copied == y.copied;
  };
  const std::map<char, int64_t> small = {{'m', 3}, {'b', 2}, {'k', 4}, {'n', 5}};
  const std::map<char, int64_t> large = {{'m', 30}, {'b', 2}, {'k', 4}, {'n', 5}};
  const internal::EinsumGemmPlan a = internal::PlanEinsumGemm("mbk", "bkn", "bmn", small);
  const internal::EinsumGemmPlan b = internal::PlanEinsumGemm("mbk", "bkn", "bmn", large);
  EXPECT_EQ(a.copied, 3 * 2 * 4);
  EXPECT_EQ(b.copied, 30 * 2 * 4);
  EXPECT_TRUE(same(internal::PlanEinsumGemm("mbk", "bkn", "bmn", small), a));
  EXPECT_TRUE(same(internal::PlanEinsumGemm("mbk", "bkn", "bmn", large), b));
}

TEST_F(EinsumTest, BadSpecsAreClearErrors) {
  Value a = Value::Replicated(Rand({3, 4}, 1)), b = Value::Replicated(Rand({5, 6}, 2));
  auto error = [](const std::function<void()>& f) {
    return std::string(CatchOpError(f).message());
  };
  EXPECT_THAT(error([&] { einsum("ij,jk", a, b); }), HasSubstr("no '->'"));
  EXPECT_THAT(error([&] { einsum("ij,jk->ik", a); }), HasSubstr("2 operand(s) but 1"));
  EXPECT_THAT(error([&] { einsum("ijk,jl->il", a, b); }),
              AllOf(HasSubstr("3 letters"), HasSubstr("f64[3,4]")));
  EXPECT_THAT(error([&] { einsum("ij,jk->ik", a, b); }),
              AllOf(HasSubstr("letter 'j' has size 4"), HasSubstr("but 5")));
  EXPECT_THAT(error([&] { einsum("ii,jk->ik", a, b); }), HasSubstr("letter 'i' repeats"));
  EXPECT_THAT(error([&] { einsum("ij,kl->iz", a, b); }), HasSubstr("'z' appears in no operand"));
  EXPECT_THAT(error([&] { einsum("i1,kl->i", a, b); }), HasSubstr("not a letter"));
}

// Types are per axis and independent of the axis sizes: a one-rank {dp, tp} mesh suffices.
class EinsumTypeTest : public ::testing::Test {
 protected:
  EinsumTypeTest() : ctx_(*Mesh::Create({{"dp", 1}, {"tp", 1}})) {}
  Value Make(std::vector<int64_t> shape, AxisType dp, AxisType tp) {
    SpmdType t(2);
    t[0] = dp;
    t[1] = tp;
    return Value(Tensor::Ones(absl::Span<const int64_t>(shape)), t);
  }
  static std::string Type(const Value& v) { return v.type.ToString({"dp", "tp"}); }
  std::string ErrorOf(const std::function<void()>& f) {
    absl::Status s = CatchOpError(f);
    EXPECT_FALSE(s.ok());
    return std::string(s.message());
  }
  SingleRankContext ctx_;
  const AxisType R = AxisType::R(), I = AxisType::I(), V = AxisType::V(), Pt = AxisType::P();
  static AxisType S(int d) { return AxisType::Sharded(d); }
};

TEST_F(EinsumTypeTest, KeptLettersStayShardedContractedOnesGivePartial) {
  // Attention scores: batch over dp, heads over tp.
  Value q = Make({2, 3, 4, 5}, S(0), S(2)), k = Make({2, 6, 4, 5}, S(0), S(2));
  EXPECT_EQ(Type(einsum("bthd,bshd->bhts", q, k)), "{dp:S0,tp:S1}");
  Value p = Make({2, 4, 3, 6}, S(0), S(1)), v = Make({2, 6, 4, 5}, S(0), S(2));
  EXPECT_EQ(Type(einsum("bhts,bshd->bthd", p, v)), "{dp:S0,tp:S2}");
  // Row-parallel: the contracted letter sharded in both operands gives P.
  Value a = Make({3, 4}, S(0), S(1)), w = Make({4, 5}, R, S(0));
  EXPECT_EQ(Type(einsum("ti,io->to", a, w)), "{dp:S0,tp:P}");
  // Column-parallel: R activations, S1 weights.
  Value x = Make({3, 4}, S(0), R), wc = Make({4, 5}, R, S(1));
  EXPECT_EQ(Type(einsum("ti,io->to", x, wc)), "{dp:S0,tp:S1}");
  EXPECT_EQ(Type(einsum("ti,io->ot", x, wc)), "{dp:S1,tp:S0}");
  // P * R = P; I * I = I; R * R = R.
  EXPECT_EQ(Type(einsum("ij,jk->ik", Make({2, 3}, Pt, R), Make({3, 4}, R, R))), "{dp:P,tp:R}");
  EXPECT_EQ(Type(einsum("ij,jk->ik", Make({2, 3}, I, I), Make({3, 4}, I, I))), "{dp:I,tp:I}");
  // Different letters sharded over one axis: rejected unless declared (as_varying): V. Unknown
  // layout: V.
  EXPECT_THAT(ErrorOf([&] { einsum("i,j->ij", Make({2}, S(0), R), Make({3}, S(0), R)); }),
              HasSubstr("a's dim 0 ('i') is sharded and b's dim 0 ('j') is sharded over 'dp'"));
  EXPECT_EQ(Type(einsum("i,j->ij", as_varying(Make({2}, S(0), R), "dp"), Make({3}, S(0), R))),
            "{dp:V,tp:R}");
  EXPECT_EQ(Type(einsum("ij,jk->ik", Make({2, 3}, V, R), Make({3, 4}, R, R))), "{dp:V,tp:R}");
  // A lone letter summed away while sharded: P (through sum_partial).
  EXPECT_EQ(Type(einsum("ij,k->ik", Make({2, 3}, R, S(1)), Make({4}, R, R))), "{dp:R,tp:P}");
}

// One contraction rule with matmul: a letter sharded in one operand and whole (or another
// letter sharded over the same axis) in the other is rejected on any mesh size (on this
// one-rank mesh the local sizes agree, so only the types can see it), with the same text for
// einsum and matmul; declared per-device blocks (as_varying) give V.
TEST_F(EinsumTypeTest, MismatchedShardingsOfOneLetterAreRejectedAsForMatmul) {
  Value a = Make({3, 4}, R, S(1)), w = Make({4, 5}, R, R);
  const std::string ew = ErrorOf([&] { einsum("ti,io->to", a, w); });
  EXPECT_THAT(ew, AllOf(HasSubstr("a's contracted dim 1 ('i') is sharded over 'tp' but b's dim 0 "
                                  "is whole (R)"),
                        HasSubstr("all_gather(a, 1, \"tp\")")));
  EXPECT_THAT(ErrorOf([&] { matmul(a, w); }), HasSubstr("is whole (R)"));
  EXPECT_EQ(Type(matmul(as_varying(a, "tp"), w)), "{dp:R,tp:V}");
  Value x = Make({3, 4}, S(0), R), y = Make({3, 4}, S(1), R);
  EXPECT_THAT(ErrorOf([&] { einsum("ij,ij->i", x, y); }),
              HasSubstr("a's dim 0 ('i') is sharded and b's dim 1 ('j') is sharded over 'dp'"));
  // The contracted letter sharded over tp in a and over dp in b: rejected as for matmul.
  Value b = Make({4, 5}, S(0), R);
  const std::string e = ErrorOf([&] { einsum("ti,io->to", a, b); });
  EXPECT_THAT(e, AllOf(HasSubstr("einsum(\"ti,io->to\")"), HasSubstr("sharded over 'dp'"),
                       HasSubstr("sharded over 'tp'"), HasSubstr("pair slices")));
  const std::string m = ErrorOf([&] { matmul(a, b); });
  EXPECT_EQ(m.substr(m.find(':')), e.substr(e.find(':')));  // the same rule and text
}

// The type error comes before the local sizes are compared, so a two-device mesh gives the
// same verdict as a one-device one; sizes that differ for other reasons still name the letter.
TEST(EinsumShardedTest, ALetterShardedInOneOperandOnlyNamesTheLetterAndBothOperands) {
  ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
    return {einsum("ti,io->to", in[0], in[1])};
  }, *Mesh::Create({{"tp", 2}}), {P(None, "tp"), P()}, {P(None, "tp")});
  absl::StatusOr<std::vector<Tensor>> r =
      f({Tensor::Ones({3, 4}, DType::kF64), Tensor::Ones({4, 5}, DType::kF64)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("a's contracted dim 1 ('i') is sharded over 'tp' but b's dim 0 is "
                              "whole (R)"),
                    HasSubstr("a=f64[3,2]{tp:S1}, b=f64[4,5]{tp:R}")));
  ShardMap g([](const std::vector<Value>& in) -> std::vector<Value> {
    return {einsum("ti,io->to", in[0], in[1])};
  }, *Mesh::Create({{"tp", 2}}), {P(), P()}, {P()});
  absl::StatusOr<std::vector<Tensor>> r2 =
      g({Tensor::Ones({3, 4}, DType::kF64), Tensor::Ones({3, 5}, DType::kF64)});
  ASSERT_FALSE(r2.ok());
  EXPECT_THAT(r2.status().message(),
              AllOf(HasSubstr("letter 'i' has size 4 in operand a"), HasSubstr("but 3")));
}

TEST_F(EinsumTypeTest, PartialAndInvariantMisuseAreErrors) {
  EXPECT_THAT(ErrorOf([&] { einsum("ij,jk->ik", Make({2, 3}, Pt, R), Make({3, 4}, Pt, R)); }),
              HasSubstr("P*P"));
  EXPECT_THAT(ErrorOf([&] { einsum("ij,jk->ik", Make({2, 3}, Pt, R), Make({3, 4}, S(0), R)); }),
              HasSubstr("partial sum (P) by a varying"));
  EXPECT_THAT(ErrorOf([&] { einsum("ij,jk->ik", Make({2, 3}, I, R), Make({3, 4}, R, R)); }),
              HasSubstr("invariant (I)"));
}

// Attention-shaped einsums with heads sharded over tp and a row-parallel projection, through
// shard_map, against the unsharded run (values and gradients).
TEST(EinsumShardedTest, HeadParallelScoresAndRowParallelProjectionMatchUnsharded) {
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    const int64_t b = 2, t = 3, h = 2 * tp, d = 2, e = 5;
    std::vector<Tensor> in = {Rand({b, t, h, d}, 1), Rand({b, t, h, d}, 2),
                              Rand({h, d, e}, 3)};
    auto body = [](const std::vector<Value>& p) {
      Value s = einsum("bthd,bshd->bhts", p[0], p[1]);
      Value o = einsum("bhts,bshd->bthd", s, p[1]);
      // A lone size-1 letter before the sharded h: summed away, h keeps its shard both ways.
      Value o5 = einsum("bthd,c->btchd", o, Value::Replicated(Tensor::Ones({1}, DType::kF64)));
      o = einsum("bhts,bschd->bthd", einsum("btchd,bschd->bhts", o5, o5), o5) + o;
      return einsum("bthd,hde->bte", o, p[2]);  // h and d contracted: P on tp when sharded
    };
    ShardFn fn = [&](const std::vector<Value>& p) -> std::vector<Value> {
      Value y = all_reduce(body(p), "tp");
      return {sum(y * y, {}), y};
    };
    std::vector<CollectiveRecord> log;
    ShardMapOptions opts;
    opts.collective_log = &log;
    absl::StatusOr<ShardMapGrads> got = value_and_grad(shard_map(
        fn, mesh, {P(None, None, "tp"), P(None, None, "tp"), P("tp")}, {P(), P()}, opts))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    SingleRankContext one{Mesh()};
    std::vector<Value> params;
    for (const Tensor& x : in) params.push_back(Value::Replicated(x));
    ValueAndGrad ref = value_and_grad(
        [&](const std::vector<Value>& p) {
          Value y = body(p);
          return sum(y * y, {});
        },
        params);
    EXPECT_TENSOR_NEAR(got->outputs[0], ref.value.tensor, 1e-10);
    for (size_t k = 0; k < in.size(); ++k) {
      EXPECT_TENSOR_NEAR(got->grads[k], ref.grads[k].tensor, 1e-10) << "input " << k;
    }
    EXPECT_EQ(log.size(), 2u);  // one all_reduce forward, its transpose backward
  }
}

}  // namespace
}  // namespace shardmap
