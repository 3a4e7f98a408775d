// ShapeOnlyCommunicator: the communicator of one rank of a world that exists only on paper
// (shape-only execution: shardmap/shape_only.h, models/train/gpt_shape_only.h). Every call validates
// its arguments as a real backend does (dtype and reduce op, counts per rank, root and peers in
// range, ppermute pairs) and returns OK without reading or writing a byte: buffers may be null
// (meta tensors have no data) and outputs stay as allocated. No thread, no peer, O(1) per call
// (O(size) only for the per-rank count lists the uneven calls take anyway).
//
//   ShapeOnlyCommunicator world(/*size=*/4096, /*rank=*/17);
//   world.AllReduce(nullptr, nullptr, 1 << 20, DataType::kBF16, ReduceOp::kSum);  // OK
//   world.Broadcast(nullptr, 8, DataType::kF32, /*root=*/4096);  // InvalidArgument: root
//
// Split cannot see the other ranks' colors, so a world made without a SplitResolver refuses it
// (FailedPrecondition). RunShapeOnly gives one that reads the group off the mesh: RankContext's
// color (axis mask * world + group color) and key (index in the group) name the group exactly.
//
//   ShapeOnlyCommunicator world(8, 5, [](int color, int key) -> absl::StatusOr<SplitGroup> {
//     return SplitGroup{/*size=*/4, /*rank=*/key};
//   });
//   std::unique_ptr<Communicator> tp = *world.Split(/*color=*/1, /*key=*/1);  // size 4, rank 1
//
// calls() counts the calls made (Split included), for tests and benchmarks. With
// set_fill_outputs(true) (host memory only) outputs are filled instead of left as allocated, so
// that a shape-only program on CPU tensors computes on finite numbers, not on garbage: the
// reductions (AllReduce, ReduceScatter, ReduceScatterV) give this rank's own contribution (as if
// it were the only one: a sum of exponentials stays positive), every other output is zeros.
#ifndef SHARDMAP_COLLECTIVES_SHAPE_ONLY_COMMUNICATOR_H_
#define SHARDMAP_COLLECTIVES_SHAPE_ONLY_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"

namespace shardmap::collectives {

// A sub-group as Split makes it: its size and this rank's position in it.
struct SplitGroup {
  int size = 0;
  int rank = 0;
};

class ShapeOnlyCommunicator : public Communicator {
 public:
  // (color, key) of this rank's Split -> its group; the group must have this rank (0 <= rank <
  // size). An error is returned by Split as is.
  using SplitResolver = std::function<absl::StatusOr<SplitGroup>(int color, int key)>;

  // size >= 1 and 0 <= rank < size, else InvalidArgument.
  static absl::StatusOr<std::unique_ptr<ShapeOnlyCommunicator>> Create(
      int size, int rank, SplitResolver resolver = nullptr, std::string name = "");
  // As Create; dies on bad arguments (for code that checked them).
  ShapeOnlyCommunicator(int size, int rank, SplitResolver resolver = nullptr,
                        std::string name = "");

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "shape-only world(4096) rank 17"
  std::string name() const override { return name_; }

  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op) override;
  absl::Status AllGather(const void* send, void* recv, size_t send_count,
                         DataType dtype) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                             ReduceOp op) override;
  absl::Status AllToAll(const void* send, void* recv, size_t count, DataType dtype) override;
  absl::Status AllGatherV(const void* send, void* recv, absl::Span<const size_t> counts,
                          DataType dtype) override;
  absl::Status ReduceScatterV(const void* send, void* recv, absl::Span<const size_t> counts,
                              DataType dtype, ReduceOp op) override;
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, DataType dtype) override;
  absl::Status Broadcast(void* buffer, size_t count, DataType dtype, int root) override;
  absl::Status Send(const void* buffer, size_t count, DataType dtype, int peer) override;
  absl::Status Recv(void* buffer, size_t count, DataType dtype, int peer) override;
  absl::Status Ppermute(const void* send, void* recv, size_t count, DataType dtype,
                        absl::Span<const std::pair<int, int>> pairs) override;
  absl::Status Barrier() override;
  // Through the resolver; a negative color returns nullptr (not in any group). The new group's
  // own Split has no resolver.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

  int64_t calls() const { return calls_; }
  // The memory its buffers are in: {.meta = true} for meta tensors (RunShapeOnly on the meta
  // device), the CPU by default. Sub-groups inherit it.
  MemorySpace memory_space() const override { return memory_; }
  void set_memory_space(const MemorySpace& m) { memory_ = m; }
  // Fill non-null output buffers (host memory) on every call (above); sub-groups inherit it.
  void set_fill_outputs(bool on) { fill_outputs_ = on; }
  bool fill_outputs() const { return fill_outputs_; }

 private:
  absl::Status Check(const char* op, DataType dtype);
  absl::Status CheckReduce(const char* op, DataType dtype, ReduceOp reduce);
  absl::Status CheckCounts(const char* op, const char* which, absl::Span<const size_t> counts);
  absl::Status Invalid(const char* op, const std::string& why) const;
  // With fill_outputs_: zeros count elements of dtype at p / copies them from src (when not
  // null).
  void Zero(void* p, size_t count, DataType dtype) const;
  void Copy(const void* src, void* p, size_t count, DataType dtype) const;

  int size_;
  int rank_;
  SplitResolver resolver_;
  std::string name_;
  int64_t calls_ = 0;
  bool fill_outputs_ = false;
  MemorySpace memory_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_SHAPE_ONLY_COMMUNICATOR_H_
