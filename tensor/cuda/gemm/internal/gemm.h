// One cuBLASLt matmul described in row-major terms, with a per-shape plan cache. Private to
// tensor/cuda/gemm: the tensor-level entry points are in tensor/cuda/gemm/ops.h.
//
//   GemmCall g;                                  // C[m,n] = op(a)[m,k] @ op(b)[k,n], row-major
//   g.device = 0; g.ab_dtype = g.cd_dtype = DType::kBF16;
//   g.m = 4096; g.n = 4096; g.k = 1024; g.a = x; g.b = w; g.c = y;
//   g.epilogue = Epilogue::kBias; g.bias = b;    // y = x @ w + b, b: [n]
//   RunGemm(g);                                  // on CurrentStream(0)
//
// Row-major to cuBLAS: cuBLASLt is column-major, and a row-major C[m,n] is a column-major
// C^T[n,m]. So C = op(a) op(b) runs as C^T = op(b)^T op(a)^T: cuBLAS's "A" is our b and its "B"
// is our a, no copies, only the transpose flags and leading dims change. The epilogues follow:
// the bias vector (length n) indexes cuBLAS's rows, the bias gradient of our rhs b is cuBLAS's
// BGRADA and the one of our lhs a is BGRADB.
//
// Plans: descriptors, layouts and the heuristic's candidates are cached per (device, m, n, k,
// batch, strides, transposes, dtypes, epilogue, pointer alignments); on a plan's first eager use
// its candidates are timed once and the fastest kept for the process (internal/autotune.h;
// SHARDMAP_GEMM_AUTOTUNE=0 keeps the heuristic's first answer). The steady state makes no
// heuristic query, times nothing and allocates nothing. The 32 MiB workspace is allocated once per
// (device, stream) through the device's caching allocator.
#ifndef SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_GEMM_H_
#define SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_GEMM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace shardmap::cuda::gemm_internal {

inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Row-major names. "aux" is the GELU input (pre-activation), [m,n] like C.
enum class Epilogue : uint8_t {
  kNone,
  kBias,         // C = a@b + bias[n]
  kGeluAux,      // aux = a@b;        C = gelu_tanh(aux)
  kGeluAuxBias,  // aux = a@b + bias; C = gelu_tanh(aux)
  kDGelu,        // C = (a@b) * gelu_tanh'(aux)
  kDGeluBGrad,   // kDGelu, and bias_grad[n] = column sums of C (over the m rows)
  kBGradRhs,     // C = a@b, and bias_grad[n] = sums of b over the contracted dim (cuBLAS BGRADA)
};

const char* EpilogueName(Epilogue e);

struct GemmCall {
  int device = 0;
  DType ab_dtype = DType::kF32;  // a and b
  DType cd_dtype = DType::kF32;  // C (read when accumulate) and D (written); also bias and aux
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;  // strided batch when > 1 (epilogues must then be kNone)
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  bool accumulate = false;  // beta = 1: C += a@b
  Epilogue epilogue = Epilogue::kNone;
  const void* bias = nullptr;  // kBias, kGeluAuxBias
  void* aux = nullptr;         // kGeluAux*, kDGelu*: [m,n] with row stride n (n % 8 == 0)
  void* bias_grad = nullptr;   // kDGeluBGrad, kBGradRhs: [n]
};

// cuBLAS's view of a GemmCall: column-major operands, each stored as rows x cols with leading
// dimension ld, used transposed when `trans`. cuBLAS's A is our b and its B is our a; C is our C.
// Pure arithmetic (no CUDA), so the mapping is tested on any machine (gemm_layout_test).
struct ColumnMajorMatrix {
  int64_t rows = 0, cols = 0, ld = 0;
  bool trans = false;
};
struct ColumnMajorProblem {
  ColumnMajorMatrix a, b, c;  // op(a) [c.rows, k] @ op(b) [k, c.cols] = c
};
ColumnMajorProblem ToColumnMajor(const GemmCall& g);

// cuBLASLt's batch count is an int32_t. A strided batch of more entries runs as consecutive
// chunks of at most max_batch entries: each part is g with a smaller batch and a, b, c advanced by
// the entries before it (pure pointer arithmetic, tested on any machine).
//
//   g.batch = 5, max_batch = 2  ->  parts with batch 2, 2, 1 at entries 0, 2, 4
inline constexpr int64_t kMaxBatch = 2147483647;
std::vector<GemmCall> SplitBatch(const GemmCall& g, int64_t max_batch = kMaxBatch);

// The plan cache's key of a call: device, dtypes, transposes, m, n, k, batch, strides (batched
// calls only), accumulate, epilogue and the alignment class (largest power of two up to 256
// dividing the address) of every pointer; so calls that differ only in where their operands sit
// (same alignment) share a plan and its tuned algorithm.
using PlanKey = std::array<int64_t, 20>;
PlanKey KeyOf(const GemmCall& g);
int64_t Alignment(const void* p);

// Enqueues the matmul on the current stream of g.device. m, n, k must be >= 1. c (and aux when
// written, bias_grad) must not overlap the inputs: a plan's first call may run its candidates
// into them before the real call (internal/autotune.h). Returns false,
// having launched nothing, when cuBLASLt has no algorithm for this epilogue (the caller then
// composes unfused ops); with Epilogue::kNone that is an OpError instead. Every cuBLASLt failure
// is an OpError with file:line and cuBLASLt's status name and text.
bool RunGemm(const GemmCall& g);

struct GemmStats {
  int64_t plans_created = 0;      // plan cache misses (each made one heuristic query)
  int64_t plan_hits = 0;          // calls served by a cached plan
  int64_t heuristic_queries = 0;  // cublasLtMatmulAlgoGetHeuristic calls
  int64_t matmuls = 0;            // cublasLtMatmul calls
  int64_t unsupported = 0;        // epilogue calls refused (no algorithm)
  int64_t workspaces = 0;         // workspaces allocated (one per device and stream)
  int64_t plans_tuned = 0;        // plans whose candidates were timed (internal/autotune.h)
  int64_t candidates_timed = 0;   // candidate algorithms timed in all
  int64_t candidates_found = 0;   // usable heuristic answers, over every plan created (one
                                  // answer: the plan has nothing to tune)
  int64_t tunes_deferred = 0;     // calls of untuned plans inside a graph capture (not timed)
};
GemmStats Stats();

}  // namespace shardmap::cuda::gemm_internal

#endif  // SHARDMAP_TENSOR_CUDA_GEMM_INTERNAL_GEMM_H_
