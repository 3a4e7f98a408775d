// Multi-tensor kernels: one launch over a list of tensors (the parameters or gradients of a
// model) for the sum of squares, an in-place scale and the fused AdamW update. The list is a
// table of MultiTensorEntry in device memory; each tensor is cut into chunks of
// kMultiTensorChunk elements, and a block finds its chunk's tensor by binary search over the
// entries' first chunks (FindEntry, shared by host tests and the device).
//
//   std::vector<MultiTensorEntry> t = ...;            // p, n, dtype per tensor
//   const int64_t chunks = PlanMultiTensorChunks(t);  // fills chunk_begin, drops nothing
//   LaunchUploadTable(t.data(), t.size() * sizeof(t[0]), device_table, stream);
//   LaunchSumOfSquares(device_table, t.size(), chunks, partials, out, DType::kF32, stream);
//
// The upload is a kernel whose parameters carry the table's bytes, so it is stream-ordered,
// needs no pinned staging, and is captured into a CUDA graph like any launch (a replay re-writes
// the same table). Plain C++: raw device pointers, a cudaStream_t as void*; each launcher
// returns a cudaError_t as int.
#ifndef SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_KERNELS_H_
#define SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

#ifdef __CUDACC__
#define SM_HOST_DEVICE __host__ __device__
#else
#define SM_HOST_DEVICE
#endif

namespace shardmap::cuda::kernels {

// Elements per chunk (a block's unit of work): a multiple of 4 so 16-byte vector loads stay
// aligned inside a tensor whose base is.
constexpr int64_t kMultiTensorChunk = 16384;

// One tensor of a multi-tensor launch. a: the tensor (the parameter for AdamW); b, c, d: AdamW's
// gradient, exp_avg and exp_avg_sq (null otherwise). dtype: DType as int (AdamW: f32 only).
// decay: AdamW applies decoupled weight decay to this tensor. aligned: every pointer is 16-byte
// aligned (vector loads).
struct MultiTensorEntry {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* d = nullptr;
  int64_t n = 0;
  int64_t chunk_begin = 0;  // first chunk of this tensor in the launch (filled by the plan)
  int32_t dtype = 0;
  int16_t decay = 0;
  int16_t aligned = 0;
};
static_assert(sizeof(MultiTensorEntry) == 56, "the device reads the host's layout");

// Fills each entry's chunk_begin; returns the total number of chunks. Entries of no elements get
// no chunks (FindEntry never returns them).
inline int64_t PlanMultiTensorChunks(std::vector<MultiTensorEntry>& entries) {
  int64_t c = 0;
  for (MultiTensorEntry& e : entries) {
    e.chunk_begin = c;
    c += (e.n + kMultiTensorChunk - 1) / kMultiTensorChunk;
  }
  return c;
}

// The entry holding chunk `chunk` (0 <= chunk < total chunks): the last entry whose chunk_begin
// is <= chunk (an empty entry shares its chunk_begin with the next one, so it is never chosen).
SM_HOST_DEVICE inline int FindEntry(const MultiTensorEntry* entries, int count, int64_t chunk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (entries[mid].chunk_begin <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// How many blocks a multi-tensor launch of `chunks` chunks uses (each loops over chunks with
// stride gridDim.x), and so how many partial sums LaunchSumOfSquares writes.
inline int64_t MultiTensorBlocks(int64_t chunks) {
  const int64_t cap = 4096;
  return chunks < 1 ? 1 : (chunks < cap ? chunks : cap);
}

// Copies nbytes of host memory to device memory `dst` on `stream` with kernels whose parameters
// carry the bytes (3968 per launch). dst: 16-byte aligned.
int LaunchUploadTable(const void* host, size_t nbytes, void* dst, void* stream);

// out (one element of out_dtype, f32 or f64) = sum over the table's tensors (f32, f64, bf16,
// f16) of their squared elements, folded in f64 in a fixed order (deterministic). partials:
// MultiTensorBlocks(chunks) doubles of device workspace.
int LaunchSumOfSquares(const MultiTensorEntry* table, int count, int64_t chunks, double* partials,
                       void* out, DType out_dtype, void* stream);

// Every element of the table's tensors (f32, f64, bf16, f16; in place) times the device scalar
// *scale (f32, or f64 when scale_f64), rounded once to the tensor's dtype.
int LaunchScaleInPlace(const MultiTensorEntry* table, int count, int64_t chunks,
                       const void* scale, bool scale_f64, void* stream);

// AdamW's per-step scalars, computed on the device by LaunchAdamWPrepare so a captured step
// replays with the right bias correction.
struct AdamWScalars {
  int64_t step = 0;          // t after this step's increment
  float step_size = 0;       // lr / (1 - b1^t)
  float inv_sqrt_bc2 = 0;    // 1 / sqrt(1 - b2^t)
  float decay_factor = 1;    // 1 - lr * weight_decay
  float grad_scale = 1;      // *grad_scale of the prepare call (1 without)
  int32_t skip = 0;          // 1: this step is skipped (a non-finite check value); see below
  float pad = 0;
};
static_assert(sizeof(AdamWScalars) == 32, "the device reads the host's layout");

// One thread: scalars->step = (set_step >= 0 ? set_step : scalars->step) + 1, then the step's
// coefficients. grad_scale: null, or a device scalar (f32, f64 when grad_scale_f64) that
// multiplies every gradient (global-norm clipping without a host sync). lr_device: null (use
// lr), or an f64 device scalar read when the kernel runs (a captured step's schedule writes it
// before each replay). skip_check: null, or a device scalar (f32, f64 when skip_check_f64):
// when it is not finite (e.g. loss + sum of squared gradients), scalars->skip = 1, the step
// count is left as it was (set_step is not applied either) and LaunchAdamW changes nothing.
int LaunchAdamWPrepare(AdamWScalars* scalars, int64_t set_step, double lr, double beta1,
                       double beta2, double weight_decay, const void* grad_scale,
                       bool grad_scale_f64, void* stream, const double* lr_device = nullptr,
                       const void* skip_check = nullptr, bool skip_check_f64 = false);

// The AdamW update of every f32 entry (a: param, b: grad, c: exp_avg, d: exp_avg_sq; in place;
// nothing when scalars->skip):
//   g *= grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p = p * (decay ? decay_factor : 1) - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
int LaunchAdamW(const MultiTensorEntry* table, int count, int64_t chunks,
                const AdamWScalars* scalars, double beta1, double beta2, double eps,
                void* stream);

// *out = min(1, max_norm / (sqrt(*sum_sq) + 1e-6)) (PyTorch's clip_grad_norm_ coefficient).
// sum_sq and out: f32 or f64 device scalars.
int LaunchClipCoefficient(const void* sum_sq, bool sum_sq_f64, double max_norm, void* out,
                          bool out_f64, void* stream);

}  // namespace shardmap::cuda::kernels

#undef SM_HOST_DEVICE

#endif  // SHARDMAP_TENSOR_CUDA_REDUCE_MULTI_TENSOR_KERNELS_H_
