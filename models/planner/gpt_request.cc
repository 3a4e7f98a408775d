#include "models/planner/gpt_request.h"

#include "absl/strings/str_cat.h"

namespace shardmap::planner {

absl::StatusOr<ModelArgs> GptModelArgs(const GptConfig& c) {
  ModelArgs a;
  a.layers = c.layers;
  a.d_model = c.d_model;
  a.heads = c.heads;
  a.vocab = c.vocab;
  a.seq = c.seq;
  a.moe = c.moe;
  a.recompute = c.recompute;
  if (c.dtype == DType::kF32 && c.compute == DType::kBF16) {
    a.dtype = "bf16";
  } else if (!c.compute.has_value() && (c.dtype == DType::kF32 || c.dtype == DType::kF64)) {
    a.dtype = DTypeName(c.dtype);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT config: dtype ", DTypeName(c.dtype), c.compute ? " with compute " : "",
        c.compute ? DTypeName(*c.compute) : "", " is none of --dtype's f32, f64, bf16"));
  }
  return a;
}

absl::Status SetGptModel(const GptConfig& c, PlanRequest* r) {
  absl::StatusOr<ModelArgs> a = GptModelArgs(c);
  if (!a.ok()) return a.status();
  r->model = "gpt2";
  r->args = *std::move(a);
  return absl::OkStatus();
}

}  // namespace shardmap::planner
