// NCCL backend. Without a GPU only the error paths run; with one GPU a single-rank world checks
// every op end to end (NCCL before 2.30 refuses two ranks on one GPU; multi-GPU runs go through
// collectives/launch with one process per GPU).
#include "collectives/nccl_communicator.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/host_waits.h"
#include "collectives/internal/free_port.h"
#include "collectives/peer_failure_board.h"
#include "collectives/tcp_store.h"
#include "collectives/internal/gpu_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace shardmap::collectives {
namespace {
using ::shardmap::base::HostWait;
using ::shardmap::base::HostWaitCounts;
using ::shardmap::base::HostWaitSnapshot;
using ::shardmap::base::HostWaitSnapshotThisThread;

using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<TcpStore>> SoloStore() {
  auto port = internal::PickFreePort();
  if (!port.ok()) return port.status();
  TcpStoreOptions o;
  o.port = *port;
  o.timeout = absl::Seconds(20);
  return TcpStore::Create(o);
}

TEST(NcclCommunicatorTest, ClearErrorWithoutCudaOrWithoutGpu) {
  if (internal::VisibleGpuCount() > 0) GTEST_SKIP() << "a GPU is visible; the no-GPU error path cannot run";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_FALSE(comm.ok());
  if (NcclCompiledIn()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr("no CUDA device is visible"));
  } else {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented) << comm.status();
  }
}

// SHARDMAP_NCCL_BLOCKING_WAIT (the old host-waiting behaviour for every communicator).
TEST(NcclCommunicatorTest, BlockingWaitFromTheEnvironment) {
  for (const char* on : {"1", "true", "TRUE", "on", "On"}) {
    EXPECT_TRUE(internal::NcclBlockingWaitFromEnv(on)) << on;
  }
  for (const char* off : {"0", "false", "off", "", "yes", "2"}) {
    EXPECT_FALSE(internal::NcclBlockingWaitFromEnv(off)) << off;
  }
  EXPECT_FALSE(internal::NcclBlockingWaitFromEnv(nullptr));
}

// CheckNcclWorld and FlushNccl refuse other backends' communicators with a clear error.
class NotNccl final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "fake communicator"; }
  absl::Status AllReduce(const void*, void*, size_t, DataType, ReduceOp) override { return {}; }
  absl::Status AllGather(const void*, void*, size_t, DataType) override { return {}; }
  absl::Status ReduceScatter(const void*, void*, size_t, DataType, ReduceOp) override {
    return {};
  }
  absl::Status AllToAll(const void*, void*, size_t, DataType) override { return {}; }
  absl::Status AllGatherV(const void*, void*, absl::Span<const size_t>, DataType) override {
    return {};
  }
  absl::Status ReduceScatterV(const void*, void*, absl::Span<const size_t>, DataType,
                              ReduceOp) override {
    return {};
  }
  absl::Status AllToAllV(const void*, absl::Span<const size_t>, void*, absl::Span<const size_t>,
                         DataType) override {
    return {};
  }
  absl::Status Broadcast(void*, size_t, DataType, int) override { return {}; }
  absl::Status Send(const void*, size_t, DataType, int) override { return {}; }
  absl::Status Recv(void*, size_t, DataType, int) override { return {}; }
  absl::Status Ppermute(const void*, void*, size_t, DataType,
                        absl::Span<const std::pair<int, int>>) override {
    return {};
  }
  absl::Status Barrier() override { return {}; }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int, int) override { return nullptr; }
};

TEST(NcclCommunicatorTest, CheckAndFlushRefuseOtherCommunicators) {
  NotNccl other;
  for (const absl::Status& s : {CheckNcclWorld(other), FlushNccl(other)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("fake communicator"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("is not an NCCL communicator"));
  }
}

#if SHARDMAP_HAS_CUDA

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* d = nullptr;
  cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T));
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  // A pageable host->device cudaMemcpy may return before its DMA lands, and the collectives
  // run on the communicator's non-blocking stream, which does not wait for the legacy stream.
  cudaDeviceSynchronize();
  return d;
}

// The collectives are stream-ordered on the communicator's non-blocking stream, which a
// legacy-stream cudaMemcpy does not wait for: the read waits for the device first.
template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> v(n);
  cudaDeviceSynchronize();
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// The caller's read of a stream-ordered result: a copy on the communicator's stream and a
// wait for that stream (what a trainer's loss read does).
template <typename T>
std::vector<T> ReadOnStream(const T* d, size_t n, cudaStream_t stream) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpyAsync(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return v;
}

// Holds `stream` with a host function until Release() (or the destructor), so that a call that
// waited for the stream on the host could not return.
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, [](void* self) {
      while (!static_cast<StreamHold*>(self)->released_.load()) {}
    }, this), cudaSuccess);
  }
  ~StreamHold() { Release(); }
  void Release() { released_ = true; }

 private:
  std::atomic<bool> released_{false};
};

TEST(NcclCommunicatorTest, SingleRankWorldRunsEveryOp) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_EQ(c.size(), 1);
  EXPECT_TRUE(c.memory_space().device);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 7.0f, 0.0f};
  float* d = ToDevice(x);
  float* out = ToDevice(std::vector<float>(5, 9.0f));
  // Every op writes into `out` freshly filled with 9s, so an op that writes nothing fails.
  const std::vector<float> nines(5, 9.0f);
  auto reset = [&] {
    cudaMemcpy(out, nines.data(), 5 * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();  // pageable copy on the legacy stream (see ToDevice)
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                      ReduceOp::kAvg}) {
    reset();
    ASSERT_TRUE(c.AllReduce(d, out, 5, DataType::kF32, op).ok());
    EXPECT_EQ(ToHost(out, 5), x) << ReduceOpName(op);
  }
  reset();
  ASSERT_TRUE(c.AllGather(d, out, 5, DataType::kF32).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  reset();
  ASSERT_TRUE(c.ReduceScatter(d, out, 5, DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  reset();
  ASSERT_TRUE(c.AllToAll(d, out, 5, DataType::kF32).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  const std::vector<size_t> counts = {5};
  reset();
  ASSERT_TRUE(c.AllGatherV(d, out, counts, DataType::kF32).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  reset();
  ASSERT_TRUE(c.AllToAllV(d, counts, out, counts, DataType::kF32).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  reset();
  ASSERT_TRUE(c.Broadcast(out, 5, DataType::kF32, 0).ok());
  EXPECT_EQ(ToHost(out, 5), nines);  // the root's own buffer is unchanged
  const std::vector<std::pair<int, int>> self = {{0, 0}};
  reset();
  ASSERT_TRUE(c.Ppermute(d, out, 5, DataType::kF32, self).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  reset();
  ASSERT_TRUE(c.Ppermute(d, out, 5, DataType::kF32, {}).ok());
  EXPECT_EQ(ToHost(out, 5), std::vector<float>(5, 0.0f));  // no source: zeros
  ASSERT_TRUE(c.Barrier().ok());
  // bf16 sum through NCCL, out of place into zeros, then in place.
  std::vector<uint16_t> h = {0x3fc0, 0x4000};  // 1.5, 2.0
  uint16_t* dh = ToDevice(h);
  uint16_t* dh_out = ToDevice(std::vector<uint16_t>(2, 0));
  ASSERT_TRUE(c.AllReduce(dh, dh_out, 2, DataType::kBF16, ReduceOp::kSum).ok());
  EXPECT_EQ(ToHost(dh_out, 2), h);
  ASSERT_TRUE(c.AllReduce(dh, dh, 2, DataType::kBF16, ReduceOp::kSum).ok());
  EXPECT_EQ(ToHost(dh, 2), h);
  auto sub = c.Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_NE(*sub, nullptr);
  EXPECT_EQ((*sub)->size(), 1);
  reset();
  ASSERT_TRUE((*sub)->AllReduce(d, out, 5, DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(ToHost(out, 5), x);
  auto none = c.Split(-1, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  // Bad input: a clear error, and the communicator (and its sub-group) is aborted afterwards.
  absl::Status bad = c.Broadcast(out, 5, DataType::kF32, 3);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("root 3 is not a rank"));
  EXPECT_EQ(c.Barrier().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*sub)->Barrier().code(), absl::StatusCode::kAborted);
  cudaFree(d);
  cudaFree(out);
  cudaFree(dh);
  cudaFree(dh_out);
}

// A split communicator shares its parent's stream: it must keep working after the parent is
// destroyed (the stream lives until the last of them is gone).
TEST(NcclCommunicatorTest, SplitOutlivesItsParent) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto sub = (*comm)->Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_NE(*sub, nullptr);
  comm->reset();
  const std::vector<float> x = {4.0f, -1.0f, 0.5f};
  float* d = ToDevice(x);
  float* out = ToDevice(std::vector<float>(3, 9.0f));
  absl::Status s = (*sub)->AllReduce(d, out, 3, DataType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ToHost(out, 3), x);
  sub->reset();
  cudaFree(d);
  cudaFree(out);
}

// A communicator made with a shared store publishes a failure of its own on the world's board
// (where its peers in other processes read it) before it aborts, and refuses later calls.
TEST(NcclCommunicatorTest, ABadArgumentIsPublishedForThePeersBeforeTheAbort) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto made = SoloStore();
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<TcpStore> store = *std::move(made);
  auto comm = CreateNcclCommunicator(store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto sub = (*comm)->Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  float* d = ToDevice(std::vector<float>(4, 1.0f));
  absl::Status s = (*sub)->Broadcast(d, 4, DataType::kF32, /*root=*/5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The world's board: beside the first unique id made through this store.
  PeerFailureBoard board(store, "nccl/unique_id/1/board");
  std::optional<PeerFailure> f = board.First(absl::Seconds(2));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 0);
  EXPECT_EQ(f->status, s);
  EXPECT_THAT(std::string(f->status.message()), HasSubstr("NCCL Broadcast(f32, count=4)"));
  EXPECT_THAT(std::string(f->status.message()), HasSubstr("split(color=0)"));
  // The whole world is aborted, the parent too.
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kAborted);
  sub->reset();
  comm->reset();
  cudaFree(d);
}

TEST(NcclCommunicatorTest, AbortNcclWorldPublishesAndRefusesLaterCalls) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto made = SoloStore();
  ASSERT_TRUE(made.ok()) << made.status();
  std::shared_ptr<TcpStore> store = *std::move(made);
  auto comm = CreateNcclCommunicator(store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->Barrier().ok());
  auto sub = (*comm)->Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  const absl::Status why = absl::FailedPreconditionError("step 3 threw: loss is NaN");
  EXPECT_TRUE(AbortNcclWorld(**comm, why).ok());
  PeerFailureBoard board(store, "nccl/unique_id/1/board");
  std::optional<PeerFailure> f = board.First(absl::Seconds(2));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->status, why);
  for (Communicator* c : {comm->get(), sub->get()}) {
    absl::Status s = c->Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("step 3 threw: loss is NaN"));
  }
  EXPECT_EQ(AbortNcclWorld(**comm, absl::OkStatus()).code(), absl::StatusCode::kInvalidArgument);
}

// Started calls run on the communication stream: the host waits neither at the start nor at
// Wait(), and work the compute stream enqueues after Wait() sees the result. The compute stream
// is held by a host function until the checks are done, so a start or Wait() that synchronised
// with the host would hang here (bounded by the test's timeout) instead of returning.
TEST(NcclCommunicatorTest, StartedCallsNeverWaitOnTheHostAndOrderTheComputeStream) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  EXPECT_TRUE(c.OverlapsStartedCalls());
  cudaStream_t compute = static_cast<cudaStream_t>(c.memory_space().stream);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f};
  float* d = ToDevice(x);
  float* out = ToDevice(std::vector<float>(3, 9.0f));
  float* copy = ToDevice(std::vector<float>(3, 7.0f));
  {  // warm-up: the first start opens the communication stream's communicator
    auto h = c.AllReduceStart(d, out, 3, DataType::kF32, ReduceOp::kSum);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait().ok());
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    const std::vector<float> nines(3, 9.0f);
    cudaMemcpy(out, nines.data(), 3 * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  static std::atomic<bool> release{false};
  release = false;
  struct Release {
    ~Release() { release = true; }
  } guard;
  ASSERT_EQ(cudaLaunchHostFunc(compute, [](void*) { while (!release.load()) {} }, nullptr),
            cudaSuccess);
  auto h = c.AllReduceStart(d, out, 3, DataType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE((*h)->Wait().ok());  // returns although the collective cannot have run yet
  EXPECT_EQ((*h)->Wait().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(cudaMemcpyAsync(copy, out, 3 * sizeof(float), cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(compute), cudaErrorNotReady);  // still held: nothing ran
  release = true;
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(ToHost(out, 3), x);
  EXPECT_EQ(ToHost(copy, 3), x) << "the copy enqueued after Wait() ran before the collective";
  cudaFree(d);
  cudaFree(out);
  cudaFree(copy);
}

// The host-wait counter (base/host_waits.h): a blocking collective (stream-ordered), a
// started call and its Wait() never wait, a barrier once; with the timeline on, the started
// call's span comes back ordered (ready <= begin <= end, ready <= joined) once it was waited,
// and only then.
TEST(NcclCommunicatorTest, HostWaitsAreCountedAndStartedCallsAreTimed) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  float* d = ToDevice(std::vector<float>{1.0f, 2.0f, 3.0f});
  float* out = ToDevice(std::vector<float>(3, 0.0f));
  {  // the first start opens the lane (a split: no stream wait either)
    const HostWaitCounts before = HostWaitSnapshot();
    auto h = c.AllReduceStart(d, out, 3, DataType::kF32, ReduceOp::kSum);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE((*h)->Wait().ok());
    EXPECT_EQ((HostWaitSnapshot() - before).total(), 0) << (HostWaitSnapshot() - before).ToString();
  }
  // A blocking collective is stream-ordered (no host wait); a barrier waits once.
  HostWaitCounts before = HostWaitSnapshot();
  ASSERT_TRUE(c.AllReduce(d, out, 3, DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ((HostWaitSnapshot() - before).ToString(), "none");
  before = HostWaitSnapshot();
  ASSERT_TRUE(c.Barrier().ok());
  EXPECT_EQ((HostWaitSnapshot() - before).ToString(), "nccl_blocking_call=1");
  ASSERT_TRUE(TakeNcclStartedCallTimeline().ok());  // nothing timed before the switch
  SetNcclStartedCallTimeline(true);
  before = HostWaitSnapshot();
  auto h = c.AllReduceStart(d, out, 3, DataType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.status();
  auto early = TakeNcclStartedCallTimeline();
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(early->empty()) << "a call not waited yet was taken";
  ASSERT_TRUE((*h)->Wait().ok());
  EXPECT_EQ((HostWaitSnapshot() - before).total(), 0) << (HostWaitSnapshot() - before).ToString();
  SetNcclStartedCallTimeline(false);
  auto spans = TakeNcclStartedCallTimeline();
  ASSERT_TRUE(spans.ok()) << spans.status();
  ASSERT_EQ(spans->size(), 1u);
  const StartedCallSpan& s = (*spans)[0];
  EXPECT_THAT(s.what, HasSubstr("AllReduceStart(f32, count=3, sum)"));
  EXPECT_EQ(s.ready_ms, 0.0);
  EXPECT_LE(s.ready_ms, s.begin_ms);
  EXPECT_LE(s.begin_ms, s.end_ms);
  EXPECT_LE(s.ready_ms, s.joined_ms);
  auto again = TakeNcclStartedCallTimeline();
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty()) << "a span was taken twice";
  cudaFree(d);
  cudaFree(out);
}

// A started call and its Wait() are recorded into a CUDA graph (the comm stream forks from the
// captured stream at the ready event and joins at Wait); the first start, which opens the comm
// stream's communicator, is refused under capture with the reason.
TEST(NcclCommunicatorTest, StartedCallsAreCapturableOnceTheLaneIsOpen) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {});
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  cudaStream_t compute = static_cast<cudaStream_t>(c.memory_space().stream);
  const std::vector<float> x = {4.0f, 5.0f};
  float* d = ToDevice(x);
  float* out = ToDevice(std::vector<float>(2, 0.0f));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  auto refused = c.AllGatherStart(d, out, 2, DataType::kF32);
  cudaStreamEndCapture(compute, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("before capturing"));
  // Nothing was enqueued: the same communicator opens its lane once uncaptured.
  Communicator& c2 = c;
  {
    auto warm = c2.AllGatherStart(d, out, 2, DataType::kF32);
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE((*warm)->Wait().ok());
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  }
  const std::vector<float> zeros(2, 0.0f);
  cudaMemcpy(out, zeros.data(), 2 * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  ASSERT_EQ(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  auto h = c2.AllGatherStart(d, out, 2, DataType::kF32);
  absl::Status w = h.ok() ? (*h)->Wait() : h.status();
  ASSERT_EQ(cudaStreamEndCapture(compute, &graph), cudaSuccess);
  ASSERT_TRUE(w.ok()) << w;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(ToHost(out, 2), zeros) << "capturing must not run the collective";
  ASSERT_EQ(cudaGraphLaunch(exec, compute), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(ToHost(out, 2), x);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d);
  cudaFree(out);
}

// A blocking collective returns once enqueued, without a host wait: the stream is held by a
// host function while the call is made, so a call that waited for the stream would not return
// (with the old host wait it fails after the 20 s timeout instead). Work enqueued after it on
// the stream, and the caller's read on the stream, see its result.
TEST(NcclCommunicatorTest, BlockingCallsAreStreamOrderedWithoutAHostWait) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions o;
  o.timeout = absl::Seconds(20);
  auto comm = CreateNcclCommunicator(**store, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  cudaStream_t stream = static_cast<cudaStream_t>(c.memory_space().stream);
  const std::vector<float> x = {2.5f, -1.0f, 8.0f, 0.25f};
  float* d = ToDevice(x);
  float* out = ToDevice(std::vector<float>(4, 9.0f));
  float* copy = ToDevice(std::vector<float>(4, 7.0f));
  float* gathered = ToDevice(std::vector<float>(4, 5.0f));
  {  // warm-up: NCCL's first calls of a communicator set up what they need uncontended
    float* scratch = ToDevice(std::vector<float>(4, 0.0f));
    ASSERT_TRUE(c.AllReduce(scratch, scratch, 4, DataType::kF32, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.AllGather(scratch, scratch, 4, DataType::kF32).ok());
    ASSERT_TRUE(c.Broadcast(scratch, 4, DataType::kF32, 0).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaFree(scratch);
  }
  StreamHold hold(stream);
  const HostWaitCounts before = HostWaitSnapshot();
  ASSERT_TRUE(c.AllReduce(d, out, 4, DataType::kF32, ReduceOp::kSum).ok());
  ASSERT_TRUE(c.AllGather(out, gathered, 4, DataType::kF32).ok());
  ASSERT_TRUE(c.Broadcast(gathered, 4, DataType::kF32, 0).ok());
  EXPECT_EQ((HostWaitSnapshot() - before).total(), 0) << (HostWaitSnapshot() - before).ToString();
  ASSERT_EQ(cudaMemcpyAsync(copy, gathered, 4 * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the stream ran while held";
  hold.Release();
  EXPECT_EQ(ReadOnStream(copy, 4, stream), x) << "work after the calls ran before them";
  EXPECT_EQ(ReadOnStream(out, 4, stream), x);
  EXPECT_TRUE(CheckNcclWorld(c).ok()) << CheckNcclWorld(c);
  EXPECT_TRUE(FlushNccl(c).ok());
  cudaFree(d);
  cudaFree(out);
  cudaFree(copy);
  cudaFree(gathered);
}

// The old behaviour on request: every blocking call waits for its stream (counted).
TEST(NcclCommunicatorTest, BlockingWaitMakesEveryBlockingCallWaitForItsStream) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions o;
  o.blocking_wait = true;
  auto comm = CreateNcclCommunicator(**store, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  float* d = ToDevice(std::vector<float>{1.0f, 2.0f});
  auto sub = (*comm)->Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  for (Communicator* c : {comm->get(), sub->get()}) {  // a split inherits the mode
    const HostWaitCounts before = HostWaitSnapshot();
    ASSERT_TRUE(c->AllReduce(d, d, 2, DataType::kF32, ReduceOp::kMax).ok());
    ASSERT_TRUE(c->Broadcast(d, 2, DataType::kF32, 0).ok());
    EXPECT_EQ((HostWaitSnapshot() - before).ToString(), "nccl_blocking_call=2") << c->name();
  }
  sub->reset();
  cudaFree(d);
}

// Completed calls are dropped by the watchdog, never flagged, also once their deadlines passed.
TEST(NcclCommunicatorTest, TheWatchdogDoesNotFlagCompletedCalls) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions o;
  o.watch_timeout = absl::Seconds(2);  // the creation keeps the default timeout
  auto comm = CreateNcclCommunicator(**store, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  cudaStream_t stream = static_cast<cudaStream_t>(c.memory_space().stream);
  float* d = ToDevice(std::vector<float>{1.0f, 2.0f, 3.0f});
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(c.AllReduce(d, d, 3, DataType::kF32, ReduceOp::kMax).ok()) << i;
  }
  EXPECT_EQ(ReadOnStream(d, 3, stream), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  absl::SleepFor(absl::Milliseconds(2500));  // past every call's deadline
  EXPECT_TRUE(CheckNcclWorld(c).ok()) << CheckNcclWorld(c);
  absl::Status next = c.AllReduce(d, d, 3, DataType::kF32, ReduceOp::kSum);
  EXPECT_TRUE(next.ok()) << next;
  EXPECT_EQ(ReadOnStream(d, 3, stream), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_TRUE(FlushNccl(c).ok());
  cudaFree(d);
}

// The watchdog finds a stream-ordered call that does not complete in time (the stream is held
// past the timeout, as a peer that never joins would hold the collective): the failure poisons
// the world, so the next call of every communicator is refused with it and CheckNcclWorld /
// FlushNccl return it. The call itself returned OK.
TEST(NcclCommunicatorTest, TheWatchdogFailsTheNextCallWhenACallDoesNotComplete) {
  if (internal::VisibleGpuCount() == 0) GTEST_SKIP() << "no GPU visible: NCCL ops cannot run on this machine";
  auto store = SoloStore();
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions o;
  o.watch_timeout = absl::Seconds(3);  // the creation and the split keep the default timeout
  auto comm = CreateNcclCommunicator(**store, o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  auto sub = c.Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status();
  cudaStream_t stream = static_cast<cudaStream_t>(c.memory_space().stream);
  float* d = ToDevice(std::vector<float>{1.0f, 2.0f, 3.0f});
  ASSERT_TRUE(c.AllReduce(d, d, 3, DataType::kF32, ReduceOp::kSum).ok());  // warm-up
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  {
    StreamHold hold(stream);
    ASSERT_TRUE(c.AllReduce(d, d, 3, DataType::kF32, ReduceOp::kSum).ok());
    // Released after the deadline whether or not the watchdog found it yet (an abort may wait
    // for the held stream).
    absl::SleepFor(absl::Milliseconds(3500));
  }
  absl::Status found = absl::OkStatus();
  for (int i = 0; i < 1000 && found.ok(); ++i) {
    found = CheckNcclWorld(c);
    if (found.ok()) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(found.code(), absl::StatusCode::kDeadlineExceeded) << found;
  EXPECT_THAT(std::string(found.message()), HasSubstr("NCCL AllReduce(f32, count=3, sum)"));
  EXPECT_THAT(std::string(found.message()), HasSubstr("stream-ordered call: not done after"));
  for (Communicator* x : {comm->get(), sub->get()}) {
    absl::Status next = x->AllReduce(d, d, 3, DataType::kF32, ReduceOp::kSum);
    EXPECT_EQ(next.code(), absl::StatusCode::kAborted) << next;
    EXPECT_THAT(std::string(next.message()), HasSubstr("refused"));
    EXPECT_THAT(std::string(next.message()), HasSubstr("AllReduce(f32, count=3, sum)"));
  }
  EXPECT_EQ(FlushNccl(**sub).code(), absl::StatusCode::kDeadlineExceeded);
  sub->reset();
  comm->reset();  // destroyed with the world failed: aborts, does not hang
  cudaFree(d);
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace
}  // namespace shardmap::collectives
