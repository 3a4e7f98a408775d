// SimulatedLinkCommunicator: a Communicator wrapper whose every collective, blocking or started,
// completes only once the modelled time of a link has passed since the call began, so that the
// benefit of overlapping communication with compute can be measured on a machine without a
// network (this one: 2 cores, ranks as threads). It SLEEPS out the rest of the modelled time
// (never spins), so a waiting rank takes no core from compute.
//
//   // Every in-process rank's world on a 1 GB/s link with 50 us per collective:
//   SimulatedLink link{.ring = {.alpha_s = 50e-6, .busbw = 1e9}};
//   RunInProcess(4, [&](Communicator& world) -> absl::Status {
//     SimulatedLinkCommunicator slow(&world, link);
//     return slow.AllReduce(x, x, n, DataType::kF32, ReduceOp::kSum);  // >= ModelledSeconds
//   });
//   // A TrainGpt run: TrainOptions::hooks.spmd_runner = SimulatedLinkSpmdRunner(link)
//   // (models/train/simulated_link_runner.h); a launched process: wrap its world and set runtime.comm.
//
// The model (per collective kind and group size t; S the call's full bytes as perfmodel's
// RingCost takes them; 0 when t == 1):
//   all_reduce                    RingCost(kAllReduce, t, S)     = alpha + 2 (t-1)/t S / B
//   all_gather(_v)                RingCost(kAllGather, t, S)     = alpha +   (t-1)/t S / B,
//                                 S = the gathered output
//   reduce_scatter(_v)            RingCost(kReduceScatter, t, S) = alpha +   (t-1)/t S / B,
//                                 S = the unreduced input
//   all_to_all(_v)                alpha + max(bytes this rank sends to others, receives) / B
//   broadcast, ppermute           alpha + S / B (S = the buffer; one pipelined hop per rank)
//   send, recv                    alpha + S / B
//   barrier                       alpha
//   split                         not modelled (setup)
// so the planner (models/planner, which prices collectives with the same RingCost) prices
// exactly what the link does. The modelled time starts when the call begins on the rank (a
// started call: when it begins on the lane, after the started calls before it: one link, FIFO)
// and includes the inner backend's own time: a call that took longer than modelled returns at
// once. Blocking calls and started calls are two links (they do not share the bandwidth).
//
// Started calls overlap the caller (OverlapsStartedCalls() is true whatever the inner backend):
// the wrapper owns a lane (collectives/async_lane.h) over the inner communicator's duplicate
// group; a started call runs the inner *blocking* call there, then sleeps out the rest. Tags
// (TagNextCall) go to the call they precede, blocking or started. Split returns wrapped
// children (their own lanes). A started call's handle dropped without Wait() refuses the
// lane's later calls; the peers' matching calls end at the inner backend's timeout.
#ifndef SHARDMAP_COLLECTIVES_SIMULATED_LINK_H_
#define SHARDMAP_COLLECTIVES_SIMULATED_LINK_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/async_lane.h"
#include "collectives/communicator.h"
#include "collectives/forwarding_communicator.h"
#include "perfmodel/ring_cost.h"

namespace shardmap::collectives {

struct SimulatedLink {
  perfmodel::RingLink ring;  // alpha_s: per-collective latency; busbw: bytes/s (> 0)
};

// The modelled seconds of one call (see the top of this file). kind: "all_reduce",
// "all_gather", "reduce_scatter", "all_to_all", "broadcast", "ppermute", "send", "recv",
// "barrier"; bytes: S as above; t: the group size.
double ModelledSeconds(const SimulatedLink& link, const std::string& kind, int t, double bytes);

// What one rank's link did (shared by a communicator and the children its Split makes;
// thread-safe: the lane's thread adds into it too).
struct LinkStats {
  int64_t calls = 0;
  double modelled_seconds = 0;  // the sum of the calls' modelled times
  double slept_seconds = 0;     // of which spent sleeping (the rest was the inner call)
};

class SimulatedLinkCommunicator : public ForwardingCommunicator {
 public:
  // Borrows `inner` (it outlives this) / owns it. InvalidArgument-free: a link with busbw <= 0
  // or a negative alpha is refused by every call (see Check()).
  SimulatedLinkCommunicator(collectives::Communicator* inner, SimulatedLink link);
  SimulatedLinkCommunicator(std::unique_ptr<collectives::Communicator> inner, SimulatedLink link);
  ~SimulatedLinkCommunicator() override;

  // OK, or InvalidArgument saying what is wrong with the link.
  static absl::Status Check(const SimulatedLink& link);

  // This rank's totals so far (this communicator and its splits).
  LinkStats stats() const;

  std::string name() const override;

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
  absl::Status Barrier() override;

  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, collectives::DataType dtype,
      collectives::ReduceOp op) override;
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, collectives::DataType dtype) override;
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, collectives::DataType dtype,
      collectives::ReduceOp op) override;
  // On the same lane (so the link's ppermutes and other started calls share its FIFO).
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> PpermuteStart(
      const void* send, void* recv, size_t count, collectives::DataType dtype,
      absl::Span<const std::pair<int, int>> pairs) override;
  bool OverlapsStartedCalls() const override { return true; }

  absl::StatusOr<std::unique_ptr<collectives::Communicator>> Split(int color, int key) override;

  void TagNextCall(const collectives::CallTag& tag) override { next_tag_ = tag; }
  // It sleeps on the host in every call: nothing to record into a graph.
  bool SupportsGraphCapture() const override { return false; }

  struct Shared;  // the stats, shared with the splits (simulated_link.cc)

 private:
  SimulatedLinkCommunicator(collectives::Communicator* inner,
                            std::unique_ptr<collectives::Communicator> owned, SimulatedLink link,
                            std::shared_ptr<Shared> shared);
  // Runs `call` on the inner communicator (the pending tag first), then sleeps out the rest of
  // the modelled time of (kind, bytes).
  template <typename F>
  absl::Status Blocking(const char* kind, double bytes, F&& call);
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> Started(
      std::string what, const char* kind, double bytes, collectives::AsyncLane::Call call);
  void ForwardTag();

  const SimulatedLink link_;
  const absl::Status link_ok_;
  std::shared_ptr<Shared> shared_;
  collectives::CallTag next_tag_;
  // Last: destroyed (its thread joined) first.
  collectives::LazyAsyncLane lane_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_SIMULATED_LINK_H_
