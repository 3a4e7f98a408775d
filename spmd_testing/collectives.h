// Expectations on the collectives a step issues, forward and backward separately, with bytes.
// The log is a ShardMapOptions::collective_log (rank 0's collectives of the last call) or a
// RankContext's collective_log().
//
//   #include "spmd_testing/testing.h"
//   #include "autograd/value_and_grad.h"
//   #include "shardmap/collective_ops.h"
//   #include "shardmap/ops.h"
//   #include "tensor/random.h"
//   using namespace shardmap;
//
//   TEST(Mlp, OneAllReduceOverTpEachWay) {
//     const int64_t b = 4, d = 6;
//     Mesh mesh = *Mesh::Create({{"tp", 3}});
//     ShardFn mlp = [](const std::vector<Value>& in) -> std::vector<Value> {
//       Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
//       return {sum(y * y, {})};
//     };
//     std::vector<CollectiveRecord> log;
//     ShardMapOptions o;
//     o.collective_log = &log;
//     ShardMap f = shard_map(mlp, mesh, {P(), P(None, "tp"), P("tp", None)}, {P()}, o);
//     std::vector<Tensor> inputs = {RandomNormal({b, d}, 1, 0, 1, DType::kF64),
//                                   RandomNormal({d, 9}, 2, 0, 1, DType::kF64),
//                                   RandomNormal({9, d}, 3, 0, 1, DType::kF64)};
//     ASSERT_TRUE(value_and_grad(f)(inputs).ok());
//     // Megatron: one all_reduce over tp each way, of the [b, d] f64 activation.
//     EXPECT_TRUE(spmd_testing::CollectivesAre(
//         mesh, log, /*forward=*/{spmd_testing::AllReduce("tp").Bytes(b * d * 8)},
//         /*backward=*/{spmd_testing::AllReduce("tp")}));
//     // The same as an expectation; a failure points at this line.
//     spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp", 1)},
//                                     {spmd_testing::AllReduce("tp", 1)});
//   }
//
// Order does not matter; every logged collective must be expected and every expectation met
// (a count is a number of calls; bytes, when given, is each call's contribution on rank 0). A
// failure prints both lists, e.g.
//  forward: want all_reduce(tp) x1 [96 B each]; got all_reduce(tp) x1 [48 B each],
//  all_gather(dp) x1 [48 B each]
#ifndef SHARDMAP_SPMD_TESTING_COLLECTIVES_H_
#define SHARDMAP_SPMD_TESTING_COLLECTIVES_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"

namespace shardmap::spmd_testing {

// One or several mesh axes: "tp", or {"dp", "tp"}.
struct AxisNames {
  AxisNames(const char* a) : names{a} {}
  AxisNames(std::string a) : names{std::move(a)} {}
  AxisNames(std::initializer_list<const char*> list) : names(list.begin(), list.end()) {}
  std::vector<std::string> names;
};

struct ExpectedCollective {
  std::string op;                // "all_reduce", "all_gather", ... (CollectiveRecord::op)
  std::vector<std::string> axes;
  int count = 1;                 // number of calls
  std::optional<int64_t> bytes;  // each call's bytes on the logging rank; unset: any

  ExpectedCollective Bytes(int64_t b) const {
    ExpectedCollective e = *this;
    e.bytes = b;
    return e;
  }
};

ExpectedCollective AllReduce(AxisNames axes, int count = 1);
ExpectedCollective AllGather(AxisNames axes, int count = 1);
ExpectedCollective ReduceScatter(AxisNames axes, int count = 1);
ExpectedCollective AllToAll(AxisNames axes, int count = 1);
ExpectedCollective Ppermute(AxisNames axes, int count = 1);
ExpectedCollective Broadcast(AxisNames axes, int count = 1);

// Success when the forward records of `log` are exactly `forward` and the backward ones exactly
// `backward` (as multisets); else a failure naming the direction and both lists.
::testing::AssertionResult CollectivesAre(const Mesh& mesh,
                                          const std::vector<CollectiveRecord>& log,
                                          const std::vector<ExpectedCollective>& forward,
                                          const std::vector<ExpectedCollective>& backward = {});

// EXPECT_TRUE(CollectivesAre(...)), reported at the caller's file and line (leave `where` to
// its default).
void ExpectCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                       const std::vector<ExpectedCollective>& forward,
                       const std::vector<ExpectedCollective>& backward = {},
                       std::source_location where = std::source_location::current());

// "all_reduce(tp) x2 [96 B each], all_gather(dp) x1 [48 B each]" ("none" when empty).
std::string DescribeCollectives(const Mesh& mesh, const std::vector<CollectiveRecord>& log,
                                bool backward);

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_COLLECTIVES_H_
