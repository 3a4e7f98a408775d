#include "collectives/nccl_communicator.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "collectives/distributed_env.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "collectives/internal/cuda_check.h"
#include "collectives/internal/status_macros.h"
#include "base/host_waits.h"
#include "collectives/nccl_finalize_policy.h"
#include "collectives/nccl_watchdog.h"
#endif

namespace shardmap::collectives {

namespace internal {

// The count lives in the store, one key per rank: each rank numbers the communicators it made
// through this store (1, 2, ...). Every rank of a store makes the same ones in the same order,
// so the numbers agree, however many communicators a process made through other stores.
absl::StatusOr<std::string> NextNcclUniqueIdKey(TcpStore& store) {
  absl::StatusOr<int64_t> n =
      store.Add(absl::StrCat("nccl/communicators_made_by_rank/", store.rank()), 1);
  if (!n.ok()) return n.status();
  return absl::StrCat("nccl/unique_id/", *n);
}

ResolvedNcclFailure ResolveNcclFailure(const absl::Status& own, FailureOrigin origin,
                                       int world_rank, const std::optional<PeerFailure>& first,
                                       const std::optional<absl::Status>& mismatch) {
  // A peer failed first: its status, also for a call that failed here (a call made after a
  // peer's failure may fail at once, with whatever NCCL says about the torn-down peer).
  const bool peer_first = first.has_value() && !first->status.ok() && first->rank != world_rank;
  if (peer_first) return {StatusAfterFailure(own, FailureOrigin::kPeer, world_rank, first), false};
  // This rank found the mismatch: it is its failure to tell, with both calls.
  if (origin == FailureOrigin::kPeer && mismatch.has_value() && !mismatch->ok()) {
    return {absl::Status(mismatch->code(),
                         absl::StrCat(mismatch->message(), " (found at: ", own.message(), ")")),
            /*publish=*/!first.has_value()};
  }
  // This rank's own error, published unless it published first already (another group).
  return {own, /*publish=*/!first.has_value()};
}

bool NcclBlockingWaitFromEnv(const char* value) {
  if (value == nullptr) return false;
  const std::string v = absl::AsciiStrToLower(value);
  return v == "1" || v == "on" || v == "true";
}

std::string NcclCallRecord(absl::string_view what, int64_t call_number) {
  return absl::StrCat(what, " #", call_number);
}

absl::Status ReportNcclCallFailure(PeerFailureBoard* board, const NcclCallFailure& call) {
  ResolvedNcclFailure resolved{call.own, /*publish=*/true};
  if (board != nullptr) {
    std::optional<PeerFailure> first;
    std::optional<absl::Status> mismatch;
    if (call.origin == FailureOrigin::kPeer && !call.call_record.empty()) {
      // Whether NCCL failed or the wait timed out, different calls are the likely cause when no
      // rank published a failure of its own: compare the group's pending calls.
      PeerFailureBoard::StuckCallDiagnosis d =
          board->DiagnoseStuckCall(call.group_key, call.group_name, call.group_rank,
                                 call.group_size, call.call_record, call.peer_failure_wait);
      first = std::move(d.first);
      mismatch = std::move(d.mismatch);
    } else if (call.origin == FailureOrigin::kPeer) {  // point-to-point: nothing to compare
      first = board->First(call.peer_failure_wait);
    } else {
      first = board->First(absl::ZeroDuration());  // only what is there already
    }
    resolved = ResolveNcclFailure(call.own, call.origin, call.world_rank, first, mismatch);
  }
  absl::Status failed(resolved.status.code(),
                      absl::StrCat(call.where, " failed: ", resolved.status.message(),
                                   "; the communicator was aborted"));
  // Published before the caller aborts, so a peer that fails because of the abort finds it.
  if (board != nullptr && resolved.publish) (void)board->Publish(failed);
  return failed;
}

}  // namespace internal

#if !SHARDMAP_HAS_CUDA

bool NcclCompiledIn() { return false; }

namespace {
absl::Status NotCompiledIn() {
  return absl::UnimplementedError(
      "the NCCL backend was built without the CUDA toolkit (CUDA_PATH pointed nowhere); "
      "rebuild where CUDA is installed, or use RunInProcess");
}
}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore&,
                                                                     const NcclOptions&) {
  return NotCompiledIn();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(std::shared_ptr<TcpStore>,
                                                                     const NcclOptions&) {
  return NotCompiledIn();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromEnv(const NcclOptions&) {
  return NotCompiledIn();
}

absl::Status AbortNcclWorld(Communicator& comm, const absl::Status&) {
  return absl::InvalidArgumentError(absl::StrCat(
      "AbortNcclWorld: ", comm.name(), " is not an NCCL communicator (NCCL is not built in)"));
}

absl::Status CheckNcclWorld(Communicator& comm) {
  return absl::InvalidArgumentError(absl::StrCat(
      "CheckNcclWorld: ", comm.name(), " is not an NCCL communicator (NCCL is not built in)"));
}

absl::Status FlushNccl(Communicator& comm) {
  return absl::InvalidArgumentError(absl::StrCat(
      "FlushNccl: ", comm.name(), " is not an NCCL communicator (NCCL is not built in)"));
}

void SetNcclStartedCallTimeline(bool) {}

absl::StatusOr<std::vector<StartedCallSpan>> TakeNcclStartedCallTimeline() {
  return std::vector<StartedCallSpan>{};
}

#else  // SHARDMAP_HAS_CUDA

bool NcclCompiledIn() { return true; }

namespace {

absl::StatusOr<ncclDataType_t> ToNccl(DataType t) {
  switch (t) {
    case DataType::kF32: return ncclFloat32;
    case DataType::kF64: return ncclFloat64;
    case DataType::kBF16: return ncclBfloat16;
    case DataType::kF16: return ncclFloat16;
    case DataType::kI32: return ncclInt32;
    case DataType::kI64: return ncclInt64;
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid DataType value ", static_cast<int>(t)));
}

absl::StatusOr<ncclRedOp_t> ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProd: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid ReduceOp value ", static_cast<int>(op)));
}

using internal::kWatchAfter;
using internal::NcclCommSlot;
using internal::NcclWorld;
using ::shardmap::base::CountHostWait;
using ::shardmap::base::HostWait;

// What a call records for the mismatch check at a timeout. Only calls that every rank of the
// group makes are numbered and compared: a Split's color and key differ across ranks by design
// (it records "Split()"), and point-to-point calls are made by some ranks only (not recorded, so
// they do not shift the numbers of the collectives either).
enum class CallRecord { kAsDescribed, kSplit, kPointToPoint };

// How a call completes once enqueued. kDefault: the communicator's mode (kHostWait with
// NcclOptions::blocking_wait, else kWatch).
enum class Completion {
  kDefault,
  kHostWait,  // the host waits for the stream (WaitStream: a counted host wait)
  kWatch,     // stream-ordered: returns at once; the world's watchdog watches the call
  kEnqueued,  // nothing on the stream to wait for (a split: done once made)
};

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

std::vector<size_t> Offsets(absl::Span<const size_t> counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

enum class StartedOp { kAllReduce, kAllGather, kReduceScatter };

const char* StartedOpName(StartedOp k) {
  switch (k) {
    case StartedOp::kAllReduce: return "AllReduce";
    case StartedOp::kAllGather: return "AllGather";
    case StartedOp::kReduceScatter: return "ReduceScatter";
  }
  return "?";
}

// What refuses a communicator's later started calls: a handle dropped without Wait(), or the
// lane that could not be opened.
struct NcclLaneFailure {
  std::mutex mu;
  absl::Status failure;  // guarded by mu
};

// One started call's timing events (SetNcclStartedCallTimeline). `joined` is recorded by Wait().
struct TimelineEntry {
  std::string what;
  int device = 0;
  cudaEvent_t ready = nullptr, begin = nullptr, end = nullptr, joined = nullptr;
  bool waited = false;   // joined recorded; guarded by Timeline::mu
  bool dropped = false;  // waited under a capture: no span of this run; guarded by Timeline::mu
  ~TimelineEntry() {
    for (cudaEvent_t e : {ready, begin, end, joined}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
};

struct Timeline {
  std::mutex mu;
  bool on = false;
  std::vector<std::shared_ptr<TimelineEntry>> entries;  // in start order
};

Timeline& GetTimeline() {
  static Timeline* t = new Timeline();
  return *t;
}

// A timeline entry with its four events created, or null when the timeline is off, `compute`
// is being captured (a timing event in a graph is no span of this run) or an event could not be
// made (the call then runs untimed).
std::shared_ptr<TimelineEntry> NewTimelineEntry(const std::string& what, int device,
                                                cudaStream_t compute) {
  {
    std::lock_guard<std::mutex> l(GetTimeline().mu);
    if (!GetTimeline().on) return nullptr;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(compute, &capture) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  auto e = std::make_shared<TimelineEntry>();
  e->what = what;
  e->device = device;
  for (cudaEvent_t* ev : {&e->ready, &e->begin, &e->end, &e->joined}) {
    if (cudaEventCreate(ev) != cudaSuccess) {
      cudaGetLastError();
      *ev = nullptr;
      return nullptr;  // the destructor frees those made
    }
  }
  return e;
}

// A started call on the communication stream: Wait() makes the compute stream wait for its done
// event (cudaStreamWaitEvent; no host wait) and reports a failure the world already knows of.
class NcclStartedCall final : public PendingCollective {
 public:
  // compute_owner: keeps the compute stream alive while the handle is (null: the caller's).
  NcclStartedCall(std::string what, int device, cudaStream_t compute,
                  std::shared_ptr<CUstream_st> compute_owner, cudaEvent_t done,
                  std::shared_ptr<NcclWorld> world, std::shared_ptr<NcclLaneFailure> lane,
                  std::shared_ptr<TimelineEntry> span)
      : what_(std::move(what)), device_(device), compute_(compute),
        compute_owner_(std::move(compute_owner)), done_(done), world_(std::move(world)),
        lane_(std::move(lane)), span_(std::move(span)) {}

  ~NcclStartedCall() override {
    if (done_ == nullptr) return;
    // Misuse: ordered as a Wait() would (work on the compute stream, a stream-ordered free
    // included, comes after the collective), reported, and later starts refused.
    const absl::Status misuse = absl::FailedPreconditionError(absl::StrCat(
        what_, ": started but never waited; call Wait() on every started collective before its "
        "handle goes out of scope"));
    std::fprintf(stderr, "shardmap: %s\n", std::string(misuse.message()).c_str());
    (void)Order();
    std::lock_guard<std::mutex> l(lane_->mu);
    if (lane_->failure.ok()) lane_->failure = misuse;
  }

  absl::Status Wait() override {
    if (done_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, ": Wait() called twice; wait each started call exactly once"));
    }
    absl::Status s = Order();
    if (const absl::Status why = world_->failure(); s.ok() && !why.ok()) {
      s = absl::Status(why.code(), absl::StrCat(what_, ": the NCCL world failed: ", why.message()));
    }
    return s;
  }

 private:
  absl::Status Order() {
    cudaSetDevice(device_);
    if (span_ != nullptr) {
      // Waited under a capture (started before it: the wait below then fails, as CUDA refuses
      // to wait inside a capture for an event recorded outside it): no span to time.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(compute_, &capture) != cudaSuccess) cudaGetLastError();
      const bool timed = capture == cudaStreamCaptureStatusNone &&
                         cudaEventRecord(span_->joined, compute_) == cudaSuccess;
      std::lock_guard<std::mutex> l(GetTimeline().mu);
      (timed ? span_->waited : span_->dropped) = true;
    }
    const cudaError_t e = cudaStreamWaitEvent(compute_, done_, 0);
    cudaEventDestroy(done_);
    done_ = nullptr;
    return internal::CudaStatus(e, "cudaStreamWaitEvent (Wait of a started call)", __FILE__,
                                __LINE__);
  }

  const std::string what_;
  const int device_;
  const cudaStream_t compute_;
  const std::shared_ptr<CUstream_st> compute_owner_;
  cudaEvent_t done_;
  const std::shared_ptr<NcclWorld> world_;
  const std::shared_ptr<NcclLaneFailure> lane_;
  const std::shared_ptr<TimelineEntry> span_;  // null: untimed
};

class NcclCommunicator final : public Communicator {
 public:
  // stream_owner: null for the caller's stream; else it destroys the stream once the world
  // communicator and every communicator split from it (they share its stream) are gone.
  // blocking_wait: every blocking collective waits for its stream (NcclOptions::blocking_wait).
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t stream,
                   std::shared_ptr<CUstream_st> stream_owner, absl::Duration timeout,
                   bool blocking_wait, std::shared_ptr<NcclWorld> world, std::string name,
                   std::string group_key)
      : slot_(std::make_shared<NcclCommSlot>(comm)),
        comm_(slot_->handle),
        blocking_wait_(blocking_wait),
        device_(device),
        stream_(stream),
        stream_owner_(std::move(stream_owner)),
        timeout_(timeout),
        world_(std::move(world)),
        name_(std::move(name)),
        group_key_(std::move(group_key)) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    // The watchdog may abort the communicator meanwhile: under slot_->mu, or without it once it
    // waited kAbortLockGrace; the teardown right is taken once (nccl_watchdog.h).
    std::unique_lock<std::timed_mutex> use(slot_->mu);
    if (comm_ != nullptr && slot_->TakeTeardown() == nullptr) comm_ = nullptr;  // aborted
    // Scratch buffers are freed only when the communicator finished its work (finalized):
    // after an abort, a copy into them queued behind a stuck kernel may still run (kept).
    bool idle = comm_ != nullptr;
    if (comm_ != nullptr) {
      if (!world_->failure().ok()) {
        ncclCommAbort(comm_);
        idle = false;
      } else {
        // Finalize flushes outstanding work (non-blocking: poll), then destroy; abort once the
        // job is known to be failing and a short grace has passed (nccl_finalize_policy.h).
        const ncclResult_t fin = ncclCommFinalize(comm_);
        const absl::Time start = absl::Now();
        std::optional<absl::Time> failing_since;
        FinalizeAction action = FinalizeAction::kWait;
        while (action == FinalizeAction::kWait) {
          ncclResult_t st = fin;
          if (fin == ncclSuccess || fin == ncclInProgress) {
            if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
          }
          const absl::Time now = absl::Now();
          if (!failing_since.has_value() && !WorldFailedElsewhere(start).ok()) failing_since = now;
          FinalizeState state;
          state.finished = st == ncclSuccess;
          state.error = st != ncclSuccess && st != ncclInProgress;
          state.waited = now - start;
          state.timeout = timeout_;
          if (failing_since.has_value()) state.failing_for = now - *failing_since;
          action = DecideFinalize(state);
          if (action == FinalizeAction::kWait) std::this_thread::yield();
        }
        if (action == FinalizeAction::kDestroy) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
          idle = false;
        }
      }
      comm_ = nullptr;
    }
    use.unlock();
    if (!idle) return;
    // A destructor cannot return the error: print it (a sticky error surfaces at the next call).
    auto free_scratch = [this](void* p) {
      const absl::Status s = internal::CudaStatus(cudaFree(p), "cudaFree (~NcclCommunicator "
                                                  "scratch)", __FILE__, __LINE__);
      if (!s.ok()) std::fprintf(stderr, "shardmap: %s: %s\n", name_.c_str(), s.ToString().c_str());
    };
    if (scratch_ != nullptr) free_scratch(scratch_);
    for (void* p : retired_scratch_) free_scratch(p);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  MemorySpace memory_space() const override {
    return MemorySpace{/*device=*/true, device_, stream_};
  }
  // Under capture the collective is recorded into the graph and Run does not wait for it.
  bool SupportsGraphCapture() const override { return true; }
  absl::Status AsyncError() override { return CheckWorld(); }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    const std::string what = Describe("AllReduce", dtype, count, ReduceOpName(op));
    return Run(what, [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      SM_COLL_ASSIGN_OR_RETURN(ncclRedOp_t o, ToNccl(op));
      SM_NCCL_RETURN_IF_ERROR(ncclAllReduce(send, recv, count, t, o, comm_, stream_), comm_);
      return absl::OkStatus();
    });
  }

  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         DataType dtype) override {
    return Run(Describe("AllGather", dtype, send_count), [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      SM_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, send_count, t, comm_, stream_), comm_);
      return absl::OkStatus();
    });
  }

  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                             ReduceOp op) override {
    return Run(Describe("ReduceScatter", dtype, recv_count, ReduceOpName(op)),
               [&]() -> absl::Status {
                 SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
                 SM_COLL_ASSIGN_OR_RETURN(ncclRedOp_t o, ToNccl(op));
                 SM_NCCL_RETURN_IF_ERROR(
                     ncclReduceScatter(send, recv, recv_count, t, o, comm_, stream_), comm_);
                 return absl::OkStatus();
               });
  }

  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype) override {
    return Run(Describe("AllToAll", dtype, count), [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      const size_t bytes = count * size_ * DataTypeSize(dtype);
      if (send == recv && bytes > 0) {  // NCCL has no in-place all-to-all: stage the input
        SM_COLL_ASSIGN_OR_RETURN(void* staged, Scratch(bytes));
        SM_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staged, send, bytes, cudaMemcpyDeviceToDevice, stream_));
        send = staged;
      }
      SM_NCCL_RETURN_IF_ERROR(ncclAlltoAll(send, recv, count, t, comm_, stream_), comm_);
      return absl::OkStatus();
    });
  }

  absl::Status AllGatherV(const void* send, void* recv, absl::Span<const size_t> counts,
                          DataType dtype) override {
    return Run(Describe("AllGatherV", dtype, 0), [&]() -> absl::Status {
      SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      const size_t esz = DataTypeSize(dtype);
      const std::vector<size_t> off = Offsets(counts);
      char* out = static_cast<char*>(recv);
      if (counts[rank_] > 0 && out + off[rank_] * esz != send) {
        SM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + off[rank_] * esz, send,
                                                counts[rank_] * esz, cudaMemcpyDeviceToDevice,
                                                stream_));
      }
      return Grouped([&]() -> absl::Status {
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          if (counts[rank_] > 0) {
            SM_NCCL_RETURN_IF_ERROR(ncclSend(send, counts[rank_], t, p, comm_, stream_), comm_);
          }
          if (counts[p] > 0) {
            SM_NCCL_RETURN_IF_ERROR(
                ncclRecv(out + off[p] * esz, counts[p], t, p, comm_, stream_), comm_);
          }
        }
        return absl::OkStatus();
      });
    });
  }

  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const size_t> counts,
                              DataType dtype, ReduceOp op) override {
    return Run(Describe("ReduceScatterV", dtype, 0, ReduceOpName(op)), [&]() -> absl::Status {
      SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      SM_COLL_ASSIGN_OR_RETURN(ncclRedOp_t o, ToNccl(op));
      const size_t esz = DataTypeSize(dtype);
      const std::vector<size_t> off = Offsets(counts);
      // One reduce per destination rank, grouped so NCCL runs them together.
      return Grouped([&]() -> absl::Status {
        for (int r = 0; r < size_; ++r) {
          if (counts[r] == 0) continue;
          SM_NCCL_RETURN_IF_ERROR(
              ncclReduce(static_cast<const char*>(send) + off[r] * esz,
                         r == rank_ ? recv : nullptr, counts[r], t, o, r, comm_, stream_),
              comm_);
        }
        return absl::OkStatus();
      });
    });
  }

  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, DataType dtype) override {
    return Run(Describe("AllToAllV", dtype, 0), [&]() -> absl::Status {
      SM_COLL_RETURN_IF_ERROR(CheckCounts(send_counts, "send_counts"));
      SM_COLL_RETURN_IF_ERROR(CheckCounts(recv_counts, "recv_counts"));
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      const size_t esz = DataTypeSize(dtype);
      const std::vector<size_t> soff = Offsets(send_counts), roff = Offsets(recv_counts);
      if (send == recv && soff.back() > 0) {
        SM_COLL_ASSIGN_OR_RETURN(void* staged, Scratch(soff.back() * esz));
        SM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staged, send, soff.back() * esz,
                                                cudaMemcpyDeviceToDevice, stream_));
        send = staged;
      }
      const char* in = static_cast<const char*>(send);
      char* out = static_cast<char*>(recv);
      if (send_counts[rank_] != recv_counts[rank_]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "this rank sends ", send_counts[rank_], " elements to itself but expects ",
            recv_counts[rank_]));
      }
      if (send_counts[rank_] > 0) {
        SM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + roff[rank_] * esz, in + soff[rank_] * esz,
                                                send_counts[rank_] * esz,
                                                cudaMemcpyDeviceToDevice, stream_));
      }
      return Grouped([&]() -> absl::Status {
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          if (send_counts[p] > 0) {
            SM_NCCL_RETURN_IF_ERROR(
                ncclSend(in + soff[p] * esz, send_counts[p], t, p, comm_, stream_), comm_);
          }
          if (recv_counts[p] > 0) {
            SM_NCCL_RETURN_IF_ERROR(
                ncclRecv(out + roff[p] * esz, recv_counts[p], t, p, comm_, stream_), comm_);
          }
        }
        return absl::OkStatus();
      });
    });
  }

  absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root) override {
    return Run(Describe("Broadcast", dtype, count), [&]() -> absl::Status {
      if (root < 0 || root >= size_) {
        return absl::InvalidArgumentError(
            absl::StrCat("root ", root, " is not a rank of this group of ", size_));
      }
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      SM_NCCL_RETURN_IF_ERROR(ncclBroadcast(buffer, buffer, count, t, root, comm_, stream_),
                              comm_);
      return absl::OkStatus();
    });
  }

  absl::Status Send(const void* buffer, size_t count, DataType dtype, int peer) override {
    return Run(absl::StrCat(Describe("Send", dtype, count), " to rank ", peer),
               [&]() -> absl::Status {
                 SM_COLL_RETURN_IF_ERROR(CheckPeer(peer));
                 SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
                 SM_NCCL_RETURN_IF_ERROR(ncclSend(buffer, count, t, peer, comm_, stream_), comm_);
                 return absl::OkStatus();
               }, nullptr, CallRecord::kPointToPoint);
  }

  absl::Status Recv(void* buffer, size_t count, DataType dtype, int peer) override {
    return Run(absl::StrCat(Describe("Recv", dtype, count), " from rank ", peer),
               [&]() -> absl::Status {
                 SM_COLL_RETURN_IF_ERROR(CheckPeer(peer));
                 SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
                 SM_NCCL_RETURN_IF_ERROR(ncclRecv(buffer, count, t, peer, comm_, stream_), comm_);
                 return absl::OkStatus();
               }, nullptr, CallRecord::kPointToPoint);
  }

  absl::Status Ppermute(const void* send, void* recv, size_t count, DataType dtype,
                        absl::Span<const std::pair<int, int>> pairs) override {
    return Run(Describe("Ppermute", dtype, count), [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      SM_COLL_ASSIGN_OR_RETURN(PpermutePeers peers, ValidatePpermutePairs(pairs, size_, rank_));
      const int from = peers.source, to = peers.dest;
      const size_t bytes = count * DataTypeSize(dtype);
      if (bytes == 0) return absl::OkStatus();
      if (send == recv && to >= 0 && to != rank_) {
        SM_COLL_ASSIGN_OR_RETURN(void* staged, Scratch(bytes));
        SM_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staged, send, bytes, cudaMemcpyDeviceToDevice, stream_));
        send = staged;
      }
      if (from < 0) {
        SM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(recv, 0, bytes, stream_));
      } else if (from == rank_) {
        if (send != recv) {
          SM_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream_));
        }
      }
      return Grouped([&]() -> absl::Status {
        if (to >= 0 && to != rank_) {
          SM_NCCL_RETURN_IF_ERROR(ncclSend(send, count, t, to, comm_, stream_), comm_);
        }
        if (from >= 0 && from != rank_) {
          SM_NCCL_RETURN_IF_ERROR(ncclRecv(recv, count, t, from, comm_, stream_), comm_);
        }
        return absl::OkStatus();
      });
    });
  }

  // A host barrier: returns once every rank reached it and this rank's stream finished the
  // work before it (always a host wait, counted: a barrier that returned before the peers
  // arrived would be none; benchmarks and file hand-offs rely on it).
  absl::Status Barrier() override {
    return Run("Barrier()", [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(void* one, Scratch(sizeof(float)));
      SM_NCCL_RETURN_IF_ERROR(
          ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_), comm_);
      return absl::OkStatus();
    }, nullptr, CallRecord::kAsDescribed, Completion::kHostWait);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> sub =
        SplitOnStream(color, key, stream_, stream_owner_, "split");
    if (!sub.ok()) return sub.status();
    return std::unique_ptr<Communicator>(*std::move(sub));
  }

  // Started calls: see "Started calls" in nccl_communicator.h.
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    return Start(StartedOp::kAllReduce, send, recv, count, dtype, op);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, DataType dtype) override {
    return Start(StartedOp::kAllGather, send, recv, send_count, dtype, ReduceOp::kSum);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) override {
    return Start(StartedOp::kReduceScatter, send, recv, recv_count, dtype, op);
  }
  bool OverlapsStartedCalls() const override { return true; }

  // The lane's NCCL communicator: its asynchronous error, if any (OK when healthy or gone).
  absl::Status LaneCommError() {
    std::lock_guard<std::timed_mutex> use(slot_->mu);
    if (comm_ == nullptr || slot_->torn_down()) return absl::OkStatus();
    ncclResult_t st = ncclSuccess;
    SM_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &st), comm_);
    if (st != ncclSuccess && st != ncclInProgress) {
      return internal::NcclStatus(st, comm_, "asynchronous NCCL error on the communication "
                                  "stream's communicator", __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }

  // Enqueues a started call's collective on this (lane) communicator's stream, without waiting
  // for the stream (Run with Completion::kWatch: it still polls the enqueue of the non-blocking
  // communicator, which does not wait for the GPU, and hands the call to the watchdog).
  absl::Status EnqueueStarted(StartedOp kind, const void* send, void* recv, size_t count,
                              DataType dtype, ReduceOp op) {
    const char* reduce = kind == StartedOp::kAllGather ? nullptr : ReduceOpName(op);
    return Run(Describe(StartedOpName(kind), dtype, count, reduce), [&]() -> absl::Status {
      SM_COLL_ASSIGN_OR_RETURN(ncclDataType_t t, ToNccl(dtype));
      if (kind == StartedOp::kAllGather) {
        SM_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, count, t, comm_, stream_), comm_);
        return absl::OkStatus();
      }
      SM_COLL_ASSIGN_OR_RETURN(ncclRedOp_t o, ToNccl(op));
      if (kind == StartedOp::kAllReduce) {
        SM_NCCL_RETURN_IF_ERROR(ncclAllReduce(send, recv, count, t, o, comm_, stream_), comm_);
      } else {
        SM_NCCL_RETURN_IF_ERROR(ncclReduceScatter(send, recv, count, t, o, comm_, stream_),
                                comm_);
      }
      return absl::OkStatus();
    }, nullptr, CallRecord::kAsDescribed, Completion::kWatch);
  }

  // A child communicator on `stream` (owned by `owner`, null: not owned). `kind` names it.
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> SplitOnStream(
      int color, int key, cudaStream_t stream, std::shared_ptr<CUstream_st> owner,
      const char* kind) {
    const std::string what = absl::StrCat("Split(color=", color, ", key=", key, ")");
    // Every rank of this group splits in the same order: the count names the child group's keys
    // on the board, with the color telling the children of one split apart.
    const int64_t split_number = ++splits_;
    ncclComm_t child = nullptr;
    absl::Status s = Run(what, [&]() -> absl::Status {
      ncclConfig_t config = NonBlockingConfig();
      SM_NCCL_RETURN_IF_ERROR(
          ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config),
          comm_);
      return absl::OkStatus();
    }, /*also_wait_for=*/&child, CallRecord::kSplit, Completion::kEnqueued);
    if (!s.ok()) return s;
    if (child == nullptr) return std::unique_ptr<NcclCommunicator>();
    return std::make_unique<NcclCommunicator>(
        child, device_, stream, std::move(owner), timeout_, blocking_wait_, world_,
        absl::StrCat(name_, "/", kind, "(color=", color, ")"),
        absl::StrCat(group_key_, "/s", split_number, "c", color));
  }

  // AbortNcclWorld: publishes `why`, poisons the world, aborts this communicator.
  absl::Status AbortWorld(const absl::Status& why) {
    absl::Status published = absl::OkStatus();
    const bool first = world_->Poison(absl::Status(
        why.code(), absl::StrCat("rank ", world_->world_rank(), " aborted its world: ",
                                 why.message())));
    if (first && world_->board() != nullptr) published = world_->board()->Publish(why);
    // The watchdog aborts the communicators with calls in flight as it finds the world failed.
    internal::AbortSlot(*slot_, device_);
    return published;
  }

  // CheckNcclWorld: a watchdog pass now, then the world's failure.
  absl::Status CheckWorld() {
    const absl::Status why = world_->Check();
    if (why.ok()) return why;
    return absl::Status(why.code(), absl::StrCat("the NCCL world of ", name_,
                                                 " failed: ", why.message()));
  }

  // FlushNccl: waits for the stream (a host wait), then CheckWorld.
  absl::Status Flush() {
    CountHostWait(HostWait::kStreamSync);
    absl::Status s = internal::CudaStatus(cudaSetDevice(device_), "cudaSetDevice", __FILE__,
                                          __LINE__);
    if (s.ok()) {
      s = internal::CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (FlushNccl)",
                               __FILE__, __LINE__);
    }
    const absl::Status world = CheckWorld();
    return world.ok() ? s : world;
  }

 private:
  std::string Describe(const char* op, DataType dtype, size_t count,
                       const char* reduce = nullptr) const {
    return absl::StrCat(op, "(", DataTypeName(dtype), ", count=", count,
                        reduce ? absl::StrCat(", ", reduce) : std::string(), ")");
  }

  absl::Status CheckCounts(absl::Span<const size_t> counts, const char* which) const {
    if (counts.size() != static_cast<size_t>(size_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, " has ", counts.size(), " entries but the group has ", size_, " ranks"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckPeer(int peer) const {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer must be another rank of this group of ", size_));
    }
    return absl::OkStatus();
  }

  // Runs `calls` (the NCCL calls of one group) between ncclGroupStart and ncclGroupEnd. The
  // group is closed also when a call inside fails: an unmatched ncclGroupStart would leave this
  // thread's NCCL group open, so every later NCCL call of the thread (on any communicator)
  // would only be queued into it and never launched.
  template <typename Calls>
  absl::Status Grouped(Calls calls) {
    SM_NCCL_RETURN_IF_ERROR(ncclGroupStart(), comm_);
    const absl::Status s = calls();
    const ncclResult_t end = ncclGroupEnd();
    if (!s.ok()) return s;
    SM_NCCL_RETURN_IF_ERROR(end, comm_);
    return absl::OkStatus();
  }

  // A device buffer of at least `bytes`, reused across calls (only touched on our stream).
  absl::StatusOr<void*> Scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      // A CUDA graph captured with the old buffer keeps using its address on every replay, so
      // the old buffer is kept (freed with the communicator) rather than freed here; that also
      // avoids cudaStreamSynchronize/cudaFree, which would invalidate a capture on stream_.
      // cudaMalloc itself is legal during a capture only in relaxed mode.
      if (scratch_ != nullptr) retired_scratch_.push_back(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      cudaThreadExchangeStreamCaptureMode(&mode);
      const cudaError_t e = cudaMalloc(&scratch_, bytes);
      cudaThreadExchangeStreamCaptureMode(&mode);
      SM_CUDA_RETURN_IF_ERROR(e);
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  // Polls the communicator (and `other`, e.g. a communicator being created) until it is no
  // longer in progress; fails on an asynchronous error or at the deadline.
  absl::Status WaitComm(absl::Time deadline, ncclComm_t other) {
    const absl::Time started = absl::Now();
    for (ncclComm_t c : {comm_, other}) {
      if (c == nullptr) continue;
      while (true) {
        if (c == comm_) SM_COLL_RETURN_IF_ERROR(AbortedMeanwhile());
        ncclResult_t st = ncclSuccess;
        SM_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(c, &st), c);
        if (st == ncclSuccess) break;
        if (st != ncclInProgress) {
          return internal::NcclStatus(st, c, "asynchronous NCCL error", __FILE__, __LINE__);
        }
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "timed out after ", absl::FormatDuration(timeout_),
              " waiting for NCCL (a peer may have failed or not issued the same call)"));
        }
        SM_COLL_RETURN_IF_ERROR(WorldFailedElsewhere(started));
        std::this_thread::yield();
      }
    }
    return absl::OkStatus();
  }

  // Aborted once the watchdog tore the communicator down without its lock (this thread kept it
  // past kAbortLockGrace): the ncclComm_t must not be touched again.
  absl::Status AbortedMeanwhile() const {
    if (!slot_->torn_down()) return absl::OkStatus();
    return absl::AbortedError("the NCCL watchdog aborted the communicator during this call");
  }

  // Non-OK once the world failed elsewhere while this rank waits (after kWatchAfter): another
  // group of this process failed, or a peer published its failure (a stuck NCCL call would
  // otherwise wait for the timeout: an aborting peer does not always fail NCCL on the others).
  absl::Status WorldFailedElsewhere(absl::Time started) {
    if (absl::Now() - started < kWatchAfter) return absl::OkStatus();
    if (const absl::Status why = world_->failure(); !why.ok()) {
      return absl::AbortedError(absl::StrCat(
          "another group of this rank's world failed meanwhile: ", why.message()));
    }
    if (world_->board() != nullptr) {
      if (std::optional<PeerFailure> f = world_->board()->Poll(); f.has_value()) {
        return absl::AbortedError(absl::StrCat("rank ", f->rank, " published a failure"));
      }
    }
    return absl::OkStatus();
  }

  // Waits for the stream to finish the enqueued work, watching for NCCL errors meanwhile. A
  // host wait (base/host_waits.h: kNcclBlockingCall), counted once per call.
  absl::Status WaitStream(absl::Time deadline) {
    CountHostWait(HostWait::kNcclBlockingCall);
    const absl::Time started = absl::Now();
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        return internal::CudaStatus(e, "cudaStreamQuery", __FILE__, __LINE__);
      }
      SM_COLL_RETURN_IF_ERROR(AbortedMeanwhile());
      ncclResult_t st = ncclSuccess;
      SM_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &st), comm_);
      if (st != ncclSuccess && st != ncclInProgress) {
        return internal::NcclStatus(st, comm_, "asynchronous NCCL error", __FILE__, __LINE__);
      }
      // The stream may wait on a started call (Wait() ordered it after the lane's done event).
      if (lane_ != nullptr) SM_COLL_RETURN_IF_ERROR(lane_->LaneCommError());
      // Stream-ordered calls enqueued before this one and still watched are the likelier
      // culprits (their deadlines come first): let the watchdog report them (it compares the
      // group's stuck calls, which this call's own report would muddle) before timing out.
      const absl::Time now = absl::Now();
      const absl::Duration grace = 2 * world_->peer_failure_wait() + absl::Seconds(1);
      if (now >= deadline && !(now < deadline + grace && world_->pending() > 0)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "timed out after ", absl::FormatDuration(timeout_),
            " waiting for the collective to finish (a peer may have failed, left, or issued a "
            "different call)"));
      }
      SM_COLL_RETURN_IF_ERROR(WorldFailedElsewhere(started));
      std::this_thread::yield();
    }
  }

  // Records an event after the enqueued call on the stream and hands the call to the world's
  // watchdog (collectives/nccl_watchdog.h), which reports it if it fails or passes `deadline`.
  absl::Status WatchCompletion(const std::string& where, const std::string& call_record,
                               absl::Time deadline) {
    internal::NcclWatchedCall call;
    SM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&call.done, cudaEventDisableTiming));
    SM_CUDA_RETURN_IF_ERROR(cudaEventRecord(call.done, stream_));  // the call destroys it
    call.device = device_;
    call.slot = slot_;
    call.failure = internal::NcclCallFailure{
        where, absl::OkStatus(), FailureOrigin::kPeer, group_key_, name_, rank_, size_,
        call_record, world_->world_rank(), world_->peer_failure_wait()};
    return world_->Watch(std::move(call), deadline);
  }

  // Runs one call under slot_->mu: refuses if the world failed; enqueues; completes it as
  // `completion` says; on failure publishes it (when it is this rank's to tell), aborts the
  // communicator, poisons the world and returns a Status naming the op, group and reason: a
  // peer's published failure with the peer's code, or the world's failure when it failed
  // elsewhere (the watchdog, another group) while this call waited.
  template <typename Enqueue>
  absl::Status Run(const std::string& what, Enqueue enqueue, ncclComm_t* also_wait_for = nullptr,
                   CallRecord record = CallRecord::kAsDescribed,
                   Completion completion = Completion::kDefault) {
    const std::string where = absl::StrCat("NCCL ", what, " on group '", name_, "' (rank ",
                                           rank_, " of ", size_, ")");
    std::unique_lock<std::timed_mutex> use(slot_->mu);
    if (const absl::Status why = world_->failure();
        !why.ok() || comm_ == nullptr || slot_->torn_down()) {
      return absl::AbortedError(absl::StrCat(where, " refused: the communicator was aborted "
                                             "after an earlier failure: ", why.message()));
    }
    if (completion == Completion::kDefault) {
      completion = blocking_wait_ ? Completion::kHostWait : Completion::kWatch;
    }
    std::string call_record;  // empty: not compared
    if (record != CallRecord::kPointToPoint) {
      call_record = internal::NcclCallRecord(record == CallRecord::kSplit ? "Split()" : what,
                                             ++calls_);
    }
    const absl::Time deadline = absl::Now() + timeout_;
    FailureOrigin origin = FailureOrigin::kLocal;
    absl::Status s = internal::CudaStatus(cudaSetDevice(device_), "cudaSetDevice", __FILE__,
                                          __LINE__);
    if (s.ok()) s = enqueue();
    if (s.ok()) {
      origin = FailureOrigin::kPeer;  // from here on a failure is a wait's
      s = WaitComm(deadline, also_wait_for ? *also_wait_for : nullptr);
    }
    // A stream being captured into a CUDA graph only records the collective: nothing to wait
    // for or watch now (querying it would invalidate the capture; replays are not watched).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (s.ok() && cudaStreamIsCapturing(stream_, &capture) != cudaSuccess) {
      cudaGetLastError();
      capture = cudaStreamCaptureStatusNone;
    }
    if (s.ok() && capture == cudaStreamCaptureStatusNone) {
      if (completion == Completion::kHostWait) s = WaitStream(deadline);
      if (completion == Completion::kWatch) {
        // Its own deadline (NcclOptions::watch_timeout), from the call's start.
        s = WatchCompletion(where, call_record, deadline - timeout_ + world_->watch_timeout());
      }
    }
    if (s.ok()) return s;
    absl::Status failed;
    if (const absl::Status why = world_->failure(); !why.ok() && origin == FailureOrigin::kPeer) {
      failed = absl::Status(why.code(), absl::StrCat(where, " failed: the NCCL world failed "
                                                     "meanwhile: ", why.message()));
    } else {
      failed = internal::ReportNcclCallFailure(
          world_->board(),
          internal::NcclCallFailure{where, s, origin, group_key_, name_, rank_, size_,
                                    call_record, world_->world_rank(),
                                    world_->peer_failure_wait()});
    }
    if (also_wait_for != nullptr && *also_wait_for != nullptr) {
      ncclCommAbort(*also_wait_for);
      *also_wait_for = nullptr;
    }
    if (slot_->TakeTeardown() != nullptr) ncclCommAbort(comm_);  // else the watchdog did
    comm_ = nullptr;
    world_->Poison(failed);
    return failed;
  }

  // Opens the lane at the first started call: a communication stream and, on it, a duplicate
  // NCCL communicator (ncclCommSplit(comm_, 0, rank): collective, host-blocking, not capturable).
  absl::Status OpenLane(const std::string& what) {
    if (lane_ != nullptr) return absl::OkStatus();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream_, &capture) != cudaSuccess) cudaGetLastError();
    if (capture != cudaStreamCaptureStatusNone) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": the first started call of a communicator opens its communication stream and "
          "its own NCCL communicator (ncclCommSplit, a host-blocking collective), which a CUDA "
          "graph capture cannot record; make one started call before capturing (run one step "
          "uncaptured first), after which started calls are capturable"));
    }
    SM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaStream_t cs = nullptr;
    SM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    std::shared_ptr<CUstream_st> owner(cs, [](cudaStream_t st) { cudaStreamDestroy(st); });
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> lane =
        SplitOnStream(0, rank_, cs, std::move(owner), "comm_stream");
    if (!lane.ok()) {
      std::lock_guard<std::mutex> l(lane_failure_->mu);
      lane_failure_->failure = absl::Status(
          lane.status().code(), absl::StrCat("opening the communication stream's NCCL "
                                             "communicator failed: ", lane.status().message()));
      return lane_failure_->failure;  // later starts are refused with it
    }
    lane_ = *std::move(lane);
    return absl::OkStatus();
  }

  // ready (recorded on the compute stream) -> the comm stream waits -> the collective -> done.
  absl::StatusOr<std::unique_ptr<PendingCollective>> Start(StartedOp kind, const void* send,
                                                           void* recv, size_t count,
                                                           DataType dtype, ReduceOp op) {
    const std::string what = absl::StrCat(
        "NCCL ", StartedOpName(kind), "Start(", DataTypeName(dtype), ", count=", count,
        kind == StartedOp::kAllGather ? "" : absl::StrCat(", ", ReduceOpName(op)),
        ") on group '", name_, "' (rank ", rank_, " of ", size_, ")");
    {
      std::lock_guard<std::mutex> l(lane_failure_->mu);
      if (!lane_failure_->failure.ok()) {
        return absl::Status(lane_failure_->failure.code(),
                            absl::StrCat(what, " refused: ", lane_failure_->failure.message()));
      }
    }
    if (absl::Status s = OpenLane(what); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    SM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    std::shared_ptr<TimelineEntry> span = NewTimelineEntry(what, device_, stream_);
    cudaEvent_t ready = nullptr, done = nullptr;
    SM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess && span != nullptr) e = cudaEventRecord(span->ready, stream_);
    if (e == cudaSuccess) e = cudaEventRecord(ready, stream_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(lane_->stream_, ready, 0);
    if (e == cudaSuccess && span != nullptr) e = cudaEventRecord(span->begin, lane_->stream_);
    absl::Status s = internal::CudaStatus(e, "ordering the communication stream after the "
                                          "compute stream", __FILE__, __LINE__);
    bool enqueued = false;
    if (s.ok()) {
      s = lane_->EnqueueStarted(kind, send, recv, count, dtype, op);
      enqueued = s.ok();
    }
    if (s.ok() && span != nullptr) {
      s = internal::CudaStatus(cudaEventRecord(span->end, lane_->stream_),
                               "cudaEventRecord (timeline end)", __FILE__, __LINE__);
    }
    if (s.ok()) {
      s = internal::CudaStatus(cudaEventRecord(done, lane_->stream_), "cudaEventRecord (done)",
                               __FILE__, __LINE__);
    }
    cudaEventDestroy(ready);  // its wait is enqueued already
    if (!s.ok()) {
      if (done != nullptr) cudaEventDestroy(done);
      if (enqueued) {
        // The collective is in flight but the compute stream cannot be ordered after it: wait
        // for it here (a host wait, on this error path only), so that the caller, who gets the
        // error and no handle, may free the buffers at once.
        CountHostWait(HostWait::kStreamSync);
        cudaStreamSynchronize(lane_->stream_);
        cudaGetLastError();
      }
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    if (span != nullptr) {
      std::lock_guard<std::mutex> l(GetTimeline().mu);
      GetTimeline().entries.push_back(span);
    }
    return std::unique_ptr<PendingCollective>(std::make_unique<NcclStartedCall>(
        what, device_, stream_, stream_owner_, done, world_, lane_failure_, std::move(span)));
  }

  // The ncclComm_t, shared with the world's watchdog, which may abort it (nccl_watchdog.h):
  // this communicator's calls use comm_ (a reference to slot_->handle) under slot_->mu.
  const std::shared_ptr<NcclCommSlot> slot_;
  ncclComm_t& comm_;
  const bool blocking_wait_;  // NcclOptions::blocking_wait: blocking calls wait for the stream
  const int device_;
  cudaStream_t stream_;
  const std::shared_ptr<CUstream_st> stream_owner_;
  const absl::Duration timeout_;
  std::shared_ptr<NcclWorld> world_;
  const std::string name_;
  const std::string group_key_;  // this group's keys on the world's board
  int64_t calls_ = 0;            // collective calls made (numbers the call records)
  int64_t splits_ = 0;           // Split calls made (names the children's group keys)
  int rank_ = 0;
  int size_ = 1;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<void*> retired_scratch_;  // outgrown scratch buffers (see Scratch)
  // Started calls: the communicator on the communication stream (opened by the first start)
  // and the misuse / opening failure that refuses later starts.
  std::unique_ptr<NcclCommunicator> lane_;
  std::shared_ptr<NcclLaneFailure> lane_failure_ = std::make_shared<NcclLaneFailure>();
};

absl::StatusOr<int> PickDevice(const NcclOptions& options, int rank) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL backend: no CUDA device is visible (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices" : cudaGetErrorString(e),
        "); use RunInProcess on machines without GPUs"));
  }
  if (options.device >= 0) {
    if (options.device >= n) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL backend: device ", options.device,
                                                     " requested but only ", n, " visible"));
    }
    return options.device;
  }
  int local = rank;
  if (const char* v = std::getenv("LOCAL_RANK")) (void)absl::SimpleAtoi(v, &local);
  else if (const char* v = std::getenv("SLURM_LOCALID")) (void)absl::SimpleAtoi(v, &local);
  return local % n;
}

// `keep`: the store again, to keep for the board (null: the store is only used here).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNccl(TcpStore& store,
                                                         std::shared_ptr<TcpStore> keep,
                                                         const NcclOptions& options) {
  if (options.peer_failure_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclOptions::peer_failure_wait must not be negative, got ",
        absl::FormatDuration(options.peer_failure_wait)));
  }
  if (options.watch_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclOptions::watch_timeout must not be negative (zero: the timeout), got ",
        absl::FormatDuration(options.watch_timeout)));
  }
  SM_COLL_ASSIGN_OR_RETURN(const int device, PickDevice(options, store.rank()));
  SM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  // Several communicators may be made through one store: number them per store.
  SM_COLL_ASSIGN_OR_RETURN(const std::string key, internal::NextNcclUniqueIdKey(store));
  ncclUniqueId id;
  if (store.rank() == 0) {
    SM_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), nullptr);
    SM_COLL_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    absl::StatusOr<std::string> got = store.Get(key);
    if (absl::IsDeadlineExceeded(got.status())) {  // rank 0 publishes the id once it has joined
      return absl::DeadlineExceededError(RanksDidNotJoin(
          {0}, store.world_size(), store.options().timeout, "train: --collective_timeout"));
    }
    if (!got.ok()) return got.status();
    const std::string& bytes = *got;
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL unique id from rank 0 has ", bytes.size(),
                                              " bytes, expected ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  const bool owns_stream = stream == nullptr;
  if (owns_stream) {
    SM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NonBlockingConfig();
  const std::string name = absl::StrCat("nccl world(", store.world_size(), ")");
  ncclResult_t r = ncclCommInitRankConfig(&comm, store.world_size(), id, store.rank(), &config);
  absl::Status s = internal::NcclStatus(r, comm, "ncclCommInitRankConfig", __FILE__, __LINE__);
  const absl::Time deadline = absl::Now() + options.timeout;
  while (s.ok()) {
    ncclResult_t st = ncclSuccess;
    s = internal::NcclStatus(ncclCommGetAsyncError(comm, &st), comm, "ncclCommGetAsyncError",
                             __FILE__, __LINE__);
    if (!s.ok() || st == ncclSuccess) break;
    if (st != ncclInProgress) {
      s = internal::NcclStatus(st, comm, "ncclCommInitRankConfig", __FILE__, __LINE__);
    } else if (absl::Now() >= deadline) {
      s = absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", absl::FormatDuration(options.timeout),
          " (did every rank of the world call CreateNcclCommunicator?)"));
    } else {
      std::this_thread::yield();
    }
  }
  if (!s.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (owns_stream) cudaStreamDestroy(stream);
    return absl::Status(s.code(), absl::StrCat("creating ", name, " (rank ", store.rank(),
                                               ", device ", device, "): ", s.message()));
  }
  std::shared_ptr<CUstream_st> stream_owner;
  if (owns_stream) stream_owner.reset(stream, [](cudaStream_t st) { cudaStreamDestroy(st); });
  std::shared_ptr<PeerFailureBoard> board;
  if (keep != nullptr) {
    // The unique id's key is unique per world on this store: the board lives beside it.
    board = std::make_shared<PeerFailureBoard>(std::move(keep), absl::StrCat(key, "/board"),
                                               options.peer_failure_wait);
  }
  const absl::Duration watch_timeout =
      options.watch_timeout == absl::ZeroDuration() ? options.timeout : options.watch_timeout;
  auto world = std::make_shared<NcclWorld>(store.rank(), device, options.peer_failure_wait,
                                           watch_timeout, std::move(board));
  const bool blocking_wait =
      options.blocking_wait || internal::NcclBlockingWaitFromEnv(std::getenv("SHARDMAP_NCCL_BLOCKING_WAIT"));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      comm, device, stream, std::move(stream_owner), options.timeout, blocking_wait,
      std::move(world), name, /*group_key=*/"world"));
}

}  // namespace

void SetNcclStartedCallTimeline(bool on) {
  std::lock_guard<std::mutex> l(GetTimeline().mu);
  GetTimeline().on = on;
}

absl::StatusOr<std::vector<StartedCallSpan>> TakeNcclStartedCallTimeline() {
  std::vector<std::shared_ptr<TimelineEntry>> taken;
  {
    Timeline& t = GetTimeline();
    std::lock_guard<std::mutex> l(t.mu);
    std::vector<std::shared_ptr<TimelineEntry>> keep;
    for (std::shared_ptr<TimelineEntry>& e : t.entries) {
      if (e->dropped) continue;
      (e->waited ? taken : keep).push_back(std::move(e));
    }
    t.entries = std::move(keep);
  }
  int current = 0;
  SM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  std::vector<StartedCallSpan> out;
  std::map<int, cudaEvent_t> base;  // per device: the first span's ready
  absl::Status s = absl::OkStatus();
  auto ms = [&](cudaEvent_t from, cudaEvent_t to) {
    float v = 0;
    const cudaError_t e = cudaEventElapsedTime(&v, from, to);
    if (e != cudaSuccess && s.ok()) {
      s = internal::CudaStatus(e, "cudaEventElapsedTime (started-call timeline)", __FILE__,
                               __LINE__);
    }
    return static_cast<double>(v);
  };
  for (const std::shared_ptr<TimelineEntry>& e : taken) {
    if (!s.ok()) break;
    s = internal::CudaStatus(cudaSetDevice(e->device), "cudaSetDevice", __FILE__, __LINE__);
    // joined is on the compute stream before its wait for the collective: end may come later.
    if (s.ok()) s = internal::CudaStatus(cudaEventSynchronize(e->joined), "cudaEventSynchronize",
                                         __FILE__, __LINE__);
    if (s.ok()) s = internal::CudaStatus(cudaEventSynchronize(e->end), "cudaEventSynchronize",
                                         __FILE__, __LINE__);
    if (!s.ok()) break;
    cudaEvent_t b = base.emplace(e->device, e->ready).first->second;
    StartedCallSpan span;
    span.what = e->what;
    span.device = e->device;
    span.ready_ms = ms(b, e->ready);
    span.begin_ms = ms(b, e->begin);
    span.end_ms = ms(b, e->end);
    span.joined_ms = ms(b, e->joined);
    out.push_back(std::move(span));
  }
  cudaSetDevice(current);
  if (!s.ok()) return s;
  // From the earliest ready of each device (another compute stream may have started earlier).
  std::map<int, double> earliest;
  for (const StartedCallSpan& x : out) {
    auto [it, fresh] = earliest.emplace(x.device, x.ready_ms);
    if (!fresh) it->second = std::min(it->second, x.ready_ms);
  }
  for (StartedCallSpan& x : out) {
    const double d = earliest[x.device];
    x.ready_ms -= d;
    x.begin_ms -= d;
    x.end_ms -= d;
    x.joined_ms -= d;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore& store,
                                                                     const NcclOptions& options) {
  return CreateNccl(store, nullptr, options);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<TcpStore> store, const NcclOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("CreateNcclCommunicator: null store");
  TcpStore& s = *store;
  return CreateNccl(s, std::move(store), options);
}

absl::Status AbortNcclWorld(Communicator& comm, const absl::Status& why) {
  if (why.ok()) return absl::InvalidArgumentError("AbortNcclWorld: the status is OK");
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("AbortNcclWorld: ", comm.name(), " is not an NCCL communicator"));
  }
  return nccl->AbortWorld(why);
}

absl::Status CheckNcclWorld(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckNcclWorld: ", comm.name(), " is not an NCCL communicator"));
  }
  return nccl->CheckWorld();
}

absl::Status FlushNccl(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FlushNccl: ", comm.name(), " is not an NCCL communicator"));
  }
  return nccl->Flush();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromEnv(
    const NcclOptions& options) {
  absl::StatusOr<DistributedEnv> env = DistributedEnvFromEnvironment();
  if (!env.ok()) return env.status();
  absl::StatusOr<std::unique_ptr<TcpStore>> made =
      TcpStore::Create(env->store_options(options.timeout));
  if (!made.ok()) return made.status();
  std::shared_ptr<TcpStore> store = *std::move(made);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicator(store, options);
  if (!comm.ok()) return comm.status();
  // Every rank has read the id before any returns (the communicators keep the store from here).
  if (absl::Status s = store->Barrier("nccl/created"); !s.ok()) return s;
  return comm;
}

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::collectives
