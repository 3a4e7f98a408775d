// The collectives of the Communicator interface as values (for call descriptors, error messages
// and wire formats), and ForwardingCommunicator: the forwarding every host backend repeats, from
// the interface's calls to a backend's own Do* primitives (the even gathers, scatters and
// all-to-alls become the uneven ones with equal counts), each result passed through Finish.
// Shared by the in-process and Gloo backends.
//
//   class MyComm final : public internal::ForwardingCommunicator {
//     absl::Status Finish(absl::Status s) override { /* poison on error */ return s; }
//     absl::Status DoAllGatherV(Op kind, ...) override { ... }   // kind: kAllGather or kAllGatherV
//     ...
//   };
//   OpName(Op::kReduceScatterV);  // "ReduceScatterV"
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_COLLECTIVE_OP_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_COLLECTIVE_OP_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"

namespace shardmap::collectives::internal {

// Starts at 1: a zeroed descriptor on the wire (Gloo) is no valid op.
enum class Op : uint8_t {
  kAllReduce = 1,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllGatherV,
  kReduceScatterV,
  kAllToAllV,
  kBroadcast,
  kPpermute,
  kBarrier,
  kSplit,
};

// "AllReduce", ...; "unknown op" for values outside the enum (a corrupted descriptor).
const char* OpName(Op op);
// Whether the call has a dtype and count (all but Barrier and Split) / a reduce op.
inline bool HasDtype(Op op) { return op != Op::kBarrier && op != Op::kSplit; }
inline bool HasReduce(Op op) {
  return op == Op::kAllReduce || op == Op::kReduceScatter || op == Op::kReduceScatterV;
}

// Implements the data calls of Communicator by forwarding to the backend's primitives; the even
// variants pass counts of size() equal entries and their own Op, so descriptors and messages
// still name the call the user made. Barrier, Split, tags and the rest stay the backend's.
class ForwardingCommunicator : public Communicator {
 public:
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) final {
    return Finish(DoAllReduce(send, recv, count, dtype, op));
  }
  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         DataType dtype) final {
    const std::vector<size_t> counts(size(), send_count);
    return Finish(DoAllGatherV(Op::kAllGather, send, recv, counts, dtype));
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                             ReduceOp op) final {
    const std::vector<size_t> counts(size(), recv_count);
    return Finish(DoReduceScatterV(Op::kReduceScatter, send, recv, counts, dtype, op));
  }
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype) final {
    const std::vector<size_t> counts(size(), count);
    return Finish(DoAllToAllV(Op::kAllToAll, send, counts, recv, counts, dtype));
  }
  absl::Status AllGatherV(const void* send, void* recv, absl::Span<const size_t> counts,
                          DataType dtype) final {
    return Finish(DoAllGatherV(Op::kAllGatherV, send, recv, counts, dtype));
  }
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const size_t> counts,
                              DataType dtype, ReduceOp op) final {
    return Finish(DoReduceScatterV(Op::kReduceScatterV, send, recv, counts, dtype, op));
  }
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, DataType dtype) final {
    return Finish(DoAllToAllV(Op::kAllToAllV, send, send_counts, recv, recv_counts, dtype));
  }
  absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root) final {
    return Finish(DoBroadcast(buffer, count, dtype, root));
  }
  absl::Status Send(const void* buffer, size_t count, DataType dtype, int peer) final {
    return Finish(DoSend(buffer, count, dtype, peer));
  }
  absl::Status Recv(void* buffer, size_t count, DataType dtype, int peer) final {
    return Finish(DoRecv(buffer, count, dtype, peer));
  }
  absl::Status Ppermute(const void* send, void* recv, size_t count, DataType dtype,
                        absl::Span<const std::pair<int, int>> pairs) final {
    return Finish(DoPpermute(send, recv, count, dtype, pairs));
  }

 protected:
  // Every call's status goes through here (the backend poisons its world on an error).
  virtual absl::Status Finish(absl::Status s) = 0;
  virtual absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType dtype,
                                   ReduceOp op) = 0;
  // kind: kAllGather / kAllGatherV (and likewise below); counts has size() entries.
  virtual absl::Status DoAllGatherV(Op kind, const void* send, void* recv,
                                    absl::Span<const size_t> counts, DataType dtype) = 0;
  virtual absl::Status DoReduceScatterV(Op kind, const void* send, void* recv,
                                        absl::Span<const size_t> counts, DataType dtype,
                                        ReduceOp op) = 0;
  virtual absl::Status DoAllToAllV(Op kind, const void* send,
                                   absl::Span<const size_t> send_counts, void* recv,
                                   absl::Span<const size_t> recv_counts, DataType dtype) = 0;
  virtual absl::Status DoBroadcast(void* buffer, size_t count, DataType dtype, int root) = 0;
  virtual absl::Status DoSend(const void* buffer, size_t count, DataType dtype, int peer) = 0;
  virtual absl::Status DoRecv(void* buffer, size_t count, DataType dtype, int peer) = 0;
  virtual absl::Status DoPpermute(const void* send, void* recv, size_t count, DataType dtype,
                                  absl::Span<const std::pair<int, int>> pairs) = 0;
};

}  // namespace shardmap::collectives::internal

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_COLLECTIVE_OP_H_
