// Each collective's VJP is the adjoint of its forward: the VJP is derived from the collective's
// row of the collectives table (CollectiveRule::transpose / transpose_invariant), so a row that
// names a wrong transpose, or wrong parameters for it, fails here. For every row and each of its
// forms (R and I results), a program loss(x) = <A(x), w> (A: the collective, with the casts that
// give it its input type) is differentiated by the tape, and
//   <A(x), w> == <x, A^T(w)>
// in f64 on a 3-device mesh with odd sizes (the adjoint identity: loss is linear in x; for
// all_reduce(max/min), which is positively homogeneous, Euler's identity says the same).
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/runtime/async_collectives.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/collective_recorder.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

struct Case {
  std::string label;
  // The collectives and casts the program runs (true: the To::kI form), one entry each.
  std::vector<std::pair<Collective, bool>> covers;
  PartitionSpec x_spec;
  bool x_invariant;  // x is I on tp (convert I->R's input)
  std::function<Value(const Value&)> fn;
  Shape w_shape;  // the global shape of the weights (and of A(x))
  PartitionSpec w_spec;
  bool loss_partial;  // sum(A(x) * w) is P on tp (returned Unreduced)
};

using C = Collective;

// x: [9, 15] globally; on tp=3, S0 gives [3, 15] per device, S1 [9, 5].
std::vector<Case> Cases() {
  const PartitionSpec s0 = P("tp", None), s1 = P(None, "tp"), r = P();
  const std::vector<int64_t> uneven = {2, 4, 9};  // of 15
  auto to_r = [](const Value& v) { return convert(v, "tp", Convert::kIToR); };
  return {
      {"all_reduce(sum)", {{C::kAllReduceSum, false}, {C::kReinterpret, false}}, s0, false,
       [](const Value& x) { return all_reduce(reinterpret(x, "tp"), "tp"); }, {3, 15}, r, false},
      {"all_reduce(sum) to I",
       {{C::kAllReduceSum, true}, {C::kConvertIToR, false}, {C::kReinterpret, false}},
       s0,
       false,
       [=](const Value& x) { return to_r(all_reduce(reinterpret(x, "tp"), "tp", To::kI)); },
       {3, 15}, r, false},
      {"all_reduce(mean)", {{C::kAllReduceMeanMaxMin, false}}, s0, false,
       [](const Value& x) { return all_reduce(x, "tp", To::kR, ReduceKind::kMean); }, {3, 15}, r,
       false},
      {"all_reduce(mean) to I",
       {{C::kAllReduceMeanMaxMin, true}, {C::kConvertIToR, false}},
       s0,
       false,
       [=](const Value& x) { return to_r(all_reduce(x, "tp", To::kI, ReduceKind::kMean)); },
       {3, 15}, r, false},
      {"all_reduce(max)", {{C::kAllReduceMeanMaxMin, false}}, s0, false,
       [](const Value& x) { return all_reduce(x, "tp", To::kR, ReduceKind::kMax); }, {3, 15}, r,
       false},
      {"all_reduce(min) to I",
       {{C::kAllReduceMeanMaxMin, true}, {C::kConvertIToR, false}},
       s0,
       false,
       [=](const Value& x) { return to_r(all_reduce(x, "tp", To::kI, ReduceKind::kMin)); },
       {3, 15}, r, false},
      {"all_gather dim 0", {{C::kAllGather, false}}, s0, false,
       [](const Value& x) { return all_gather(x, 0, "tp"); }, {9, 15}, r, false},
      {"all_gather dim 1", {{C::kAllGather, false}}, s1, false,
       [](const Value& x) { return all_gather(x, -1, "tp"); }, {9, 15}, r, false},
      {"all_gather to I", {{C::kAllGather, true}, {C::kConvertIToR, false}}, s1, false,
       [=](const Value& x) { return to_r(all_gather(x, 1, "tp", To::kI)); }, {9, 15}, r, false},
      {"reduce_scatter", {{C::kReduceScatter, false}, {C::kReinterpret, false}}, s0, false,
       [](const Value& x) { return reduce_scatter(reinterpret(x, "tp"), 1, "tp"); }, {3, 15}, s1,
       true},
      {"reduce_scatter then all_gather, uneven",
       {{C::kReduceScatter, false}, {C::kAllGather, false}, {C::kReinterpret, false}},
       s0,
       false,
       [=](const Value& x) {
         return all_gather(reduce_scatter(reinterpret(x, "tp"), 1, "tp", uneven), 1, "tp",
                           uneven);
       },
       {3, 15}, r, false},
      {"all_gather to I, uneven",
       {{C::kAllGather, true}, {C::kAllGather, false}, {C::kVary, false}, {C::kConvertIToR, false}},
       s0,
       false,
       [=](const Value& x) {
         // Each device keeps an uneven share (2, 4, 9 of 15 columns) of x before gathering.
         const int i = axis_index("tp");
         int64_t start = 0;
         for (int k = 0; k < i; ++k) start += uneven[k];
         Value mine = slice(vary(all_gather(x, 0, "tp"), "tp"), 1, start, uneven[i]);
         return to_r(all_gather(mine, 1, "tp", uneven, To::kI));
       },
       {9, 15}, r, false},
      {"all_to_all", {{C::kAllToAll, false}}, s0, false,
       [](const Value& x) { return all_to_all(x, 1, 0, "tp"); }, {9, 15}, s1, true},
      {"all_to_all, uneven, scaled per device, and back",
       {{C::kAllToAllSizes, false}, {C::kAllToAllSizes, false}},
       s0,
       false,
       [=](const Value& x) {
         Value y = all_to_all(x, 1, 0, "tp", uneven, {3, 3, 3});  // [9, 2|4|9]
         y = y * (axis_index_value("tp", DType::kF64) + 2.0);
         return all_to_all(y, 0, 1, "tp", {3, 3, 3}, uneven);
       },
       {9, 15}, s0, true},
      {"ppermute", {{C::kPpermute, false}}, s0, false,
       [](const Value& x) { return ppermute(x, "tp", {{0, 1}, {1, 2}, {2, 0}}); }, {9, 15}, s0,
       true},
      {"broadcast", {{C::kBroadcast, false}}, s0, false,
       [](const Value& x) { return broadcast(x, "tp", 1); }, {3, 15}, r, false},
      {"convert(I->R)", {{C::kConvertIToR, false}}, r, true, to_r, {9, 15}, r, false},
      {"convert(R->P)", {{C::kConvertRToP, false}}, r, false,
       [](const Value& x) { return convert(x, "tp", Convert::kRToP); }, {9, 15}, r, true},
      {"reinterpret", {{C::kReinterpret, false}}, s0, false,
       [](const Value& x) { return reinterpret(x, "tp"); }, {3, 15}, r, true},
      {"vary", {{C::kVary, false}}, r, false, [](const Value& x) { return vary(x, "tp"); },
       {9, 15}, r, true},
  };
}

ShardMap MakeProgram(const Case& c, const Mesh& mesh) {
  ShardFn fn = [c](const std::vector<Value>& in) -> std::vector<Value> {
    return {sum_partial(c.fn(in[0]) * in[1], {})};
  };
  ShardMapOptions o;
  if (c.x_invariant) o.invariant_inputs = {0};
  return shard_map(fn, mesh, {c.x_spec, c.w_spec}, {c.loss_partial ? P().Unreduced({"tp"}) : P()},
                   o);
}

double Dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.at(i) * b.at(i);
  return s;
}

TEST(CollectiveAdjoint, EveryRowsVjpIsTheAdjointOfItsForward) {
  const Mesh mesh = *Mesh::Create({{"tp", 3}});
  std::set<std::pair<Collective, bool>> covered;
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.label);
    const Tensor x = RandomNormal({9, 15}, seed++, 0, 1, DType::kF64);
    const Tensor w = RandomNormal(c.w_shape, seed++, 0, 1, DType::kF64);
    absl::StatusOr<ShardMapGrads> r = value_and_grad(MakeProgram(c, mesh))({x, w});
    ASSERT_TRUE(r.ok()) << r.status();
    const double forward = r->outputs[0].at(0);  // <A(x), w>
    const double adjoint = Dot(x, r->grads[0]);  // <x, A^T(w)>, A^T from the table
    EXPECT_NEAR(forward, adjoint, 1e-10 * (1 + std::abs(forward)));
    EXPECT_GT(std::abs(forward), 1e-3);  // a loss of zero would pass vacuously
    covered.insert(c.covers.begin(), c.covers.end());
  }
  // Every row's transposes are covered: a new Collective needs its case here.
  for (int i = 0; i < static_cast<int>(Collective::kCount); ++i) {
    const Collective op = static_cast<Collective>(i);
    const CollectiveRule& rule = CollectiveRuleFor(op);
    EXPECT_TRUE(covered.count({op, false})) << rule.name << " has no case";
    const bool has_i = rule.result == CollectiveResultKind::kRorI ||
                       rule.result == CollectiveResultKind::kGathered;
    if (has_i) {
      EXPECT_TRUE(covered.count({op, true})) << rule.name << " to I has no case";
    }
  }
}

// ppermute_start / Wait write the async form of ppermute's row by hand (the transpose's transfer
// is started in Wait's VJP and waited in the start's): the same adjoint identity.
TEST(CollectiveAdjoint, AsyncPpermuteIsTheAdjointOfItsForward) {
  const Mesh mesh = *Mesh::Create({{"tp", 3}});
  ASSERT_EQ(TransposeOf(Collective::kPpermute, false).op, Collective::kPpermute);
  Case c{"ppermute_start/wait", {}, P("tp", None), false,
         [](const Value& x) { return ppermute_start(x, "tp", {{0, 2}, {1, 0}, {2, 1}}).Wait(); },
         {9, 15}, P("tp", None), true};
  const Tensor x = RandomNormal({9, 15}, 11, 0, 1, DType::kF64);
  const Tensor w = RandomNormal(c.w_shape, 12, 0, 1, DType::kF64);
  absl::StatusOr<ShardMapGrads> r = value_and_grad(MakeProgram(c, mesh))({x, w});
  ASSERT_TRUE(r.ok()) << r.status();
  const double forward = r->outputs[0].at(0);
  EXPECT_NEAR(forward, Dot(x, r->grads[0]), 1e-10 * (1 + std::abs(forward)));
  EXPECT_GT(std::abs(forward), 1e-3);
}

// The VJP runs the collective the row names, and nothing else: the backward of each program
// issues exactly its ops' rows' transpose collectives (in any order; max/min adds the
// all_reduce that finds the extreme).
TEST(CollectiveAdjoint, BackwardIssuesTheRowsTransposes) {
  const Mesh mesh = *Mesh::Create({{"tp", 3}});
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.label);
    std::multiset<std::string> want;
    for (const auto& [op, invariant] : c.covers) {
      const CollectiveTranspose& tr = TransposeOf(op, invariant);
      if (tr.op != Collective::kCount && CollectiveRuleFor(tr.op).communicates) {
        want.insert(CollectiveRuleFor(tr.op).api);
      }
      if (tr.then == TransposeLocal::kSpread &&
          (c.label.find("max") != std::string::npos || c.label.find("min") != std::string::npos)) {
        want.insert("all_reduce");
      }
    }
    const Tensor x = RandomNormal({9, 15}, 7, 0, 1, DType::kF64);
    const Tensor w = RandomNormal(c.w_shape, 8, 0, 1, DType::kF64);
    CollectiveRecorder rec;
    absl::StatusOr<ShardMapGrads> r = value_and_grad(MakeProgram(c, mesh))({x, w});
    ASSERT_TRUE(r.ok()) << r.status();
    std::multiset<std::string> backward;
    for (const CollectiveRecord& rc : rec.records()) {
      if (rc.backward) backward.insert(rc.op);
    }
    EXPECT_EQ(backward, want);
  }
}

}  // namespace
}  // namespace shardmap
