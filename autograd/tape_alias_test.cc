// The tape's saved-activation figures count each buffer once: outputs that are views or aliases
// of an input (reshape) share its storage and add nothing, as MemoryTracker (the independent
// count of the storage the forward allocates) sees it; on the meta device too.
#include "autograd/tape.h"

#include "gtest/gtest.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/memory_tracker.h"

namespace shardmap {
namespace {

struct Counts {
  int64_t saved = 0, peak = 0, recorded = 0, tracked = 0;
};

// x -> y = x * x (a new buffer) -> two reshapes of y (views) -> t = y2 * 2 (a new buffer).
Counts Forward(Device device) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value x = tape.Watch(Value::Replicated(Tensor::Zeros({4, 6}, DType::kF64, device)));
  MemoryTracker mem;
  Value y, y1, y2, t;
  {
    ScopedRecorder rec(&tape);
    y = x * x;
    y1 = reshape(y, {24});
    y2 = reshape(y1, {6, 4});
    t = y2 * 2.0;
  }
  EXPECT_TRUE(y2.tensor.SharesStorageWith(y.tensor));
  return {tape.saved_bytes(), tape.peak_saved_bytes(), tape.recorded_bytes(), mem.live_bytes()};
}

TEST(TapeAliasTest, ViewsOfOneBufferAreCountedOnce) {
  for (Device device : {Device::Cpu(), Device::Meta()}) {
    SCOPED_TRACE(device.ToString());
    const Counts c = Forward(device);
    const int64_t buffer = 4 * 6 * 8;  // f64[4,6]
    EXPECT_EQ(c.tracked, 2 * buffer);  // y and t: the reshapes allocate nothing
    EXPECT_EQ(c.saved, c.tracked);
    EXPECT_EQ(c.peak, c.tracked);
    EXPECT_EQ(c.recorded, c.tracked);
  }
}

// A view of a leaf (a parameter reshaped at use) is the parameter's memory, not an activation.
TEST(TapeAliasTest, AViewOfALeafIsNotAnActivation) {
  SingleRankContext one{Mesh()};
  Tape tape;
  Value w = tape.Watch(Value::Replicated(Tensor::Zeros({3, 4}, DType::kF64)));
  {
    ScopedRecorder rec(&tape);
    Value v = reshape(w, {12});
    EXPECT_TRUE(v.tensor.SharesStorageWith(w.tensor));
  }
  EXPECT_EQ(tape.saved_bytes(), 0);
  EXPECT_EQ(tape.recorded_bytes(), 0);
}

}  // namespace
}  // namespace shardmap
