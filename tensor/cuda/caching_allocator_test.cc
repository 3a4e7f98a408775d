#include "tensor/cuda/caching_allocator.h"

#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/error.h"

namespace shardmap::cuda {
namespace {

// Host memory standing in for cudaMalloc, with a budget so out-of-memory can be provoked.
struct FakeDevice {
  size_t budget = size_t{1} << 40;
  size_t used = 0;
  int syncs = 0;
  std::map<void*, size_t> live;

  CachingAllocator::RawOps Ops() {
    CachingAllocator::RawOps ops;
    ops.malloc = [this](size_t n) -> void* {
      if (used + n > budget) return nullptr;
      void* p = std::malloc(n);
      used += n;
      live[p] = n;
      return p;
    };
    ops.free = [this](void* p) {
      auto it = live.find(p);
      ASSERT_NE(it, live.end()) << "raw free of a pointer the fake never handed out";
      used -= it->second;
      live.erase(it);
      std::free(p);
    };
    ops.synchronize = [this] { ++syncs; };
    return ops;
  }
};

StreamHandle Stream(int i) { return reinterpret_cast<StreamHandle>(static_cast<uintptr_t>(i)); }

TEST(CachingAllocatorTest, RoundSizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  // Above 1 MiB: steps of an eighth of the power of two below.
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1), (size_t{1} << 20) + (1 << 17));
  EXPECT_EQ(CachingAllocator::RoundSize(size_t{3} << 20), size_t{3} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((size_t{100} << 20) + 5), size_t{104} << 20);
  for (size_t n : {size_t{1}, size_t{700}, size_t{5} << 20, size_t{999999999}}) {
    const size_t r = CachingAllocator::RoundSize(n);
    EXPECT_GE(r, n);
    EXPECT_LE(r, n + n / 8 + 512) << n;  // waste is bounded
  }
}

TEST(CachingAllocatorTest, SteadyStateTrainingStepMakesNoRawAllocations) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  const std::vector<size_t> step = {4096, 1 << 20, 3 << 20, 4096, 100, 7 << 20};
  for (int iter = 0; iter < 5; ++iter) {
    std::vector<void*> live;
    for (size_t n : step) live.push_back(alloc.Allocate(n, Stream(1)));
    for (void* p : live) alloc.Free(p);
    if (iter == 0) {
      EXPECT_EQ(alloc.stats().raw_allocs, static_cast<int64_t>(step.size()));
    }
  }
  const CachingAllocator::Stats s = alloc.stats();
  EXPECT_EQ(s.raw_allocs, static_cast<int64_t>(step.size()));
  EXPECT_EQ(s.cache_hits, 4 * static_cast<int64_t>(step.size()));
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_GT(s.cached_bytes, 0);
  EXPECT_GE(s.peak_allocated_bytes, static_cast<int64_t>(11 << 20));
}

TEST(CachingAllocatorTest, ResetPeakStatsStartsANewPeakWindow) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* big = alloc.Allocate(4 << 20, Stream(1));
  void* small = alloc.Allocate(4096, Stream(1));
  alloc.Free(big);
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, (4 << 20) + 4096);
  alloc.ResetPeakStats();  // the peak is what is allocated now
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, 4096);
  void* mid = alloc.Allocate(1 << 20, Stream(1));
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, (1 << 20) + 4096);
  alloc.Free(mid);
  alloc.Free(small);
}

TEST(CachingAllocatorTest, BlocksAreReusedOnlyOnTheirOwnStream) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* a = alloc.Allocate(1000, Stream(1));
  alloc.Free(a);
  void* b = alloc.Allocate(1000, Stream(2));  // other stream: a new block
  EXPECT_NE(a, b);
  void* c = alloc.Allocate(900, Stream(1));  // same class, same stream: reused
  EXPECT_EQ(a, c);
  EXPECT_EQ(alloc.stats().raw_allocs, 2);
  alloc.Free(b);
  alloc.Free(c);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  FakeDevice dev;
  dev.budget = 4 << 20;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* a = alloc.Allocate(3 << 20, Stream(1));
  alloc.Free(a);  // cached: 3 MiB held
  void* b = alloc.Allocate(2 << 20, Stream(1));  // does not fit beside the cached block
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(alloc.stats().raw_frees, 1);
  EXPECT_GE(dev.syncs, 1);  // synchronised before handing the cached block back
  try {
    alloc.Allocate(3 << 20, Stream(1));
    FAIL() << "expected an out-of-memory OpError";
  } catch (const OpError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(std::string(e.status().message()).find("fake:0: out of memory allocating"),
              std::string::npos)
        << e.status();
  }
  alloc.Free(b);
}

TEST(CachingAllocatorTest, OutOfMemoryDuringACaptureDoesNotSynchronizeOrFree) {
  // A device-wide synchronize is invalid while a stream is captured (it would fail and
  // invalidate the capture); freeing cached blocks without it could free memory queued kernels
  // still use. So during a capture the first out-of-memory throws.
  FakeDevice dev;
  dev.budget = 4 << 20;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* a = alloc.Allocate(3 << 20, Stream(2));
  alloc.Free(a);  // cached in the default pool
  const auto pool = alloc.CreatePool();
  alloc.BeginPool(pool, Stream(1));
  try {
    alloc.Allocate(2 << 20, Stream(1));
    FAIL() << "expected an out-of-memory OpError";
  } catch (const OpError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(std::string(e.status().message()).find("captured"), std::string::npos)
        << e.status();
  }
  EXPECT_EQ(dev.syncs, 0);
  EXPECT_EQ(dev.live.count(a), 1u);
  EXPECT_EQ(alloc.stats().raw_frees, 0);
  alloc.EndPool(pool);
  // After the capture the usual retry applies.
  void* b = alloc.Allocate(2 << 20, Stream(1));
  EXPECT_NE(b, nullptr);
  EXPECT_GE(dev.syncs, 1);
  EXPECT_EQ(alloc.stats().raw_frees, 1);  // the cached block went back (malloc may reuse it)
  alloc.Free(b);
}

TEST(CachingAllocatorTest, DoubleFreeIsAnError) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* a = alloc.Allocate(10, Stream(1));
  alloc.Free(a);
  EXPECT_THROW(alloc.Free(a), OpError);
  alloc.Free(nullptr);  // ignored
}

TEST(CachingAllocatorTest, PrivatePoolIsolatesCapturedMemory) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* eager = alloc.Allocate(4096, Stream(1));
  alloc.Free(eager);  // cached in the default pool

  const CachingAllocator::PoolId pool = alloc.CreatePool();
  alloc.BeginPool(pool, Stream(1));
  void* g1 = alloc.Allocate(4096, Stream(1));
  EXPECT_NE(g1, eager);  // the default pool's block is not used while capturing
  alloc.Free(g1);        // back to the private pool...
  void* g2 = alloc.Allocate(4096, Stream(1));
  EXPECT_EQ(g2, g1);  // ...and reused inside it
  void* other_stream = alloc.Allocate(4096, Stream(2));  // other streams are not captured
  EXPECT_NE(other_stream, g1);
  alloc.EndPool(pool);
  alloc.Free(g2);

  // After capture: eager allocations never get the graph's block.
  void* e2 = alloc.Allocate(4096, Stream(1));
  EXPECT_EQ(e2, eager);
  void* e3 = alloc.Allocate(4096, Stream(1));
  EXPECT_NE(e3, g1);

  // Released: the pool's cached block goes back to the raw allocator.
  const int64_t frees = alloc.stats().raw_frees;
  alloc.ReleasePool(pool);
  EXPECT_EQ(alloc.stats().raw_frees, frees + 1);
  EXPECT_EQ(dev.live.count(g1), 0u);
  EXPECT_THROW(alloc.BeginPool(pool, Stream(1)), OpError);
  alloc.Free(e2);
  alloc.Free(e3);
  alloc.Free(other_stream);
}

TEST(CachingAllocatorTest, BlocksFreedDuringACaptureAreKeptByItsPool) {
  // An eager block the captured function drops (e.g. a reassigned tensor) is used by the graph
  // on every replay: it must not be handed to eager allocations (or to the capture) afterwards.
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* eager = alloc.Allocate(4096, Stream(1));
  void* other = alloc.Allocate(4096, Stream(3));  // e.g. made on an unbound thread's stream
  const CachingAllocator::PoolId pool = alloc.CreatePool();
  alloc.BeginPool(pool, Stream(1));
  alloc.Free(eager);                // its stream is being captured
  alloc.Free(other, Stream(1));     // freed by the capturing thread
  void* in_capture = alloc.Allocate(4096, Stream(1));
  EXPECT_NE(in_capture, eager);
  EXPECT_NE(in_capture, other);
  alloc.EndPool(pool);
  void* after1 = alloc.Allocate(4096, Stream(1));
  void* after3 = alloc.Allocate(4096, Stream(3));
  EXPECT_NE(after1, eager);
  EXPECT_NE(after1, other);
  EXPECT_NE(after3, eager);
  EXPECT_NE(after3, other);
  EXPECT_EQ(dev.live.count(eager), 1u);  // still allocated for the graph
  // Released with the pool (after a synchronisation: a replay may still use them).
  const int syncs = dev.syncs;
  alloc.ReleasePool(pool);
  EXPECT_GT(dev.syncs, syncs);
  EXPECT_EQ(dev.live.count(eager), 0u);
  EXPECT_EQ(dev.live.count(other), 0u);
  // Outside a capture, frees go back to the block's stream as before.
  void* x = alloc.Allocate(1000, Stream(5));
  alloc.Free(x, Stream(6));
  EXPECT_EQ(alloc.Allocate(1000, Stream(5)), x);
  alloc.Free(x);
  alloc.Free(in_capture);
  alloc.Free(after1);
  alloc.Free(after3);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
}

TEST(CachingAllocatorTest, PoolMisuseIsReported) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  EXPECT_THROW(alloc.BeginPool(7, Stream(1)), OpError);  // never created
  const auto pool = alloc.CreatePool();
  alloc.BeginPool(pool, Stream(1));
  EXPECT_THROW(alloc.BeginPool(pool, Stream(1)), OpError);  // already capturing
  EXPECT_THROW(alloc.ReleasePool(pool), OpError);           // still in use
  alloc.EndPool(pool);
  EXPECT_THROW(alloc.EndPool(pool), OpError);
  EXPECT_THROW(alloc.ReleasePool(0), OpError);
}

TEST(CachingAllocatorTest, LiveBlocksOfAReleasedPoolAreFreedWhenDropped) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  const auto pool = alloc.CreatePool();
  alloc.BeginPool(pool, Stream(1));
  void* out = alloc.Allocate(2048, Stream(1));  // e.g. a graph output still held by the user
  alloc.EndPool(pool);
  alloc.ReleasePool(pool);
  EXPECT_EQ(dev.live.count(out), 1u);
  alloc.Free(out);
  EXPECT_EQ(dev.live.count(out), 0u);
}

// A tensor that outlives its graph, dropped while another graph is being captured: the
// synchronize and raw free it needs would invalidate that capture, so they wait for its end.
TEST(CachingAllocatorTest, ABlockOfAReleasedPoolFreedDuringACaptureWaitsForItsEnd) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  const auto first = alloc.CreatePool();
  alloc.BeginPool(first, Stream(1));
  void* out = alloc.Allocate(2048, Stream(1));
  alloc.EndPool(first);
  alloc.ReleasePool(first);  // the first graph is destroyed; `out` still held

  const auto second = alloc.CreatePool();
  alloc.BeginPool(second, Stream(2));  // another thread's capture (another stream)
  const int syncs_before = dev.syncs;
  alloc.Free(out, Stream(1));
  EXPECT_EQ(dev.syncs, syncs_before) << "a device-wide synchronize inside a capture";
  EXPECT_EQ(dev.live.count(out), 1u) << "a raw free inside a capture";
  EXPECT_EQ(alloc.stats().cached_bytes, 2048);
  // Not to be handed out again meanwhile: a capture allocation of that size gets a new block.
  void* in_capture = alloc.Allocate(2048, Stream(2));
  EXPECT_NE(in_capture, out);
  alloc.EndPool(second);  // the capture is over: now it goes back
  EXPECT_EQ(dev.live.count(out), 0u);
  EXPECT_GT(dev.syncs, syncs_before);
  EXPECT_EQ(alloc.stats().cached_bytes, 0);
  alloc.Free(in_capture);
  alloc.ReleasePool(second);
  EXPECT_EQ(dev.live.size(), 0u);
}

// A graph destroyed (its pool released) while another graph is being captured: neither the
// pool's cached blocks nor the eager blocks it kept are synchronized or freed inside the capture;
// they go back at its end. EmptyCache inside a capture leaves the default pool's cache alone.
TEST(CachingAllocatorTest, ReleasingAPoolOrEmptyingTheCacheDuringACaptureWaitsForItsEnd) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  void* eager = alloc.Allocate(8192, Stream(1));
  void* cached = alloc.Allocate(1024, Stream(4));
  alloc.Free(cached);  // in the default pool's cache
  const auto first = alloc.CreatePool();
  alloc.BeginPool(first, Stream(1));
  void* pool_block = alloc.Allocate(2048, Stream(1));
  alloc.Free(pool_block);  // cached in the first pool
  alloc.Free(eager);       // kept by the first pool (its stream is captured)
  alloc.EndPool(first);

  const auto second = alloc.CreatePool();
  alloc.BeginPool(second, Stream(2));  // another graph's capture
  const int syncs_before = dev.syncs;
  const int64_t cached_before = alloc.stats().cached_bytes;
  alloc.ReleasePool(first);
  alloc.EmptyCache();
  EXPECT_EQ(dev.syncs, syncs_before) << "a device-wide synchronize inside a capture";
  EXPECT_EQ(dev.live.count(pool_block), 1u) << "a raw free inside a capture";
  EXPECT_EQ(dev.live.count(eager), 1u) << "a raw free inside a capture";
  EXPECT_EQ(dev.live.count(cached), 1u) << "EmptyCache freed inside a capture";
  EXPECT_EQ(alloc.stats().cached_bytes, cached_before);
  void* in_capture = alloc.Allocate(2048, Stream(2));  // not the released pool's block
  EXPECT_NE(in_capture, pool_block);
  alloc.EndPool(second);  // over: the released pool's blocks go back now
  EXPECT_GT(dev.syncs, syncs_before);
  EXPECT_EQ(dev.live.count(pool_block), 0u);
  EXPECT_EQ(dev.live.count(eager), 0u);
  EXPECT_EQ(dev.live.count(cached), 1u);  // the default pool's cache is still there to reuse
  EXPECT_EQ(alloc.Allocate(1024, Stream(4)), cached);
  alloc.Free(cached);
  alloc.EmptyCache();
  EXPECT_EQ(dev.live.count(cached), 0u);
  alloc.Free(in_capture);
  alloc.ReleasePool(second);
  EXPECT_EQ(dev.live.size(), 0u);
  EXPECT_EQ(alloc.stats().cached_bytes, 0);
}

// With two captures under way, the first EndPool does not flush: the other is still capturing.
TEST(CachingAllocatorTest, DeferredFreesWaitForTheLastCapture) {
  FakeDevice dev;
  CachingAllocator alloc(dev.Ops(), "fake:0");
  const auto old = alloc.CreatePool();
  alloc.BeginPool(old, Stream(1));
  void* out = alloc.Allocate(4096, Stream(1));
  alloc.EndPool(old);
  alloc.ReleasePool(old);
  const auto a = alloc.CreatePool();
  const auto b = alloc.CreatePool();
  alloc.BeginPool(a, Stream(2));
  alloc.BeginPool(b, Stream(3));
  alloc.Free(out);
  alloc.EndPool(a);
  EXPECT_EQ(dev.live.count(out), 1u);
  alloc.EndPool(b);
  EXPECT_EQ(dev.live.count(out), 0u);
}

TEST(CachingAllocatorTest, ConcurrentStreamsFromManyThreads) {
  FakeDevice dev;
  CachingAllocator::RawOps ops = dev.Ops();
  std::mutex raw_mu;  // the fake itself is not thread-safe
  CachingAllocator::RawOps locked;
  locked.malloc = [&](size_t n) {
    std::lock_guard<std::mutex> l(raw_mu);
    return ops.malloc(n);
  };
  locked.free = [&](void* p) {
    std::lock_guard<std::mutex> l(raw_mu);
    ops.free(p);
  };
  CachingAllocator alloc(locked, "fake:0");
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        void* p = alloc.Allocate(512 * (1 + i % 5), Stream(t));
        static_cast<char*>(p)[0] = static_cast<char>(i);
        alloc.Free(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto s = alloc.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_LE(s.raw_allocs, 6 * 5);  // at most one block per (stream, size class)
}

}  // namespace
}  // namespace shardmap::cuda
