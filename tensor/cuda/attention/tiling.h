// Tiling of the fused causal attention kernels (attention.cu), as plain C++ shared by the kernels
// (nvcc) and the host launcher, so the host-side tests check the same numbers the kernels use.
//
//   AttentionTiling t = ForwardTiling(/*batch_heads=*/192, /*tq=*/1024, /*head_dim=*/64, 4);
//   // t.d_pad 64, t.group 4 threads per row, t.threads 256, t.blocks 16 * 192, t.smem 16 KiB
//
// Each query row (forward, dQ) or key row (dK/dV) is owned by a group of `group` consecutive
// lanes; lane `sub` of a group holds dims sub, sub + group, ... of the row (kPerThread of them):
// the row's dot products are a partial sum per lane plus log2(group) xor-shuffles. head_dim is
// padded with zeros to d_pad (32, 64 or 128) in registers and shared memory, so any head_dim from
// 1 to 128 runs; longer heads are refused by the launcher (kMaxHeadDim).
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_TILING_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_TILING_H_

#include <cstddef>
#include <cstdint>

// The causal-bound helpers are also called in device code.
#ifdef __CUDACC__
#define SM_ATTN_HD __host__ __device__
#else
#define SM_ATTN_HD
#endif

namespace shardmap::cuda::attention_kernels {

constexpr int kMaxHeadDim = 128;
constexpr int kPerThread = 16;   // head dims held per lane
constexpr int kQueryRows = 64;   // query rows per block (forward, dQ)
constexpr int kKeyRows = 32;     // key rows per block (dK/dV)
constexpr int kQueryTile = 32;   // query rows staged in shared memory per step (dK/dV)
// Keys staged per step (forward, dQ): fewer for f64 so its score registers stay bounded.
template <int kAccBytes>
struct KeyTile {
  static constexpr int kRows = kAccBytes == 8 ? 16 : 32;
};

// head_dim rounded up to a padded width the kernels are compiled for; 0 when unsupported.
inline int PaddedHeadDim(int64_t d) {
  if (d < 1 || d > kMaxHeadDim) return 0;
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

struct AttentionTiling {
  int d_pad = 0;      // padded head dim (32, 64, 128)
  int group = 0;      // lanes per row: d_pad / kPerThread
  int rows = 0;       // rows owned per block (queries or keys)
  int tile = 0;       // rows of the other side staged in shared memory per step
  int threads = 0;    // rows * group
  int64_t row_blocks = 0;  // ceil(rows of the sequence / rows)
  int64_t blocks = 0;      // row_blocks * batch_heads (one grid dim)
  size_t smem = 0;         // dynamic shared memory bytes
};

// Forward and dQ kernels: a block owns kQueryRows queries of one (batch, head) and stages
// KeyTile keys of K and V (as the accumulator type, acc_bytes wide) per step.
inline AttentionTiling ForwardTiling(int64_t batch_heads, int64_t tq, int64_t head_dim,
                                     int acc_bytes) {
  AttentionTiling t;
  t.d_pad = PaddedHeadDim(head_dim);
  if (t.d_pad == 0) return t;
  t.group = t.d_pad / kPerThread;
  t.rows = kQueryRows;
  t.tile = acc_bytes == 8 ? KeyTile<8>::kRows : KeyTile<4>::kRows;
  t.threads = t.rows * t.group;
  t.row_blocks = (tq + t.rows - 1) / t.rows;
  t.blocks = t.row_blocks * batch_heads;
  t.smem = static_cast<size_t>(2) * t.tile * t.d_pad * acc_bytes;  // K and V
  return t;
}

// dK/dV kernel: a block owns kKeyRows keys and stages kQueryTile rows of Q and dO plus their
// logsumexp and delta per step.
inline AttentionTiling KeyGradTiling(int64_t batch_heads, int64_t tk, int64_t head_dim,
                                     int acc_bytes) {
  AttentionTiling t;
  t.d_pad = PaddedHeadDim(head_dim);
  if (t.d_pad == 0) return t;
  t.group = t.d_pad / kPerThread;
  t.rows = kKeyRows;
  t.tile = kQueryTile;
  t.threads = t.rows * t.group;
  t.row_blocks = (tk + t.rows - 1) / t.rows;
  t.blocks = t.row_blocks * batch_heads;
  t.smem = static_cast<size_t>(2 * t.tile * t.d_pad + 2 * t.tile) * acc_bytes;
  return t;
}

// Causal bounds. Query i (local) sits at global position i + q_offset and sees keys
// j <= i + q_offset (keys are at positions 0..tk-1).

// Keys [0, result) that any of queries [q_first, q_first + rows) sees (clamped to tk).
SM_ATTN_HD inline int64_t VisibleKeyEnd(int64_t q_first, int64_t rows, int64_t tq, int64_t tk,
                             int64_t q_offset) {
  int64_t last = q_first + rows - 1;
  if (last > tq - 1) last = tq - 1;
  int64_t end = last + q_offset + 1;
  return end < 0 ? 0 : end > tk ? tk : end;
}

// The first query that sees key k_first (queries before it see none of keys >= k_first).
SM_ATTN_HD inline int64_t FirstQuerySeeing(int64_t k_first, int64_t q_offset) {
  const int64_t i = k_first - q_offset;
  return i < 0 ? 0 : i;
}

}  // namespace shardmap::cuda::attention_kernels

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_TILING_H_
