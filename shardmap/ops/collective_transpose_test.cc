// Each collective's VJP runs the transpose the collectives table names (type_rules.h): under
// value_and_grad, the backward pass of a program with that one collective issues exactly the
// table's transpose collective (or none for a local transpose), and (checked mode: the tape
// checks every cotangent against its primal's dual type) the gradients agree with f64 finite
// differences.
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/collective_recorder.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

struct Case {
  Collective op;
  bool invariant_input;  // the input is I on tp (for convert I->R)
  PartitionSpec in_spec;
  // The collective under test (and the local casts that give it its input type).
  std::function<Value(const Value&)> fn;
  // The spec of the loss weights w (fitting the result's local shape) and whether the loss
  // sum(result * w) is P on tp (returned Unreduced).
  PartitionSpec out_spec;
  bool loss_partial;
};

std::vector<Case> Cases() {
  const PartitionSpec s0 = P("tp", None), s1 = P(None, "tp"), r = P();
  return {
      {Collective::kAllReduceSum, false, s0,
       [](const Value& x) { return all_reduce(reinterpret(x, "tp"), "tp"); }, P(), false},
      {Collective::kAllReduceMeanMaxMin, false, s0,
       [](const Value& x) { return all_reduce(x, "tp", To::kR, ReduceKind::kMean); }, P(),
       false},
      {Collective::kAllGather, false, s0, [](const Value& x) { return all_gather(x, 0, "tp"); },
       r, false},
      {Collective::kReduceScatter, false, s0,
       [](const Value& x) { return reduce_scatter(reinterpret(x, "tp"), 1, "tp"); }, s1, true},
      {Collective::kAllToAll, false, s0, [](const Value& x) { return all_to_all(x, 1, 0, "tp"); },
       s1, true},
      {Collective::kAllToAllSizes, false, s0,
       [](const Value& x) { return all_to_all(x, 1, 0, "tp", {2, 2, 2}, {2, 2, 2}); }, s1,
       true},
      {Collective::kPpermute, false, s0,
       [](const Value& x) { return ppermute(x, "tp", {{0, 1}, {1, 2}, {2, 0}}); }, s0, true},
      {Collective::kBroadcast, false, s0, [](const Value& x) { return broadcast(x, "tp", 1); }, r,
       false},
      {Collective::kConvertIToR, true, r,
       [](const Value& x) { return convert(x, "tp", Convert::kIToR); }, r, false},
      {Collective::kConvertRToP, false, r,
       [](const Value& x) { return convert(x, "tp", Convert::kRToP); }, r, true},
      {Collective::kReinterpret, false, s0, [](const Value& x) { return reinterpret(x, "tp"); },
       r, true},
      {Collective::kVary, false, r, [](const Value& x) { return vary(x, "tp"); }, r, true},
  };
}

// loss = sum(op(x) * w): no collective besides op's (a P loss is returned Unreduced).
ShardMap MakeProgram(const Case& c, const Mesh& mesh) {
  ShardFn fn = [c](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = c.fn(in[0]);
    return {sum_partial(y * in[1], {})};
  };
  ShardMapOptions o;
  if (c.invariant_input) o.invariant_inputs = {0};
  return shard_map(fn, mesh, {c.in_spec, c.out_spec},
                   {c.loss_partial ? P().Unreduced({"tp"}) : P()}, o);
}

TEST(CollectiveTranspose, BackwardIssuesTheTablesTranspose) {
  const Mesh mesh = *Mesh::Create({{"tp", 3}});
  const std::vector<Case> cases = Cases();
  ASSERT_EQ(cases.size(), static_cast<size_t>(Collective::kCount));
  for (const Case& c : cases) {
    const CollectiveRule& rule = CollectiveRuleFor(c.op);
    SCOPED_TRACE(rule.name);
    const CollectiveTranspose& tr = rule.transpose;
    const bool communicates = tr.op != Collective::kCount && CollectiveRuleFor(tr.op).communicates;
    // x: [6, 6] (S0 on tp: 2 rows each); w: the result's global shape.
    const Tensor x = RandomNormal({6, 6}, 1, 0, 1, DType::kF64);
    ShardMap f = MakeProgram(c, mesh);
    // The result's global shape, from a forward run with all-ones weights of any fitting shape.
    std::vector<Tensor> in = {x, Tensor()};
    for (const Shape& s : {Shape{6, 6}, Shape{2, 6}, Shape{6, 2}}) {
      in[1] = RandomNormal(s, 2, 0, 1, DType::kF64);
      if (f(in).ok()) break;
    }
    CollectiveRecorder rec;
    absl::StatusOr<ShardMapGrads> r = value_and_grad(f)(in);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<std::string> backward;
    for (const CollectiveRecord& rc : rec.records()) {
      if (rc.backward) backward.push_back(rc.op);
    }
    if (communicates) {
      EXPECT_EQ(backward, std::vector<std::string>{CollectiveRuleFor(tr.op).api});
    } else {
      EXPECT_TRUE(backward.empty()) << backward[0];
    }
    EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(f, in));
  }
}

}  // namespace
}  // namespace shardmap
