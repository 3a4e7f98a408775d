// The tape: backward order, accumulation, the dual-type check of cotangents, loss seeding.
#include "autograd/tape.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(TapeTest, AccumulatesAndSkipsUnusedBranches) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {1.5, -2.0})));
  Value unused = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {3, 4})));
  Value y;
  {
    ScopedRecorder rec(&tape);
    Value z = unused * 2.0;  // not on the path to y
    (void)z;
    y = sum(x * x * x + x * 3.0, {});  // dy/dx = 3x^2 + 3
  }
  std::vector<Value> g = tape.Backward(y, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()),
                                       {x, unused});
  EXPECT_DOUBLE_EQ(g[0].tensor.at(0), 3 * 1.5 * 1.5 + 3);
  EXPECT_DOUBLE_EQ(g[0].tensor.at(1), 3 * 4.0 + 3);
  EXPECT_DOUBLE_EQ(g[1].tensor.at(0), 0.0);
}

// Records "+op" / "-op" for each call.
class LogObserver : public BackwardObserver {
 public:
  void BeforeVjp(const char* op) override { log.push_back(std::string("+") + op); }
  void AfterVjp(const char* op) override { log.push_back(std::string("-") + op); }
  std::vector<std::string> log;
};

TEST(TapeTest, ObserverSeesEachVjpInBackwardOrder) {
  SingleRankContext one{Mesh()};
  Tape tape;
  LogObserver obs;
  tape.set_backward_observer(&obs);
  Value x = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {1.5, -2.0})));
  Value y;
  {
    ScopedRecorder rec(&tape);
    y = sum(exp(x), {});
  }
  std::vector<Value> g =
      tape.Backward(y, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), {x});
  EXPECT_DOUBLE_EQ(g[0].tensor.at(0), std::exp(1.5));
  EXPECT_THAT(obs.log, ::testing::ElementsAre("+sum", "-sum", "+exp", "-exp"));
  tape.set_backward_observer(nullptr);  // off: nothing more is logged
  tape.Backward(y, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), {x});
  EXPECT_EQ(obs.log.size(), 4u);
}

// A chain of "layers" x -> tanh(x * w0) -> tanh(. * w1) -> tanh(. * w2); w1 is also used at the
// end (like a tied embedding). Each gradient is reported once, as soon as the pass is below its
// first consumer: w2 before the VJPs of layer 1 run, w0 last but one, the tied w1 at its first use.
TEST(TapeTest, ReportsEachGradientWhenItIsFinal) {
  SingleRankContext one{Mesh()};
  Tape tape;
  LogObserver obs;
  tape.set_backward_observer(&obs);
  auto vec = [](double a, double b) {
    return Value::Replicated(Tensor::FromVector<double>({2}, {a, b}));
  };
  std::vector<Value> w = {tape.Watch(vec(0.5, -0.3)), tape.Watch(vec(1.2, 0.7)),
                          tape.Watch(vec(-0.4, 0.9))};
  Value x = vec(0.8, -1.1);
  Value unused = tape.Watch(vec(1, 1));
  Value loss;
  {
    ScopedRecorder rec(&tape);
    Value h = x;
    for (const Value& wi : w) h = tanh(h * wi);
    loss = sum(h * w[1], {});
  }
  std::vector<std::string> events;
  std::vector<Value> reported(4);
  std::vector<Value> wrt = {w[0], w[1], w[2], unused};
  std::vector<Value> g =
      tape.Backward(loss, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), wrt,
                    [&](int k, const Value& grad) {
                      events.push_back("ready " + std::to_string(k) + " after " +
                                       std::to_string(obs.log.size()));
                      EXPECT_FALSE(reported[k].defined()) << "reported twice: " << k;
                      reported[k] = grad;
                    });
  // The returned gradients are the reported ones, bit for bit, and equal a plain Backward's.
  Tape plain;
  std::vector<Value> pw;
  for (const Value& wi : wrt) pw.push_back(plain.Watch(Value(wi.tensor, wi.type)));
  Value ploss;
  {
    ScopedRecorder rec(&plain);
    Value h = x;
    for (int i = 0; i < 3; ++i) h = tanh(h * pw[i]);
    ploss = sum(h * pw[1], {});
  }
  std::vector<Value> pg = plain.Backward(ploss, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), pw);
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(reported[k].defined()) << k;
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(reported[k].tensor.at(e), g[k].tensor.at(e));
      EXPECT_EQ(g[k].tensor.at(e), pg[k].tensor.at(e));
    }
  }
  // Backward order: w2 (its mul's VJP is the 4th: sum, mul(h,w1), tanh, mul(.,w2)), then w1
  // (first used in layer 1), then w0; the unused leaf at the end.
  ASSERT_EQ(events.size(), 4u);
  EXPECT_THAT(events[0], HasSubstr("ready 2 after 8"));
  EXPECT_THAT(events[1], HasSubstr("ready 1 after 12"));
  EXPECT_THAT(events[2], HasSubstr("ready 0 after 16"));
  EXPECT_THAT(events[3], HasSubstr("ready 3 after 16"));
}

// AtBackwardBelow(slot): fn runs once every op recorded from `slot` on has had its VJP and
// before the VJPs of the ops before it; slots never reached fire at the end, once.
TEST(TapeTest, TriggersFireBetweenTheVjpsOfTheirSlots) {
  SingleRankContext one{Mesh()};
  Tape tape;
  LogObserver obs;
  tape.set_backward_observer(&obs);
  Value x = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {0.5, -1.5})));
  Value y;
  std::vector<std::string> fired;
  {
    ScopedRecorder rec(&tape);
    Value a = tanh(x);                    // layer 0
    const int32_t layer1 = static_cast<int32_t>(tape.size());
    Value b = exp(a);                     // layer 1
    const int32_t layer2 = static_cast<int32_t>(tape.size());
    y = sum(b * b, {});                   // layer 2
    tape.AtBackwardBelow(layer2, [&] { fired.push_back("below2@" + std::to_string(obs.log.size())); });
    tape.AtBackwardBelow(layer1, [&] { fired.push_back("below1@" + std::to_string(obs.log.size())); });
    tape.AtBackwardBelow(layer2, [&] { fired.push_back("below2b@" + std::to_string(obs.log.size())); });
    tape.AtBackwardBelow(0, [&] { fired.push_back("end@" + std::to_string(obs.log.size())); });
  }
  (void)tape.Backward(y, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), {x});
  // VJPs: sum, mul (layer 2: 4 log entries), exp (layer 1: 2), tanh (layer 0: 2).
  EXPECT_THAT(fired, ::testing::ElementsAre("below2@4", "below2b@4", "below1@6", "end@8"));
  fired.clear();
  (void)tape.Backward(y, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), {x});
  EXPECT_TRUE(fired.empty());  // each fires once
}

// The pass visits only the slots a cotangent reaches (a later microbatch's backward skips the
// earlier microbatches' ops), with the triggers and gradient reports of the slots it skips in
// the order a slot-by-slot walk from the top down to 0 gives them: above the top all at once
// (triggers first), then slot by slot, each slot's triggers before its reports.
TEST(TapeTest, TriggersAndReportsOfSkippedSlotsKeepTheWalksOrder) {
  SingleRankContext one{Mesh()};
  Tape tape;
  std::vector<std::string> events;
  struct Log : BackwardObserver {
    std::vector<std::string>* events;
    void BeforeVjp(const char* op) override { events->push_back(std::string("vjp ") + op); }
    void AfterVjp(const char*) override {}
  } obs;
  obs.events = &events;
  tape.set_backward_observer(&obs);
  Value x0 = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {0.5, -1.5})));
  Value w = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {2.0, 3.0})));
  Value x1 = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {0.25, 1.0})));
  Value y1;
  auto trigger = [&](int32_t slot, const std::string& name) {
    tape.AtBackwardBelow(slot, [&events, name] { events.push_back("trigger " + name); });
  };
  {
    ScopedRecorder rec(&tape);
    Value a0 = tanh(x0 * w);            // microbatch 0: slots 3 (mul), 4 (tanh)
    (void)sum(a0 * a0, {});             // 5, 6: never reached below
    const int32_t mb1 = static_cast<int32_t>(tape.size());
    Value b1 = exp(x1);                 // microbatch 1: 7
    y1 = sum(b1 * w, {});               // 8, 9
    trigger(static_cast<int32_t>(tape.size()) + 3, "above the top");
    trigger(mb1, "mb1");
    trigger(5, "inside mb0");
    trigger(4, "inside mb0 (2)");
    trigger(1, "leaf w");
    trigger(0, "end");
  }
  std::vector<Value> g = tape.Backward(
      y1, Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()), {x1, w, x0},
      [&events](int k, const Value&) { events.push_back("ready " + std::to_string(k)); });
  EXPECT_THAT(events, ::testing::ElementsAre(
                          "trigger above the top", "vjp sum", "vjp mul", "vjp exp", "trigger mb1",
                          "ready 0", "trigger inside mb0", "trigger inside mb0 (2)", "ready 1",
                          "ready 2", "trigger leaf w", "trigger end"));
  EXPECT_EQ(g[0].tensor.at(0), 2.0 * std::exp(0.25));
  EXPECT_EQ(g[1].tensor.at(1), std::exp(1.0));
}

TEST(TapeTest, RejectsACotangentOfTheWrongDualType) {
  SingleRankContext one(*Mesh::Create({{"tp", 1}}));
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Tensor::Ones({2}, DType::kF64)));
  Value y;
  {
    ScopedRecorder rec(&tape);
    y = Value(x.tensor, x.type);
    // A broken VJP: returns the R cotangent unchanged for an R primal (it must be P).
    internal::RecordOp("broken_op", {&x}, y, [](const Value& g, uint32_t, Value* d) {
      d[0] = Value(g.tensor, SpmdType(1, AxisType::R()));
    });
  }
  Value seed(Tensor::Ones({2}, DType::kF64), SpmdType(1, AxisType::P()));
  absl::Status s = CatchOpError([&] { tape.Backward(y, seed, {x}); });
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("backward of 'broken_op'"), HasSubstr("f64[2]{tp:R}"),
                    HasSubstr("needs f64[2]{tp:P}"), HasSubstr("dual type")));
  // Erased mode does not check.
  one.ctx().set_check(TypeCheck::kErased);
  EXPECT_TRUE(CatchOpError([&] { tape.Backward(y, seed, {x}); }).ok());
}

TEST(TapeTest, NoGradScopeInsideRecording) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Tensor::Ones({2})));
  ScopedRecorder rec(&tape);
  {
    NoGradScope ng;
    Value z = x * x;
    EXPECT_EQ(z.node, -1);
  }
  EXPECT_GE((x * x).node, 0);
  EXPECT_EQ(tape.size(), 2u);
}

TEST(LossSeedTest, FollowsTheDualType) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    SpmdType t(2);
    t[0] = AxisType::P();  // dp: each rank's share
    t[1] = AxisType::R();  // tp: replicated -> seeded like convert(R->P)
    Value loss(Tensor::Scalar(0.5, DType::kF64), t);
    Value seed = LossSeed(loss);
    double expect = ctx.coord(1) == 0 ? 1.0 : 0.0;
    EXPECT_EQ(seed.item(), expect);
    EXPECT_EQ(seed.type.ToString({"dp", "tp"}), "{dp:R,tp:P}");
    t[1] = AxisType::I();
    EXPECT_EQ(LossSeed(Value(loss.tensor, t)).item(), 1.0);
    t[0] = AxisType::V();
    absl::Status err = CatchOpError([&] { LossSeed(Value(loss.tensor, t)); });
    EXPECT_THAT(err.message(), AllOf(HasSubstr("varies (V) over axis 'dp'"),
                                     HasSubstr("reduce it first")));
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValueAndGradTest, VLossInShardMapIsAnError) {
  Mesh mesh = *Mesh::Create({{"dp", 2}});
  absl::StatusOr<ShardMapGrads> r = value_and_grad(shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> { return {sum(v[0], {1})}; }, mesh,
      {P("dp")}, {P("dp")}))({Tensor::Ones({4, 2}, DType::kF64)});
  EXPECT_THAT(r.status().message(), HasSubstr("reduce it first"));
}

TEST(ValueAndGradTest, InvariantInputsGetInvariantGradientsNotSummed) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardMapOptions opts;
  opts.invariant_inputs = {0};
  Tensor x = Tensor::FromVector<double>({2}, {1.0, -2.0});
  absl::StatusOr<ShardMapGrads> r = value_and_grad(shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        EXPECT_EQ(v[0].type[0].kind, AxisKind::kI);
        return {sum(v[0] * v[0], {})};  // I loss: seed 1 on every device
      },
      mesh, {P()}, {P()}, opts))({x});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->grads[0].at(0), 2.0);
  EXPECT_EQ(r->grads[0].at(1), -4.0);
  // The same input typed R: the loss is R, seeded on one device, the P gradient summed.
  r = value_and_grad(shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> { return {sum(v[0] * v[0], {})}; },
      mesh, {P()}, {P()}))({x});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->grads[0].at(0), 2.0);
}

TEST(ValueAndGradTest, LocalViewGradientsAreShardsOfTheGlobalOnes) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  Tensor x = Tensor::Full({4, 5}, 0.5, DType::kF64), w = Tensor::Full({5, 6}, -0.25, DType::kF64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] += 0.01 * i;
  for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] += 0.02 * i;
  ShardMap f = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        Value h = tanh(v[0].matmul(v[1]));  // {dp:S0, tp:S1}
        return {sum_partial(h * h, {})};     // P on both
      },
      mesh, {P("dp"), P(None, "tp")}, {P().Unreduced({"dp", "tp"})});
  absl::StatusOr<ShardMapGrads> global = value_and_grad(f)({x, w});
  ASSERT_TRUE(global.ok()) << global.status();
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    LocalGrads lg = value_and_grad(f).CallLocal(
        {ShardOf(x, mesh, P("dp"), ctx.rank()), ShardOf(w, mesh, P(None, "tp"), ctx.rank())},
        /*reduce_partial_grads=*/true);
    // w is R on dp: its gradient was P there and is now all-reduced; S1 on tp.
    EXPECT_EQ(lg.grads[1].type.ToString({"dp", "tp"}), "{dp:R,tp:S1}");
    Tensor expect = ShardOf(global->grads[1], mesh, P(None, "tp"), ctx.rank());
    for (int64_t i = 0; i < expect.numel(); ++i) {
      EXPECT_NEAR(lg.grads[1].tensor.at(i), expect.at(i), 1e-12);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ValueAndGradTest, BackwardCollectivesAreLoggedAsBackward) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Value x = Value::Replicated(Tensor::Ones({3}, DType::kF64));
    ValueAndGrad r = value_and_grad(
        [](const std::vector<Value>& p) {
          return sum(all_reduce(convert(p[0], "tp", Convert::kRToP), "tp"), {});
        },
        {x});
    EXPECT_EQ(ctx.CountCollectives("all_reduce", 1, false), 1);
    EXPECT_EQ(ctx.CountCollectives("all_reduce", 1, true), 1);
    // d/dx of sum(x) (kept once): 1 on tp index 0, 0 elsewhere, as a P gradient.
    EXPECT_EQ(r.grads[0].type[0].kind, AxisKind::kP);
    EXPECT_EQ(r.grads[0].tensor.at(0), ctx.coord(0) == 0 ? 1.0 : 0.0);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// VjpFn keeps small closures inline and larger ones on the heap; either way it calls, moves and
// frees them like std::function, and frees what they captured exactly once.
TEST(VjpFnTest, CallsMovesAndFreesInlineAndHeapClosures) {
  struct Big {
    double pad[64] = {};  // 512 bytes: over kInlineBytes, so on the heap
  };
  static_assert(sizeof(Big) > VjpFn::kInlineBytes);
  SingleRankContext one{Mesh()};
  auto alive = std::make_shared<int>(0);  // counts the calls; use_count() counts the captures
  const Value g = Value::Replicated(Tensor::Full({2}, 3.0, DType::kF64));
  for (bool big : {false, true}) {
    SCOPED_TRACE(big ? "heap" : "inline");
    VjpFn f;
    EXPECT_FALSE(f);
    if (big) {
      f = [alive, big_pad = Big()](const Value& c, uint32_t need, Value* d) {
        if (need & 1) d[0] = c;
        ++*alive;
        (void)big_pad;
      };
    } else {
      f = [alive](const Value& c, uint32_t need, Value* d) {
        if (need & 1) d[0] = c;
        ++*alive;
      };
    }
    ASSERT_TRUE(f);
    EXPECT_EQ(alive.use_count(), 2);
    VjpFn moved = std::move(f);
    EXPECT_FALSE(f);  // NOLINT(bugprone-use-after-move): a moved-from VjpFn is empty
    EXPECT_EQ(alive.use_count(), 2);
    Value d[1];
    moved(g, 1, d);
    EXPECT_EQ(*alive, big ? 2 : 1);
    EXPECT_EQ(d[0].tensor.ToVector<double>(), (std::vector<double>{3, 3}));
    VjpFn other;
    other = std::move(moved);
    EXPECT_EQ(alive.use_count(), 2);
    other = nullptr;
    EXPECT_FALSE(other);
    EXPECT_EQ(alive.use_count(), 1);  // the capture is freed once
  }
}

// Matmul's VJP (two captured Values) fits inline; a tape of many such ops grows past its initial
// reserve (moving its nodes, and so the inline closures) and still differentiates correctly.
TEST(VjpFnTest, TapeGrowthMovesInlineClosures) {
  SingleRankContext one{Mesh()};
  Tape tape;
  const double w0 = 1.001;
  Value w = tape.Watch(Value::Replicated(Tensor::Full({1, 1}, w0, DType::kF64)));
  Value y = Value::Replicated(Tensor::Ones({1, 1}, DType::kF64));
  constexpr int kOps = 300;
  {
    ScopedRecorder rec(&tape);
    for (int i = 0; i < kOps; ++i) y = y.matmul(w);  // y = w^300
  }
  EXPECT_EQ(tape.size(), static_cast<size_t>(kOps + 1));
  std::vector<Value> g =
      tape.Backward(y, Value(Tensor::Ones({1, 1}, DType::kF64), SpmdType()), {w});
  EXPECT_NEAR(y.tensor.at(0), std::pow(w0, kOps), 1e-12);
  EXPECT_NEAR(g[0].tensor.at(0), kOps * std::pow(w0, kOps - 1), 1e-9);  // d(w^n)/dw = n w^(n-1)
}

}  // namespace
}  // namespace shardmap
