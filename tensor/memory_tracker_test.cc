// MemoryTracker: requested bytes on every device, peak between ops (scratch excluded), nesting,
// frees on other threads and after the tracker is gone, and per-thread counting (run under tsan).
#include "tensor/memory_tracker.h"

#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

const Device kMeta = Device::Meta();
const Device kCpu = Device::Cpu();

TEST(MemoryTracker, CountsRequestedBytesOnMetaAndCpuAlike) {
  for (Device d : {kMeta, kCpu}) {
    SCOPED_TRACE(d.ToString());
    MemoryTracker mem;
    Tensor a = Tensor::Empty({1024}, DType::kF32, d);
    Tensor small = Tensor::Zeros({3}, DType::kBF16, d);  // 6 bytes (inline on the CPU)
    EXPECT_EQ(mem.live_bytes(), 4096 + 6);
    EXPECT_EQ(mem.allocations(), 2);
    Tensor view = a.Reshape({32, 32}).SliceRows(0, 4);  // a view: no allocation
    EXPECT_EQ(mem.allocated_bytes(), 4096 + 6);
    a = Tensor();
    EXPECT_EQ(mem.live_bytes(), 4096 + 6);  // the view keeps the storage alive
    view = Tensor();
    EXPECT_EQ(mem.live_bytes(), 6);
    EXPECT_EQ(mem.peak_bytes(), 4096 + 6);
    Tensor b = Tensor::Full({10}, 2.0, DType::kF64, d);
    EXPECT_EQ(mem.live_bytes(), 86);
    EXPECT_EQ(mem.peak_bytes(), 4102);
    mem.ResetPeak();
    EXPECT_EQ(mem.peak_bytes(), 86);
    EXPECT_EQ(mem.allocated_bytes(), 4096 + 6 + 80);
  }
}

// FSDP's reshard: a released buffer is no longer live; a refill moves the other tensor's buffer
// (and its accounting) in; views of the released storage read the refilled bytes.
TEST(MemoryTracker, ReleasedBuffersAreNotLiveAndRefillsMoveTheirBytesIn) {
  for (Device d : {kMeta, kCpu}) {
    for (int64_t n : {int64_t{3}, int64_t{1000}}) {  // inline on the CPU, and heap
      SCOPED_TRACE(absl::StrCat(d.ToString(), " n=", n));
      MemoryTracker mem;
      Tensor gathered = Tensor::Full({n}, 1.5, DType::kF64, d);
      Tensor saved = gathered.Reshape({n, 1});  // what a VJP closure keeps
      EXPECT_EQ(mem.live_bytes(), 8 * n);
      gathered.ReleaseBuffer();
      gathered.ReleaseBuffer();  // idempotent
      EXPECT_TRUE(saved.buffer_released());
      EXPECT_EQ(mem.live_bytes(), 0);
      EXPECT_EQ(saved.shape(), (Shape{n, 1}));
      Tensor again = Tensor::Full({n}, -2.25, DType::kF64, d);
      EXPECT_EQ(mem.live_bytes(), 8 * n);
      saved.RefillBuffer(again.Reshape({n, 1}));
      EXPECT_FALSE(gathered.buffer_released());
      EXPECT_TRUE(again.buffer_released());
      EXPECT_EQ(mem.live_bytes(), 8 * n);
      if (!d.is_meta()) {
        EXPECT_EQ(gathered.at(n - 1), -2.25);
      }
      again = Tensor();
      EXPECT_EQ(mem.live_bytes(), 8 * n);
      gathered = saved = Tensor();
      EXPECT_EQ(mem.live_bytes(), 0);
    }
  }
}

TEST(MemoryTracker, RefillNeedsAReleasedBufferOfTheSameSize) {
  Tensor a = Tensor::Zeros({4}, DType::kF32, kCpu);
  Tensor b = Tensor::Zeros({4}, DType::kF32, kCpu);
  EXPECT_THROW(a.RefillBuffer(b), OpError);  // a is live
  a.ReleaseBuffer();
  EXPECT_THROW(a.RefillBuffer(Tensor::Zeros({5}, DType::kF32, kCpu)), OpError);
  EXPECT_THROW(a.RefillBuffer(Tensor::Zeros({4}, DType::kF64, kCpu)), OpError);
  EXPECT_THROW(a.RefillBuffer(Tensor::Zeros({4}, DType::kF32, kMeta)), OpError);
  a.RefillBuffer(b);
  EXPECT_THROW(a.RefillBuffer(b), OpError);  // b is released now
}

TEST(MemoryTracker, StorageFromBeforeTheTrackerIsNotCounted) {
  Tensor before = Tensor::Empty({100}, DType::kF32, kMeta);
  MemoryTracker mem;
  before = Tensor();
  EXPECT_EQ(mem.live_bytes(), 0);
  EXPECT_EQ(mem.allocated_bytes(), 0);
}

TEST(MemoryTracker, ScratchInsideAnOpIsNotCounted) {
  // A bf16 matmul on the CPU widens both operands to f32 and rounds the f32 product: three
  // scratch buffers freed before it returns. Only the output counts, as on meta.
  for (Device d : {kCpu, kMeta}) {
    SCOPED_TRACE(d.ToString());
    Tensor a = Tensor::Ones({64, 32}, DType::kBF16, d), b = Tensor::Ones({32, 16}, DType::kBF16, d);
    MemoryTracker mem;
    Tensor c = Matmul(a, b);
    EXPECT_EQ(mem.allocated_bytes(), 64 * 16 * 2);
    EXPECT_EQ(mem.allocations(), 1);
    EXPECT_EQ(mem.peak_bytes(), 64 * 16 * 2);
    EXPECT_EQ(mem.live_bytes(), 64 * 16 * 2);
    c = Tensor();
    EXPECT_EQ(mem.live_bytes(), 0);
  }
}

TEST(MemoryTracker, PeakIsTakenBetweenOps) {
  for (Device d : {kCpu, kMeta}) {
    SCOPED_TRACE(d.ToString());
    MemoryTracker mem;
    Tensor x = Tensor::Ones({256}, DType::kF32, d);  // 1 KiB
    {
      Tensor y = Exp(x);     // 2 KiB live
      Tensor z = Add(y, x);  // 3 KiB live
    }                        // y, z freed
    EXPECT_EQ(mem.live_bytes(), 1024);
    EXPECT_EQ(mem.peak_bytes(), 3072);
    EXPECT_EQ(mem.allocated_bytes(), 3072);
    // Temporaries live to the end of the full expression: x and three results, 4 KiB.
    Tensor w = Neg(Neg(Neg(x)));
    EXPECT_EQ(mem.peak_bytes(), 4096);
    EXPECT_EQ(mem.live_bytes(), 2048);
    EXPECT_EQ(mem.allocated_bytes(), 3072 + 3 * 1024);
  }
}

TEST(MemoryTracker, NestedTrackersEachCountTheirOwnSpan) {
  MemoryTracker outer;
  Tensor a = Tensor::Empty({10}, DType::kF32, kMeta);
  {
    MemoryTracker inner;
    Tensor b = Tensor::Empty({20}, DType::kF32, kMeta);
    EXPECT_EQ(inner.live_bytes(), 80);
    EXPECT_EQ(outer.live_bytes(), 120);
    a = Tensor();  // allocated before inner: only outer sees the free
    EXPECT_EQ(inner.live_bytes(), 80);
    EXPECT_EQ(outer.live_bytes(), 80);
  }
  EXPECT_EQ(outer.live_bytes(), 0);
  EXPECT_EQ(outer.peak_bytes(), 120);
  EXPECT_EQ(outer.allocated_bytes(), 120);
}

TEST(MemoryTracker, StorageMayOutliveItsTracker) {
  Tensor kept;
  {
    MemoryTracker mem;
    kept = Tensor::Empty({1000}, DType::kF32, kCpu);
  }
  kept = Tensor();  // decrements the dead tracker's state: no use-after-free (asan/tsan)
  SUCCEED();
}

TEST(MemoryTracker, FreeOnAnotherThreadDecrements) {
  MemoryTracker mem;
  Tensor t = Tensor::Empty({256}, DType::kF32, kMeta);
  std::thread([moved = std::move(t)]() mutable { moved = Tensor(); }).join();
  EXPECT_EQ(mem.live_bytes(), 0);
  EXPECT_EQ(mem.peak_bytes(), 1024);
  EXPECT_EQ(mem.allocated_bytes(), 1024);
}

// Each "rank" thread runs the same ops on its own tracker while handing tensors to a neighbour,
// which frees them: every tracker ends at live 0 with the same peak and total.
TEST(MemoryTracker, ThreadsCountTheirOwnAllocations) {
  constexpr int kThreads = 4, kSteps = 50;
  std::vector<int64_t> peak(kThreads), allocated(kThreads), live(kThreads);
  std::vector<std::vector<Tensor>> inbox(kThreads);
  std::vector<std::thread> threads;
  std::mutex mu;
  for (int r = 0; r < kThreads; ++r) {
    threads.emplace_back([&, r] {
      const Device d = r % 2 == 0 ? kMeta : kCpu;
      MemoryTracker mem;
      Tensor x = Tensor::Ones({64}, DType::kF32, d);
      for (int i = 0; i < kSteps; ++i) {
        Tensor y = MulScalar(Add(x, x), 0.5);
        std::lock_guard<std::mutex> lock(mu);
        inbox[(r + 1) % kThreads].push_back(y);  // the neighbour frees it, maybe after we end
        inbox[r].clear();
      }
      x = Tensor();
      {
        std::lock_guard<std::mutex> lock(mu);
        inbox[(r + 1) % kThreads].clear();
      }
      allocated[r] = mem.allocated_bytes();
      peak[r] = mem.peak_bytes();
      live[r] = mem.live_bytes();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kThreads; ++r) {
    SCOPED_TRACE(r);
    EXPECT_EQ(allocated[r], 256 + kSteps * 2 * 256);
    EXPECT_GE(peak[r], 3 * 256);
    EXPECT_LE(live[r], (kSteps + 1) * 256);  // what the neighbour has not freed yet
  }
}

}  // namespace
}  // namespace shardmap
