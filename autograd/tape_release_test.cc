// One backward per microbatch on one tape: BackwardAndRelease gives the gradients Backward
// gives, frees each pass's ops as it goes (saved_bytes falls to what other passes still hold),
// tracks the peak, and refuses a cotangent that reaches an op an earlier pass released; the last
// pass reports a leaf's gradient as soon as it is below the leaf's first use in that pass (the
// released passes' uses do not hold it back).
#include "autograd/tape.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

Value Seed() { return Value(Tensor::Scalar(1.0, DType::kF64), SpmdType()); }

// Microbatch b's loss: sum((w * x_b)^3); d/dw = sum(3 w^2 x_b^3).
Value MicrobatchLoss(const Value& w, double xb) {
  Value x = Value::Replicated(Tensor::FromVector<double>({3}, {xb, 2 * xb, -xb}));
  Value y = w * x;
  return sum(y * y * y, {});
}

TEST(TapeReleaseTest, PerMicrobatchBackwardsSumToTheWholeBackwardAndFreeTheTape) {
  SingleRankContext one{Mesh()};
  const Tensor w0 = Tensor::FromVector<double>({3}, {0.5, -1.0, 2.0});
  const std::vector<double> xs = {1.0, -0.5, 0.25};

  // Reference: one pass over the sum of the microbatch losses.
  Tape whole;
  Value w = whole.Watch(Value::Replicated(w0));
  Value total;
  {
    ScopedRecorder rec(&whole);
    for (double xb : xs) total = total.defined() ? total + MicrobatchLoss(w, xb) : MicrobatchLoss(w, xb);
  }
  const Tensor expect = whole.Backward(total, Seed(), {w})[0].tensor;

  // GPipe order on one tape: all forwards, then one released backward per microbatch.
  Tape tape;
  Value wp = tape.Watch(Value::Replicated(w0));
  std::vector<Value> losses;
  std::vector<int64_t> held;
  {
    ScopedRecorder rec(&tape);
    for (double xb : xs) {
      losses.push_back(MicrobatchLoss(wp, xb));
      held.push_back(tape.saved_bytes());
    }
  }
  const int64_t per_mb = held[0];
  ASSERT_GT(per_mb, 0);
  EXPECT_EQ(held[2], 3 * per_mb);
  EXPECT_EQ(tape.peak_saved_bytes(), 3 * per_mb);
  EXPECT_EQ(tape.recorded_bytes(), 3 * per_mb);
  EXPECT_GT(tape.largest_recorded_bytes(), 0);
  EXPECT_LE(tape.largest_recorded_bytes(), per_mb);
  std::vector<double> acc(3, 0.0);
  for (size_t b = 0; b < xs.size(); ++b) {
    Tensor g = tape.BackwardAndRelease(losses[b], Seed(), {wp})[0].tensor;
    for (int i = 0; i < 3; ++i) acc[i] += g.at(i);
    EXPECT_EQ(tape.saved_bytes(), static_cast<int64_t>(xs.size() - b - 1) * per_mb) << b;
  }
  for (int i = 0; i < 3; ++i) {
    const double wi = w0.at(i);
    double by_hand = 0;
    for (double xb : xs) {
      const double xi = i == 0 ? xb : i == 1 ? 2 * xb : -xb;
      by_hand += 3 * wi * wi * xi * xi * xi;
    }
    EXPECT_NEAR(acc[i], expect.at(i), 1e-12);
    EXPECT_NEAR(acc[i], by_hand, 1e-12);
  }
  EXPECT_EQ(tape.peak_saved_bytes(), 3 * per_mb);

  // 1F1B order: forward then backward of each microbatch: the peak is one microbatch.
  Tape interleaved;
  Value wi = interleaved.Watch(Value::Replicated(w0));
  for (double xb : xs) {
    Value l;
    {
      ScopedRecorder rec(&interleaved);
      l = MicrobatchLoss(wi, xb);
    }
    interleaved.BackwardAndRelease(l, Seed(), {wi});
  }
  EXPECT_EQ(interleaved.peak_saved_bytes(), per_mb);
  EXPECT_EQ(interleaved.saved_bytes(), 0);
  EXPECT_EQ(interleaved.recorded_bytes(), 3 * per_mb);  // released, still counted as recorded
  EXPECT_GT(interleaved.peak_saved_bytes(), 0);
  interleaved.Clear();  // resets the peak too, as the header says
  EXPECT_EQ(interleaved.peak_saved_bytes(), 0);
}

TEST(TapeReleaseTest, ACotangentReachingAReleasedOpIsAnError) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value w = tape.Watch(Value::Replicated(Tensor::FromVector<double>({2}, {1.0, 2.0})));
  Value shared, a, b;
  {
    ScopedRecorder rec(&tape);
    shared = w * w;  // used by both "microbatches"
    a = sum(shared * 2.0, {});
    b = sum(shared * 3.0, {});
  }
  std::vector<Value> g = tape.BackwardAndRelease(a, Seed(), {w});
  EXPECT_DOUBLE_EQ(g[0].tensor.at(1), 8.0);  // d/dw 2 w^2 = 4w
  try {
    tape.BackwardAndRelease(b, Seed(), {w});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_THAT(e.what(), HasSubstr("already ran and freed"));
  }
  // Backward (no release) leaves the tape intact: it can run twice.
  Tape keep;
  Value v = keep.Watch(Value::Replicated(Tensor::FromVector<double>({1}, {3.0})));
  Value y;
  {
    ScopedRecorder rec(&keep);
    y = sum(v * v, {});
  }
  EXPECT_DOUBLE_EQ(keep.Backward(y, Seed(), {v})[0].tensor.at(0), 6.0);
  EXPECT_DOUBLE_EQ(keep.Backward(y, Seed(), {v})[0].tensor.at(0), 6.0);
}

// Two leaves, each microbatch using w1 after w0: in the last pass w1's gradient (summed by the
// caller) is reported right after the VJPs of its own uses, before w0's and before the pass ends,
// though microbatch 0's (released) ops used both leaves long before.
TEST(TapeReleaseTest, TheLastPassReportsEachLeafBelowItsOwnFirstUse) {
  SingleRankContext one{Mesh()};
  Tape tape;
  struct Count : BackwardObserver {
    int vjps = 0;
    void BeforeVjp(const char*) override {}
    void AfterVjp(const char*) override { ++vjps; }
  } count;
  tape.set_backward_observer(&count);
  const Value w0 = tape.Watch(Value::Replicated(Tensor::FromVector<double>({3}, {0.5, -1, 2})));
  const Value w1 = tape.Watch(Value::Replicated(Tensor::FromVector<double>({3}, {1, 0.3, -2})));
  std::vector<Value> losses;
  for (double xb : {1.0, -0.5}) {
    ScopedRecorder rec(&tape);
    Value x = Value::Replicated(Tensor::FromVector<double>({3}, {xb, 2 * xb, -xb}));
    Value h = tanh(x * w0);
    losses.push_back(sum(tanh(h * w1), {}));
  }
  (void)tape.BackwardAndRelease(losses[0], Seed(), {w0, w1});
  const int before = count.vjps;
  std::vector<std::pair<int, int>> ready;  // (k, VJPs of this pass run by then)
  (void)tape.BackwardAndRelease(losses[1], Seed(), {w0, w1}, [&](int k, const Value&) {
    ready.push_back({k, count.vjps - before});
  });
  const int pass = count.vjps - before;  // sum, tanh, mul(h, w1), tanh, mul(x, w0)
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].first, 1);
  EXPECT_EQ(ready[0].second, 3) << "w1 is final after sum, tanh and its mul";
  EXPECT_EQ(ready[1].first, 0);
  EXPECT_EQ(ready[1].second, pass);
  EXPECT_LT(ready[0].second, pass);
}

}  // namespace
}  // namespace shardmap
