#include "bench/timed_communicator.h"

#include <time.h>

#include <chrono>
#include <numeric>
#include <string>
#include <utility>

namespace shardmap::bench {
namespace {

using collectives::DataType;
using collectives::DataTypeSize;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Bytes(size_t count, DataType dtype) {
  return static_cast<double>(count) * DataTypeSize(dtype);
}

double SumBytes(absl::Span<const size_t> counts, DataType dtype) {
  return Bytes(std::accumulate(counts.begin(), counts.end(), size_t{0}), dtype);
}

// A started call's handle whose Wait() is timed under "<op>_wait".
class TimedCall final : public collectives::PendingCollective {
 public:
  TimedCall(std::unique_ptr<collectives::PendingCollective> inner, CommStats* stats,
            std::string op)
      : inner_(std::move(inner)), stats_(stats), op_(std::move(op)) {}
  absl::Status Wait() override {
    const double cpu0 = ThreadCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = inner_->Wait();
    OpStats& o = stats_->by_op[op_];
    o.calls += 1;
    o.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    o.cpu_seconds += ThreadCpuSeconds() - cpu0;
    return s;
  }

 private:
  std::unique_ptr<collectives::PendingCollective> inner_;
  CommStats* stats_;
  std::string op_;
};

}  // namespace

OpStats CommStats::Total() const {
  OpStats t;
  for (const auto& [op, s] : by_op) {
    t.calls += s.calls;
    t.bytes += s.bytes;
    t.seconds += s.seconds;
    t.cpu_seconds += s.cpu_seconds;
  }
  return t;
}

TimedCommunicator::TimedCommunicator(collectives::Communicator* inner, CommStats* stats)
    : ForwardingCommunicator(inner), stats_(stats) {}

TimedCommunicator::TimedCommunicator(std::unique_ptr<collectives::Communicator> inner,
                                     CommStats* stats)
    : ForwardingCommunicator(std::move(inner)), stats_(stats) {}

template <typename F>
absl::Status TimedCommunicator::Timed(const char* op, double bytes, F&& call) {
  const double cpu0 = ThreadCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = call();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  OpStats& o = stats_->by_op[op];
  o.calls += 1;
  o.bytes += bytes;
  o.seconds += wall;
  o.cpu_seconds += ThreadCpuSeconds() - cpu0;
  return s;
}

absl::Status TimedCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                          DataType dtype, collectives::ReduceOp op) {
  return Timed("all_reduce", Bytes(count, dtype),
               [&] { return inner()->AllReduce(send, recv, count, dtype, op); });
}
absl::Status TimedCommunicator::AllGather(const void* send, void* recv, size_t send_count,
                                          DataType dtype) {
  return Timed("all_gather", Bytes(send_count, dtype),
               [&] { return inner()->AllGather(send, recv, send_count, dtype); });
}
absl::Status TimedCommunicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                              DataType dtype, collectives::ReduceOp op) {
  return Timed("reduce_scatter", Bytes(recv_count * size(), dtype),
               [&] { return inner()->ReduceScatter(send, recv, recv_count, dtype, op); });
}
absl::Status TimedCommunicator::AllToAll(const void* send, void* recv, size_t count,
                                         DataType dtype) {
  return Timed("all_to_all", Bytes(count * size(), dtype),
               [&] { return inner()->AllToAll(send, recv, count, dtype); });
}
absl::Status TimedCommunicator::AllGatherV(const void* send, void* recv,
                                           absl::Span<const size_t> counts, DataType dtype) {
  return Timed("all_gather", Bytes(counts[rank()], dtype),
               [&] { return inner()->AllGatherV(send, recv, counts, dtype); });
}
absl::Status TimedCommunicator::ReduceScatterV(const void* send, void* recv,
                                               absl::Span<const size_t> counts, DataType dtype,
                                               collectives::ReduceOp op) {
  return Timed("reduce_scatter", SumBytes(counts, dtype),
               [&] { return inner()->ReduceScatterV(send, recv, counts, dtype, op); });
}
absl::Status TimedCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                          void* recv, absl::Span<const size_t> recv_counts,
                                          DataType dtype) {
  return Timed("all_to_all", SumBytes(send_counts, dtype), [&] {
    return inner()->AllToAllV(send, send_counts, recv, recv_counts, dtype);
  });
}
absl::Status TimedCommunicator::Broadcast(void* buffer, size_t count, DataType dtype, int root) {
  return Timed("broadcast", Bytes(count, dtype),
               [&] { return inner()->Broadcast(buffer, count, dtype, root); });
}
absl::Status TimedCommunicator::Send(const void* buffer, size_t count, DataType dtype,
                                     int peer) {
  return Timed("send", Bytes(count, dtype),
               [&] { return inner()->Send(buffer, count, dtype, peer); });
}
absl::Status TimedCommunicator::Recv(void* buffer, size_t count, DataType dtype, int peer) {
  return Timed("recv", 0, [&] { return inner()->Recv(buffer, count, dtype, peer); });
}
absl::Status TimedCommunicator::Ppermute(const void* send, void* recv, size_t count,
                                         DataType dtype,
                                         absl::Span<const std::pair<int, int>> pairs) {
  return Timed("ppermute", Bytes(count, dtype),
               [&] { return inner()->Ppermute(send, recv, count, dtype, pairs); });
}
absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> TimedCommunicator::PpermuteStart(
    const void* send, void* recv, size_t count, DataType dtype,
    absl::Span<const std::pair<int, int>> pairs) {
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> pending;
  absl::Status s = Timed("ppermute_start", Bytes(count, dtype), [&] {
    pending = inner()->PpermuteStart(send, recv, count, dtype, pairs);
    return pending.status();
  });
  (void)s;
  return pending;
}
template <typename F>
absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> TimedCommunicator::TimedStart(
    const char* op, double bytes, F&& start) {
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> pending;
  (void)Timed((std::string(op) + "_start").c_str(), bytes, [&] {
    pending = start();
    return pending.status();
  });
  if (!pending.ok()) return pending;
  return std::unique_ptr<collectives::PendingCollective>(
      std::make_unique<TimedCall>(*std::move(pending), stats_, std::string(op) + "_wait"));
}
absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> TimedCommunicator::AllReduceStart(
    const void* send, void* recv, size_t count, DataType dtype, collectives::ReduceOp op) {
  return TimedStart("all_reduce", Bytes(count, dtype),
                    [&] { return inner()->AllReduceStart(send, recv, count, dtype, op); });
}
absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> TimedCommunicator::AllGatherStart(
    const void* send, void* recv, size_t send_count, DataType dtype) {
  return TimedStart("all_gather", Bytes(send_count, dtype),
                    [&] { return inner()->AllGatherStart(send, recv, send_count, dtype); });
}
absl::StatusOr<std::unique_ptr<collectives::PendingCollective>>
TimedCommunicator::ReduceScatterStart(const void* send, void* recv, size_t recv_count,
                                      DataType dtype, collectives::ReduceOp op) {
  return TimedStart("reduce_scatter", Bytes(recv_count * size(), dtype), [&] {
    return inner()->ReduceScatterStart(send, recv, recv_count, dtype, op);
  });
}
absl::StatusOr<std::unique_ptr<collectives::Communicator>> TimedCommunicator::Split(int color,
                                                                                     int key) {
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> sub = inner()->Split(color, key);
  if (!sub.ok() || *sub == nullptr) return sub;
  return std::unique_ptr<collectives::Communicator>(
      new TimedCommunicator(std::move(*sub), stats_));
}

}  // namespace shardmap::bench
