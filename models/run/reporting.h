// What a training run prints: its first lines (the model, the mesh, the batch, the data), a
// step line every --log_every steps (loss, progress, throughput, MFU, communication, memory),
// the summary after the last step, and --plan's view of the run before it.
#ifndef SHARDMAP_MODELS_RUN_REPORTING_H_
#define SHARDMAP_MODELS_RUN_REPORTING_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "models/model/model.h"
#include "models/run/connection.h"
#include "models/train/trainer.h"

namespace shardmap {

// The step lines: "step N loss X | ...", every --log_every steps (and the first, the last and
// every evaluated one), with the communication of the step; totals for the summary.
// The MFU of the step line: the model FLOPs per token against the peak of the run's devices.
struct MfuBasis {
  double flops_per_token = 0;  // nanoGPT's estimate_mfu: 6N + 12 L H Q T
  double peak_flops = 0;       // 0: unknown (no MFU printed)
  std::string peak_source;     // where the peak comes from
  bool cpu = true;             // CPU ranks: the step line shows the process's RSS too
};

class StepPrinter {
 public:
  StepPrinter(bool print, int64_t tokens_per_step, TypeTrace* types, MfuBasis mfu = {})
      : print_(print), tokens_per_step_(tokens_per_step), types_(types), mfu_(std::move(mfu)) {}

  void operator()(const StepInfo& s);

  double total_s() const { return total_s_; }
  const MfuBasis& mfu() const { return mfu_; }
  int64_t peak_rss() const { return peak_rss_; }
  // Percent of the peak at `tokens_per_s`, and the step line's " | MFU x%" ("" without a peak).
  double MfuPercent(double tokens_per_s) const {
    return 100.0 * mfu_.flops_per_token * tokens_per_s / mfu_.peak_flops;
  }
  std::string MfuText(double tokens_per_s) const {
    if (mfu_.peak_flops <= 0) return "";
    return absl::StrFormat(" | MFU %.2f%%", MfuPercent(tokens_per_s));
  }
  double last_val() const { return last_val_; }
  const std::map<std::string, int64_t>& total_bytes() const { return total_bytes_; }

 private:
  bool print_;
  int64_t tokens_per_step_;
  TypeTrace* types_;
  MfuBasis mfu_;
  int64_t peak_rss_ = -1;
  double total_s_ = 0;
  int64_t steps_run_ = 0;
  double last_val_ = std::nan("");
  std::map<std::string, int64_t> total_bytes_;
};

// The MFU's basis (rank 0 only: it may measure the CPU): --peak_flops, else on GPUs the spec
// peak of the compute dtype from the planner's profile named by the card (h100_node, h200_node)
// times the GPUs the ranks use, else on CPU ranks the machine's hardware peak (all ranks share
// its cores, threads or processes alike; models/train/mfu.h).
MfuBasis MfuFor(const Model& layout, const RankWorld& ranks);

// The run's first lines: the model, the mesh and where it runs, the batch and the data; with a
// pipeline, its schedule.
void PrintHeader(const Model& layout, const RankWorld& ranks, const TrainOptions& o,
                 size_t data_tokens);

// The run's last lines: the summary, GPU memory and the CUDA graph, the pipeline's bubble, the
// final validation loss, the trace and the saved file.
void PrintSummary(const Model& layout, const TrainOptions& o, const TrainResult& r,
                  const StepPrinter& steps, const std::string& trace_path,
                  const std::string& save_path);

// --plan: the planner's view of this run, printed before it (GPT-2 only so far).
absl::Status PrintPlan(const Model& model);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_REPORTING_H_
