// A Communicator of one rank: every collective is a copy. Used by SingleRankContext.
#ifndef SHARDMAP_SHARDMAP_INTERNAL_SELF_COMMUNICATOR_H_
#define SHARDMAP_SHARDMAP_INTERNAL_SELF_COMMUNICATOR_H_

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "collectives/communicator.h"

namespace shardmap::internal {

class SelfCommunicator : public collectives::Communicator {
 public:
  using DataType = collectives::DataType;
  using ReduceOp = collectives::ReduceOp;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self(1)"; }

  absl::Status AllReduce(const void* s, void* r, size_t n, DataType t, ReduceOp) override {
    return Copy(s, r, n, t);
  }
  absl::Status AllGather(const void* s, void* r, size_t n, DataType t) override {
    return Copy(s, r, n, t);
  }
  absl::Status ReduceScatter(const void* s, void* r, size_t n, DataType t, ReduceOp) override {
    return Copy(s, r, n, t);
  }
  absl::Status AllToAll(const void* s, void* r, size_t n, DataType t) override {
    return Copy(s, r, n, t);
  }
  absl::Status AllGatherV(const void* s, void* r, absl::Span<const size_t> c,
                          DataType t) override {
    return Copy(s, r, c[0], t);
  }
  absl::Status ReduceScatterV(const void* s, void* r, absl::Span<const size_t> c, DataType t,
                              ReduceOp) override {
    return Copy(s, r, c[0], t);
  }
  absl::Status AllToAllV(const void* s, absl::Span<const size_t> sc, void* r,
                         absl::Span<const size_t>, DataType t) override {
    return Copy(s, r, sc[0], t);
  }
  absl::Status Broadcast(void*, size_t, DataType, int) override { return absl::OkStatus(); }
  absl::Status Send(const void*, size_t, DataType, int) override {
    return absl::UnimplementedError("Send on a one-rank communicator");
  }
  absl::Status Recv(void*, size_t, DataType, int) override {
    return absl::UnimplementedError("Recv on a one-rank communicator");
  }
  absl::Status Ppermute(const void* s, void* r, size_t n, DataType t,
                        absl::Span<const std::pair<int, int>> pairs) override {
    if (!pairs.empty()) return Copy(s, r, n, t);
    std::memset(r, 0, n * collectives::DataTypeSize(t));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int) override {
    if (color < 0) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new SelfCommunicator());
  }

 private:
  static absl::Status Copy(const void* s, void* r, size_t n, DataType t) {
    if (s != r) std::memmove(r, s, n * collectives::DataTypeSize(t));
    return absl::OkStatus();
  }
};

}  // namespace shardmap::internal

#endif  // SHARDMAP_SHARDMAP_INTERNAL_SELF_COMMUNICATOR_H_
