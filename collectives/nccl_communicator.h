// NCCL backend: one rank per process (and per GPU), across nodes. Rendezvous through a TcpStore
// (rank 0 creates the ncclUniqueId and serves it); sub-groups through ncclCommSplit.
// Communicators are non-blocking (ncclConfig_t::blocking = 0): every call polls
// ncclCommGetAsyncError while it enqueues, and on an error or after `timeout` aborts the
// communicator (ncclCommAbort) and returns a Status naming the op, the group and the reason.
//
// Blocking calls are stream-ordered (as PyTorch's ProcessGroupNCCL without
// TORCH_NCCL_BLOCKING_WAIT): AllReduce, AllGather, ReduceScatter, AllToAll, the V variants,
// Broadcast, Send, Recv and Ppermute return once the collective is enqueued on
// memory_space().stream, without a host wait. Work enqueued later on that stream (or ordered
// after it by an event) sees the result; the host sees it after its own read on that stream
// (a cudaMemcpyAsync on it and a stream synchronisation: the step's loss read), never earlier.
// Reading the buffers on another stream, or freeing them from another stream, without ordering
// it after this one is the caller's error. Every such call records an event after it and hands
// it to the world's watchdog thread (nccl_watchdog.h): a call that fails asynchronously (an
// NCCL error, a peer's published failure, the world failing in another group, `timeout`
// passed) is reported there as a failed blocking call would be (published for the peers, the
// communicator aborted so that its stuck kernel exits and the stream moves on) and poisons the
// world: the next call of any communicator of the world is refused (Aborted, naming the
// failure; a host-waiting call already in progress fails with the failure's own code), and
// CheckNcclWorld / FlushNccl below return it, with its own code, at the caller's sync point.
// A value read after the failure is garbage: check at the sync point.
// The exceptions wait for the stream on the host as before (counted, kNcclBlockingCall):
//   - Barrier(): a host barrier by contract (benchmarks time with it, processes hand files over
//     with it); it also waits for everything enqueued on the stream before it;
//   - every blocking call when NcclOptions::blocking_wait is set or SHARDMAP_NCCL_BLOCKING_WAIT
//     is 1/true/on (the old behaviour: failures surface in the call that failed).
// Split() waits for the new communicator on the host (a rendezvous of the ranks, not a wait for
// the GPU: not counted), as before. Under a CUDA graph capture nothing is waited for or watched
// (the collective is only recorded; replays are not watched).
//
// Failures across processes: a communicator made with a shared store (the shared_ptr factory,
// FromEnv) keeps it, with a PeerFailureBoard per world (peer_failure_board.h). The rank whose
// call fails first publishes its status there before it aborts; its peers, whose NCCL calls
// then fail or stay stuck, see the publication (their host waits and the watchdog look at the
// board every 100 ms once a call has been pending that long) and
// return that rank's own code and message ("rank 2 failed: root 7 is not a rank ..."). When no
// rank published (a timeout, an NCCL error), the ranks of the group publish the collective they
// are stuck in (numbered per
// communicator; Send/Recv are not compared, Split is compared without its color and key), so
// collectives that differ fail on every rank with InvalidArgument naming both ("rank 0 called
// AllReduce(f32, count=4, sum) #2 but rank 2 called AllReduce(f32, count=5, sum) #2"). NCCL
// itself does not compare calls, so a mismatch that NCCL happens to complete is caught only when
// a later call gets stuck. Every store access is bounded (NcclOptions::peer_failure_wait).
//
//   // Started by `collectives/launch --nproc_per_node=8 -- prog` or torchrun / srun:
//   absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateNcclCommunicatorFromEnv({});
//   // buffers are device pointers on comm->memory_space().device_index, ordered on its stream;
//   // calls return once the collective is enqueued there (stream-ordered, see above).
//   (*comm)->AllReduce(d_x, d_x, n, DataType::kBF16, ReduceOp::kSum);
//   ... more work on the stream, then the step's read on the stream (the caller's host wait);
//   absl::Status s = CheckNcclWorld(**comm);   // OK, or the asynchronous failure
//
// Started calls (AllReduceStart, AllGatherStart, ReduceScatterStart; OverlapsStartedCalls):
//   - Each communicator gets, at its first started call, a communication stream of its own and,
//     on it, a duplicate NCCL communicator (ncclCommSplit(comm, 0, rank)). Why not the same
//     ncclComm_t on two streams: NCCL orders a communicator's operations by their issue order
//     and each kernel waits for its peers, so a blocking call and a started call issued in
//     different orders on different ranks (allowed: communicator.h matches started calls apart
//     from blocking ones) would pair the wrong operations or deadlock. Two communicators running
//     at once on one GPU is what every PyTorch process group does; their kernels must be able to
//     run concurrently, which NCCL guarantees only when every rank issues them in the same host
//     order (true under SPMD; NCCL >= 2.26's NCCL_LAUNCH_ORDER_IMPLICIT=1 makes the device
//     follow that order).
//   - Start: records `ready` on the compute stream (memory_space().stream), makes the comm
//     stream wait for it, enqueues the collective there and records `done`. Wait(): the
//     compute stream waits for `done` (cudaStreamWaitEvent). No host synchronisation in either
//     (the enqueue of the non-blocking communicator is polled, which does not wait for the GPU).
//   - Memory (PyTorch's record_stream problem): a caching allocator that hands a freed block to
//     later work on the same stream would race with a collective still reading it on the comm
//     stream. The contract (communicator.h) solves it without recording streams: the caller
//     keeps send and recv alive and unchanged until Wait(); after Wait() the compute stream is
//     ordered after the collective, so a block freed then (stream-ordered on the compute stream)
//     is reused only by work that runs after the collective. The backend itself allocates
//     nothing for these calls. shardmap's typed calls keep that rule by construction
//     (shardmap/async_collectives.cc: PendingValue's state holds the input, the buffer sent and
//     the output until Wait(), and its handle is destroyed first, so even an abandoned call is
//     ordered before its buffers are freed). The handle also keeps the compute stream alive.
//   - Failures: a failure at the start (arguments, enqueue) aborts and poisons the world as a
//     blocking call does; an asynchronous one (a peer died) is found by the watchdog, which
//     watches each started collective on the comm stream like a stream-ordered blocking call;
//     Wait() and the next call report a world that already failed. A handle dropped unwaited
//     is ordered as a Wait(), printed on stderr, and refuses later starts (FailedPrecondition).
//   - CUDA graphs: the event record / stream wait pair is how a capture forks a second stream
//     and joins it, so a started call and its Wait() are capturable (every started call must be
//     waited before the capture ends). The first started call, which opens the comm stream's
//     communicator (a host-blocking ncclCommSplit), is refused under capture with that reason:
//     make one started call uncaptured first. A call started outside a capture must be waited
//     before the capture begins (CUDA refuses, inside a capture, to wait for an event recorded
//     outside it: that Wait() fails).
//   - Host waits (base/host_waits.h): a started call and its Wait() wait for nothing on
//     the host (the opening split included), nor does a stream-ordered blocking call; Barrier()
//     and, with blocking_wait, every blocking call wait for the stream once, counted as
//     kNcclBlockingCall; FlushNccl waits once, counted as kStreamSync. The non-blocking
//     communicator's enqueue is polled (ncclCommGetAsyncError), which may wait for peers on
//     the host (NCCL's lazy connection setup) but never for the GPU: not counted.
//
// Without the CUDA toolkit at build time, the factories return Unimplemented.
#ifndef SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/peer_failure_board.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

struct NcclOptions {
  // How long one call (or the initialisation, or a split) may take before the communicator is
  // aborted.
  absl::Duration timeout = absl::Minutes(5);
  // How long a stream-ordered call may stay unfinished on its stream before the watchdog fails
  // the world with it; zero: `timeout`. Its own option so that a short watch (a test's) does
  // not also bound a slow NCCL initialisation or split. Splits inherit it.
  absl::Duration watch_timeout = absl::ZeroDuration();
  // CUDA device of this rank; -1: LOCAL_RANK modulo the visible device count.
  int device = -1;
  // cudaStream_t the collectives run on; nullptr: the communicator creates its own.
  void* stream = nullptr;
  // How long a rank whose call failed because of a peer (a remote error, an abort, the timeout)
  // waits for the peer's published status before it reports its own error; also the limit on
  // publishing its own. Only for communicators that keep their store.
  absl::Duration peer_failure_wait = absl::Seconds(2);
  // Every blocking call waits for its stream on the host (and reports its own failure), as
  // PyTorch's TORCH_NCCL_BLOCKING_WAIT=1; the environment variable SHARDMAP_NCCL_BLOCKING_WAIT
  // (1, true or on) sets it for every communicator of the process. Off: stream-ordered calls
  // (see the header comment). Splits inherit it.
  bool blocking_wait = false;
};

// True when built with CUDA and NCCL.
bool NcclCompiledIn();

// Collective over all ranks of `store`: every rank calls it. The communicator and those split
// from it keep the store (keys "nccl/..."), so that a failing rank's peers report its status.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<TcpStore> store, const NcclOptions& options);

// The same without keeping the store: it is only used during the call, so it may be destroyed
// afterwards once every rank returned; peers then learn of a failure only from NCCL itself (a
// remote error or the timeout), with NCCL's error instead of the failing rank's status.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore& store,
                                                                     const NcclOptions& options);

// Fails this rank's NCCL world on purpose, for a program that failed outside a collective (a
// step threw, a check failed) and cannot carry on: publishes `why` (not OK) for the peers,
// whose pending and later calls then fail with this rank's code and message, and aborts every
// communicator of the world in this process (later calls are refused with Aborted). Call it from
// the thread that makes `comm`'s calls (not during one); `comm` may be the world or a split.
// InvalidArgument when `comm` is not an NCCL communicator or `why` is OK.
absl::Status AbortNcclWorld(Communicator& comm, const absl::Status& why);

// The asynchronous failure of `comm`'s NCCL world found so far: runs one watchdog pass now on
// this thread (it asks the pending calls' events; no host wait), then returns the world's
// failure, OK while there is none. Call it at the step's sync point, after the read that waited
// for the stream (the loss read): a call that failed before that read is reported here (the
// value read is then garbage). InvalidArgument when `comm` is not an NCCL communicator.
absl::Status CheckNcclWorld(Communicator& comm);

// Waits for `comm`'s stream (memory_space().stream) on the host (a host wait, counted
// kStreamSync), then CheckNcclWorld: every call enqueued on that stream before it (started calls
// once waited) completed, or its failure is returned. Bounded: a stuck call is aborted by the
// watchdog at its timeout, which lets the stream finish.
absl::Status FlushNccl(Communicator& comm);

// Started-call timeline (the GPU bundle's overlap check, tests/gpu_nccl_overlap_check.cc).
// While on, every started call of this process that is not being captured records four timing
// events: `ready` on the compute stream at the start, `begin` and `end` on the communication
// stream around the collective, and `joined` on the compute stream at Wait(), before the compute
// stream is made to wait for the collective. So [begin, end] is when the collective ran, and the
// compute stream stood waiting for it only in [joined, end] (when end > joined). Off by default
// (the events cost a few microseconds per call).
struct StartedCallSpan {
  std::string what;  // "NCCL AllReduceStart(bf16, count=..., sum) on group ..."
  int device = 0;
  // Milliseconds after the earliest `ready` of the spans taken together on the same device.
  double ready_ms = 0, begin_ms = 0, end_ms = 0, joined_ms = 0;
};
void SetNcclStartedCallTimeline(bool on);
// The spans of the started calls waited so far (in start order), and forgets them; calls not
// waited yet stay for a later take. Waits for their events (host waits, not counted in
// base/host_waits.h: this is the measurement). Empty without CUDA.
absl::StatusOr<std::vector<StartedCallSpan>> TakeNcclStartedCallTimeline();

// Reads DistributedEnv, rendezvous through a TcpStore at MASTER_ADDR:MASTER_PORT.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicatorFromEnv(
    const NcclOptions& options);

namespace internal {
// The store key CreateNcclCommunicator publishes the next unique id under: numbered by a
// counter in `store` (per store, per rank), so communicators made through several stores in
// uneven numbers still agree on their keys. Exposed for nccl_unique_id_key_test.
absl::StatusOr<std::string> NextNcclUniqueIdKey(TcpStore& store);

// What a failed NCCL call reports, and whether this rank publishes it for its peers. `own`: the
// call's own error; `origin`: kLocal for this rank's doing (arguments, CUDA, enqueueing), kPeer
// for a wait that failed (a remote or asynchronous error, an abort, the timeout); `first`: the
// world's first published failure, if any; `mismatch`: the calls of the group disagreed after
// the wait failed. A peer's failure published first is reported with the peer's code and message
// (whatever the origin: the world failed before this call did); otherwise a mismatch this rank
// found, or its own error, is reported and published.
struct ResolvedNcclFailure {
  absl::Status status;
  bool publish = false;
};
ResolvedNcclFailure ResolveNcclFailure(const absl::Status& own, FailureOrigin origin,
                                       int world_rank, const std::optional<PeerFailure>& first,
                                       const std::optional<absl::Status>& mismatch);

// The failure path of one NCCL call, without NCCL: what the call was and how it failed.
struct NcclCallFailure {
  std::string where;      // "NCCL AllReduce(f32, count=4, sum) on group 'g' (rank 0 of 3)"
  absl::Status own;       // the call's own error
  FailureOrigin origin = FailureOrigin::kLocal;
  std::string group_key;   // the group's keys on the board ("world", "world/s1c0", ...)
  std::string group_name;  // for messages
  int group_rank = 0;
  int group_size = 1;
  // NcclCallRecord of the call, compared across the group at a timeout; empty for calls that
  // not every rank of the group makes (point-to-point), which are not compared.
  std::string call_record;
  int world_rank = 0;
  absl::Duration peer_failure_wait = absl::Seconds(2);
};
// Consults `board` (null: no store kept) as the failure requires (after a failed wait: the
// first published failure, or else the group's pending calls; after a local failure: a failure
// published already), publishes what is this rank's to tell, and returns the call's status:
// "<where> failed: <reason>; the communicator was aborted". The caller aborts the communicator
// after it returned (so after the publication).
absl::Status ReportNcclCallFailure(PeerFailureBoard* board, const NcclCallFailure& call);

// The call a rank records at a timeout (compared across the group): "<what> #<n>", n counting
// this communicator's calls from 1.
std::string NcclCallRecord(absl::string_view what, int64_t call_number);

// SHARDMAP_NCCL_BLOCKING_WAIT's value: true for 1, true or on (any case); false otherwise.
bool NcclBlockingWaitFromEnv(const char* value);
}  // namespace internal

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_NCCL_COMMUNICATOR_H_
