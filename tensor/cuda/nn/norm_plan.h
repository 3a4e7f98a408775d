// Launch plan of the register-resident LayerNorm / RmsNorm kernels (norm_vec.cu), host-only and
// pure so it is tested without a GPU (norm_plan_test).
//
// A row of h elements is held in registers by a group of `tpr` threads (a warp, 128 or 512
// threads), each loading `vecs` 16-byte vectors (4 f32 or 8 bf16/f16 elements) at
// (i * tpr + lane) * V for i < vecs: coalesced, read from memory once, at most 32 elements per
// thread (16 with 512 threads). Forward: sum, centred sum of squares and the output from registers. Backward: dx from
// registers, and each group accumulates its rows' dgamma / dbeta terms in registers across the
// rows it visits (grid-stride), writing one partial row per group (no atomics); a second kernel
// folds the partial rows in a fixed order (deterministic).
//
//   const VecNormPlan p = PlanVecNorm(/*h=*/4096, /*elem_bytes=*/2);  // bf16: tpr 128, vecs 4
//   if (p.ok) { ... } else { /* the general kernels of norm.cu */ }
#ifndef SHARDMAP_TENSOR_CUDA_NN_NORM_PLAN_H_
#define SHARDMAP_TENSOR_CUDA_NN_NORM_PLAN_H_

#include <cstdint>

namespace shardmap::cuda::nn_kernels {

struct VecNormPlan {
  bool ok = false;
  int tpr = 0;             // threads per row: 32, 128 or 512
  int vecs = 0;            // 16-byte vectors per thread: 1, 2, 4 or 8 (vecs * V <= 32)
  int threads = 0;         // per block: max(128, tpr)
  int rows_per_block = 0;  // threads / tpr
};

// Elements per thread kept in registers, at most.
inline constexpr int kVecNormMaxElems = 32;

// f32 (elem_bytes 4) and bf16/f16 (2) rows whose length h is a positive multiple of the vector
// width and at most 512 * 16 = 8192; anything else is not ok.
inline VecNormPlan PlanVecNorm(int64_t h, int elem_bytes) {
  VecNormPlan p;
  if (elem_bytes != 4 && elem_bytes != 2) return p;
  const int v = 16 / elem_bytes;
  if (h <= 0 || h % v != 0) return p;
  const int64_t hv = h / v;
  for (int tpr : {32, 128, 512}) {
    // 512-thread blocks get at most 128 registers per thread: 16 elements each there, or the
    // backward (4 arrays of them) spills.
    const int max_vecs = (tpr == 512 ? kVecNormMaxElems / 2 : kVecNormMaxElems) / v;
    const int64_t need = (hv + tpr - 1) / tpr;
    if (need > max_vecs) continue;
    int vecs = 1;
    while (vecs < need) vecs *= 2;
    p.ok = true;
    p.tpr = tpr;
    p.vecs = vecs;
    p.threads = tpr > 128 ? tpr : 128;
    p.rows_per_block = p.threads / tpr;
    return p;
  }
  return p;
}

// Blocks of a forward launch over `rows` rows (grid-stride beyond 2^20 blocks).
inline int64_t VecNormBlocks(const VecNormPlan& p, int64_t rows) {
  int64_t b = (rows + p.rows_per_block - 1) / p.rows_per_block;
  if (b < 1) b = 1;
  if (b > (int64_t{1} << 20)) b = int64_t{1} << 20;
  return b;
}

// Blocks of a backward launch that also reduces dgamma / dbeta: each of its
// blocks * rows_per_block groups writes a partial row of h floats per gradient, so the groups are
// capped (at most 1024, fewer for long rows: about 64 MiB of partials) but kept >= 128 for
// bandwidth.
inline int64_t VecNormBackwardBlocks(const VecNormPlan& p, int64_t rows, int64_t h) {
  int64_t max_groups = (int64_t{64} << 20) / (8 * (h > 0 ? h : 1));
  if (max_groups > 1024) max_groups = 1024;
  if (max_groups < 128) max_groups = 128;
  int64_t b = VecNormBlocks(p, rows);
  const int64_t cap = max_groups / p.rows_per_block;
  if (b > cap) b = cap;
  return b < 1 ? 1 : b;
}

}  // namespace shardmap::cuda::nn_kernels

#endif  // SHARDMAP_TENSOR_CUDA_NN_NORM_PLAN_H_
