// The user's layer tested with shardmap's testing library: equal to the one-device run on
// several meshes (odd sizes included), one all_reduce over tp each way, gradients equal to
// finite differences, and a wrong variant rejected with a useful message.
#include <cmath>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "mlp_block.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "spmd_testing/testing.h"

namespace external_user {
namespace {

using shardmap::Mesh;
using shardmap::Tensor;
namespace smt = shardmap::spmd_testing;

// batch 6, d 5, h 12: divisible by every dp and tp below.
std::vector<Tensor> Inputs() {
  auto data = [](std::vector<int64_t> shape, int seed) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.5 * std::cos(0.9 * i + seed);
    return Tensor::FromVector<double>(shape, v);
  };
  return {data({6, 5}, 1), data({5, 12}, 2), data({12}, 3), data({12, 5}, 4), data({5}, 5)};
}

TEST(MlpBlock, ShardedMatchesOneDevice) {
  EXPECT_TRUE(smt::ShardedMatchesOneDevice(
      MakeMlpBlock,
      {{{"dp", 1}, {"tp", 1}}, {{"dp", 1}, {"tp", 2}}, {{"dp", 2}, {"tp", 3}},
       {{"dp", 3}, {"tp", 4}}},
      Inputs()));
}

TEST(MlpBlock, OneAllReduceOverTpEachWay) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::vector<shardmap::CollectiveRecord> log;
  shardmap::ShardMap block = MakeMlpBlock(mesh);
  shardmap::ShardMapOptions o = block.options();
  o.collective_log = &log;
  block = shardmap::shard_map(block.fn(), mesh, block.in_specs(), block.out_specs(), o);
  ASSERT_TRUE(shardmap::value_and_grad(block)(Inputs()).ok());
  const int64_t activation_bytes = 3 * 5 * 8;  // this rank's [3, 5] f64 rows
  smt::ExpectCollectives(mesh, log, {smt::AllReduce("tp").Bytes(activation_bytes)},
                         {smt::AllReduce("tp").Bytes(activation_bytes)});
}

TEST(MlpBlock, GradientsMatchFiniteDifferences) {
  EXPECT_TRUE(smt::GradientsMatchFiniteDifferences(
      MakeMlpBlock(*Mesh::Create({{"dp", 3}, {"tp", 2}})), Inputs()));
}

TEST(MlpBlock, BiasBeforeTheAllReduceIsRejected) {
  // b2 added to the pending sum would be counted tp times: the type rules refuse it.
  shardmap::ShardFn wrong = [](const std::vector<shardmap::Value>& in) {
    shardmap::Value a = shardmap::gelu(in[0].matmul(in[1]) + in[2]);
    shardmap::Value y = shardmap::all_reduce(a.matmul(in[3]) + in[4], "tp");
    return std::vector<shardmap::Value>{shardmap::sum_partial(y * y, {}), y};
  };
  const Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 2}});
  shardmap::ShardMap block = MakeMlpBlock(mesh);
  shardmap::ShardMap f =
      shardmap::shard_map(wrong, mesh, block.in_specs(), block.out_specs(), block.options());
  EXPECT_TRUE(smt::RejectedWith([&] { return f(Inputs()); }, {"tp", "P"}));
}

}  // namespace
}  // namespace external_user
