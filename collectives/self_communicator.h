// A Communicator of one rank: every collective is a copy of the rank's own data (a ppermute
// without a pair zero-fills, as on a device no one sends to). Used by SingleRankContext; handy
// wherever code written for a Communicator runs on one process without peers.
//
//   collectives::SelfCommunicator self;
//   float x[3] = {1, 2, 3}, y[3];
//   absl::Status s = self.AllReduce(x, y, 3, DataType::kF32, ReduceOp::kSum);  // y = x
//   self.Send(x, 3, DataType::kF32, 0);  // Unimplemented: there is no peer
//
// Works on host memory (memory_space() is the CPU default).
#ifndef SHARDMAP_COLLECTIVES_SELF_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_SELF_COMMUNICATOR_H_

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "collectives/communicator.h"

namespace shardmap::collectives {

class SelfCommunicator : public Communicator {
 public:
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
    std::memset(r, 0, n * DataTypeSize(t));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int) override {
    if (color < 0) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new SelfCommunicator());
  }

 private:
  static absl::Status Copy(const void* s, void* r, size_t n, DataType t) {
    if (s != r) std::memmove(r, s, n * DataTypeSize(t));
    return absl::OkStatus();
  }
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_SELF_COMMUNICATOR_H_
