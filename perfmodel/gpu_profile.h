// A GPU profile measured by `tp_bench --device=cuda --profile_out=FILE` (bench/tp_bench.cc): the
// GEMMs timed by shape and dtype, collectives timed over virtual ranks of one card and over the
// machine's GPUs, and whole layer steps. The planner reads it (models/planner/hardware_profile.h:
// FromTpBenchProfile) and bench's GPU TP model predicts from it (bench/tp_model_gpu.h).
//
//   absl::StatusOr<GpuProfile> p = ParseGpuProfile(text);   // errors name the line
//   double s = p->gemm_s.at({DType::kBF16, GemmShape{1, 4096, 2048, 8192}});
//   ClusterLinks links = LinksFromProfile(*p);   // intra link fitted from `link` lines, or stated
//
// Profile format (one record per line, fields separated by spaces, '#' starts a comment):
//   device <free text: the card's name>
//   gemm <f32|bf16> <batch> <m> <k> <n> <seconds>     C[m,n] = A[m,k] B[k,n], batch of them
//   collective <all_reduce|all_gather|reduce_scatter> <f32|bf16> <t> <full_bytes> <seconds>
//                                                     t virtual ranks on one GPU (in-process)
//   link <all_reduce|all_gather|reduce_scatter> <t> <full_bytes> <seconds>
//                                                     t ranks on t GPUs (several-GPU machines)
//   layer <name> <seconds> <fenced_seconds>           a layer step (bench's LayerCase::Name())
// full_bytes as in perfmodel/ring_cost.h (the all_reduce buffer / gathered output / unreduced
// input).
#ifndef SHARDMAP_PERFMODEL_GPU_PROFILE_H_
#define SHARDMAP_PERFMODEL_GPU_PROFILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "perfmodel/ring_cost.h"
#include "tensor/dtype.h"

namespace shardmap::perfmodel {

// C[m,n] = A[m,k] B[k,n], `batch` times.
struct GemmShape {
  int64_t batch = 1, m = 0, k = 0, n = 0;
  double Flops() const { return 2.0 * batch * m * k * n; }
  std::string ToString() const;  // "32 x 128x64x128" or "4096x2048x2048"
  auto Key() const { return std::make_tuple(batch, m, k, n); }
  bool operator<(const GemmShape& o) const { return Key() < o.Key(); }
  bool operator==(const GemmShape& o) const { return Key() == o.Key(); }
};

struct GpuProfile {
  std::string device;
  std::map<std::pair<DType, GemmShape>, double> gemm_s;
  std::map<std::tuple<CollectiveKind, DType, int, double>, double> collective_s;
  std::map<std::tuple<CollectiveKind, int, double>, double> link_s;
  struct Layer {
    double seconds = 0, fenced_seconds = 0;
  };
  std::map<std::string, Layer> layers;  // by bench's LayerCase::Name()
};
// InvalidArgument naming the line and what was expected on a malformed line.
absl::StatusOr<GpuProfile> ParseGpuProfile(std::string_view text);
// The profile's lines (the inverse of ParseGpuProfile), for writers and tests.
std::string GemmLine(DType dtype, const GemmShape& s, double seconds);
std::string CollectiveLine(CollectiveKind kind, DType dtype, int t, double full_bytes,
                           double seconds);
std::string LinkLine(CollectiveKind kind, int t, double full_bytes, double seconds);
std::string LayerLine(const std::string& name, double seconds, double fenced_seconds);

// Link figures for multi-node predictions, with where each came from.
struct ClusterLinks {
  RingLink intra, inter;  // inside a node (t <= gpus_per_node) / across nodes
  std::string intra_source, inter_source;
  int gpus_per_node = 8;
};
// NVLink 4 (H100/H200 SXM): 900 GB/s bidirectional per GPU = 450 GB/s each way, taken as the
// ring's bus bandwidth, alpha 10 us; InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one NIC per
// GPU), alpha 20 us. Upper bounds: NCCL typically reaches ~80% of the link rate.
ClusterLinks StatedLinks();
// The intra-node link fitted from the profile's `link` all_reduce lines (several GPUs; the
// largest t measured, >= 2 sizes), else StatedLinks()'s; inter-node always stated.
ClusterLinks LinksFromProfile(const GpuProfile& p);

}  // namespace shardmap::perfmodel

#endif  // SHARDMAP_PERFMODEL_GPU_PROFILE_H_
