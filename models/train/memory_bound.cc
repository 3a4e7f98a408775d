#include "models/train/memory_bound.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardmap {

namespace {

ModelShape ShapeOf(const GptConfig& c) {
  return ModelShape{.layers = c.layers, .d_model = c.d_model, .heads = c.heads,
                    .kv_heads = c.heads, .vocab = c.vocab, .seq = c.seq, .dtype = c.dtype,
                    .compute = c.compute};
}

}  // namespace

double MinStepBytes(const GptConfig& cfg, const StepBatch& b, int processes) {
  return MinStepBytes(GptParameterCount(cfg), ShapeOf(cfg), b, processes);
}

double MinStepBytes(double params, const ModelShape& cfg, const StepBatch& b, int processes) {
  const double dtype = static_cast<double>(DTypeSize(cfg.compute_dtype()));
  const double state = params * DTypeSize(cfg.dtype) * 4;
  const double parts = static_cast<double>(std::max<int64_t>(1, b.grad_accum)) *
                       static_cast<double>(std::max<int64_t>(1, b.microbatches));
  const double tokens = static_cast<double>(b.batch) * static_cast<double>(cfg.seq) / parts;
  const double per_token = 2.0 * static_cast<double>(cfg.vocab) +
                           static_cast<double>(cfg.layers) * static_cast<double>(cfg.d_model);
  return (state + tokens * per_token * dtype) / std::max(1, processes);
}

double HostMemoryBytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

absl::StatusOr<double> ParseMemoryLimit(const std::string& text) {
  if (text.empty()) return HostMemoryBytes();
  std::string t = absl::AsciiStrToLower(text);
  double unit = 1;
  for (const auto& [suffix, scale] :
       {std::pair<const char*, double>{"gib", 1073741824.0}, {"mib", 1048576.0},
        {"kib", 1024.0}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}}) {
    if (absl::EndsWith(t, suffix)) {
      t.resize(t.size() - std::string(suffix).size());
      unit = scale;
      break;
    }
  }
  double v = 0;
  if (!absl::SimpleAtod(t, &v) || !std::isfinite(v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_memory '", text, "' is not a size: give bytes or a number with GiB, MiB, KiB, "
        "G, M or K (e.g. 8GiB)"));
  }
  return v * unit;
}

absl::Status CheckStepFitsMemory(const GptConfig& cfg, const StepBatch& b, int processes,
                                 double limit_bytes, const std::string& limit_name) {
  return CheckStepFitsMemory(GptParameterCount(cfg), ShapeOf(cfg), b, processes,
                             limit_bytes, limit_name);
}

absl::Status CheckStepFitsMemory(double params, const ModelShape& cfg, const StepBatch& b,
                                 int processes, double limit_bytes,
                                 const std::string& limit_name) {
  const double need = MinStepBytes(params, cfg, b, processes);
  if (std::isfinite(need) && need <= limit_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--batch %d (seq %d, vocab %d, %d layers of d_model %d, %s) needs at least %.3g GiB per "
      "process%s for one step (the logits and their gradient, the layers' activations, the "
      "parameters and AdamW state), more than %s (%.3g GiB); lower --batch, or keep it with "
      "--grad_accum=N (each microstep holds batch/N)",
      b.batch, cfg.seq, cfg.vocab, cfg.layers, cfg.d_model, DTypeName(cfg.compute_dtype()),
      need / 1073741824.0, processes > 1 ? absl::StrCat(" (", processes, " processes)") : "",
      limit_name, limit_bytes / 1073741824.0));
}

}  // namespace shardmap
