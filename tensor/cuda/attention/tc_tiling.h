// Tiling, shared-memory layout and eligibility of the tensor-core (WMMA) attention kernels
// (attention_tc.cu), as plain C++ shared by the kernels (nvcc) and the host, so host tests check
// the very offsets the kernels use.
//
//   if (TensorCoreEligible(DType::kBF16, 64)) {
//     const TcLayout f = TcForwardLayout(64);  // f.total bytes of dynamic shared memory
//   }
//
// Every kernel runs kTcWarps warps; warp w owns rows [16 w, 16 w + 16) of the block's kTcRows
// rows (queries for the forward and dQ, keys for dK/dV) and streams tiles of kTcCols rows of the
// other side through shared memory. Products run as 16x16x16 bf16/f16 WMMA fragments with f32
// accumulators; the softmax statistics and masking run on f32 scores stored to shared memory, so
// nothing depends on the accumulator fragments' register layout.
//
// Layouts (elements): 16-bit tiles [rows][d + 8], f32 score tiles [rows][kTcCols + 4], 16-bit
// probability tiles [rows][kTcCols + 8], f32 output tiles [rows][d + 4]. The pads keep WMMA's
// ldm a multiple of 8 (16-bit) or 4 (f32) and shift rows across shared-memory banks; every
// region starts on a 128-byte boundary and every 16-row/16-column fragment origin is 32-byte
// aligned (checked by the host test).
#ifndef SHARDMAP_TENSOR_CUDA_ATTENTION_TC_TILING_H_
#define SHARDMAP_TENSOR_CUDA_ATTENTION_TC_TILING_H_

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

// The constexpr layout helpers are also evaluated in device code.
#ifdef __CUDACC__
#define SM_TC_HD __host__ __device__
#else
#define SM_TC_HD
#endif

namespace shardmap::cuda::attention_kernels {

constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = kTcWarps * 16;  // rows owned per block
constexpr int kTcCols = 64;             // rows of the other side per streamed tile
constexpr int kTcFrag = 16;             // WMMA m = n = k
constexpr size_t kTcMaxSmem = 227 * 1024;  // sm_90's opt-in per-block maximum

// Leading dimensions (in elements) of the shared-memory tiles.
SM_TC_HD constexpr int TcHalfLd(int d) { return d + 8; }   // 16-bit [rows][d] tiles (Q, K, V, dO)
constexpr int kTcScoreLd = kTcCols + 4;           // f32 [rows][kTcCols] (S, dP)
constexpr int kTcProbLd = kTcCols + 8;            // 16-bit [rows][kTcCols] (P, dS)
SM_TC_HD constexpr int TcOutLd(int d) { return d + 4; }    // f32 [rows][d] (the forward's O)

// The tensor-core kernels run bf16 and f16 data with head_dim 64 or 128 (the GPT shapes); every
// other dtype or head_dim takes the SIMT kernels of attention.cu.
inline bool TensorCoreEligible(DType dtype, int64_t head_dim) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && (head_dim == 64 || head_dim == 128);
}

// Which kernels run: kAuto = tensor cores where UseTensorCores allows, SIMT otherwise; kSimt
// forces the SIMT kernels (the reference, and SHARDMAP_ATTENTION_KERNEL=simt); kTensorCore asks
// for tensor cores (the ops layer refuses it for ineligible dtypes/head dims).
enum class AttentionKernel { kAuto, kSimt, kTensorCore };

// Whether a launch takes the tensor-core kernels. `aligned`: every input pointer is 16-byte
// aligned (the kernels stage rows with 16-byte vector loads); unaligned views fall back to SIMT.
inline bool UseTensorCores(DType dtype, int64_t head_dim, AttentionKernel kernel, bool aligned) {
  return kernel != AttentionKernel::kSimt && aligned && TensorCoreEligible(dtype, head_dim);
}

// Byte offsets of a kernel's shared-memory regions (0 where the kernel has none) and the total.
struct TcLayout {
  size_t a = 0, b = 0, c = 0, d = 0;  // four 16-bit [kTcRows][hd + 8] tiles
  size_t s = 0, dp = 0;               // f32 score tiles [kTcRows][kTcScoreLd]
  size_t p = 0, ds = 0;               // 16-bit probability tiles [kTcRows][kTcProbLd]
  size_t o = 0;                       // f32 output tile [kTcRows][hd + 4]
  size_t stats = 0;                   // f32 per-row statistics, 4 arrays of kTcRows (or kTcCols)
  size_t total = 0;
};

SM_TC_HD constexpr size_t TcAlign(size_t x) { return (x + 127) / 128 * 128; }

// Forward: a = Q, b = K, c = V; s = S; p = P; o = O; stats = m, l, alpha, poison.
SM_TC_HD constexpr TcLayout TcForwardLayout(int hd) {
  TcLayout l;
  const size_t half_tile = TcAlign(size_t{2} * kTcRows * TcHalfLd(hd));
  l.a = 0;
  l.b = l.a + half_tile;
  l.c = l.b + half_tile;
  l.s = l.c + half_tile;
  l.p = l.s + TcAlign(size_t{4} * kTcRows * kTcScoreLd);
  l.o = l.p + TcAlign(size_t{2} * kTcRows * kTcProbLd);
  l.stats = l.o + TcAlign(size_t{4} * kTcRows * TcOutLd(hd));
  l.total = l.stats + TcAlign(size_t{4} * 4 * kTcRows);
  return l;
}

// dK/dV: a = K, b = V (the block's keys), c = Q, d = dO (the streamed queries); s = S^T,
// dp = dP^T; p = P^T, ds = dS^T; stats = lse and delta of the streamed queries.
// dQ: a = Q, b = dO (the block's queries), c = K, d = V (the streamed keys); s = S, dp = dP;
// ds = dS; stats = lse and delta of the block's queries.
// Both reuse s and dp (contiguous) at the end as each warp's f32 staging of its output rows.
SM_TC_HD constexpr TcLayout TcBackwardLayout(int hd) {
  TcLayout l;
  const size_t half_tile = TcAlign(size_t{2} * kTcRows * TcHalfLd(hd));
  const size_t score = TcAlign(size_t{4} * kTcRows * kTcScoreLd);
  const size_t prob = TcAlign(size_t{2} * kTcRows * kTcProbLd);
  l.a = 0;
  l.b = l.a + half_tile;
  l.c = l.b + half_tile;
  l.d = l.c + half_tile;
  l.s = l.d + half_tile;
  l.dp = l.s + score;
  l.p = l.dp + score;
  l.ds = l.p + prob;
  l.stats = l.ds + prob;
  l.total = l.stats + TcAlign(size_t{4} * 2 * kTcRows);
  return l;
}

// Bytes one warp needs to stage its 16 output rows as f32 [16][hd + 4] at the end of a
// backward kernel; must fit in the s + dp regions divided among the warps.
SM_TC_HD constexpr size_t TcWarpOutStage(int hd) { return size_t{4} * kTcFrag * TcOutLd(hd); }

// Blocks of kTcRows rows covering n rows.
inline int64_t TcRowBlocks(int64_t n) { return (n + kTcRows - 1) / kTcRows; }

}  // namespace shardmap::cuda::attention_kernels

#endif  // SHARDMAP_TENSOR_CUDA_ATTENTION_TC_TILING_H_
