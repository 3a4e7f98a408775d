// Device tensors: allocation through the caching allocator, copies both ways and between GPUs,
// per-rank streams. Skips without a GPU; the no-GPU error paths run everywhere.
#include <cstdlib>
#include <thread>
#include <vector>

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

#include "base/host_waits.h"
#include "gtest/gtest.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

TEST(DeviceTensorTest, WithoutAGpuDeviceTensorsAreAClearError) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present";
  try {
    Tensor::Zeros({4}, DType::kF32, Device::Cuda(0));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.status().message()).find("CUDA device 0 does not exist"),
              std::string::npos)
        << e.status();
  }
  EXPECT_THROW(Tensor::Ones({2}).To(Device::Cuda(0)), OpError);
  EXPECT_FALSE(cuda::UnavailableReason().empty());
}

TEST(DeviceTensorTest, DeferredIndexChecksSwitch) {
  EXPECT_FALSE(cuda::DeferredIndexChecksFromEnv(nullptr));
  EXPECT_FALSE(cuda::DeferredIndexChecksFromEnv("0"));
  EXPECT_TRUE(cuda::DeferredIndexChecksFromEnv("1"));
  EXPECT_TRUE(cuda::DeferredIndexChecksFromEnv("True"));
  const bool before = cuda::DeferredIndexChecks();
  cuda::SetDeferredIndexChecks(!before);
  EXPECT_EQ(cuda::DeferredIndexChecks(), !before);
  cuda::SetDeferredIndexChecks(before);
  if (!cuda::Available()) {
    EXPECT_THROW(cuda::RunDeferredIndexChecks(0), OpError);
  }
}

// The trainer's choice is this thread's, for a scope: it nests, leaves other threads and the
// process default alone, and ends with the scope.
TEST(DeviceTensorTest, DeferredIndexChecksScopeIsPerThread) {
  if (std::getenv("SHARDMAP_DEFER_INDEX_CHECKS") != nullptr) GTEST_SKIP() << "the env decides";
  cuda::SetDeferredIndexChecks(false);
  {
    cuda::DeferredIndexChecksScope on(true);
    EXPECT_TRUE(cuda::DeferredIndexChecks());
    bool other = true;
    std::thread([&] { other = cuda::DeferredIndexChecks(); }).join();
    EXPECT_FALSE(other);
    {
      cuda::DeferredIndexChecksScope off(false);
      EXPECT_FALSE(cuda::DeferredIndexChecks());
    }
    EXPECT_TRUE(cuda::DeferredIndexChecks());
  }
  EXPECT_FALSE(cuda::DeferredIndexChecks());
  cuda::SetDeferredIndexChecks(true);
  {
    cuda::DeferredIndexChecksScope off(false);
    EXPECT_FALSE(cuda::DeferredIndexChecks());
  }
  EXPECT_TRUE(cuda::DeferredIndexChecks());
  cuda::SetDeferredIndexChecks(false);
}

// A check queued after the last read back (the last ops of a rank's run) is run by the run's
// final Synchronize, not lost.
TEST(DeviceTensorTest, DeferredChecksRunAtSynchronize) {
  SKIP_WITHOUT_GPU();
  cuda::DeferredIndexChecksScope defer(true);
  Tensor bad = Tensor::Full({1}, 5.0, DType::kI64).To(Device::Cuda(0));
  cuda::DeferIndexCheck(0, bad.raw_data(), [](int64_t pos) { OpFail("last op: bad id at ", pos); });
  EXPECT_EQ(cuda::PendingDeferredIndexChecks(), 1u);
  try {
    cuda::Synchronize(0);
    FAIL() << "expected the deferred check's error";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.status().message()).find("last op: bad id at 5"), std::string::npos)
        << e.status();
    EXPECT_NE(std::string(e.status().message()).find("deferred"), std::string::npos);
  }
  EXPECT_EQ(cuda::PendingDeferredIndexChecks(), 0u);
}

#if SHARDMAP_HAS_CUDA
// Checks queued on a stream destroyed since run at the thread's next wait on another stream, and
// filling every slot afterwards waits on events, never on the dead stream's handle.
TEST(DeviceTensorTest, DeferredChecksOutliveTheirStream) {
  SKIP_WITHOUT_GPU();
  cuda::DeferredIndexChecksScope defer(true);
  Tensor good = Tensor::Full({1}, -1.0, DType::kI64).To(Device::Cuda(0));
  Tensor bad = Tensor::Full({1}, 3.0, DType::kI64).To(Device::Cuda(0));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cuda::Synchronize(0);  // good and bad are on the device before s reads them
  {
    cuda::StreamScope scope(0, s);
    for (int i = 0; i < 3; ++i) {
      cuda::DeferIndexCheck(0, good.raw_data(), [](int64_t) { OpFail("not this one"); });
    }
  }
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  for (int i = 0; i < 600; ++i) {  // over two fillings of the 256 slots
    cuda::DeferIndexCheck(0, good.raw_data(), [](int64_t) { OpFail("not this one"); });
  }
  cuda::DeferIndexCheck(0, bad.raw_data(), [](int64_t p) { OpFail("the bad op at ", p); });
  int64_t word = 0;
  try {
    cuda::CopyDeviceToHost(&word, good.raw_data(), 0, sizeof(word));
    FAIL() << "expected the deferred check's error";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.status().message()).find("the bad op at 3"), std::string::npos)
        << e.status();
  }
  EXPECT_EQ(cuda::PendingDeferredIndexChecks(), 0u);
}
#endif

// Host waits (base/host_waits.h): a device->host read is one, counted as such; uploads
// that find their staging chunk free, device-side work and a Synchronize of an idle stream are
// none.
TEST(DeviceTensorTest, HostWaitsAreCountedByKind) {
  SKIP_WITHOUT_GPU();
  using base::HostWait;
  Tensor x = Tensor::Ones({1000}).To(Device::Cuda(0));
  cuda::Synchronize(0);  // the staging ring's chunks are free from here
  base::HostWaitCounts before = base::HostWaitSnapshotThisThread();
  Tensor y = Tensor::Ones({1000}).To(Device::Cuda(0));  // one chunk, free: no wait
  Tensor z = x.Clone();                                 // device work: no wait
  EXPECT_EQ((base::HostWaitSnapshotThisThread() - before).ToString(), "none");
  before = base::HostWaitSnapshotThisThread();
  Tensor back = z.To(Device::Cpu());
  const base::HostWaitCounts read = base::HostWaitSnapshotThisThread() - before;
  EXPECT_EQ(read[HostWait::kDeviceToHostRead], 1) << read.ToString();
  EXPECT_EQ(read.total(), 1) << read.ToString();
  before = base::HostWaitSnapshotThisThread();
  cuda::Synchronize(0);  // the read drained the stream: asked first, nothing to wait for
  EXPECT_EQ((base::HostWaitSnapshotThisThread() - before).ToString(), "none");
}

// Many small copies in a row go through the staging ring (each call takes the next chunk, the
// ring carries on across calls) and one larger than the ring: every byte arrives.
TEST(DeviceTensorTest, ConsecutiveCopiesRotateTheStaging) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> dev;
  for (int i = 0; i < 11; ++i) {
    dev.push_back(
        Tensor::Full({1000 + i}, static_cast<double>(i), DType::kF32).To(Device::Cuda(0)));
  }
  for (int i = 0; i < 11; ++i) {
    const std::vector<float> back = dev[i].To(Device::Cpu()).ToVector<float>();
    ASSERT_EQ(back.size(), static_cast<size_t>(1000 + i));
    EXPECT_EQ(back.front(), static_cast<float>(i));
    EXPECT_EQ(back.back(), static_cast<float>(i));
  }
  const int64_t n = (int64_t{4} << 20) * 5 / 4 + 3;  // 5 staging chunks of floats and a bit
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 4099);
  const Tensor big = Tensor::FromVector<float>({n}, v).To(Device::Cuda(0));
  EXPECT_EQ(big.To(Device::Cpu()).ToVector<float>(), v);
}

TEST(DeviceTensorTest, RoundTripAllDtypesAndOddSizes) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {0, 1, 7, 1000003, (8 << 20) / 4 + 5}) {  // 0, odd, > one staging chunk
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i % 1000) - 300;
    for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32,
                     DType::kI64}) {
      Tensor host = Tensor::FromVector<double>({n}, v, dt);
      Tensor dev = host.To(Device::Cuda(0));
      EXPECT_TRUE(dev.is_cuda());
      EXPECT_EQ(dev.device(), Device::Cuda(0));
      Tensor back = dev.Clone().To(Device::Cpu());
      ASSERT_EQ(back.numel(), n);
      EXPECT_EQ(back.ToVector<double>(), host.ToVector<double>()) << DTypeName(dt) << " n=" << n;
      if (n > 0) {
        EXPECT_EQ(dev.at(n - 1), host.at(n - 1));
      }
    }
  }
}

TEST(DeviceTensorTest, ZerosFullAndViews) {
  SKIP_WITHOUT_GPU();
  Tensor z = Tensor::Zeros({3, 5}, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(z.ToVector<float>(), std::vector<float>(15, 0.0f));
  Tensor f = Tensor::Full({2, 3}, 2.5, DType::kBF16, Device::Cuda(0));
  EXPECT_EQ(f.ToVector<double>(), std::vector<double>(6, 2.5));
  Tensor rows = Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6}).To(Device::Cuda(0));
  EXPECT_EQ(rows.SliceRows(1, 2).ToVector<float>(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_THROW(rows.Reshape({6}).item(), OpError);  // six elements
  EXPECT_EQ(rows.SliceRows(2, 1).Reshape({2}).at(1), 6.0);
}

TEST(DeviceTensorTest, SteadyStateAllocatesNoNewDeviceMemory) {
  SKIP_WITHOUT_GPU();
  cuda::StreamScope scope(0, cuda::NewStream(0));
  auto step = [] {
    std::vector<Tensor> live;
    for (int64_t n : {1 << 10, 1 << 20, 3 << 20, 17}) {
      live.push_back(Tensor::Empty({n}, DType::kF32, Device::Cuda(0)));
    }
  };
  step();
  const int64_t before = cuda::DeviceAllocator(0).stats().raw_allocs;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(cuda::DeviceAllocator(0).stats().raw_allocs, before);
}

TEST(DeviceTensorTest, RanksOnTheirOwnStreamsShareOneGpu) {
  SKIP_WITHOUT_GPU();
  std::vector<std::thread> ranks;
  std::vector<std::vector<float>> got(4);
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([r, &got] {
      cuda::StreamScope scope(0, cuda::NewStream(0));
      Tensor x = Tensor::Full({1000}, r, DType::kF32).To(Device::Cuda(0));
      got[r] = x.Clone().ToVector<float>();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], std::vector<float>(1000, r));
}

TEST(DeviceTensorTest, NestedStreamScopesKeepEachDevicesBinding) {
  SKIP_WITHOUT_GPU();
  const cuda::StreamHandle s0 = cuda::NewStream(0), s0b = cuda::NewStream(0);
  const cuda::StreamHandle unbound = cuda::CurrentStream(0);
  {
    cuda::StreamScope a(0, s0);
    EXPECT_EQ(cuda::CurrentStream(0), s0);
    {
      cuda::StreamScope b(0, s0b);
      EXPECT_EQ(cuda::CurrentStream(0), s0b);
    }
    EXPECT_EQ(cuda::CurrentStream(0), s0);
    if (cuda::DeviceCount() >= 2) {
      // A scope for another device leaves device 0's work on s0 (before: the per-thread stream,
      // unordered with what this thread had queued on s0).
      const cuda::StreamHandle s1 = cuda::NewStream(1);
      cuda::StreamScope c(1, s1);
      EXPECT_EQ(cuda::CurrentStream(1), s1);
      EXPECT_EQ(cuda::CurrentStream(0), s0);
      Tensor x = Tensor::Full({1000}, 3.0, DType::kF32, Device::Cuda(0));  // on s0
      EXPECT_EQ(x.To(Device::Cuda(1)).ToVector<float>(), std::vector<float>(1000, 3.0f));
    }
    EXPECT_EQ(cuda::CurrentStream(0), s0);
  }
  EXPECT_EQ(cuda::CurrentStream(0), unbound);
}

TEST(DeviceTensorTest, PeerCopyBetweenGpus) {
  SKIP_WITHOUT_GPU();
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << cuda::DeviceCount();
  // Unbound thread: the host->device copy runs on GPU 0's per-thread stream and may still be in
  // flight (its last staging chunk) when the peer copy on GPU 1's starts; the large case spans
  // several staging chunks.
  for (int64_t n : {int64_t{12345}, (int64_t{24} << 20) + 3}) {
    Tensor a = Tensor::Arange(n).To(Device::Cuda(0));
    Tensor b = a.To(Device::Cuda(1));
    EXPECT_EQ(b.device(), Device::Cuda(1));
    EXPECT_EQ(b.ToVector<float>(), Tensor::Arange(n).ToVector<float>()) << "n=" << n;
  }
}

TEST(DeviceTensorTest, BadDeviceIndexIsAnError) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(Tensor::Zeros({1}, DType::kF32, Device::Cuda(cuda::DeviceCount())), OpError);
  EXPECT_THROW(Tensor::Zeros({1}, DType::kF32, Device::Cuda(-1)), OpError);
}

}  // namespace
}  // namespace shardmap
