// GPT-2's configuration as checkpoint metadata ("gpt.*" keys) and back.
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/gpt/gpt_model.h"

namespace shardmap {

std::map<std::string, std::string> GptConfigMetadata(const GptConfig& c) {
  std::map<std::string, std::string> m = {
      {"gpt.layers", absl::StrCat(c.layers)},
      {"gpt.d_model", absl::StrCat(c.d_model)},
      {"gpt.heads", absl::StrCat(c.heads)},
      {"gpt.vocab", absl::StrCat(c.vocab)},
      {"gpt.seq", absl::StrCat(c.seq)},
      {"gpt.dtype", DTypeName(c.dtype)},
      {"gpt.moe.experts", absl::StrCat(c.moe.experts)},
      {"gpt.moe.topk", absl::StrCat(c.moe.topk)},
      {"gpt.moe.capacity_factor", absl::StrFormat("%.17g", c.moe.capacity_factor)},
      {"gpt.moe.aux_loss_coef", absl::StrFormat("%.17g", c.moe.aux_loss_coef)},
      {"gpt.moe.expert_axes", absl::StrJoin(c.moe.expert_axes, ",")},
  };
  if (c.compute.has_value()) m["gpt.compute"] = DTypeName(*c.compute);
  return m;
}

namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

const std::string kFix =
    "; the checkpoint was not written with its model configuration (or was edited): give the "
    "shape flags (--layers, --d_model, --heads, --vocab, --seq) explicitly";

absl::StatusOr<std::string> Get(const std::map<std::string, std::string>& m,
                                const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return absl::NotFoundError(absl::StrCat("metadata lacks '", key, "'", kFix));
  return it->second;
}

absl::Status ReadInt(const std::map<std::string, std::string>& m, const std::string& key,
                     int64_t min, int64_t* out) {
  absl::StatusOr<std::string> v = Get(m, key);
  if (!v.ok()) return v.status();
  if (!absl::SimpleAtoi(*v, out)) {
    return Invalid(absl::StrCat("metadata '", key, "' = '", *v, "' is not an integer", kFix));
  }
  if (*out < min) {
    return Invalid(absl::StrCat("metadata '", key, "' = ", *out, " must be >= ", min, kFix));
  }
  return absl::OkStatus();
}

absl::Status ReadDouble(const std::map<std::string, std::string>& m, const std::string& key,
                        double* out) {
  absl::StatusOr<std::string> v = Get(m, key);
  if (!v.ok()) return v.status();
  if (!absl::SimpleAtod(*v, out) || !std::isfinite(*out)) {
    return Invalid(absl::StrCat("metadata '", key, "' = '", *v, "' is not a finite number",
                                kFix));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ReadDType(const std::string& key, const std::string& v) {
  for (DType t : kDTypes) {
    if (v == DTypeName(t)) return t;
  }
  return Invalid(absl::StrCat("metadata '", key, "' = '", v,
                              "' is not a floating dtype (f32, f64, bf16, f16)", kFix));
}

}  // namespace

absl::StatusOr<GptConfig> GptConfigFromMetadata(const std::map<std::string, std::string>& m) {
  GptConfig c;
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"gpt.layers", &c.layers},
                            {"gpt.d_model", &c.d_model},
                            {"gpt.heads", &c.heads},
                            {"gpt.vocab", &c.vocab},
                            {"gpt.seq", &c.seq}}) {
    if (absl::Status s = ReadInt(m, key, 1, field); !s.ok()) return s;
  }
  if (c.d_model % c.heads != 0) {
    return Invalid(absl::StrCat("metadata: d_model ", c.d_model, " is not divisible by heads ",
                                c.heads, kFix));
  }
  absl::StatusOr<std::string> dtype = Get(m, "gpt.dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<DType> dt = ReadDType("gpt.dtype", *dtype);
  if (!dt.ok()) return dt.status();
  c.dtype = *dt;
  if (auto it = m.find("gpt.compute"); it != m.end()) {
    absl::StatusOr<DType> ct = ReadDType("gpt.compute", it->second);
    if (!ct.ok()) return ct.status();
    c.compute = *ct;
  }
  if (absl::Status s = ReadInt(m, "gpt.moe.experts", 0, &c.moe.experts); !s.ok()) return s;
  if (absl::Status s = ReadInt(m, "gpt.moe.topk", 0, &c.moe.topk); !s.ok()) return s;
  if (absl::Status s = ReadDouble(m, "gpt.moe.capacity_factor", &c.moe.capacity_factor);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadDouble(m, "gpt.moe.aux_loss_coef", &c.moe.aux_loss_coef); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> axes = Get(m, "gpt.moe.expert_axes");
  if (!axes.ok()) return axes.status();
  c.moe.expert_axes = absl::StrSplit(*axes, ',', absl::SkipEmpty());
  if (absl::Status s = ValidateMoeConfig(c.moe, 1); !s.ok()) {
    return Invalid(absl::StrCat("metadata: ", s.message(), kFix));
  }
  return c;
}

}  // namespace shardmap
