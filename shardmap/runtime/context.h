// The SPMD context and runner, in five headers (included here, so this one header serves):
//   rank_context.h      RankContext, ScopedRankContext, SingleRankContext, RankDescription
//   device_placement.h  DevicePlacement, ResolvePlacement, RankMemorySpaces
//   spmd_runner.h       SpmdOptions, RunSpmd, RunOnCommunicator
//   host_collectives.h  AllGatherHost, AllReduceHost
//   collective_recorder.h  CollectiveRecorder: the collectives issued in a scope (any call)
//
// The per-rank context of SPMD code: the mesh, this rank's coordinates, the communicators per
// axis set (split lazily on first use and cached), the type-checking mode, and a log of the
// collectives issued (so tests can assert "one all-reduce forward and one backward per layer").
//
// It is thread-local: shard_map and RunSpmd install one on each rank-thread.
//
//   absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
//     int tp = ctx.coord(ctx.mesh().AxisIndex("tp"));
//     ...typed ops and collectives...
//   });
//
//   // One rank, no threads (overhead measurements, single-device runs): a mesh whose axes all
//   // have size 1 and a trivial communicator.
//   SingleRankContext one(*Mesh::Create({{"dp", 1}, {"tp", 1}}));
//   Value y = gelu(x);   // runs on this thread
//
// Axis sets are used in the same order on every rank in SPMD code, so creating the communicator
// of an axis set lazily (a collective Split over the world) is safe.
//
// GPU ranks (DevicePlacement): each rank runs on a device; per-device code creates its tensors
// there (Tensor::Empty(shape, dtype, ctx.device())) and collectives move device memory:
//
//   SpmdOptions o;
//   o.placement = DevicePlacement::SharedGpu();    // 4 virtual ranks on GPU 0, a stream each
//   // o.placement = DevicePlacement::GpuPerRank(); // rank r on GPU r (needs >= 4 GPUs)
//   RunSpmd(*Mesh::Create({{"tp", 4}}), [&](RankContext& ctx) {
//     Tensor x = Tensor::Ones({8}, DType::kF32, ctx.device());   // on cuda:0, this rank's stream
//     ...
//   }, o);
//
// Each GPU rank thread is bound (cuda::StreamScope) to its device and a stream of its own for
// the body, and the in-process communicator works on device memory ordered on that stream.
// Streams come from a process-wide pool (one per (device, rank slot)), so repeated RunSpmd calls
// reuse them and the caching allocator's per-stream blocks. Before a GPU rank's thread returns
// its stream is synchronised, so the tensors it produced may be read from any thread; before the
// ranks start, the calling thread's current stream of each of their devices is waited for, so
// device tensors the caller made (or freed) just before are ready (or unused) when ranks run.
// RunOnCommunicator over an NCCL communicator binds the thread to the communicator's device and
// stream the same way (one GPU per process).
#ifndef SHARDMAP_SHARDMAP_RUNTIME_CONTEXT_H_
#define SHARDMAP_SHARDMAP_RUNTIME_CONTEXT_H_

#include "shardmap/runtime/collective_recorder.h"
#include "shardmap/runtime/device_placement.h"
#include "shardmap/runtime/host_collectives.h"
#include "shardmap/runtime/rank_context.h"
#include "shardmap/runtime/spmd_runner.h"

#endif  // SHARDMAP_SHARDMAP_RUNTIME_CONTEXT_H_
