// checkpoint: gradients bitwise equal to the run without it (f64 and f32), against central
// finite differences (f64), captured parameters, several outputs, nesting, the FSDP pattern
// (an all_gather inside the function, issued again in the backward and logged as recomputed, on
// 3 ranks), memory (the tape's peak), and every error path.
#include "autograd/checkpoint.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;

bool Bitwise(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A block with a residual (x is used twice inside), a few nonlinear ops and two parameters.
Value Block(const Value& x, const Value& w1, const Value& w2) {
  return x + tanh(gelu(x.matmul(w1)).matmul(w2));
}

Value Seed(DType dt) { return Value(Tensor::Scalar(1.0, dt), SpmdType()); }

struct BlockRun {
  double loss = 0;
  std::vector<Tensor> grads;  // x, w1, w2
  int64_t peak = 0, saved_after_forward = 0;
  size_t tape_size = 0;
};

enum class Mode { kPlain, kCheckpoint, kCheckpointExplicitParams, kNested, kTwoBlocks };

// loss = sum((block(block(1.5 x)))^2) with the blocks run per `mode`; grads of x, w1, w2.
BlockRun RunBlocks(DType dt, Mode mode, const Tensor& x0, const Tensor& w10, const Tensor& w20) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(x0.To(Device::Cpu())));
  Value w1 = tape.Watch(Value::Replicated(w10)), w2 = tape.Watch(Value::Replicated(w20));
  (void)dt;
  Value loss;
  BlockRun r;
  {
    ScopedRecorder rec(&tape);
    Value h = x * 1.5;
    for (int b = 0; b < 2; ++b) {
      switch (mode) {
        case Mode::kPlain:
          h = Block(h, w1, w2);
          break;
        case Mode::kCheckpoint:  // parameters captured by the function
          h = checkpoint([w1, w2](const std::vector<Value>& in) { return Block(in[0], w1, w2); },
                         {h});
          break;
        case Mode::kCheckpointExplicitParams:
          h = checkpoint(
              [](const std::vector<Value>& in) { return Block(in[0], in[1], in[2]); },
              {h, w1, w2});
          break;
        case Mode::kNested:  // an inner checkpoint inside the outer one
          h = checkpoint(
              [w1, w2](const std::vector<Value>& in) {
                Value y = checkpoint(
                    [w1](const std::vector<Value>& i2) { return gelu(i2[0].matmul(w1)); },
                    {in[0]}, "inner");
                return in[0] + tanh(y.matmul(w2));
              },
              {h}, "outer");
          break;
        case Mode::kTwoBlocks:  // both blocks in one checkpoint
          if (b == 0) {
            h = checkpoint(
                [w1, w2](const std::vector<Value>& in) {
                  return Block(Block(in[0], w1, w2), w1, w2);
                },
                {h});
          }
          break;
      }
    }
    loss = sum(h * h, {});
  }
  r.saved_after_forward = tape.saved_bytes();
  r.tape_size = tape.size();
  std::vector<Value> g = tape.Backward(loss, Seed(loss.dtype()), {x, w1, w2});
  r.loss = loss.tensor.item();
  for (const Value& v : g) r.grads.push_back(v.tensor);
  r.peak = tape.peak_saved_bytes();
  return r;
}

class CheckpointDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(CheckpointDtypeTest, GradientsEqualThePlainRunBitwise) {
  const DType dt = GetParam();
  const Tensor x = Rand({5, 4}, 1, dt), w1 = Rand({4, 7}, 2, dt), w2 = Rand({7, 4}, 3, dt);
  const BlockRun plain = RunBlocks(dt, Mode::kPlain, x, w1, w2);
  for (Mode m : {Mode::kCheckpoint, Mode::kCheckpointExplicitParams, Mode::kNested,
                 Mode::kTwoBlocks}) {
    SCOPED_TRACE(static_cast<int>(m));
    const BlockRun r = RunBlocks(dt, m, x, w1, w2);
    EXPECT_EQ(r.loss, plain.loss);
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(Bitwise(r.grads[k], plain.grads[k])) << "grad " << k;
    // Less kept: 3 leaves + mul + 2 checkpoints (or 1) + mul + sum, against every op's output.
    EXPECT_LT(r.tape_size, plain.tape_size);
    EXPECT_LT(r.saved_after_forward, plain.saved_after_forward);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CheckpointDtypeTest, ::testing::Values(DType::kF64, DType::kF32));

TEST(CheckpointTest, OneNodePerCheckpointAndThePeakCountsTheRecomputation) {
  const Tensor x = Rand({5, 4}, 1), w1 = Rand({4, 7}, 2), w2 = Rand({7, 4}, 3);
  const BlockRun plain = RunBlocks(DType::kF64, Mode::kPlain, x, w1, w2);
  const BlockRun ck = RunBlocks(DType::kF64, Mode::kCheckpoint, x, w1, w2);
  // 3 leaves, x * 1.5, two checkpoints, h * h, sum.
  EXPECT_EQ(ck.tape_size, 3u + 1 + 2 + 1 + 1);
  // Kept after the forward: [5,4] f64 outputs of mul, 2 checkpoints, h*h, and the scalar sum.
  EXPECT_EQ(ck.saved_after_forward, 4 * 5 * 4 * 8 + 8);
  // The recomputed block's own tape was alive on top of that during the backward: one block
  // (matmul [5,7], gelu [5,7], matmul [5,4], tanh [5,4], add [5,4]).
  EXPECT_EQ(ck.peak, ck.saved_after_forward + (2 * 5 * 7 + 3 * 5 * 4) * 8);
  EXPECT_LT(ck.peak, plain.peak);
}

// L(x, w1, w2) in f64 without a tape.
double LossOf(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  SingleRankContext one{Mesh()};
  Value h = Value::Replicated(x) * 1.5;
  for (int b = 0; b < 2; ++b) h = Block(h, Value::Replicated(w1), Value::Replicated(w2));
  return sum(h * h, {}).tensor.item();
}

TEST(CheckpointTest, MatchesCentralFiniteDifferencesInF64) {
  std::vector<Tensor> p = {Rand({5, 4}, 1), Rand({4, 7}, 2), Rand({7, 4}, 3)};
  const BlockRun r = RunBlocks(DType::kF64, Mode::kCheckpoint, p[0], p[1], p[2]);
  const double eps = 1e-6;
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < p[k].numel(); i += 3) {
      std::vector<Tensor> hi = {p[0].Clone(), p[1].Clone(), p[2].Clone()};
      std::vector<Tensor> lo = {p[0].Clone(), p[1].Clone(), p[2].Clone()};
      hi[k].data<double>()[i] += eps;
      lo[k].data<double>()[i] -= eps;
      const double fd = (LossOf(hi[0], hi[1], hi[2]) - LossOf(lo[0], lo[1], lo[2])) / (2 * eps);
      EXPECT_NEAR(r.grads[k].data<double>()[i], fd, 1e-7 * std::max(1.0, std::abs(fd)))
          << "param " << k << " element " << i;
    }
  }
}

// Several outputs: a = gelu(x w1) and b = tanh(x w2); the loss uses both, or only one.
std::vector<Tensor> MultiOutputGrads(bool ckpt, int use) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Rand({3, 4}, 5)));
  Value w1 = tape.Watch(Value::Replicated(Rand({4, 4}, 6)));
  Value w2 = tape.Watch(Value::Replicated(Rand({4, 4}, 7)));
  Value loss;
  {
    ScopedRecorder rec(&tape);
    auto fn = [w1, w2](const std::vector<Value>& in) {
      Value a = gelu(in[0].matmul(w1));
      return std::vector<Value>{a, tanh(in[0].matmul(w2)) * a,
                                Value::Replicated(Tensor::Ones({2}, DType::kF64)), in[0]};
    };
    std::vector<Value> o = ckpt ? checkpoint(fn, {x}) : fn({x});
    EXPECT_EQ(o[2].node, -1);       // a constant stays one
    EXPECT_EQ(o[3].node, x.node);   // an input returned as is stays that value
    // (o[3] stays out of the loss: x's uses inside and after the function would sum in
    // another order.)
    Value l = use == 1 ? sum(o[0], {}) : use == 2 ? sum(o[1] * 3.0, {}) : sum(o[0] * o[1], {});
    loss = l;
  }
  std::vector<Tensor> out;
  for (const Value& g : tape.Backward(loss, Seed(DType::kF64), {x, w1, w2})) {
    out.push_back(g.tensor);
  }
  return out;
}

TEST(CheckpointTest, SeveralOutputsAnySubsetUsedBitwise) {
  for (int use : {0, 1, 2}) {
    SCOPED_TRACE(use);
    std::vector<Tensor> plain = MultiOutputGrads(false, use), ck = MultiOutputGrads(true, use);
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(Bitwise(ck[k], plain[k])) << "grad " << k;
  }
}

TEST(CheckpointTest, RecomputesOnlyInTheBackwardAndSaysSo) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Rand({2, 2}, 9)));
  auto calls = std::make_shared<std::vector<bool>>();  // IsRecomputing() per call
  Value loss;
  {
    ScopedRecorder rec(&tape);
    Value y = checkpoint(
        [calls](const std::vector<Value>& in) {
          calls->push_back(IsRecomputing());
          return exp(in[0]);
        },
        {x});
    loss = sum(y, {});
  }
  EXPECT_EQ(*calls, std::vector<bool>({false}));
  std::vector<Value> g = tape.Backward(loss, Seed(DType::kF64), {x});
  EXPECT_EQ(*calls, std::vector<bool>({false, true}));
  EXPECT_FALSE(IsRecomputing());
  EXPECT_TRUE(Bitwise(g[0].tensor, exp(Value::Replicated(x.tensor)).tensor));
  // Without a tape recorder it is just the function (no probe, no node).
  Value plain = checkpoint([calls](const std::vector<Value>& in) { return in[0] * 2.0; }, {x});
  EXPECT_EQ(plain.node, -1);
}

TEST(CheckpointTest, ReleasedBackwardFreesTheNode) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Rand({4, 4}, 9)));
  Value loss;
  {
    ScopedRecorder rec(&tape);
    Value y = checkpoint([](const std::vector<Value>& in) { return tanh(in[0].matmul(in[0])); },
                         {x});
    loss = sum(y, {});
  }
  tape.BackwardAndRelease(loss, Seed(DType::kF64), {x});
  EXPECT_EQ(tape.saved_bytes(), 0);
}

// ---- The FSDP pattern on 3 ranks --------------------------------------------------------------

struct RankGrads {
  std::vector<Tensor> x, w;
  std::vector<std::vector<CollectiveRecord>> logs;
};

// Each rank: x [2, 6] (rows S0 over dp), w [2, 5] (its S0 shard of a [6, 5] weight, gathered at
// use, as GptParamUse does); loss = sum(tanh(x gather(w))^2) (P over dp).
RankGrads FsdpGrads(bool ckpt, DType dt) {
  Mesh mesh = *Mesh::Create({{"dp", 3}});
  RankGrads out;
  out.x.resize(3);
  out.w.resize(3);
  out.logs.resize(3);
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    SpmdType s0(1, AxisType::Sharded(0));
    s0.set_mesh_id(ctx.mesh().id());
    const int r = ctx.rank();
    Tape tape;
    Value x = tape.Watch(Value(Rand({2, 6}, 20 + r, dt), s0));
    Value w = tape.Watch(Value(Rand({2, 5}, 30 + r, dt), s0));
    auto use = [w]() { return all_gather(w, 0, "dp"); };  // the parameter at use
    Value loss;
    {
      ScopedRecorder rec(&tape);
      Value y = ckpt ? checkpoint([use](const std::vector<Value>& in) {
                         return tanh(in[0].matmul(use()));
                       }, {x})
                     : tanh(x.matmul(use()));
      loss = sum_partial(y * y, {});
    }
    std::vector<Value> g = tape.Backward(loss, LossSeed(loss), {x, w});
    out.x[r] = g[0].tensor;
    out.w[r] = g[1].tensor;
    out.logs[r] = ctx.collective_log();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(CheckpointTest, FsdpGatherIsIssuedAgainInTheBackwardAndGradientsMatchBitwise) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    RankGrads plain = FsdpGrads(false, dt), ck = FsdpGrads(true, dt);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(Bitwise(ck.x[r], plain.x[r])) << "rank " << r;
      EXPECT_TRUE(Bitwise(ck.w[r], plain.w[r])) << "rank " << r;
      // Plain: all_gather forward, reduce_scatter backward. Checkpointed: the all_gather again
      // in the backward, tagged recomputed, then the reduce_scatter.
      ASSERT_EQ(plain.logs[r].size(), 2u);
      ASSERT_EQ(ck.logs[r].size(), 3u);
      const std::vector<CollectiveRecord>& l = ck.logs[r];
      EXPECT_STREQ(l[0].op, "all_gather");
      EXPECT_FALSE(l[0].backward);
      EXPECT_FALSE(l[0].recomputed);
      EXPECT_STREQ(l[1].op, "all_gather");
      EXPECT_TRUE(l[1].backward);
      EXPECT_TRUE(l[1].recomputed);
      EXPECT_EQ(l[1].bytes, l[0].bytes);
      EXPECT_STREQ(l[2].op, "reduce_scatter");
      EXPECT_TRUE(l[2].backward);
      EXPECT_FALSE(l[2].recomputed);
    }
  }
}

// ---- Errors ----------------------------------------------------------------------------------

// Runs a checkpoint whose function is `fn` (called with its call number) and its backward;
// returns the error.
absl::Status CheckpointError(
    const std::function<std::vector<Value>(int call, const std::vector<Value>&, const Value& w)>&
        fn) {
  return CatchOpError([&] {
    SingleRankContext one(*Mesh::Create({{"tp", 1}}));
    Tape tape;
    Value x = tape.Watch(Value::Replicated(Rand({2, 3}, 1)));
    Value w = tape.Watch(Value::Replicated(Rand({3, 3}, 2)));
    auto calls = std::make_shared<int>(0);
    Value loss;
    {
      ScopedRecorder rec(&tape);
      std::vector<Value> y = checkpoint(
          [fn, calls, w](const std::vector<Value>& in) { return fn((*calls)++, in, w); }, {x},
          "my_block");
      loss = sum_partial(y[0], {});
      if (y.size() > 1) loss = loss + sum_partial(y[1], {});
    }
    tape.Backward(loss, LossSeed(loss), {x});
  });
}

TEST(CheckpointErrorTest, ADifferentShapeOnRecomputeIsNamed) {
  absl::Status s = CheckpointError([](int call, const std::vector<Value>& in, const Value&) {
    Value y = tanh(in[0]);
    return std::vector<Value>{call == 0 ? y : y.reshape({3, 2})};
  });
  EXPECT_THAT(s.message(), HasSubstr("checkpoint 'my_block': on recompute output 0 is "
                                     "f64[3,2]{tp:R} but the forward's was f64[2,3]{tp:R}"));
}

TEST(CheckpointErrorTest, ADifferentDtypeOrTypeOnRecomputeIsNamed) {
  absl::Status s = CheckpointError([](int call, const std::vector<Value>& in, const Value&) {
    Value y = tanh(in[0]);
    return std::vector<Value>{call == 0 ? y : cast(y, DType::kF32)};
  });
  EXPECT_THAT(s.message(), HasSubstr("output 0 is f32[2,3]{tp:R} but the forward's was "
                                     "f64[2,3]{tp:R}"));
  s = CheckpointError([](int call, const std::vector<Value>& in, const Value&) {
    Value y = tanh(in[0]);
    return std::vector<Value>{call == 0 ? y : convert(y, "tp", Convert::kRToP)};
  });
  EXPECT_THAT(s.message(), HasSubstr("output 0 is f64[2,3]{tp:P} but the forward's was "
                                     "f64[2,3]{tp:R}"));
}

TEST(CheckpointErrorTest, ADifferentNumberOfOutputsOrAConstantIsNamed) {
  absl::Status s = CheckpointError([](int call, const std::vector<Value>& in, const Value&) {
    std::vector<Value> o = {tanh(in[0]), exp(in[0])};
    if (call > 0) o.pop_back();
    return o;
  });
  EXPECT_THAT(s.message(), HasSubstr("on recompute the function returned 1 outputs but 2 in the "
                                     "forward"));
  s = CheckpointError([](int call, const std::vector<Value>& in, const Value&) {
    return std::vector<Value>{call == 0 ? tanh(in[0])
                                        : Value::Replicated(Tensor::Zeros({2, 3}, DType::kF64))};
  });
  EXPECT_THAT(s.message(), HasSubstr("output 0 is f64[2,3]{tp:R} (a constant) but the forward's"));
}

TEST(CheckpointErrorTest, ReadingANewValueOnRecomputeIsNamed) {
  absl::Status s = CheckpointError([](int call, const std::vector<Value>& in, const Value& w) {
    return std::vector<Value>{call == 0 ? tanh(in[0]) : tanh(in[0].matmul(w))};
  });
  EXPECT_THAT(s.message(), HasSubstr("checkpoint 'my_block', recomputing its function in the "
                                     "backward: op 'matmul': its input 1"));
  EXPECT_THAT(s.message(), HasSubstr("must read and compute the same values every time"));
}

TEST(CheckpointErrorTest, TooManyInputsAndLeakedValuesAreNamed) {
  absl::Status s = CatchOpError([] {
    SingleRankContext one{Mesh()};
    Tape tape;
    std::vector<Value> leaves;
    for (int i = 0; i < kMaxCheckpointInputs + 1; ++i) {
      leaves.push_back(tape.Watch(Value::Replicated(Tensor::Ones({2}, DType::kF64))));
    }
    ScopedRecorder rec(&tape);
    checkpoint([leaves](const std::vector<Value>&) {
      Value acc = leaves[0] * 1.0;
      for (size_t i = 1; i < leaves.size(); ++i) acc = acc + leaves[i];
      return acc;
    }, {}, "wide");
  });
  EXPECT_THAT(s.message(), HasSubstr("checkpoint 'wide': the function reads 33 differentiable "
                                     "values from outside"));
  EXPECT_THAT(s.message(), HasSubstr("split it"));
  s = CatchOpError([] {
    SingleRankContext one{Mesh()};
    Tape tape;
    Value x = tape.Watch(Value::Replicated(Tensor::Ones({2}, DType::kF64)));
    ScopedRecorder rec(&tape);
    Value leaked;
    checkpoint([&leaked](const std::vector<Value>& in) {
      leaked = exp(in[0]);  // kept outside the function: not one of its outputs
      return leaked * 2.0;
    }, {x});
    (void)(leaked + 1.0);
  });
  EXPECT_THAT(s.message(), HasSubstr("was recorded on another tape"));
  EXPECT_THAT(s.message(), HasSubstr("must leave it through its outputs"));
}

}  // namespace
}  // namespace shardmap
