// Kernel launchers of the CUDA neural-network ops (tensor/cuda/nn/*.cu), called by nn_ops.cc.
//
//   int e = nn_kernels::LaunchSoftmax(x, y, DType::kBF16, outer, n, inner, /*log=*/false, stream);
//   SM_CUDA_CHECK(static_cast<cudaError_t>(e));
//
// Plain C++: raw device pointers, int64 sizes, the element DType, a cudaStream_t as void*.
// Each returns a cudaError_t as int (cudaGetLastError after the launches). "A" below is the
// accumulator/compute type: double for f64 data, float for f32, bf16 and f16.
//
// Layout: every kernel works on contiguous row-major data. Row kernels give one warp to a row of
// up to 1024 elements and one block (512 or 1024 threads) to longer rows; reductions are in A.
// Softmax and norm rows are read from global memory once and kept in shared memory (as A) for
// the later passes when the group's rows fit in 47 KiB; longer rows are re-read (from L2 mostly).
// Cross-entropy rows (a vocabulary) are always streamed: online statistics, then the write pass.
// Softmax over a dim other than the last gives each thread one lane (strided, coalesced across
// threads): fast when outer * inner is large, slow for few long lanes.
//
// Bad indices: `bad` (nullable) is a device uint64 the caller sets to ~0 beforehand; a kernel
// that meets an out-of-range id or target atomically lowers it to that flat position and treats
// the row as absent (zeros in outputs, no contribution to sums).
#ifndef SHARDMAP_TENSOR_CUDA_NN_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_NN_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "tensor/dtype.h"

namespace shardmap::cuda::nn_kernels {

// dst[i] = src[i] converted (any float dtype to any float dtype), i < n.
int LaunchCast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
               void* stream);

// Softmax (log_softmax when log) of x viewed as [outer, n, inner] along the middle dim.
int LaunchSoftmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner,
                  bool log, void* stream);
// dx from y = softmax(x) (or log_softmax(x)) and dy, same layout.
int LaunchSoftmaxBackward(const void* y, const void* dy, void* dx, DType dtype, int64_t outer,
                          int64_t n, int64_t inner, bool log, void* stream);

// LayerNorm (rms: RmsNorm) of rows x [rows, h] (dtype) with gamma/beta [h] in A (nullable).
// Writes y [rows, h] (dtype), rstd [rows] in A, and mean [rows] in A (LayerNorm only).
int LaunchNorm(const void* x, const void* gamma, const void* beta, void* y, void* mean,
               void* rstd, DType dtype, int64_t rows, int64_t h, double eps, bool rms,
               void* stream);
// dx [rows, h] (dtype) of LayerNorm (rms: RmsNorm); gamma [h], mean [rows] (LayerNorm only) and
// rstd [rows] in A.
int LaunchNormBackwardDx(const void* x, const void* gamma, const void* mean, const void* rstd,
                         const void* dy, void* dx, DType dtype, int64_t rows, int64_t h, bool rms,
                         void* stream);
// Number of row chunks of the parameter-gradient reduction; its workspace holds
// NormParamChunks(rows) * h elements of A for dgamma plus as many again for dbeta.
int64_t NormParamChunks(int64_t rows);
// dgamma[j] = sum_r dy[r,j] * xhat[r,j] and dbeta[j] = sum_r dy[r,j] (dbeta nullable; rms: no
// mean), written in dgamma_dtype / dbeta_dtype. Deterministic: fixed-order partial sums per row
// chunk in `workspace` (2 * NormParamChunks(rows) * h elements of A), then a sum over chunks.
int LaunchNormBackwardParams(const void* x, const void* mean, const void* rstd, const void* dy,
                             DType dtype, int64_t rows, int64_t h, bool rms, void* workspace,
                             void* dgamma, DType dgamma_dtype, void* dbeta, DType dbeta_dtype,
                             void* stream);

// The register-resident norm kernels (norm_vec.cu, plan in norm_plan.h): f32/bf16/f16 rows
// whose length is a multiple of 16 bytes, up to 8192 elements, every pointer 16-byte aligned
// (nullptr counts as aligned). Same arguments and results as LaunchNorm and
// LaunchNormBackwardDx + LaunchNormBackwardParams (gamma, beta, mean, rstd in f32).
bool VecNormUsable(DType dtype, int64_t h, std::initializer_list<const void*> pointers);
int LaunchNormVec(const void* x, const void* gamma, const void* beta, void* y, void* mean,
                  void* rstd, DType dtype, int64_t rows, int64_t h, double eps, bool rms,
                  void* stream);
// Softmax (log: log_softmax) over the last dim of rows [rows, n], forward and backward, with the
// register-resident kernels: usable when VecNormUsable(dtype, n, {every pointer}).
int LaunchSoftmaxVec(const void* x, void* y, DType dtype, int64_t rows, int64_t n, bool log,
                     void* stream);
int LaunchSoftmaxBackwardVec(const void* y, const void* dy, void* dx, DType dtype, int64_t rows,
                             int64_t n, bool log, void* stream);
// Partial rows of the backward's dgamma / dbeta reduction; its workspace holds
// 2 * VecNormPartialRows(dtype, rows, h) * h floats.
int64_t VecNormPartialRows(DType dtype, int64_t rows, int64_t h);
// dx, and dgamma / dbeta (each nullable; rms: no dbeta) folded deterministically from per-group
// partial rows: x and dy are read once.
int LaunchNormBackwardVec(const void* x, const void* gamma, const void* mean, const void* rstd,
                          const void* dy, void* dx, DType dtype, int64_t rows, int64_t h,
                          bool rms, void* workspace, void* dgamma, DType dgamma_dtype,
                          void* dbeta, DType dbeta_dtype, void* stream);

// Per-row loss [rows] in A of logits [rows, v] (dtype) and integer targets [rows] (i64 when
// targets_i64, else i32): logsumexp(row) - row[t]; 0 for ignore_index and bad targets.
int LaunchCrossEntropy(const void* logits, DType dtype, const void* targets, bool targets_i64,
                       void* loss, int64_t rows, int64_t v, int64_t ignore_index,
                       unsigned long long* bad, void* stream);
// dx [rows, v] (dtype) = (softmax(row) - onehot(t)) * dloss[r], dloss [rows] in A; zero rows
// for ignore_index and bad targets.
int LaunchCrossEntropyBackward(const void* logits, DType dtype, const void* targets,
                               bool targets_i64, const void* dloss, void* dx, int64_t rows,
                               int64_t v, int64_t ignore_index, unsigned long long* bad,
                               void* stream);

// out[i, :] = table[ids[i], :] for i < n; table [v, row_bytes] of any dtype. Rows of bad ids
// are zero.
int LaunchEmbedding(const void* table, int64_t v, int64_t row_bytes, const void* ids,
                    bool ids_i64, int64_t n, void* out, unsigned long long* bad, void* stream);
// acc [num_rows, h] in A: acc[r, :] = sum of dy[i, :] over ids[i] == r, summed in order of i
// (deterministic: the ids are radix-sorted stably, then each row sums its tokens; no atomics, so
// the same inputs give the same bits on every run). Bad ids are skipped and recorded. scratch:
// EmbeddingBackwardScratchBytes(n, num_rows) bytes of device memory, 256-byte aligned. n and
// num_rows below 2^31 (else cudaErrorInvalidValue).
size_t EmbeddingBackwardScratchBytes(int64_t n, int64_t num_rows);
int LaunchEmbeddingBackward(const void* ids, bool ids_i64, int64_t n, const void* dy, DType dtype,
                            int64_t h, int64_t num_rows, void* acc, unsigned long long* bad,
                            void* scratch, void* stream);

// y = softmax over the last dim of x viewed as [mats, s, t], entries [.., i, j] with
// j > i + offset excluded (and written as 0); rows with no visible entry are all 0.
int LaunchCausalSoftmax(const void* x, void* y, DType dtype, int64_t mats, int64_t s, int64_t t,
                        int64_t offset, void* stream);

// y = x with entries [.., i, j] where j > i + offset set to fill; x viewed as [mats, s, t].
int LaunchCausalMask(const void* x, void* y, DType dtype, int64_t mats, int64_t s, int64_t t,
                     int64_t offset, double fill, void* stream);

}  // namespace shardmap::cuda::nn_kernels

#endif  // SHARDMAP_TENSOR_CUDA_NN_KERNELS_H_
