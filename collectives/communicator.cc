#include "collectives/communicator.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace shardmap::collectives {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kF32: return 4;
    case DataType::kF64: return 8;
    case DataType::kBF16: return 2;
    case DataType::kF16: return 2;
    case DataType::kI32: return 4;
    case DataType::kI64: return 8;
  }
  return 0;  // Not a DataType: callers validate with IsValidDataType first.
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kF32: return "f32";
    case DataType::kF64: return "f64";
    case DataType::kBF16: return "bf16";
    case DataType::kF16: return "f16";
    case DataType::kI32: return "i32";
    case DataType::kI64: return "i64";
  }
  return "<invalid dtype>";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kAvg: return "avg";
  }
  return "<invalid reduce op>";
}

bool IsValidDataType(DataType t) { return DataTypeSize(t) != 0; }

bool IsValidReduceOp(ReduceOp op) {
  return static_cast<uint8_t>(op) <= static_cast<uint8_t>(ReduceOp::kAvg);
}

absl::StatusOr<PpermutePeers> ValidatePpermutePairs(absl::Span<const std::pair<int, int>> pairs,
                                                    int size, int rank) {
  std::vector<char> is_src(size > 0 ? size : 0, 0), is_dst(size > 0 ? size : 0, 0);
  PpermutePeers peers;
  for (const auto& [s, t] : pairs) {
    if (s < 0 || s >= size || t < 0 || t >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("pair (", s, ", ", t, ") names a rank outside [0, ", size, ")"));
    }
    const bool repeated_source = is_src[s]++ != 0;
    if (repeated_source || is_dst[t]++ != 0) {
      const char* role = repeated_source ? "source" : "destination";
      return absl::InvalidArgumentError(absl::StrCat(
          "pair (", s, ", ", t, ") repeats a ", role, ": rank ", repeated_source ? s : t,
          " appears twice as a ", role, "; each rank may appear at most once as each"));
    }
    if (t == rank) peers.source = s;
    if (s == rank) peers.dest = t;
  }
  return peers;
}

namespace {

// The default *Start's result: the call already ran; Wait() only enforces "exactly once".
class CompletedCall final : public PendingCollective {
 public:
  explicit CompletedCall(std::string what) : what_(std::move(what)) {}
  absl::Status Wait() override {
    if (waited_) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, ": Wait() called twice; wait each started call exactly once"));
    }
    waited_ = true;
    return absl::OkStatus();
  }

 private:
  std::string what_;
  bool waited_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::PpermuteStart(
    const void* send, void* recv, size_t count, DataType dtype,
    absl::Span<const std::pair<int, int>> pairs) {
  absl::Status s = Ppermute(send, recv, count, dtype, pairs);
  if (!s.ok()) return s;
  return std::unique_ptr<PendingCollective>(
      std::make_unique<CompletedCall>(absl::StrCat("PpermuteStart on ", name())));
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::AllReduceStart(
    const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) {
  absl::Status s = AllReduce(send, recv, count, dtype, op);
  if (!s.ok()) return s;
  return std::unique_ptr<PendingCollective>(
      std::make_unique<CompletedCall>(absl::StrCat("AllReduceStart on ", name())));
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::AllGatherStart(
    const void* send, void* recv, size_t send_count, DataType dtype) {
  absl::Status s = AllGather(send, recv, send_count, dtype);
  if (!s.ok()) return s;
  return std::unique_ptr<PendingCollective>(
      std::make_unique<CompletedCall>(absl::StrCat("AllGatherStart on ", name())));
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::ReduceScatterStart(
    const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) {
  absl::Status s = ReduceScatter(send, recv, recv_count, dtype, op);
  if (!s.ok()) return s;
  return std::unique_ptr<PendingCollective>(
      std::make_unique<CompletedCall>(absl::StrCat("ReduceScatterStart on ", name())));
}

}  // namespace shardmap::collectives
