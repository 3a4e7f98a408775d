// Profiles of many microbatches from profiles of few: a pipeline stage (or a gradient-
// accumulation loop) runs the same work for every microbatch of the same rows, so what a rank
// logs in one step is affine in the microbatch count once the schedule has reached its steady
// state: GEMM and op counts, op bytes and FLOPs, collective calls and the activation peak each
// grow by a fixed step per microbatch (0 for 1F1B's peak, whose activations in flight stop at the
// stage count; one microbatch's activations for GPipe's), while the parameters, gradients and
// optimizer state do not change. Two profiles at n1 and n1 + 1 microbatches of those rows give
// every count at n:
//
//   X(n) = X(n1) + (n - n1) * (X(n1 + 1) - X(n1))
//
//   absl::StatusOr<std::vector<RoleWork>> w = ExtrapolateMicrobatches(at_4, at_5, 4, 64);
//
// The planner (plan.h, PlanRequest::reuse_profiles) uses it for 1F1B pipelines of
// m > 2 pp + 3 microbatches (n1 = pp + 1: every stage has its whole warm-up and a steady pair;
// at m = pp stage 0's peak is not reached yet) and gradient accumulation of more than 5
// microsteps (n1 = 2: the first microstep writes the gradients, the others add to them), never
// for GPipe (its peak, the larger of the optimizer's and all the activations', has a kink two
// profiles cannot place); plan_test checks the extrapolation against the full shape-only step on
// meshes of every kind.
//
// Pipeline stages of the same layer count between the first and the last run the same actions
// in another order: the same GEMMs, ops and collectives; only their activation peak differs, by
// a fixed amount per microbatch in flight (1F1B's stage s holds min(m, pp - s); GPipe's every
// stage m). SameStageWork checks two profiled stages for that, and StageInFlight gives a third
// stage's role from two of them.
//
//   absl::StatusOr<RoleWork> s5 = StageInFlight(s1, 4, s2, 3, /*in_flight=*/1, 5, "pp stage 5");
#ifndef SHARDMAP_MODELS_PLANNER_PROFILE_REUSE_H_
#define SHARDMAP_MODELS_PLANNER_PROFILE_REUSE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/planner/step_work.h"

namespace shardmap::planner {

// The roles at n microbatches from the roles at n1 (`low`) and n1 + step (`high`), step > 1 for
// schedules that take microbatches in groups (interleaved 1F1B: multiples of pp). Collectives
// come back grouped (identical records together, in first-seen order): the cost model sums
// them, their order is not priced. FailedPrecondition when the two profiles are not one affine
// step apart (other roles, other parameter / gradient / optimizer bytes, a count that would go
// negative): the caller profiles n itself. InvalidArgument for n1 < 1, step < 1,
// n <= n1 + step or n - n1 not a multiple of step.
absl::StatusOr<std::vector<RoleWork>> ExtrapolateMicrobatches(const std::vector<RoleWork>& low,
                                                              const std::vector<RoleWork>& high,
                                                              int n1, int n, int step = 1);

// Whether a and b run the same work (GEMMs, ops, collectives as multisets, op count, parameter,
// gradient and optimizer bytes, ranks, layers): everything but the role's name, its stage and its
// activation peak.
bool SameStageWork(const RoleWork& a, const RoleWork& b);

// Stage `stage`'s role (named `role`) holding `in_flight` microbatches at its peak, from stages a
// and b of the same work (SameStageWork) holding in_flight_a != in_flight_b: a's work with the
// peak moved along the line through a's and b's. FailedPrecondition when the work differs or the
// peaks are not a whole number of bytes per microbatch apart (the caller profiles the stage).
absl::StatusOr<RoleWork> StageInFlight(const RoleWork& a, int in_flight_a, const RoleWork& b,
                                       int in_flight_b, int in_flight, int stage,
                                       const std::string& role);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_PROFILE_REUSE_H_
