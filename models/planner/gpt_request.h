// A GPT-2 GptConfig as a planner request's model (models/model/registry.h's "gpt2" with every
// shape field set): for the tests and plan_validate, which describe their GPTs as GptConfigs.
//
//   PlanRequest r;
//   absl::Status s = SetGptModel(GptConfig{.layers = 2, .d_model = 16, .heads = 4}, &r);
#ifndef SHARDMAP_MODELS_PLANNER_GPT_REQUEST_H_
#define SHARDMAP_MODELS_PLANNER_GPT_REQUEST_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/model/registry.h"
#include "models/planner/plan.h"

namespace shardmap::planner {

// The args Gpt2ConfigFromArgs turns back into `c`. InvalidArgument for a precision --dtype
// cannot say (f32, f64, or f32 with bf16 compute).
absl::StatusOr<ModelArgs> GptModelArgs(const GptConfig& c);

// r->model = "gpt2", r->args = GptModelArgs(c).
absl::Status SetGptModel(const GptConfig& c, PlanRequest* r);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_GPT_REQUEST_H_
