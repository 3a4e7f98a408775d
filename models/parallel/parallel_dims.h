// The GPT mesh's parallel dimensions (as torchtitan's ParallelDims): the axis names as named
// constants, the mesh parser that orders them, and what each axis shards.
//
//   absl::StatusOr<Mesh> mesh = ParseMesh("tp=2,dp_shard=2");   // axes: dp_shard, tp
//   absl::StatusOr<ParallelDims> dims = ParallelDims::Create(*mesh, /*sp=*/true);
//   dims->size(axis::kTp);        // 2; an absent axis has size 1
//   dims->batch_axes();           // {"dp_shard"}: the axes that split the batch's sequences
//   dims->fsdp_axis();            // "dp_shard" ("" without it)
//
// The axes, in the canonical mesh order (outermost first):
//   pp            pipeline stages: each stage holds its layers' parameters (models/parallel/pipeline.h).
//   dp_replicate  data parallel between FSDP groups (HSDP): params R, gradients all_reduced.
//   dp_shard      FSDP / ZeRO-3: params, gradients and AdamW state S over it; all_gather at use.
//   dp            data parallel: params R, gradients all_reduced once per step.
//   ep            expert parallel: a batch axis for dense layers; MoE experts are split over it.
//   cp            context parallel: each sequence cut into 2*cp load-balanced chunks (ring
//                 attention); params R, their gradients all_reduced with the data-parallel ones.
//   tp            Megatron tensor parallel (+ sp: activations S0 on tp between TP regions).
// The batch axes (dp_replicate, dp_shard, dp, ep present in the mesh, in mesh order) split the
// sequences of a batch; cp then splits each sequence.
#ifndef SHARDMAP_MODELS_PARALLEL_PARALLEL_DIMS_H_
#define SHARDMAP_MODELS_PARALLEL_PARALLEL_DIMS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shardmap/mesh.h"

namespace shardmap {

namespace axis {
inline constexpr char kPp[] = "pp";
inline constexpr char kDpReplicate[] = "dp_replicate";
inline constexpr char kDpShard[] = "dp_shard";
inline constexpr char kDp[] = "dp";
inline constexpr char kEp[] = "ep";
inline constexpr char kCp[] = "cp";
inline constexpr char kTp[] = "tp";
// The canonical order of a GPT mesh's axes, outermost first.
inline constexpr const char* kOrder[] = {kPp, kDpReplicate, kDpShard, kDp, kEp, kCp, kTp};
// The axes that split a batch's sequences, in mesh order.
inline constexpr const char* kBatch[] = {kDpReplicate, kDpShard, kDp, kEp};
}  // namespace axis

// "dp=2,tp=2" -> a mesh with axes in the canonical order (axis::kOrder).
// InvalidArgument for unknown axes, repeated axes, sizes < 1 or a malformed string.
absl::StatusOr<Mesh> ParseMesh(const std::string& text);

class ParallelDims {
 public:
  // Checks the axis names (axis::kOrder only), that pp comes first and tp last, and that sp has
  // a tp axis. Errors name the mesh and the fix.
  static absl::StatusOr<ParallelDims> Create(const Mesh& mesh, bool sp);

  const Mesh& mesh() const { return mesh_; }
  bool has(const char* axis) const { return mesh_.AxisIndex(axis) >= 0; }
  int size(const char* axis) const;  // 1 when absent
  bool sp() const { return sp_; }
  int world() const { return mesh_.size(); }

  // Present axes named by role ("" when absent).
  std::string tp_axis() const { return has(axis::kTp) ? axis::kTp : ""; }
  std::string fsdp_axis() const { return has(axis::kDpShard) ? axis::kDpShard : ""; }
  std::string cp_axis() const { return has(axis::kCp) ? axis::kCp : ""; }
  std::string pp_axis() const { return has(axis::kPp) ? axis::kPp : ""; }
  const std::vector<std::string>& batch_axes() const { return batch_axes_; }
  int batch_ways() const;  // product of the batch axes' sizes
  int cp_ways() const { return size(axis::kCp); }
  int pp_ways() const { return size(axis::kPp); }
  int tp_ways() const { return size(axis::kTp); }
  bool pipelined() const { return pp_ways() > 1; }

 private:
  Mesh mesh_;
  bool sp_ = false;
  std::vector<std::string> batch_axes_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_PARALLEL_DIMS_H_
