// TimedCommunicator: a Communicator that forwards every call to another one and adds up, per
// collective op, the calls, the bytes this rank passed in and the time spent inside (wall and
// this thread's CPU time). Sub-groups made by Split are wrapped too and add into the same stats,
// so wrapping a rank's world before RunOnCommunicator times every typed collective of the rank.
//
//   CommStats stats;
//   TimedCommunicator timed(&world_comm, &stats);     // per rank; stats owned by the caller
//   RunOnCommunicator(timed, mesh, body);
//   stats.Total().seconds;                             // wall time this rank spent in collectives
//
// Bytes follow the collective log's convention (shardmap/rank_context.h): what the call took from
// the rank, so a reduce_scatter counts its whole input and an all_gather its one block. The time
// includes waiting for the slower peers: on simulated devices that is part of the cost.
// Barrier is forwarded but not counted (the benchmarks fence their steps with it).
#ifndef SHARDMAP_BENCH_TIMED_COMMUNICATOR_H_
#define SHARDMAP_BENCH_TIMED_COMMUNICATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "collectives/communicator.h"
#include "collectives/forwarding_communicator.h"

namespace shardmap::bench {

struct OpStats {
  int64_t calls = 0;
  double bytes = 0;
  double seconds = 0;      // wall
  double cpu_seconds = 0;  // this thread's CPU time inside the calls
};

// One rank's counters (not thread-safe: a rank's communicators are used by its one thread).
struct CommStats {
  std::map<std::string, OpStats> by_op;
  OpStats Total() const;
  void Clear() { by_op.clear(); }
};

class TimedCommunicator : public collectives::ForwardingCommunicator {
 public:
  // Neither pointer is owned; both must outlive this object.
  TimedCommunicator(collectives::Communicator* inner, CommStats* stats);
  TimedCommunicator(std::unique_ptr<collectives::Communicator> inner, CommStats* stats);

  std::string name() const override { return "timed(" + inner()->name() + ")"; }

  absl::Status AllReduce(const void* send, void* recv, size_t count, collectives::DataType dtype,
                         collectives::ReduceOp op) override;
  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         collectives::DataType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count,
                             collectives::DataType dtype, collectives::ReduceOp op) override;
  absl::Status AllToAll(const void* send, void* recv, size_t count,
                        collectives::DataType dtype) override;
  absl::Status AllGatherV(const void* send, void* recv, absl::Span<const size_t> counts,
                          collectives::DataType dtype) override;
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const size_t> counts,
                              collectives::DataType dtype, collectives::ReduceOp op) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts,
                         collectives::DataType dtype) override;
  absl::Status Broadcast(void* buffer, size_t count, collectives::DataType dtype,
                         int root) override;
  absl::Status Send(const void* buffer, size_t count, collectives::DataType dtype,
                    int peer) override;
  absl::Status Recv(void* buffer, size_t count, collectives::DataType dtype, int peer) override;
  absl::Status Ppermute(const void* send, void* recv, size_t count, collectives::DataType dtype,
                        absl::Span<const std::pair<int, int>> pairs) override;
  // Barrier: forwarded untimed (ForwardingCommunicator).
  // Timed up to the start only (the transfer overlaps the caller's work until Wait).
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> PpermuteStart(
      const void* send, void* recv, size_t count, collectives::DataType dtype,
      absl::Span<const std::pair<int, int>> pairs) override;
  // Started calls: the start is counted under "<op>_start" (its bytes, the time inside the
  // start) and the Wait() under "<op>_wait" (the time the caller waited: what the overlap did
  // not hide; no bytes, one call per wait).
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, collectives::DataType dtype,
      collectives::ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, collectives::DataType dtype) override;
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, collectives::DataType dtype,
      collectives::ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> Split(int color, int key) override;

 private:
  template <typename F>
  absl::Status Timed(const char* op, double bytes, F&& call);
  template <typename F>
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> TimedStart(const char* op,
                                                                             double bytes,
                                                                             F&& start);

  CommStats* stats_;
};

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_TIMED_COMMUNICATOR_H_
