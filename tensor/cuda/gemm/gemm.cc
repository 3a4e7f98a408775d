#include "tensor/cuda/gemm/internal/gemm.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "base/host_waits.h"
#include "absl/strings/str_cat.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/gemm/internal/autotune.h"
#include "tensor/cuda/gemm/internal/cublaslt_check.h"
#include "tensor/cuda/internal/capture_mode.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/runtime.h"

#endif  // SHARDMAP_HAS_CUDA

namespace shardmap::cuda::gemm_internal {

const char* EpilogueName(Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return "none";
    case Epilogue::kBias: return "bias";
    case Epilogue::kGeluAux: return "gelu_aux";
    case Epilogue::kGeluAuxBias: return "gelu_aux_bias";
    case Epilogue::kDGelu: return "dgelu";
    case Epilogue::kDGeluBGrad: return "dgelu_bgrad";
    case Epilogue::kBGradRhs: return "bgrad_rhs";
  }
  return "?";
}

ColumnMajorProblem ToColumnMajor(const GemmCall& g) {
  ColumnMajorProblem p;
  // Row-major b: [k,n] (or [n,k] when trans_b) is column-major [n,k] (or [k,n]) with ld = n (k):
  // already op(b)^T unless trans_b, in which case cuBLAS transposes it.
  p.a.rows = g.trans_b ? g.k : g.n;
  p.a.cols = g.trans_b ? g.n : g.k;
  p.a.trans = g.trans_b;
  // Row-major a: [m,k] (or [k,m] when trans_a) is column-major [k,m] (or [m,k]).
  p.b.rows = g.trans_a ? g.m : g.k;
  p.b.cols = g.trans_a ? g.k : g.m;
  p.b.trans = g.trans_a;
  // Row-major C [m,n] is column-major [n,m] with ld = n.
  p.c.rows = g.n;
  p.c.cols = g.m;
  for (ColumnMajorMatrix* x : {&p.a, &p.b, &p.c}) x->ld = x->rows;  // dense
  return p;
}

std::vector<GemmCall> SplitBatch(const GemmCall& g, int64_t max_batch) {
  std::vector<GemmCall> parts;
  const uint64_t ab = DTypeSize(g.ab_dtype), cd = DTypeSize(g.cd_dtype);
  // Integer address arithmetic: no pointer arithmetic past (or from) the operands.
  auto advance = [](const void* p, int64_t entries, int64_t stride, uint64_t size) {
    return reinterpret_cast<uintptr_t>(p) +
           static_cast<uintptr_t>(static_cast<uint64_t>(entries) *
                                  static_cast<uint64_t>(stride) * size);
  };
  for (int64_t done = 0; done < g.batch; done += max_batch) {
    GemmCall part = g;
    part.batch = std::min(max_batch, g.batch - done);
    part.a = reinterpret_cast<const void*>(advance(g.a, done, g.stride_a, ab));
    part.b = reinterpret_cast<const void*>(advance(g.b, done, g.stride_b, ab));
    part.c = reinterpret_cast<void*>(advance(g.c, done, g.stride_c, cd));
    parts.push_back(part);
  }
  return parts;
}

// The largest power of two (at most 256) dividing the address: what the heuristic must assume.
int64_t Alignment(const void* p) {
  if (p == nullptr) return 256;
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  return static_cast<int64_t>(std::min<uintptr_t>(256, v & (~v + 1)));
}

PlanKey KeyOf(const GemmCall& g) {
  return PlanKey{g.device,
                 static_cast<int64_t>(g.ab_dtype),
                 static_cast<int64_t>(g.cd_dtype),
                 g.trans_a,
                 g.trans_b,
                 g.m,
                 g.n,
                 g.k,
                 g.batch,
                 g.batch > 1 ? g.stride_a : 0,
                 g.batch > 1 ? g.stride_b : 0,
                 g.batch > 1 ? g.stride_c : 0,
                 g.accumulate,
                 static_cast<int64_t>(g.epilogue),
                 Alignment(g.a),
                 Alignment(g.b),
                 Alignment(g.c),
                 Alignment(g.bias),
                 Alignment(g.aux),
                 Alignment(g.bias_grad)};
}

#if SHARDMAP_HAS_CUDA
namespace {

struct Counters {
  std::atomic<int64_t> plans_created{0}, plan_hits{0}, heuristic_queries{0}, matmuls{0},
      unsupported{0}, workspaces{0}, plans_tuned{0}, candidates_timed{0}, candidates_found{0},
      tunes_deferred{0};
};
Counters& GetCounters() {
  static Counters* c = new Counters;
  return *c;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF64: return CUDA_R_64F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: OpFail("cuda gemm: unsupported dtype ", DTypeName(t));
  }
}

uint32_t CublasEpilogue(Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::kDGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::kBGradRhs: return CUBLASLT_EPILOGUE_BGRADA;  // our rhs is cuBLAS's A
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One cuBLASLt handle per device, shared by all threads (the handle holds no stream or
// workspace; cublasLtMatmul takes both per call). Never destroyed: a static destructor would run
// after the CUDA context is torn down at exit.
cublasLtHandle_t Handle(int device) {
  static std::mutex mu;
  static auto* handles = new std::map<int, cublasLtHandle_t>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cublasLtHandle_t h = nullptr;
  {
    // The first GEMM of a device may come inside a CUDA-graph capture: whatever set-up calls
    // cublasLtCreate makes must not invalidate it.
    cuda::internal::RelaxedCaptureMode relaxed;
    SM_CUBLASLT_CHECK(cublasLtCreate(&h));
  }
  handles->emplace(device, h);
  return h;
}

// The 32 MiB workspace of (device, stream), allocated once from the caching allocator on that
// stream. Work on one stream is serialised, so its GEMMs can share one workspace. The per-thread
// default stream has one handle value for every thread but is a different stream per thread,
// so its workspaces are per thread (a thread_local map: a new thread never inherits the
// workspace of an exited one whose work may still run). Workspaces are never freed.
void* NewWorkspace(int device) {
  void* p = DeviceAllocate(device, kWorkspaceBytes);  // on this thread's current stream
  GetCounters().workspaces.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void* Workspace(int device, cudaStream_t stream) {
  if (stream == cudaStreamPerThread) {
    thread_local std::map<int, void*> mine;
    auto it = mine.find(device);
    if (it != mine.end()) return it->second;
    void* p = NewWorkspace(device);
    mine.emplace(device, p);
    return p;
  }
  static std::mutex mu;
  static auto* spaces = new std::map<std::pair<int, void*>, void*>;
  const auto key = std::make_pair(device, static_cast<void*>(stream));
  std::lock_guard<std::mutex> lock(mu);
  auto it = spaces->find(key);
  if (it != spaces->end()) return it->second;
  void* p = NewWorkspace(device);
  spaces->emplace(key, p);
  return p;
}

// Descriptors and the chosen algorithm for one cache key. `desc` is the heuristic's (and
// tuning's) descriptor; each call sets its pointers on a per-thread copy (ThreadDesc). `mu`
// guards `algo` (a copy is taken per call) and serialises tuning; it is never held across the
// matmul a caller enqueues.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};  // the one used: the heuristic's first, then the tuned winner
  std::vector<cublasLtMatmulAlgo_t> candidates;  // usable answers of the heuristic, its order
  std::atomic<bool> supported{false};  // read without mu; cleared when cublasLtMatmul refuses
  std::atomic<bool> tuned{false};      // candidates timed (or nothing to choose from)
  std::mutex mu;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // only for a plan whose creation threw: cached plans live as long as the process
    if (lc != nullptr) cublasLtMatrixLayoutDestroy(lc);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

void SetDescPointers(cublasLtMatmulDesc_t desc, const GemmCall& g) {
  if (g.bias != nullptr) {
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  if (g.bias_grad != nullptr) {
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias_grad, sizeof(g.bias_grad)));
  }
  if (g.aux != nullptr) {
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  }
}

cublasLtMatrixLayout_t MakeLayout(cudaDataType_t type, const ColumnMajorMatrix& x,
                                  int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  SM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&l, type, x.rows, x.cols, x.ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    SM_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof(count)));
    SM_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

// The matmul descriptor of g's plan: compute type, transposes, epilogue and g's pointers.
cublasLtMatmulDesc_t MakeDesc(const GemmCall& g) {
  cublasLtMatmulDesc_t desc = nullptr;
  const bool f64 = g.ab_dtype == DType::kF64;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;  // no TF32
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  SM_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale));
  try {
    // cuBLAS computes C^T = op(b)^T op(a)^T: its A is our b, its B is our a.
    const ColumnMajorProblem cm = ToColumnMajor(g);
    const int32_t op_a = cm.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_b = cm.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                     sizeof(op_a)));
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                     sizeof(op_b)));
    const uint32_t epilogue = CublasEpilogue(g.epilogue);
    SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof(epilogue)));
    if (g.aux != nullptr) {
      const int64_t aux_ld = g.n;  // aux is row-major [m,n] = column-major [n,m]
      SM_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    SetDescPointers(desc, g);  // the heuristic reads their alignment
  } catch (...) {
    cublasLtMatmulDescDestroy(desc);
    throw;
  }
  return desc;
}

// This thread's copy of plan's descriptor, with g's pointers set. The pointer attributes change
// per call, so each thread sets them on a descriptor of its own: no lock is held across
// cublasLtMatmul (GEMMs of virtual ranks sharing a GPU enqueue concurrently). Plans live as long
// as the process, so a plan's address keys its copies; they are destroyed with the thread.
cublasLtMatmulDesc_t ThreadDesc(const Plan* plan, const GemmCall& g) {
  struct Descs {
    std::map<const Plan*, cublasLtMatmulDesc_t> by_plan;
    ~Descs() {
      for (auto& [p, d] : by_plan) cublasLtMatmulDescDestroy(d);
    }
  };
  thread_local Descs descs;
  auto it = descs.by_plan.find(plan);
  if (it == descs.by_plan.end()) {
    it = descs.by_plan.emplace(plan, MakeDesc(g)).first;  // pointers set by MakeDesc
    return it->second;
  }
  SetDescPointers(it->second, g);
  return it->second;
}

std::unique_ptr<Plan> MakePlan(cublasLtHandle_t handle, const GemmCall& g) {
  auto plan = std::make_unique<Plan>();
  plan->desc = MakeDesc(g);
  const ColumnMajorProblem cm = ToColumnMajor(g);

  const cudaDataType_t ab = CudaType(g.ab_dtype), cd = CudaType(g.cd_dtype);
  plan->la = MakeLayout(ab, cm.a, g.batch, g.stride_b);
  plan->lb = MakeLayout(ab, cm.b, g.batch, g.stride_a);
  plan->lc = MakeLayout(cd, cm.c, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align_a = static_cast<uint32_t>(Alignment(g.b));  // cuBLAS A = our b
  const uint32_t align_b = static_cast<uint32_t>(Alignment(g.a));
  const uint32_t align_c = static_cast<uint32_t>(Alignment(g.c));
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));

  constexpr int kRequested = kHeuristicCandidates;
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  GetCounters().heuristic_queries.fetch_add(1, std::memory_order_relaxed);
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->la, plan->lb, plan->lc, plan->lc,
                                     pref, kRequested, results, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  const bool refusal = s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE;
  if (s != CUBLAS_STATUS_SUCCESS && !(refusal && g.epilogue != Epilogue::kNone)) {
    SM_CUBLASLT_CHECK(s);
  }
  if (s == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < returned; ++i) {  // ordered by estimated time: the first usable leads
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws) {
        plan->candidates.push_back(results[i].algo);
      }
    }
    if (!plan->candidates.empty()) {
      plan->algo = plan->candidates[0];
      plan->supported = true;
    }
  }
  plan->tuned = plan->candidates.size() < 2;  // nothing to choose from
  GetCounters().plans_created.fetch_add(1, std::memory_order_relaxed);
  GetCounters().candidates_found.fetch_add(static_cast<int64_t>(plan->candidates.size()),
                                           std::memory_order_relaxed);
  return plan;
}

std::string Describe(const GemmCall& g) {
  return absl::StrCat("cuda gemm [", g.batch > 1 ? absl::StrCat(g.batch, "x") : "", g.m, ",",
                      g.k, "]", g.trans_a ? "^T" : "", " @ [", g.k, ",", g.n, "]",
                      g.trans_b ? "^T" : "", " ", DTypeName(g.ab_dtype), "->",
                      DTypeName(g.cd_dtype), " epilogue ", EpilogueName(g.epilogue));
}

Plan* FindPlan(cublasLtHandle_t handle, const GemmCall& g) {
  static std::mutex mu;
  static auto* plans = new absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>>;
  const PlanKey key = KeyOf(g);
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans->find(key);
  if (it != plans->end()) {
    GetCounters().plan_hits.fetch_add(1, std::memory_order_relaxed);
    return it->second.get();
  }
  // Created under the lock: a miss is rare (once per shape) and host-only.
  auto plan = MakePlan(handle, g);
  Plan* p = plan.get();
  plans->emplace(key, std::move(plan));
  return p;
}

// Times every candidate of `plan` on g's operands (one warm-up and kTimedRuns timed runs each,
// CUDA events on `stream`) and makes the fastest the plan's algorithm. Without accumulation the
// runs write g's own C (and epilogue outputs: aux, bias gradient), which the real call then
// rewrites, so tuning allocates nothing. With accumulation (C is an input) they write a zeroed
// scratch C of at most kMaxTuneScratchBytes; a larger one, or one that cannot be allocated,
// leaves the plan on the heuristic's first answer. Waits for the stream (once per candidate).
// Caller holds plan.mu with the descriptor's pointers set for g; the stream is not being
// captured.
void Tune(Plan& plan, const GemmCall& g, cublasLtHandle_t handle, void* workspace,
          cudaStream_t stream, const void* alpha, const void* beta) {
  // Another thread's stream may be capturing in global mode: event and memory calls here record
  // nothing into it.
  cuda::internal::RelaxedCaptureMode relaxed;
  void* out = g.c;
  void* scratch = nullptr;
  if (g.accumulate) {
    const int64_t c_elems = g.batch > 1 ? (g.batch - 1) * g.stride_c + g.m * g.n : g.m * g.n;
    const size_t c_bytes = static_cast<size_t>(c_elems) * DTypeSize(g.cd_dtype);
    if (c_bytes <= kMaxTuneScratchBytes) {
      try {
        scratch = DeviceAllocate(g.device, c_bytes);  // on this thread's current stream
      } catch (const OpError&) {
        scratch = nullptr;  // out of memory: no tuning, not an error
      }
    }
    if (scratch == nullptr) {
      plan.tuned = true;  // stays on the heuristic's first answer
      return;
    }
    SM_CUDA_CHECK(cudaMemsetAsync(scratch, 0, c_bytes, stream));
    out = scratch;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  SM_CUDA_CHECK(cudaEventCreate(&start));
  SM_CUDA_CHECK(cudaEventCreate(&stop));
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, plan.desc, alpha, /*A=*/g.b, plan.la, /*B=*/g.a, plan.lb, beta,
                          out, plan.lc, out, plan.lc, &algo, workspace, kWorkspaceBytes, stream);
  };
  const int count = static_cast<int>(plan.candidates.size());
  const int best = PickFastest(count, [&](int i) -> double {
    GetCounters().candidates_timed.fetch_add(1, std::memory_order_relaxed);
    if (run(plan.candidates[i]) != CUBLAS_STATUS_SUCCESS) return INFINITY;  // warm-up
    if (cudaEventRecord(start, stream) != cudaSuccess) return INFINITY;
    for (int r = 0; r < kTimedRuns; ++r) {
      if (run(plan.candidates[i]) != CUBLAS_STATUS_SUCCESS) return INFINITY;
    }
    float ms = 0;
    base::CountHostWait(base::HostWait::kEventSync);
    if (cudaEventRecord(stop, stream) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      return INFINITY;
    }
    return ms;
  });
  internal::NoteCudaError(cudaEventDestroy(start), "cudaEventDestroy (GEMM autotune)");
  internal::NoteCudaError(cudaEventDestroy(stop), "cudaEventDestroy (GEMM autotune)");
  if (scratch != nullptr) DeviceFree(g.device, scratch);  // reused in stream order
  // A failed launch must not linger as the stream's sticky "last error".
  (void)cudaGetLastError();
  plan.algo = plan.candidates[best];
  plan.tuned = true;
  GetCounters().plans_tuned.fetch_add(1, std::memory_order_relaxed);
}

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SM_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

bool RunGemm(const GemmCall& g) {
  if (g.m < 1 || g.n < 1 || g.k < 1 || g.batch < 1) {
    OpFail(Describe(g), ": needs m, n, k, batch >= 1");
  }
  if ((g.ab_dtype == DType::kF64) != (g.cd_dtype == DType::kF64)) {
    OpFail(Describe(g), ": f64 operands need an f64 output and the reverse");
  }
  if (g.batch > 1 && g.epilogue != Epilogue::kNone) {
    OpFail(Describe(g), ": epilogues are not batched; fold the batch into m");
  }
  if (g.batch > kMaxBatch) {  // cuBLASLt's BATCH_COUNT is an int32_t (epilogues are unbatched)
    for (const GemmCall& part : SplitBatch(g)) RunGemm(part);
    return true;
  }
  DeviceGuard guard(g.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(CurrentStream(g.device));
  cublasLtHandle_t handle = Handle(g.device);
  void* workspace = Workspace(g.device, stream);
  Plan* plan = FindPlan(handle, g);
  if (!plan->supported) {
    if (g.epilogue == Epilogue::kNone) {
      throw OpError(absl::InternalError(
          absl::StrCat(Describe(g), ": cuBLASLt's heuristic found no algorithm")));
    }
    GetCounters().unsupported.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const float alpha_f = 1.0f, beta_f = g.accumulate ? 1.0f : 0.0f;
  const double alpha_d = 1.0, beta_d = g.accumulate ? 1.0 : 0.0;
  const bool f64 = g.ab_dtype == DType::kF64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = f64 ? static_cast<const void*>(&beta_d) : &beta_f;

  cublasLtMatmulAlgo_t algo;
  if (!plan->tuned.load()) {
    // Tuning times candidates on plan->desc (its pointers set for g): under mu, once per plan;
    // other threads' first calls of the plan wait for the winner (the same algorithm then for
    // every call after).
    std::lock_guard<std::mutex> lock(plan->mu);
    const bool capturing = Capturing(stream);
    const int count = static_cast<int>(plan->candidates.size());
    const bool allowed = TuningAllowed(AutotuneEnabled(), Deterministic());
    if (plan->tuned.load()) {
      // another thread tuned it meanwhile
    } else if (DecideTuning(allowed, capturing, /*tuned=*/false, count) == TuneAction::kTune) {
      SetDescPointers(plan->desc, g);
      Tune(*plan, g, handle, workspace, stream, alpha, beta);
    } else if (capturing && allowed) {
      GetCounters().tunes_deferred.fetch_add(1, std::memory_order_relaxed);
    } else if (!allowed) {
      plan->tuned = true;  // nothing will tune it: skip the lock from now on
    }
    algo = plan->algo;
  } else {
    std::lock_guard<std::mutex> lock(plan->mu);  // a struct copy, nothing enqueued
    algo = plan->algo;
  }
  cublasLtMatmulDesc_t desc = ThreadDesc(plan, g);
  const cublasStatus_t s =
      cublasLtMatmul(handle, desc, alpha, /*A=*/g.b, plan->la, /*B=*/g.a, plan->lb, beta,
                     g.c, plan->lc, g.c, plan->lc, &algo, workspace, kWorkspaceBytes, stream);
  // An epilogue the heuristic offered but cublasLtMatmul rejects is refused like one it never
  // offered: the caller composes unfused ops (counted in Stats().unsupported). A plain GEMM that
  // fails is an error.
  const bool refused = s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE;
  if (refused && g.epilogue != Epilogue::kNone) {
    plan->supported = false;  // refuse at once from now on
    GetCounters().unsupported.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    internal::ThrowCublasLtError(s, Describe(g).c_str(), __FILE__, __LINE__);
  }
  GetCounters().matmuls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

GemmStats Stats() {
  const Counters& c = GetCounters();
  GemmStats s;
  s.plans_created = c.plans_created.load();
  s.plan_hits = c.plan_hits.load();
  s.heuristic_queries = c.heuristic_queries.load();
  s.matmuls = c.matmuls.load();
  s.unsupported = c.unsupported.load();
  s.workspaces = c.workspaces.load();
  s.plans_tuned = c.plans_tuned.load();
  s.candidates_timed = c.candidates_timed.load();
  s.candidates_found = c.candidates_found.load();
  s.tunes_deferred = c.tunes_deferred.load();
  return s;
}

#else  // !SHARDMAP_HAS_CUDA

bool RunGemm(const GemmCall&) { OpFail("cuda gemm: this build has no CUDA (built without CUDA)"); }

GemmStats Stats() { return GemmStats{}; }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda::gemm_internal
