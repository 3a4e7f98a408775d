#include "collectives/shape_only_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardmap::collectives {

absl::StatusOr<std::unique_ptr<ShapeOnlyCommunicator>> ShapeOnlyCommunicator::Create(
    int size, int rank, SplitResolver resolver, std::string name) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape-only communicator: world size ", size, " must be >= 1"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("shape-only communicator: rank ", rank,
                                                   " is outside [0, ", size, ")"));
  }
  return std::make_unique<ShapeOnlyCommunicator>(size, rank, std::move(resolver),
                                                 std::move(name));
}

ShapeOnlyCommunicator::ShapeOnlyCommunicator(int size, int rank, SplitResolver resolver,
                                             std::string name)
    : size_(size), rank_(rank), resolver_(std::move(resolver)), name_(std::move(name)) {
  if (size < 1 || rank < 0 || rank >= size) {
    std::cerr << "ShapeOnlyCommunicator: rank " << rank << " of world size " << size
              << " (use Create to get an error instead)\n";
    std::abort();
  }
  if (name_.empty()) name_ = absl::StrCat("shape-only world(", size, ")");
  absl::StrAppend(&name_, " rank ", rank);
}

absl::Status ShapeOnlyCommunicator::Invalid(const char* op, const std::string& why) const {
  return absl::InvalidArgumentError(absl::StrCat(op, " on '", name_, "': ", why));
}

void ShapeOnlyCommunicator::Zero(void* p, size_t count, DataType dtype) const {
  if (fill_outputs_ && p != nullptr && count > 0) std::memset(p, 0, count * DataTypeSize(dtype));
}

void ShapeOnlyCommunicator::Copy(const void* src, void* p, size_t count, DataType dtype) const {
  if (!fill_outputs_ || p == nullptr || count == 0) return;
  if (src == nullptr) return Zero(p, count, dtype);
  if (src != p) std::memmove(p, src, count * DataTypeSize(dtype));
}

namespace {
size_t Sum(absl::Span<const size_t> counts) {
  size_t n = 0;
  for (size_t c : counts) n += c;
  return n;
}
}  // namespace

absl::Status ShapeOnlyCommunicator::Check(const char* op, DataType dtype) {
  ++calls_;
  if (!IsValidDataType(dtype)) {
    return Invalid(op, absl::StrCat("invalid DataType value ", static_cast<int>(dtype)));
  }
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::CheckReduce(const char* op, DataType dtype,
                                                ReduceOp reduce) {
  if (absl::Status s = Check(op, dtype); !s.ok()) return s;
  if (!IsValidReduceOp(reduce)) {
    return Invalid(op, absl::StrCat("invalid ReduceOp value ", static_cast<int>(reduce)));
  }
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::CheckCounts(const char* op, const char* which,
                                                absl::Span<const size_t> counts) {
  if (counts.size() != static_cast<size_t>(size_)) {
    return Invalid(op, absl::StrCat(which, " has ", counts.size(), " entries but the group has ",
                                    size_, " ranks"));
  }
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::AllReduce(const void* send, void* recv, size_t count,
                                              DataType dtype, ReduceOp op) {
  if (absl::Status s = CheckReduce("AllReduce", dtype, op); !s.ok()) return s;
  Copy(send, recv, count, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::AllGather(const void*, void* recv, size_t send_count,
                                              DataType dtype) {
  if (absl::Status s = Check("AllGather", dtype); !s.ok()) return s;
  Zero(recv, send_count * size_, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::ReduceScatter(const void* send, void* recv,
                                                  size_t recv_count, DataType dtype,
                                                  ReduceOp op) {
  if (absl::Status s = CheckReduce("ReduceScatter", dtype, op); !s.ok()) return s;
  Copy(send == nullptr ? nullptr
                       : static_cast<const char*>(send) + rank_ * recv_count * DataTypeSize(dtype),
       recv, recv_count, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::AllToAll(const void*, void* recv, size_t count,
                                             DataType dtype) {
  if (absl::Status s = Check("AllToAll", dtype); !s.ok()) return s;
  Zero(recv, count * size_, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::AllGatherV(const void*, void* recv,
                                               absl::Span<const size_t> counts, DataType dtype) {
  if (absl::Status s = Check("AllGatherV", dtype); !s.ok()) return s;
  if (absl::Status s = CheckCounts("AllGatherV", "counts", counts); !s.ok()) return s;
  Zero(recv, Sum(counts), dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::ReduceScatterV(const void* send, void* recv,
                                                   absl::Span<const size_t> counts,
                                                   DataType dtype, ReduceOp op) {
  if (absl::Status s = CheckReduce("ReduceScatterV", dtype, op); !s.ok()) return s;
  if (absl::Status s = CheckCounts("ReduceScatterV", "counts", counts); !s.ok()) return s;
  size_t before = 0;
  for (int r = 0; r < rank_; ++r) before += counts[r];
  Copy(send == nullptr ? nullptr : static_cast<const char*>(send) + before * DataTypeSize(dtype),
       recv, counts[rank_], dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::AllToAllV(const void*, absl::Span<const size_t> send_counts,
                                              void* recv, absl::Span<const size_t> recv_counts,
                                              DataType dtype) {
  if (absl::Status s = Check("AllToAllV", dtype); !s.ok()) return s;
  if (absl::Status s = CheckCounts("AllToAllV", "send_counts", send_counts); !s.ok()) return s;
  if (absl::Status s = CheckCounts("AllToAllV", "recv_counts", recv_counts); !s.ok()) return s;
  // What this rank keeps for itself is what it receives from itself (the one pair of counts a
  // single rank can check).
  if (send_counts[rank_] != recv_counts[rank_]) {
    return Invalid("AllToAllV", absl::StrCat("this rank sends itself ", send_counts[rank_],
                                             " elements but expects ", recv_counts[rank_],
                                             " from itself"));
  }
  Zero(recv, Sum(recv_counts), dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::Broadcast(void* buffer, size_t count, DataType dtype,
                                              int root) {
  if (absl::Status s = Check("Broadcast", dtype); !s.ok()) return s;
  if (root < 0 || root >= size_) {
    return Invalid("Broadcast",
                   absl::StrCat("root ", root, " is not a rank of this group of ", size_));
  }
  if (rank_ != root) Zero(buffer, count, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::Send(const void*, size_t, DataType dtype, int peer) {
  if (absl::Status s = Check("Send", dtype); !s.ok()) return s;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return Invalid("Send", absl::StrCat("peer ", peer, " must be another rank of this group of ",
                                        size_));
  }
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::Recv(void* buffer, size_t count, DataType dtype, int peer) {
  if (absl::Status s = Check("Recv", dtype); !s.ok()) return s;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return Invalid("Recv", absl::StrCat("peer ", peer, " must be another rank of this group of ",
                                        size_));
  }
  Zero(buffer, count, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::Ppermute(const void*, void* recv, size_t count, DataType dtype,
                                             absl::Span<const std::pair<int, int>> pairs) {
  if (absl::Status s = Check("Ppermute", dtype); !s.ok()) return s;
  if (absl::StatusOr<PpermutePeers> peers = ValidatePpermutePairs(pairs, size_, rank_);
      !peers.ok()) {
    return Invalid("Ppermute", std::string(peers.status().message()));
  }
  Zero(recv, count, dtype);
  return absl::OkStatus();
}

absl::Status ShapeOnlyCommunicator::Barrier() {
  ++calls_;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> ShapeOnlyCommunicator::Split(int color, int key) {
  ++calls_;
  if (color < 0) return std::unique_ptr<Communicator>();
  if (!resolver_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Split(color=", color, ", key=", key, ") on '", name_,
        "': a shape-only communicator cannot see the other ranks' colors; give it a "
        "SplitResolver (shardmap's RunShapeOnly reads the groups off the mesh)"));
  }
  absl::StatusOr<SplitGroup> g = resolver_(color, key);
  if (!g.ok()) return g.status();
  if (g->size < 1 || g->rank < 0 || g->rank >= g->size) {
    return absl::InternalError(absl::StrCat("Split(color=", color, ", key=", key, ") on '",
                                            name_, "': the resolver gave rank ", g->rank,
                                            " of a group of ", g->size));
  }
  auto sub = std::make_unique<ShapeOnlyCommunicator>(
      g->size, g->rank, nullptr, absl::StrCat(name_, " split(color=", color, ")"));
  sub->set_fill_outputs(fill_outputs_);
  sub->set_memory_space(memory_);
  return std::unique_ptr<Communicator>(std::move(sub));
}

}  // namespace shardmap::collectives
