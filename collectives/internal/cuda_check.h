// Check macros turning CUDA / NCCL result codes into absl::Status with file:line. Only defined
// when built with the CUDA toolkit (SHARDMAP_HAS_CUDA).
//
//   SM_CUDA_RETURN_IF_ERROR(cudaSetDevice(d));
//   SM_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), nullptr);
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_CUDA_CHECK_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_CUDA_CHECK_H_

#if SHARDMAP_HAS_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardmap::collectives::internal {

inline absl::Status CudaStatus(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr, " failed: ",
                                          cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

// `comm` may be null (before a communicator exists); with one, NCCL's last error detail is added.
inline absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, const char* expr,
                               const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", expr, " failed: ",
                                          ncclGetErrorString(r),
                                          last != nullptr && last[0] ? absl::StrCat(" (", last, ")")
                                                                     : std::string()));
}

}  // namespace shardmap::collectives::internal

#define SM_CUDA_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                      \
    ::absl::Status sm_cuda_s_ =                                                             \
        ::shardmap::collectives::internal::CudaStatus((expr), #expr, __FILE__, __LINE__);   \
    if (!sm_cuda_s_.ok()) return sm_cuda_s_;                                                \
  } while (0)

// ncclInProgress is not an error for non-blocking communicators: callers poll afterwards.
#define SM_NCCL_RETURN_IF_ERROR(expr, comm)                                                   \
  do {                                                                                        \
    ::absl::Status sm_nccl_s_ = ::shardmap::collectives::internal::NcclStatus(               \
        (expr), (comm), #expr, __FILE__, __LINE__);                                           \
    if (!sm_nccl_s_.ok()) return sm_nccl_s_;                                                  \
  } while (0)

#endif  // SHARDMAP_HAS_CUDA

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_CUDA_CHECK_H_
