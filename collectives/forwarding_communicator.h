// ForwardingCommunicator: the base of decorators (a Communicator that wraps another one and
// changes a few calls: bench/timed_communicator.h times them, collectives/simulated_link.h
// delays them). Every call forwards to the inner communicator unchanged; a decorator overrides
// the calls it changes and inherits the rest, so a call added to Communicator reaches the
// inner backend through every decorator instead of falling back to the base class's default.
//
//   class Counting : public ForwardingCommunicator {
//    public:
//     using ForwardingCommunicator::ForwardingCommunicator;
//     absl::Status Barrier() override { ++barriers; return inner()->Barrier(); }
//     int barriers = 0;
//   };
#ifndef SHARDMAP_COLLECTIVES_FORWARDING_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_FORWARDING_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace shardmap::collectives {

class ForwardingCommunicator : public Communicator {
 public:
  // Borrows `inner` (it must outlive this object).
  explicit ForwardingCommunicator(Communicator* inner) : inner_(inner) {}
  // Owns `inner`.
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner)
      : owned_(std::move(inner)), inner_(owned_.get()) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override {
    return inner_->AllReduce(send, recv, count, dtype, op);
  }
  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         DataType dtype) override {
    return inner_->AllGather(send, recv, send_count, dtype);
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                             ReduceOp op) override {
    return inner_->ReduceScatter(send, recv, recv_count, dtype, op);
  }
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype) override {
    return inner_->AllToAll(send, recv, count, dtype);
  }
  absl::Status AllGatherV(const void* send, void* recv, absl::Span<const size_t> counts,
                          DataType dtype) override {
    return inner_->AllGatherV(send, recv, counts, dtype);
  }
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const size_t> counts,
                              DataType dtype, ReduceOp op) override {
    return inner_->ReduceScatterV(send, recv, counts, dtype, op);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, DataType dtype) override {
    return inner_->AllToAllV(send, send_counts, recv, recv_counts, dtype);
  }
  absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root) override {
    return inner_->Broadcast(buffer, count, dtype, root);
  }
  absl::Status Send(const void* buffer, size_t count, DataType dtype, int peer) override {
    return inner_->Send(buffer, count, dtype, peer);
  }
  absl::Status Recv(void* buffer, size_t count, DataType dtype, int peer) override {
    return inner_->Recv(buffer, count, dtype, peer);
  }
  absl::Status Ppermute(const void* send, void* recv, size_t count, DataType dtype,
                        absl::Span<const std::pair<int, int>> pairs) override {
    return inner_->Ppermute(send, recv, count, dtype, pairs);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

  absl::StatusOr<std::unique_ptr<PendingCollective>> PpermuteStart(
      const void* send, void* recv, size_t count, DataType dtype,
      absl::Span<const std::pair<int, int>> pairs) override {
    return inner_->PpermuteStart(send, recv, count, dtype, pairs);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(const void* send, void* recv,
                                                                    size_t count, DataType dtype,
                                                                    ReduceOp op) override {
    return inner_->AllReduceStart(send, recv, count, dtype, op);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(const void* send, void* recv,
                                                                    size_t send_count,
                                                                    DataType dtype) override {
    return inner_->AllGatherStart(send, recv, send_count, dtype);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) override {
    return inner_->ReduceScatterStart(send, recv, recv_count, dtype, op);
  }
  bool OverlapsStartedCalls() const override { return inner_->OverlapsStartedCalls(); }

  // Split's children are the inner communicator's children, unwrapped: a decorator that should
  // wrap them too (both of ours do) overrides Split.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    return inner_->Split(color, key);
  }

  void TagNextCall(const CallTag& tag) override { inner_->TagNextCall(tag); }
  bool ComparesCallTags() const override { return inner_->ComparesCallTags(); }
  MemorySpace memory_space() const override { return inner_->memory_space(); }
  bool SupportsGraphCapture() const override { return inner_->SupportsGraphCapture(); }
  absl::Status AsyncError() override { return inner_->AsyncError(); }

 protected:
  // For a decorator that may either borrow or own: `inner` when not null, else `owned`.
  ForwardingCommunicator(Communicator* inner, std::unique_ptr<Communicator> owned)
      : owned_(std::move(owned)), inner_(inner != nullptr ? inner : owned_.get()) {}

  Communicator* inner() const { return inner_; }

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_FORWARDING_COMMUNICATOR_H_
