// The testing library's own tests: every helper accepts a right program and rejects a wrong one
// with the message its header promises. Also built as testing_test_gpu (GPU ranks, or skipped).
#include "spmd_testing/testing.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Deterministic data in [-1, 1) without tensor/random (an independent source).
Tensor Data(std::vector<int64_t> shape, int seed, DType dtype = DType::kF64) {
  // f64 or f32 only.
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(1.7 * (i + 1) + 13.0 * seed);
  Tensor t = Tensor::FromVector<double>(shape, v);
  if (dtype == DType::kF64) return t;
  std::vector<float> f(v.begin(), v.end());
  return Tensor::FromVector<float>(shape, f);
}

// A Megatron MLP block; `scale_by_local_width` makes it silently wrong when tp > 1 (a constant
// taken from the local shard's shape: type-correct, numerically wrong).
ShardMap Mlp(const Mesh& mesh, bool scale_by_local_width = false,
             std::vector<CollectiveRecord>* log = nullptr) {
  ShardFn fn = [scale_by_local_width](const std::vector<Value>& in) -> std::vector<Value> {
    Value h = gelu(in[0].matmul(in[1]));
    if (scale_by_local_width) h = h * (4.0 / static_cast<double>(in[1].tensor.shape()[1]));
    Value y = all_reduce(h.matmul(in[2]), "tp");
    return {sum(y * y, {}), y};
  };
  ShardMapOptions o;
  o.input_names = {"x", "w1", "w2"};
  o.output_names = {"loss", "y"};
  o.collective_log = log;
  return shard_map(fn, mesh, {P(), P(None, "tp"), P("tp", None)}, {P(), P()}, o);
}

std::vector<Tensor> MlpInputs(DType dtype = DType::kF64) {
  // d_hidden 12: divisible by every tp below (1, 2, 3, 4, 6).
  return {Data({5, 7}, 1, dtype), Data({7, 12}, 2, dtype), Data({12, 7}, 3, dtype)};
}

const std::vector<spmd_testing::MeshAxes> kMeshes = {
    {{"tp", 1}}, {{"tp", 2}}, {{"tp", 3}}, {{"dp", 2}, {"tp", 3}}, {{"tp", 6}}};

// ---- ShardedMatchesOneDevice ----------------------------------------------------------------

TEST(ShardedMatchesOneDevice, AcceptsARightLayerOnEveryMesh) {
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice([](const Mesh& m) { return Mlp(m); }, kMeshes,
                                                    MlpInputs()));
}

TEST(ShardedMatchesOneDevice, AcceptsF32WithItsDefaultTolerance) {
  EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice([](const Mesh& m) { return Mlp(m); }, kMeshes,
                                                    MlpInputs(DType::kF32)));
}

TEST(ShardedMatchesOneDevice, NamesMeshOutputRankAndWorstElementOfAWrongLayer) {
  ::testing::AssertionResult r = spmd_testing::ShardedMatchesOneDevice(
      [](const Mesh& m) { return Mlp(m, /*scale_by_local_width=*/true); },
      {{{"tp", 1}}, {{"tp", 4}}}, MlpInputs());
  ASSERT_FALSE(r);
  const std::string msg = r.message();
  EXPECT_THAT(msg, Not(HasSubstr("mesh {tp:1}")));  // tp=1 is the one-device program itself
  EXPECT_THAT(msg, HasSubstr("mesh {tp:4}: output 1 (y): f64[5,7] vs f64[5,7]: 35 of 35 elements "
                             "differ by more than atol "));
  EXPECT_THAT(msg, HasSubstr("mesh {tp:4}: output 0 (loss)"));
  EXPECT_THAT(msg, HasSubstr("mesh {tp:4}: gradient of input 1 (w1)"));
  EXPECT_THAT(msg, HasSubstr("(rank 0 (tp=0), local ["));  // y is replicated: rank 0 holds it
  // w1 [7,12] is S1 over tp=4: column 11 is in rank 3's block, its column 2.
  EXPECT_THAT(msg, HasSubstr("worst at [2,11]: got "));
  EXPECT_THAT(msg, HasSubstr("that element is [2,11] (rank 3 (tp=3), local [2,2])"));
  EXPECT_THAT(msg, HasSubstr("(f64 tolerance)"));
  // x is R on tp, so its gradient is a pending sum there (ShardMap::GradientSpecs): each rank
  // holds a part of the element, and the message says so.
  std::string x_line;
  for (absl::string_view line : absl::StrSplit(msg, '\n')) {
    if (absl::StartsWith(line, "mesh {tp:4}: gradient of input 0 (x)")) x_line = std::string(line);
  }
  EXPECT_THAT(x_line, HasSubstr("(rank 0 (tp=0), local ["));
  EXPECT_THAT(x_line, HasSubstr("; summed over tp)"));
}

TEST(ShardedMatchesOneDevice, ReportsAFailingRunWithItsStatus) {
  ::testing::AssertionResult r = spmd_testing::ShardedMatchesOneDevice(
      [](const Mesh& m) { return Mlp(m); }, {{{"tp", 5}}}, MlpInputs());  // 12 % 5 != 0
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("mesh {tp:5}: the sharded run failed"));
  EXPECT_THAT(r.message(), HasSubstr("divisible"));
}

TEST(CompareAssembled, NamesTheRankAndLocalIndexOfTheWorstElement) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  Tensor want = Data({2, 4}, 4);
  Tensor got = want.Clone();
  got.data<double>()[7] += 0.5;  // [1,3]: tp block 1, local column 1; R on dp: ranks 1 and 3
  got.data<double>()[0] += 0.25;
  const std::string msg = spmd_testing::CompareAssembled(mesh, P(None, "tp"), "output 0", got, want,
                                                    spmd_testing::DefaultTolerance(DType::kF64));
  EXPECT_THAT(msg, HasSubstr("output 0: f64[2,4] vs f64[2,4]: 2 of 8 elements differ"));
  EXPECT_THAT(msg, HasSubstr("worst at [1,3]: got "));
  EXPECT_THAT(msg, HasSubstr("that element is [1,3] (rank 1 (dp=0,tp=1), local [1,1])"));
  EXPECT_EQ(spmd_testing::CompareAssembled(mesh, P(None, "tp"), "x", want, want.Clone(),
                                      spmd_testing::DefaultTolerance(DType::kF64)),
            "");
}

TEST(CompareAssembled, TreatsNanAndInfinityExactly) {
  const Mesh mesh = *Mesh::Create({{"tp", 1}});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const spmd_testing::Tolerance loose{1e9, 1e9};  // no finite difference would fail
  auto cmp = [&](std::vector<double> g, std::vector<double> w) {
    return spmd_testing::CompareAssembled(mesh, P(), "t", Tensor::FromVector<double>({2}, g),
                                          Tensor::FromVector<double>({2}, w), loose);
  };
  EXPECT_EQ(cmp({nan, inf}, {nan, inf}), "");
  EXPECT_EQ(cmp({-inf, 1}, {-inf, 2}), "");
  EXPECT_THAT(cmp({nan, 1}, {1, 1}), HasSubstr("1 of 2 elements differ"));
  EXPECT_THAT(cmp({nan, 1}, {1, 1}), HasSubstr("that element is [0] (rank 0 (tp=0), local [0])"));
  EXPECT_THAT(cmp({1, 1}, {1, nan}), HasSubstr("that element is [1]"));
  EXPECT_THAT(cmp({1, inf}, {1, -inf}), HasSubstr("that element is [1]"));
  EXPECT_THAT(cmp({1, 1e300}, {1, inf}), HasSubstr("that element is [1]"));
  EXPECT_THAT(
      spmd_testing::CompareAssembled(mesh, P(), "t", Data({2, 3}, 1), Data({3, 2}, 1), loose),
      HasSubstr("t: got f64[2,3], want f64[3,2]"));
  // Re-exported from tensor/testing/compare.h for users of this library.
  EXPECT_TENSOR_NEAR(Data({2}, 1), Data({2}, 1), 0);
}

TEST(DefaultTolerance, LoosensWithThePrecision) {
  EXPECT_LT(spmd_testing::DefaultTolerance(DType::kF64).rtol,
            spmd_testing::DefaultTolerance(DType::kF32).rtol);
  EXPECT_LT(spmd_testing::DefaultTolerance(DType::kF32).rtol,
            spmd_testing::DefaultTolerance(DType::kF16).rtol);
  EXPECT_LT(spmd_testing::DefaultTolerance(DType::kF16).rtol,
            spmd_testing::DefaultTolerance(DType::kBF16).rtol);
  EXPECT_EQ(spmd_testing::DefaultTolerance(DType::kI32).atol, 0);
}

// ---- CollectivesAre -------------------------------------------------------------------------

TEST(CollectivesAre, CountsForwardAndBackwardWithBytes) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::vector<CollectiveRecord> log;
  ASSERT_TRUE(value_and_grad(Mlp(mesh, false, &log))(MlpInputs()).ok());
  const int64_t y_bytes = 5 * 7 * 8;  // the f64 [5,7] activation
  EXPECT_TRUE(spmd_testing::CollectivesAre(mesh, log,
                                           {spmd_testing::AllReduce("tp").Bytes(y_bytes)},
                                           {spmd_testing::AllReduce("tp").Bytes(y_bytes)}));
  spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp")},
                                  {spmd_testing::AllReduce("tp")});

  ::testing::AssertionResult twice = spmd_testing::CollectivesAre(
      mesh, log, {spmd_testing::AllReduce("tp", 2)}, {spmd_testing::AllReduce("tp")});
  ASSERT_FALSE(twice);
  EXPECT_THAT(twice.message(), HasSubstr("forward: want all_reduce(tp) x2; got all_reduce(tp) "
                                         "x1 [280 B each] (missing 1 of 2 all_reduce(tp))"));

  ::testing::AssertionResult bytes = spmd_testing::CollectivesAre(
      mesh, log, {spmd_testing::AllReduce("tp")}, {spmd_testing::AllReduce("tp").Bytes(8)});
  ASSERT_FALSE(bytes);
  EXPECT_THAT(bytes.message(), HasSubstr("backward: want all_reduce(tp) x1 [8 B each]"));
  EXPECT_THAT(bytes.message(), HasSubstr("missing 1 of 1 all_reduce(tp) of 8 B"));
  EXPECT_THAT(bytes.message(), HasSubstr("unexpected all_reduce(tp) x1 [280 B each]"));

  ::testing::AssertionResult none = spmd_testing::CollectivesAre(mesh, log, {}, {});
  ASSERT_FALSE(none);
  EXPECT_THAT(none.message(), HasSubstr("forward: want none; got all_reduce(tp) x1"));
  EXPECT_THAT(none.message(), HasSubstr("backward: want none"));

  ::testing::AssertionResult wrong_axis = spmd_testing::CollectivesAre(
      mesh, log, {spmd_testing::AllReduce("dp")}, {spmd_testing::AllReduce("sp")});
  ASSERT_FALSE(wrong_axis);
  EXPECT_THAT(wrong_axis.message(), HasSubstr("missing 1 of 1 all_reduce(dp)"));
  EXPECT_THAT(wrong_axis.message(), HasSubstr("expected all_reduce over sp: "));
}

TEST(CollectivesAre, SeveralAxesAndOtherOps) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  std::vector<CollectiveRecord> log = {{"all_reduce", 0b11, 16, false},
                                       {"all_gather", 0b01, 8, false},
                                       {"reduce_scatter", 0b01, 32, true}};
  EXPECT_TRUE(spmd_testing::CollectivesAre(
      mesh, log, {spmd_testing::AllGather("dp"), spmd_testing::AllReduce({"dp", "tp"})},
      {spmd_testing::ReduceScatter("dp").Bytes(32)}));
  EXPECT_EQ(spmd_testing::DescribeCollectives(mesh, log, false),
            "all_gather(dp) x1 [8 B each], all_reduce((dp,tp)) x1 [16 B each]");
  EXPECT_EQ(spmd_testing::DescribeCollectives(mesh, {}, true), "none");
}

TEST(ExpectCollectives, ReportsAFailureAtTheCallersLine) {
  const Mesh mesh = *Mesh::Create({{"tp", 2}});
  const std::vector<CollectiveRecord> log = {{"all_reduce", 0b1, 8, false}};
  ::testing::TestPartResultArray results;
  int line = 0;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllReduce("tp")});  // passes
    line = __LINE__ + 1;
    spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::AllGather("tp")});
  }
  ASSERT_EQ(results.size(), 1);
  const ::testing::TestPartResult& r = results.GetTestPartResult(0);
  EXPECT_TRUE(r.nonfatally_failed());
  // This file and line, not the library's.
  ASSERT_NE(r.file_name(), nullptr);
  EXPECT_EQ(std::string(r.file_name()), __FILE__);
  EXPECT_EQ(r.line_number(), line);
  EXPECT_THAT(r.message(), HasSubstr("missing 1 of 1 all_gather(tp)"));
  EXPECT_THAT(r.message(), HasSubstr("unexpected all_reduce(tp) x1 [8 B each]"));
}

// ---- GradientsMatchFiniteDifferences --------------------------------------------------------

TEST(GradientsMatchFiniteDifferences, AcceptsTheShardedBackwardOfTheMlp) {
  for (const spmd_testing::MeshAxes& axes : {spmd_testing::MeshAxes{{"tp", 3}},
                                             spmd_testing::MeshAxes{{"dp", 2}, {"tp", 2}}}) {
    SCOPED_TRACE(spmd_testing::MeshAxesToString(axes));
    EXPECT_TRUE(
        spmd_testing::GradientsMatchFiniteDifferences(Mlp(*Mesh::Create(axes)), MlpInputs()));
  }
}

TEST(GradientsMatchFiniteDifferences, RejectsACoarseStepOnACubic) {
  // d/dx sum(x^3) = 3x^2, but the central difference with step e is 3x^2 + e^2.
  ShardFn cube = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {all_reduce(sum_partial(in[0] * in[0] * in[0], {}), "tp")};
  };
  ShardMap f = shard_map(cube, *Mesh::Create({{"tp", 2}}), {P("tp")}, {P()});
  const std::vector<Tensor> x = {Data({6}, 5)};
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(f, x));
  spmd_testing::FiniteDifferenceOptions coarse;
  coarse.eps = 0.5;
  ::testing::AssertionResult r = spmd_testing::GradientsMatchFiniteDifferences(f, x, coarse);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("mesh {tp:2}: d loss / d input 0 f64[6] at [4] (rank 1 "
                                     "(tp=1), local [1]): value_and_grad "));
  EXPECT_THAT(r.message(), HasSubstr("|diff| 0.25"));
}

TEST(GradientsMatchFiniteDifferences, AsksForF64Inputs) {
  ::testing::AssertionResult r = spmd_testing::GradientsMatchFiniteDifferences(
      Mlp(*Mesh::Create({{"tp", 2}})), MlpInputs(DType::kF32));
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("input 0 (x) is f32: finite differences need f64 inputs"));
}

// ---- RejectedWith ---------------------------------------------------------------------------

TEST(RejectedWith, AcceptsAnErrorWithEveryFragment) {
  ShardFn forgot = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {gelu(in[0].matmul(in[1])).matmul(in[2])};  // a pending sum over tp, not reduced
  };
  ShardMap f = shard_map(forgot, *Mesh::Create({{"tp", 2}}), {P(), P(None, "tp"), P("tp", None)},
                         {P()});
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return f(MlpInputs()); }, {"tp", "all_reduce"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return f(MlpInputs()).status(); }, {"tp"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return value_and_grad(f)(MlpInputs()); }, {"tp"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [] { throw OpError(absl::InvalidArgumentError("thrown: bad shape")); }, {"bad shape"}));
}

TEST(RejectedWith, SaysWhatHappenedOtherwise) {
  ::testing::AssertionResult ok =
      spmd_testing::RejectedWith([] { return absl::OkStatus(); }, {"x"});
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.message(), HasSubstr("accepted (OK); expected a rejection containing 'x'"));

  ::testing::AssertionResult lacks = spmd_testing::RejectedWith(
      [] { return absl::InvalidArgumentError("shape mismatch"); }, {"shape", "w1"});
  ASSERT_FALSE(lacks);
  EXPECT_THAT(lacks.message(), HasSubstr("rejected, but the message lacks 'w1': "));
  EXPECT_THAT(lacks.message(), HasSubstr("shape mismatch"));
}

TEST(RejectedWith, FailsAHangWithinTheTimeout) {
  auto release = std::make_shared<std::atomic<bool>>(false);
  const auto t0 = std::chrono::steady_clock::now();
  ::testing::AssertionResult r = spmd_testing::RejectedWith(
      [release] {
        while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return absl::InternalError("released");
      },
      {"anything"}, absl::Milliseconds(200));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release->store(true);  // lets the detached program finish
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("still running after 200ms (a hang?)"));
  EXPECT_LT(waited, 5.0);
}

}  // namespace
}  // namespace shardmap
