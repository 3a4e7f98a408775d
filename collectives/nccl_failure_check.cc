// Multi-process NCCL failure check, one process per GPU, started by collectives/launch (see
// nccl_multiprocess_test): one good all-reduce, then one rank (--fail_rank) fails its next call
// in the chosen way while its peers make theirs, and every rank prints the status it got:
//   nccl_failure_check rank R of N: <CODE>: <message>
// Modes: mismatch (the failing rank all-reduces 5 elements, the others 4), bad_root (it
// broadcasts from a root outside the group), abort (its program fails outside a collective and
// calls AbortNcclWorld). Exit code 0 once the status was printed, 2 on a bad flag or without
// CUDA, 1 when the setup or the first all-reduce failed.
//
//   launch --nproc_per_node=3 -- nccl_failure_check --mode=mismatch --fail_rank=2 --timeout_s=5
#include <cstdio>
#include <string>
#include <vector>

#include "base/command_line.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/nccl_communicator.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif

ABSL_FLAG(std::string, mode, "mismatch", "how --fail_rank fails: mismatch, bad_root or abort");
ABSL_FLAG(int, fail_rank, 1, "the rank that fails");
ABSL_FLAG(double, timeout_s, 10, "NcclOptions::timeout in seconds");

namespace shardmap::collectives {
namespace {

int Run(const std::string& mode, int fail_rank, absl::Duration timeout) {
#if !SHARDMAP_HAS_CUDA
  (void)mode, (void)fail_rank, (void)timeout;
  std::fprintf(stderr, "nccl_failure_check: built without CUDA\n");
  return 2;
#else
  NcclOptions options;
  options.timeout = timeout;
  absl::StatusOr<std::unique_ptr<Communicator> > comm = CreateNcclCommunicatorFromEnv(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "nccl_failure_check: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  Communicator& c = **comm;
  if (fail_rank < 0 || fail_rank >= c.size()) {
    std::fprintf(stderr, "nccl_failure_check: --fail_rank=%d outside the world of %d\n", fail_rank,
                 c.size());
    return 2;
  }
  float* d = nullptr;
  if (cudaMalloc(&d, 64 * sizeof(float)) != cudaSuccess ||
      cudaMemset(d, 0, 64 * sizeof(float)) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    std::fprintf(stderr, "nccl_failure_check: cudaMalloc failed\n");
    return 1;
  }
  if (absl::Status s = c.AllReduce(d, d, 4, DataType::kF32, ReduceOp::kSum); !s.ok()) {
    std::fprintf(stderr, "nccl_failure_check: first all-reduce: %s\n", s.ToString().c_str());
    return 1;
  }
  const bool failing = c.rank() == fail_rank;
  absl::Status s;
  if (mode == "mismatch") {
    s = c.AllReduce(d, d, failing ? 5 : 4, DataType::kF32, ReduceOp::kSum);
  } else if (mode == "bad_root") {
    s = c.Broadcast(d, 4, DataType::kF32, failing ? c.size() : 0);
  } else {  // abort
    if (failing) {
      // What a trainer's top-level catch does when a step threw.
      absl::Status why = absl::FailedPreconditionError(
          absl::StrCat("step 3 of rank ", c.rank(), " threw: loss is NaN"));
      if (absl::Status a = AbortNcclWorld(c, why); !a.ok()) {
        std::fprintf(stderr, "nccl_failure_check: AbortNcclWorld: %s\n", a.ToString().c_str());
      }
      s = why;
    } else {
      s = c.AllReduce(d, d, 4, DataType::kF32, ReduceOp::kSum);
    }
  }
  // A rank whose call returned (NCCL does not compare calls: a mismatch may complete with
  // garbage) carries on, as a program would, and gets stuck in its next call instead.
  if (s.ok()) s = c.Barrier();
  std::printf("nccl_failure_check rank %d of %d: %s\n", c.rank(), c.size(),
              s.ok() ? "OK" : s.ToString().c_str());
  std::fflush(stdout);
  cudaFree(d);
  return 0;
#endif
}

}  // namespace
}  // namespace shardmap::collectives

int main(int argc, char** argv) {
  if (absl::Status s = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = "One rank of an NCCL job fails on purpose; every rank prints the status it "
                    "got.\n  launch --nproc_per_node=N -- nccl_failure_check "
                    "--mode=mismatch|bad_root|abort --fail_rank=R [--timeout_s=10]"});
      !s.ok()) {
    return shardmap::base::ExitWithError("nccl_failure_check", s);
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "mismatch" && mode != "bad_root" && mode != "abort") {
    std::fprintf(stderr, "nccl_failure_check: --mode=%s: use mismatch, bad_root or abort\n",
                 mode.c_str());
    return 2;
  }
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0) || timeout_s > 3600) {
    std::fprintf(stderr, "nccl_failure_check: --timeout_s=%g: must be in (0, 3600]\n", timeout_s);
    return 2;
  }
  return shardmap::collectives::Run(mode, absl::GetFlag(FLAGS_fail_rank), absl::Seconds(timeout_s));
}
