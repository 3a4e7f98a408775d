#include "collectives/simulated_link.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardmap::collectives {

using collectives::AsyncLane;
using collectives::CallTag;
using collectives::Communicator;
using collectives::DataType;
using collectives::DataTypeSize;
using collectives::PendingCollective;
using collectives::ReduceOp;
using Clock = std::chrono::steady_clock;

struct SimulatedLinkCommunicator::Shared {
  std::mutex mu;
  LinkStats stats;  // guarded by mu
};

namespace {

double Bytes(size_t count, DataType dtype) {
  return static_cast<double>(count) * (collectives::IsValidDataType(dtype) ? DataTypeSize(dtype) : 0);
}

double SumBytes(absl::Span<const size_t> counts, DataType dtype) {
  return Bytes(std::accumulate(counts.begin(), counts.end(), size_t{0}), dtype);
}

// Sleeps until `t0 + seconds` (nothing when that is past); returns the seconds slept.
double SleepUntil(Clock::time_point t0, double seconds) {
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
  const auto now = Clock::now();
  if (now >= end) return 0;
  std::this_thread::sleep_until(end);
  return std::chrono::duration<double>(Clock::now() - now).count();
}

}  // namespace

double ModelledSeconds(const SimulatedLink& link, const std::string& kind, int t, double bytes) {
  if (t <= 1) return 0;
  const perfmodel::CollectiveCost ring = perfmodel::RingCost(link.ring);
  if (kind == "all_reduce") return ring(perfmodel::CollectiveKind::kAllReduce, t, bytes);
  if (kind == "all_gather") return ring(perfmodel::CollectiveKind::kAllGather, t, bytes);
  if (kind == "reduce_scatter") return ring(perfmodel::CollectiveKind::kReduceScatter, t, bytes);
  if (kind == "barrier") return link.ring.alpha_s;
  // all_to_all (bytes: the larger of sent and received), broadcast, ppermute, send, recv.
  return link.ring.alpha_s + bytes / link.ring.busbw;
}

absl::Status SimulatedLinkCommunicator::Check(const SimulatedLink& link) {
  if (!(link.ring.busbw > 0) || !std::isfinite(link.ring.busbw)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated link: busbw must be a positive number of bytes/s, got ", link.ring.busbw,
        " (e.g. 1e9 for 1 GB/s)"));
  }
  if (!(link.ring.alpha_s >= 0) || !std::isfinite(link.ring.alpha_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated link: alpha_s must be a non-negative number of seconds, got ",
        link.ring.alpha_s));
  }
  return absl::OkStatus();
}

SimulatedLinkCommunicator::SimulatedLinkCommunicator(Communicator* inner,
                                                     std::unique_ptr<Communicator> owned,
                                                     SimulatedLink link,
                                                     std::shared_ptr<Shared> shared)
    : ForwardingCommunicator(inner, std::move(owned)),
      link_(link),
      link_ok_(Check(link)),
      shared_(std::move(shared)),
      lane_(collectives::LaneOptions{.name = "simulated link over " + this->inner()->name()}) {}

SimulatedLinkCommunicator::SimulatedLinkCommunicator(Communicator* inner, SimulatedLink link)
    : SimulatedLinkCommunicator(inner, nullptr, link, std::make_shared<Shared>()) {}

SimulatedLinkCommunicator::SimulatedLinkCommunicator(std::unique_ptr<Communicator> inner,
                                                     SimulatedLink link)
    : SimulatedLinkCommunicator(nullptr, std::move(inner), link, std::make_shared<Shared>()) {}

SimulatedLinkCommunicator::~SimulatedLinkCommunicator() = default;

std::string SimulatedLinkCommunicator::name() const {
  return absl::StrCat("simulated link(", link_.ring.busbw / 1e9, " GB/s, ",
                      link_.ring.alpha_s * 1e6, " us) over ", inner()->name());
}

LinkStats SimulatedLinkCommunicator::stats() const {
  std::lock_guard<std::mutex> l(shared_->mu);
  return shared_->stats;
}

void SimulatedLinkCommunicator::ForwardTag() {
  if (collectives::IsTagged(next_tag_)) inner()->TagNextCall(next_tag_);
  next_tag_ = CallTag{};
}

template <typename F>
absl::Status SimulatedLinkCommunicator::Blocking(const char* kind, double bytes, F&& call) {
  if (!link_ok_.ok()) return link_ok_;
  ForwardTag();
  const Clock::time_point t0 = Clock::now();
  absl::Status s = call();
  if (!s.ok()) return s;  // a failed call is not held back
  const double modelled = ModelledSeconds(link_, kind, size(), bytes);
  const double slept = SleepUntil(t0, modelled);
  std::lock_guard<std::mutex> l(shared_->mu);
  shared_->stats.calls += 1;
  shared_->stats.modelled_seconds += modelled;
  shared_->stats.slept_seconds += slept;
  return s;
}

absl::StatusOr<std::unique_ptr<PendingCollective>> SimulatedLinkCommunicator::Started(
    std::string what, const char* kind, double bytes, AsyncLane::Call call) {
  if (!link_ok_.ok()) return link_ok_;
  const CallTag tag = next_tag_;
  next_tag_ = CallTag{};
  const double modelled = ModelledSeconds(link_, kind, size(), bytes);
  return lane_.Start(*inner(), std::move(what), tag,
                     [call = std::move(call), modelled, shared = shared_](Communicator& dup) {
                       const Clock::time_point t0 = Clock::now();  // the link is ours from now
                       absl::Status s = call(dup);
                       if (!s.ok()) return s;
                       const double slept = SleepUntil(t0, modelled);
                       std::lock_guard<std::mutex> l(shared->mu);
                       shared->stats.calls += 1;
                       shared->stats.modelled_seconds += modelled;
                       shared->stats.slept_seconds += slept;
                       return s;
                     });
}

absl::Status SimulatedLinkCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                                  DataType dtype, ReduceOp op) {
  return Blocking("all_reduce", Bytes(count, dtype),
                  [&] { return inner()->AllReduce(send, recv, count, dtype, op); });
}
absl::Status SimulatedLinkCommunicator::AllGather(const void* send, void* recv, size_t send_count,
                                                  DataType dtype) {
  return Blocking("all_gather", Bytes(send_count * size(), dtype),
                  [&] { return inner()->AllGather(send, recv, send_count, dtype); });
}
absl::Status SimulatedLinkCommunicator::ReduceScatter(const void* send, void* recv,
                                                      size_t recv_count, DataType dtype,
                                                      ReduceOp op) {
  return Blocking("reduce_scatter", Bytes(recv_count * size(), dtype),
                  [&] { return inner()->ReduceScatter(send, recv, recv_count, dtype, op); });
}
absl::Status SimulatedLinkCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                                 DataType dtype) {
  return Blocking("all_to_all", Bytes(count * (size() - 1), dtype),
                  [&] { return inner()->AllToAll(send, recv, count, dtype); });
}
absl::Status SimulatedLinkCommunicator::AllGatherV(const void* send, void* recv,
                                                   absl::Span<const size_t> counts,
                                                   DataType dtype) {
  return Blocking("all_gather", SumBytes(counts, dtype),
                  [&] { return inner()->AllGatherV(send, recv, counts, dtype); });
}
absl::Status SimulatedLinkCommunicator::ReduceScatterV(const void* send, void* recv,
                                                       absl::Span<const size_t> counts,
                                                       DataType dtype, ReduceOp op) {
  return Blocking("reduce_scatter", SumBytes(counts, dtype),
                  [&] { return inner()->ReduceScatterV(send, recv, counts, dtype, op); });
}
absl::Status SimulatedLinkCommunicator::AllToAllV(const void* send,
                                                  absl::Span<const size_t> send_counts,
                                                  void* recv,
                                                  absl::Span<const size_t> recv_counts,
                                                  DataType dtype) {
  // What this rank sends to / receives from the others (its own share stays local).
  const int me = rank();
  double out = SumBytes(send_counts, dtype), in = SumBytes(recv_counts, dtype);
  if (me < static_cast<int>(send_counts.size())) out -= Bytes(send_counts[me], dtype);
  if (me < static_cast<int>(recv_counts.size())) in -= Bytes(recv_counts[me], dtype);
  return Blocking("all_to_all", std::max(out, in), [&] {
    return inner()->AllToAllV(send, send_counts, recv, recv_counts, dtype);
  });
}
absl::Status SimulatedLinkCommunicator::Broadcast(void* buffer, size_t count, DataType dtype,
                                                  int root) {
  return Blocking("broadcast", Bytes(count, dtype),
                  [&] { return inner()->Broadcast(buffer, count, dtype, root); });
}
absl::Status SimulatedLinkCommunicator::Send(const void* buffer, size_t count, DataType dtype,
                                             int peer) {
  return Blocking("send", Bytes(count, dtype),
                  [&] { return inner()->Send(buffer, count, dtype, peer); });
}
absl::Status SimulatedLinkCommunicator::Recv(void* buffer, size_t count, DataType dtype,
                                             int peer) {
  return Blocking("recv", Bytes(count, dtype),
                  [&] { return inner()->Recv(buffer, count, dtype, peer); });
}
absl::Status SimulatedLinkCommunicator::Ppermute(const void* send, void* recv, size_t count,
                                                 DataType dtype,
                                                 absl::Span<const std::pair<int, int>> pairs) {
  return Blocking("ppermute", Bytes(count, dtype),
                  [&] { return inner()->Ppermute(send, recv, count, dtype, pairs); });
}
absl::Status SimulatedLinkCommunicator::Barrier() {
  return Blocking("barrier", 0, [&] { return inner()->Barrier(); });
}

absl::StatusOr<std::unique_ptr<PendingCollective>> SimulatedLinkCommunicator::AllReduceStart(
    const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) {
  return Started(
      collectives::StartedCallName("AllReduceStart", dtype, &op, count, name()), "all_reduce",
      Bytes(count, dtype),
      [=](Communicator& dup) { return dup.AllReduce(send, recv, count, dtype, op); });
}
absl::StatusOr<std::unique_ptr<PendingCollective>> SimulatedLinkCommunicator::AllGatherStart(
    const void* send, void* recv, size_t send_count, DataType dtype) {
  return Started(
      collectives::StartedCallName("AllGatherStart", dtype, nullptr, send_count, name()),
      "all_gather", Bytes(send_count * size(), dtype),
      [=](Communicator& dup) { return dup.AllGather(send, recv, send_count, dtype); });
}
absl::StatusOr<std::unique_ptr<PendingCollective>> SimulatedLinkCommunicator::ReduceScatterStart(
    const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) {
  return Started(
      collectives::StartedCallName("ReduceScatterStart", dtype, &op, recv_count, name()),
      "reduce_scatter", Bytes(recv_count * size(), dtype),
      [=](Communicator& dup) { return dup.ReduceScatter(send, recv, recv_count, dtype, op); });
}

absl::StatusOr<std::unique_ptr<PendingCollective>> SimulatedLinkCommunicator::PpermuteStart(
    const void* send, void* recv, size_t count, DataType dtype,
    absl::Span<const std::pair<int, int>> pairs) {
  return Started(
      collectives::StartedCallName("PpermuteStart", dtype, nullptr, count, name()), "ppermute",
      Bytes(count, dtype),
      [=, pairs = std::vector<std::pair<int, int>>(pairs.begin(), pairs.end())](
          Communicator& dup) { return dup.Ppermute(send, recv, count, dtype, pairs); });
}

absl::StatusOr<std::unique_ptr<Communicator>> SimulatedLinkCommunicator::Split(int color,
                                                                             int key) {
  ForwardTag();
  absl::StatusOr<std::unique_ptr<Communicator>> sub = inner()->Split(color, key);
  if (!sub.ok() || *sub == nullptr) return sub;
  return std::unique_ptr<Communicator>(
      new SimulatedLinkCommunicator(nullptr, *std::move(sub), link_, shared_));
}

}  // namespace shardmap::collectives
