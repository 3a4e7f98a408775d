// Communicator: collectives over raw buffers among the ranks of a group. Backends: in-process
// (threads of one process; CPU or GPU memory) and NCCL. Depends on nothing else of shardmap.
//
//   // On every rank of a world of size n:
//   std::vector<float> x(1024, comm.rank());
//   absl::Status s = comm.AllReduce(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
//   // every rank now holds 0+1+...+(n-1) in each element (bitwise the same on all ranks)
//
//   // A sub-group per tensor-parallel row (like MPI_Comm_split); collective over this group:
//   absl::StatusOr<std::unique_ptr<Communicator>> tp = comm.Split(/*color=*/rank / 4, /*key=*/rank);
//
// Every call is collective over the group (send/recv: over the pair) and blocking for the host
// unless the backend documents otherwise. Failures (a peer that failed or left, a timeout, a
// mismatched call in debug mode) come back as a Status naming the op, the group and the rank.
// In-place operation is allowed where send == recv (AllReduce, and AllGather/ReduceScatter when
// the send buffer is this rank's slice of recv / the recv buffer is this rank's slice of send).
#ifndef SHARDMAP_COLLECTIVES_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_COMMUNICATOR_H_

// shardmap is C++20. Checked here, at the root of every target's includes, so that a workspace
// built without -std=c++20 stops with this line instead of pages of template errors.
#if __cplusplus < 202002L
#error "shardmap needs C++20: add `build --cxxopt=-std=c++20 --host_cxxopt=-std=c++20` to your .bazelrc (see shardmap's deps.bzl)"
#endif


#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardmap::collectives {

enum class DataType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64 };
enum class ReduceOp : uint8_t { kSum, kProd, kMax, kMin, kAvg };

size_t DataTypeSize(DataType t);
const char* DataTypeName(DataType t);
const char* ReduceOpName(ReduceOp op);
// False for values outside the enums (e.g. a cast from a corrupted integer).
bool IsValidDataType(DataType t);
bool IsValidReduceOp(ReduceOp op);

// A ppermute's pairs checked once for every backend: ranks in [0, size), each rank at most once
// as a source and once as a destination (InvalidArgument naming the pair and the repeated rank,
// without a backend prefix: callers add theirs). On success, `rank`'s peers: the rank it receives
// from and the rank it sends to, -1 for none.
struct PpermutePeers {
  int source = -1;
  int dest = -1;
};
absl::StatusOr<PpermutePeers> ValidatePpermutePairs(absl::Span<const std::pair<int, int>> pairs,
                                                    int size, int rank);

// What the caller (shardmap's typed layer) wants checked across the ranks of the next call of a
// communicator, beyond what the backend compares itself (op, dtype, count): e.g. the op as the
// user wrote it, the mesh axes, the tensor shape and the program-wide sequence number of the
// collective. Under SPMD every rank of a group issues the same tagged call, so a difference means
// rank-dependent control flow or mismatched shapes: the call fails on every rank of the group
// with InvalidArgument naming both ranks' descriptions (built by `describe`, only on failure).
// A tag applies to the next collective call on that communicator (Split included), then clears.
struct CallTag {
  static constexpr int kWords = 14;
  uint64_t words[kWords] = {};  // compared bitwise; all zero = untagged
  // Formats a rank's tag for the error message (a plain function: it may read a peer's words).
  std::string (*describe)(const uint64_t* words) = nullptr;
};

// Where the buffers of a call live. GPU buffers are used on `stream` (a cudaStream_t).
struct MemorySpace {
  bool device = false;
  int device_index = 0;
  void* stream = nullptr;
  // Buffers of meta tensors (no data; shape-only execution: shape_only_communicator.h).
  bool meta = false;
};

// A non-blocking call in flight (Communicator::PpermuteStart, AllReduceStart, ...). Call Wait()
// exactly once: it returns when this rank's part is over (recv holds the data, send may be
// reused; on a GPU backend: once the caller's stream is ordered after it, see AllReduceStart) or
// failed; a second Wait() is FailedPrecondition. Destroying it without Wait() is a program
// error: the backend finishes or abandons the transfer before the destructor returns (the
// buffers are never touched afterwards) and reports it where it can (the in-process and Gloo
// backends fail the world with an error saying the call was never waited; a backend whose start
// already did the whole call, the default below, has nothing left to report).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short description for error messages, e.g. "in-process world(8) split(color=1) [4 ranks]".
  virtual std::string name() const = 0;

  // recv[i] = op over ranks of send[i]; count elements.
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                                 ReduceOp op) = 0;
  // recv = concat over ranks of send (send_count elements each; recv has size()*send_count).
  virtual absl::Status AllGather(const void* send, void* recv, size_t send_count,
                                 DataType dtype) = 0;
  // send has size()*recv_count elements; rank r receives op over ranks of chunk r.
  virtual absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count,
                                     DataType dtype, ReduceOp op) = 0;
  // send has size() chunks of count elements; chunk j goes to rank j; recv chunk j came from j.
  virtual absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype) = 0;

  // Uneven variants: counts[r] is rank r's share (the same vector on every rank).
  virtual absl::Status AllGatherV(const void* send, void* recv,
                                  absl::Span<const size_t> counts, DataType dtype) = 0;
  virtual absl::Status ReduceScatterV(const void* send, void* recv,
                                      absl::Span<const size_t> counts, DataType dtype,
                                      ReduceOp op) = 0;
  // send_counts[j]: elements this rank sends to j (packed in rank order in send);
  // recv_counts[j]: elements this rank receives from j (packed in rank order in recv).
  virtual absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                 void* recv, absl::Span<const size_t> recv_counts,
                                 DataType dtype) = 0;

  virtual absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root) = 0;
  virtual absl::Status Send(const void* buffer, size_t count, DataType dtype, int peer) = 0;
  virtual absl::Status Recv(void* buffer, size_t count, DataType dtype, int peer) = 0;
  // pairs (source, destination), each rank at most once as a source and once as a destination;
  // the same list on every rank. A rank that is no destination gets zeros in recv.
  virtual absl::Status Ppermute(const void* send, void* recv, size_t count, DataType dtype,
                                absl::Span<const std::pair<int, int>> pairs) = 0;
  virtual absl::Status Barrier() = 0;

  // Ppermute that returns before the data has moved: send must stay unchanged and recv unread
  // until the returned call's Wait(). Several may be in flight; each rank starts them in the same
  // order (they are matched across ranks by that order) and may wait for them in any order.
  // The default does the blocking Ppermute here, so every backend supports the call (without
  // overlap) and issues it in program order with its CallTag; the in-process backend overrides
  // it so that the copy proceeds while the rank computes (in_process_async.h).
  virtual absl::StatusOr<std::unique_ptr<PendingCollective>> PpermuteStart(
      const void* send, void* recv, size_t count, DataType dtype,
      absl::Span<const std::pair<int, int>> pairs);

  // Non-blocking all-reduce / all-gather / reduce-scatter (the arguments of the blocking calls).
  // The buffers belong to the call until its Wait(): send unchanged, recv unread, both alive
  // (the caller owns them; the backend never frees or keeps them). Several may be in flight;
  // every rank of the group starts them in the same order, and they are matched across ranks by
  // that order among this communicator's started calls, independently of its blocking calls (a
  // backend runs them on its own lane: a background thread over a dedicated duplicate of the
  // group, collectives/async_lane.h, or, on GPUs, a communication stream). The first started
  // call of a communicator may open that lane, a collective over the group (every rank reaches
  // it at the same program point under SPMD): it returns once every rank did. A TagNextCall tag
  // goes to the started call and is compared like a blocking call's. A failure may surface at
  // the start or at Wait(), and fails the communicator's later started calls with its code.
  // Wait() semantics per memory space:
  //  - host memory: Wait() returns once this rank's part is over (recv holds the result);
  //  - GPU memory (NCCL): Wait() does not block the host. It orders memory_space().stream after
  //    the collective (cudaStreamWaitEvent): work enqueued on that stream after Wait() sees recv,
  //    and a buffer freed after Wait() by a stream-ordered allocator keyed on that stream (a
  //    caching allocator that reuses a block for later work on the same stream) is safe, because
  //    any reuse is ordered after the collective. Freeing or reusing a buffer before Wait(), or
  //    from another stream, is the caller's error (PyTorch's record_stream problem: here it is
  //    solved by the rule "keep the buffers until Wait()", not by recording streams).
  // The defaults run the blocking call here (no overlap, program order, CallTag kept), so every
  // backend supports them; OverlapsStartedCalls() says whether this one overlaps.
  virtual absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, DataType dtype, ReduceOp op);
  virtual absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, DataType dtype);
  virtual absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op);
  // Whether the *Start calls proceed while the caller computes (false: the defaults above).
  virtual bool OverlapsStartedCalls() const { return false; }

  // Collective over this group: ranks with the same color form a new group, ordered by key (then
  // by rank). A negative color means "not in any group" (returns nullptr).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // Tags the next collective call (see CallTag). Backends whose ranks publish their calls in
  // shared memory (in-process) or exchange a call descriptor anyway (Gloo) compare tags on every
  // call at no extra round. The default ignores tags: a backend that would need an extra round
  // of communication to compare them (NCCL) does not; see its header.
  virtual void TagNextCall(const CallTag& tag) { (void)tag; }
  // Whether TagNextCall's tags are compared on every call (so callers may rely on the check).
  virtual bool ComparesCallTags() const { return false; }

  // Where this communicator's buffers live (CPU by default).
  virtual MemorySpace memory_space() const { return MemorySpace{}; }
  // Whether calls may be recorded into a CUDA graph being captured on memory_space().stream
  // (they enqueue work and do not wait for it then). False for backends that synchronise with
  // the host inside every call (in-process).
  virtual bool SupportsGraphCapture() const { return false; }
  // The failure, found so far, of calls that returned before their work was done (NCCL's
  // stream-ordered calls, caught by its watchdog: CheckNcclWorld); OK while there is none, and
  // always for backends whose calls finish before they return. Call it at a sync point, after
  // the read that waited for the work (the step's loss read): a value read after a failure is
  // garbage. No host wait.
  virtual absl::Status AsyncError() { return absl::OkStatus(); }
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_COMMUNICATOR_H_
