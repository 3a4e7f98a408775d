// The planner's profiler: one shape-only step per rank role (models/train/gpt_shape_only.h's
// ProfileGptStep) for a candidate mesh, converted to the cost model's RoleWork.
//
//   Profiler profiler = ShapeOnlyProfiler();
//   absl::StatusOr<std::vector<RoleWork>> roles = profiler(candidate, request);
//
// Collective phases for the overlap assumption (planner/cost_model.h): all_gathers and
// reduce_scatters over dp_shard are "fsdp"; optimizer-phase all_reduces of more than 64 bytes
// over non-pipeline axes (the data-parallel gradient reductions) are "grad"; forward / backward
// collectives over pp are "pp" (stage boundaries); the rest block (tp, cp, ep, the norm, the
// tied-embedding exchange).
#ifndef SHARDMAP_MODELS_PLANNER_SHAPE_ONLY_SOURCE_H_
#define SHARDMAP_MODELS_PLANNER_SHAPE_ONLY_SOURCE_H_

#include "models/planner/plan.h"
#include "models/train/step_profile.h"
#include "tensor/tensor.h"

namespace shardmap::planner {

// stage: the role's pipeline stage (-1 without one).
RoleWork ToRoleWork(const StepProfile& p, int stage);

// The phase ToRoleWork gives a collective (see above).
std::string CollectivePhase(const CollectiveTraffic& c);

// device: Device::Meta() (nothing computed: any size, seconds) or Device::Cpu() (the ops run
// for real on zeros, collectives shape-only: small models only, e.g. to cross-check meta).
// share_stages: a pipeline's middle stages of one layer count share the profiles of two of them
// (profile_reuse.h's StageInFlight: they run the same work, their activations in flight apart);
// false: every stage profiled.
Profiler ShapeOnlyProfiler(Device device = Device::Meta(), bool share_stages = true);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_SHAPE_ONLY_SOURCE_H_
