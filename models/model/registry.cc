#include "models/model/registry.h"

#include <cstdlib>
#include <iostream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardmap {
namespace {

std::map<std::string, ModelSpec>& Specs() {
  static auto* specs = new std::map<std::string, ModelSpec>;  // never destroyed (static init)
  return *specs;
}

}  // namespace

bool RegisterModel(ModelSpec spec) {
  const std::string name = spec.name;
  if (name.empty() || !spec.create || !Specs().emplace(name, std::move(spec)).second) {
    std::cerr << "RegisterModel: model '" << name
              << "' is registered twice, or without a name or a create function\n";
    std::abort();
  }
  return true;
}

std::vector<const ModelSpec*> RegisteredModels() {
  std::vector<const ModelSpec*> out;
  for (const auto& [name, spec] : Specs()) out.push_back(&spec);
  return out;
}

absl::StatusOr<const ModelSpec*> FindModel(const std::string& name) {
  auto it = Specs().find(name);
  if (it != Specs().end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [n, spec] : Specs()) names.push_back(n);
  return absl::NotFoundError(absl::StrCat("--model ", name, ": no such model; registered: ",
                                          names.empty() ? "none" : absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const std::string& name, const ModelArgs& args,
                                                   const Mesh& mesh, bool sp) {
  absl::StatusOr<const ModelSpec*> spec = FindModel(name);
  if (!spec.ok()) return spec.status();
  if (!args.preset.empty()) {
    bool known = false;
    for (const std::string& p : (*spec)->presets) known = known || p == args.preset;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--preset ", args.preset, ": model ", name, " has the presets ",
          absl::StrJoin((*spec)->presets, ", ")));
    }
  }
  return (*spec)->create(args, mesh, sp);
}

absl::StatusOr<std::string> ModelNameInMetadata(const std::map<std::string, std::string>& m) {
  if (auto it = m.find("model"); it != m.end()) return it->second;
  if (m.count("gpt.layers") > 0) return std::string("gpt2");
  return absl::NotFoundError(
      "the checkpoint's metadata names no model (no \"model\" key): it was not written by "
      "train --save");
}

absl::Status ParsePrecision(const std::string& dtype, ModelShape* shape) {
  if (dtype.empty()) return absl::OkStatus();
  if (dtype == "f32") {
    shape->dtype = DType::kF32;
    shape->compute.reset();
  } else if (dtype == "f64") {
    shape->dtype = DType::kF64;
    shape->compute.reset();
  } else if (dtype == "bf16") {
    shape->dtype = DType::kF32;  // master weights
    shape->compute = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype ", dtype, ": use f32, f64 or bf16 (mixed precision)"));
  }
  return absl::OkStatus();
}

}  // namespace shardmap
