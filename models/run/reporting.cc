#include "models/run/reporting.h"

#include <algorithm>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt/gpt_model.h"
#include "models/parallel/moe.h"
#include "models/parallel/pipeline.h"
#include "models/planner/hardware_profile.h"
#include "models/planner/plan_cli.h"
#include "models/run/placement.h"
#include "models/run/train_flags.h"
#include "models/train/mfu.h"
#include "models/train/run_format.h"
#include "tensor/cuda/runtime.h"

namespace shardmap {

void StepPrinter::operator()(const StepInfo& s) {
  if (!print_) return;
  if (!types_->empty()) {  // recorded during the first step
    std::cout << "per-device SPMD types inside block 0 (rank 0):\n";
    for (const auto& [name, type] : *types_) {
      std::cout << absl::StrFormat("  %-52s %s\n", name, type);
    }
    types_->clear();
  }
  std::map<std::string, int64_t> bytes;
  for (const CollectiveRecord& r : *s.log) bytes[r.op] += r.bytes;
  std::string comm;
  for (const auto& [op, b] : bytes) {
    absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
    total_bytes_[op] += b;
  }
  total_s_ += s.seconds;
  std::string moe;
  if (s.moe_dropped >= 0) {
    moe = absl::StrFormat(" | MoE dropped %d of %d assignments (%.1f%%), %d tokens lost all",
                          s.moe_dropped, s.moe_assignments,
                          100.0 * s.moe_dropped / s.moe_assignments, s.moe_dropped_tokens);
  }
  std::string mem =
      s.peak_device_bytes >= 0 ? absl::StrCat(" | peak GPU memory ", Bytes(s.peak_device_bytes))
                               : "";
  if (mfu_.cpu) {
    const int64_t rss = ProcessRssBytes();
    peak_rss_ = std::max(peak_rss_, rss);
    if (rss >= 0) absl::StrAppend(&mem, " | RSS ", Bytes(rss));
  }
  ++steps_run_;
  const bool evaluated = !std::isnan(s.val_loss);
  if (evaluated) last_val_ = s.val_loss;
  const int64_t log_every = std::max<int64_t>(1, absl::GetFlag(FLAGS_log_every));
  if (!(s.step % log_every == 0 || s.step + 1 == s.total_steps || steps_run_ == 1 || evaluated)) {
    return;
  }
  // ETA from the mean step time so far.
  const double eta_s = total_s_ / steps_run_ * static_cast<double>(s.total_steps - s.step - 1);
  std::cout << absl::StrFormat(
      "step %d loss %.10g | %d/%d, ETA %s, %d tokens seen, lr %.4g, grad norm %.4g%s | "
      "%.1f ms/step | %.0f tokens/s%s | %s%s%s\n",
      s.step, s.loss, s.step + 1, s.total_steps, Duration(eta_s), s.tokens_seen, s.lr,
      s.grad_norm, evaluated ? absl::StrFormat(" | val loss %.10g", s.val_loss) : "",
      s.seconds * 1e3, tokens_per_step_ / s.seconds, MfuText(tokens_per_step_ / s.seconds),
      comm.empty() ? "no communication" : comm,
      moe, mem);
  std::cout.flush();
}

MfuBasis MfuFor(const Model& layout, const RankWorld& ranks) {
  const ModelShape& cfg = layout.shape();
  MfuBasis m;
  m.flops_per_token = layout.FlopsPerToken();
  const DType dtype = cfg.compute_dtype();
  const bool gpu = absl::GetFlag(FLAGS_device) == "cuda";
  m.cpu = !gpu;
  if (absl::GetFlag(FLAGS_peak_flops) > 0) {
    m.peak_flops = absl::GetFlag(FLAGS_peak_flops);
    m.peak_source = "--peak_flops";
    return m;
  }
  if (!gpu) {
    absl::StatusOr<CpuPeak> peak = CpuPeakFlops(dtype, DefaultPeakCachePath());
    m.peak_flops = peak.ok() ? peak->flops : 0;
    m.peak_source = peak.ok() ? absl::StrCat("this CPU's ", DTypeName(dtype), " peak, ",
                                             peak->source)
                              : std::string(peak.status().message());
    return m;
  }
  const std::string name = cuda::DeviceName(0);
  const std::string lower = absl::AsciiStrToLower(name);
  // The profiles are SXM nodes' (an H100 PCIe or NVL card has lower peaks: not guessed).
  const bool sxm_h100 = absl::StrContains(lower, "h100") && !absl::StrContains(lower, "pcie") &&
                        !absl::StrContains(lower, "nvl");
  const char* profile = absl::StrContains(lower, "h200") ? "h200_node"
                        : sxm_h100                       ? "h100_node"
                                                         : nullptr;
  absl::StatusOr<planner::HardwareProfile> p =
      profile != nullptr ? planner::LoadHardwareProfile(profile)
                         : absl::NotFoundError("no profile");
  if (!p.ok() || p->peak_flops.count(dtype) == 0) {
    m.peak_source = absl::StrCat("no spec peak for ", name.empty() ? "this GPU" : name, " in ",
                                 DTypeName(dtype), "; give --peak_flops");
    return m;
  }
  const int gpus = ranks.world != nullptr ? ranks.world->size()
                   : ranks.placement.kind == DevicePlacement::Kind::kGpuPerRank
                       ? layout.mesh().size()
                       : 1;
  m.peak_flops = p->peak_flops.at(dtype) * gpus;
  m.peak_source = absl::StrCat(name, " ", DTypeName(dtype), " spec peak (", profile, ") x ", gpus,
                               " GPU", gpus == 1 ? "" : "s");
  return m;
}

// The run's first lines: the model, the mesh and where it runs, the batch and the data.
void PrintHeader(const Model& layout, const RankWorld& ranks, const TrainOptions& o,
                 size_t data_tokens) {
  const ModelShape& cfg = layout.shape();
  const Mesh& mesh = layout.mesh();
  int64_t params = 0;
  for (const ParamInfo& p : layout.params()) params += NumElements(p.global_shape);
  const DevicePlacement& placement = ranks.placement;
  std::cout << absl::StrFormat(
      "%s: %d layers, d_model %d, %d heads, vocab %d, seq %d, %.2fM parameters, %s\n"
      "mesh %s%s%s on %d %s; global batch %d x %d tokens; %d tokens of data, %s\n",
      layout.name() == "gpt2" ? std::string("GPT-2") : layout.Describe(), cfg.layers,
      cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, params / 1e6,
      cfg.compute.has_value()
          ? absl::StrCat(DTypeName(*cfg.compute), " compute, ", DTypeName(cfg.dtype),
                         " master weights")
          : std::string(DTypeName(cfg.dtype)),
      mesh.ShortString(), layout.tp().sp ? " + sequence parallel" : "",
      layout.cp_axis().empty() ? "" : " (cp: ring attention, load-balanced chunks)", mesh.size(),
      ranks.world != nullptr ? absl::StrCat("processes (", absl::GetFlag(FLAGS_backend), ")")
      : placement.kind == DevicePlacement::Kind::kSharedGpu
          ? "virtual ranks sharing cuda:0 (a stream each)"
      : placement.kind == DevicePlacement::Kind::kGpuPerRank ? "GPUs (one rank each)"
                                                             : "simulated CPU devices",
      o.batch, cfg.seq, data_tokens,
      o.batch_order.random ? absl::StrCat("random order (seed ", o.batch_order.seed, ")")
                           : std::string("in order"));
  if (cfg.moe.on()) {
    const MoeConfig& m = cfg.moe;
    std::cout << absl::StrFormat(
        "MoE MLPs: %d experts, top-%d, capacity %d per expert and sequence (factor %g), aux loss "
        "coef %g, experts split over %s\n",
        m.experts, m.topk, MoeCapacity(m.capacity_factor, cfg.seq, m.topk, m.experts),
        m.capacity_factor, m.aux_loss_coef,
        m.expert_axes.empty() ? std::string("no axis (all experts on every device)")
                              : absl::StrJoin(m.expert_axes, " x "));
  }
}

// The run's last lines: the summary, GPU memory and the CUDA graph, the pipeline's bubble, the
// final validation loss, the trace and the saved file.
void PrintSummary(const Model& layout, const TrainOptions& o, const TrainResult& r,
                  const StepPrinter& steps, const std::string& trace_path,
                  const std::string& save_path) {
  const int64_t tokens_per_step = o.batch * layout.shape().seq;
  std::string comm;
  for (const auto& [op, b] : steps.total_bytes()) {
    absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
  }
  const double total_s = steps.total_s();
  // Memory per rank, what a user sizes a run by: what persists (parameters, gradients, AdamW's
  // moments), the activations the tape held at most (FSDP parameters count while gathered and
  // held, not once resharding freed them), the gathered parameters at most, the step's peak.
  const int64_t moments = r.optimizer_bytes_per_rank - r.gradient_bytes_per_rank;
  std::string step_peak;
  if (r.peak_step_bytes_per_rank >= 0) {
    step_peak = absl::StrFormat(
        ", step peak %s above them (%s)", Bytes(r.peak_step_bytes_per_rank),
        r.peak_step_bytes_per_rank > r.peak_backprop_bytes_per_rank
            ? absl::StrCat("after the backward: gradient reductions and AdamW; forward + backward ",
                           Bytes(r.peak_backprop_bytes_per_rank))
            : std::string("in the forward + backward"));
  }
  std::cout << absl::StrFormat(
      "summary: %d steps, loss %.10g -> %.10g, %.1f ms/step, %.0f tokens/s; per rank: "
      "parameters %s, gradients %s, optimizer state %s, activations %s saved at most (largest "
      "%s)%s%s; rank 0 sent %s\n",
      r.losses.size(), r.losses.front(), r.losses.back(), total_s * 1e3 / r.losses.size(),
      tokens_per_step * r.losses.size() / total_s, Bytes(r.param_bytes_per_rank),
      Bytes(r.gradient_bytes_per_rank), Bytes(moments), Bytes(r.peak_activation_bytes_per_rank),
      Bytes(r.largest_activation_bytes),
      r.peak_gathered_bytes_per_rank >= 0
          ? absl::StrCat(", FSDP gathered parameters at most ", Bytes(r.peak_gathered_bytes_per_rank))
          : std::string(),
      step_peak, comm.empty() ? "nothing" : comm);
  if (r.peak_step_bytes_per_rank >= 0) {
    std::string gathered;
    if (r.peak_gathered_bytes_per_rank >= 0) {
      const bool stages = layout.pp_ways() > 1 || o.pipeline.microbatches > 1;
      gathered = absl::StrFormat(
          "; FSDP gathered parameters: %s",
          stages ? std::string("the stage's, gathered once per step and kept over its "
                               "microbatches")
          : absl::StrCat("prefetch ", o.overlap.fsdp_prefetch, ", ",
                         o.overlap.reshard_after_forward
                             ? "resharded after forward: at most prefetch + 1 blocks, the last "
                               "block, embeddings and final LayerNorm"
                             : "kept from forward to backward: the whole model"));
    }
    std::cout << absl::StrFormat(
        "memory (rank 0, first step): the step's tensors (activations, gathered parameters, "
        "gradients, then the gradient reductions and AdamW's in-place update) %s at most, %s up "
        "to the end of the backward; tape outputs %s in all%s; overlap %s\n",
        Bytes(r.peak_step_bytes_per_rank), Bytes(r.peak_backprop_bytes_per_rank),
        Bytes(r.activation_bytes_per_rank), gathered,
        o.overlap.on ? absl::StrCat("on (", Bytes(o.overlap.bucket_bytes), " gradient buckets)")
                     : std::string("off"));
  }
  std::cout << absl::StrFormat("activations: recompute=%s, peak saved per rank %s (rank 0, first "
                               "step)\n",
                               r.recompute, Bytes(r.peak_activation_bytes_per_rank));
  if (r.peak_device_bytes_per_rank >= 0) {
    std::cout << absl::StrFormat(
        "GPU: peak memory %s on %s%s; CUDA graph: %s\n", Bytes(r.peak_device_bytes_per_rank),
        r.device,
        r.ranks_per_device > 1 ? absl::StrCat(" (shared by ", r.ranks_per_device, " virtual ranks)")
                               : std::string(" (per rank)"),
        r.cuda_graph_used ? absl::StrCat("captured (", r.cuda_graph_replays, " replays)")
                          : r.cuda_graph_note);
  }
  if (layout.pp_ways() > 1 || o.pipeline.microbatches != 1) {
    const int p = layout.pp_ways(), v = o.pipeline.virtual_stages;
    std::cout << absl::StrFormat(
        "pipeline: peak saved activations (rank 0) %s; bubble measured %.3f (ideal: "
        "(p-1)/(%sm+p-1) = %.3f)\n",
        Bytes(r.peak_activation_bytes_per_rank), r.pipeline_bubble, v > 1 ? "v " : "",
        static_cast<double>(p - 1) /
            static_cast<double>(static_cast<int64_t>(v) * o.pipeline.microbatches + p - 1));
  }
  const MfuBasis& mfu = steps.mfu();
  std::cout << absl::StrFormat(
      "MFU: %s; %.0f model FLOPs per token (6N + 12 L H Q T, nanoGPT's estimate)%s\n",
      mfu.peak_flops > 0
          ? absl::StrFormat("%.2f%% of %.4g FLOP/s (%s)%s",
                            steps.MfuPercent(tokens_per_step * r.losses.size() / total_s),
                            mfu.peak_flops, mfu.peak_source,
                            steps.MfuPercent(tokens_per_step * r.losses.size() / total_s) > 100
                                ? "; above 100%: the peak is too low: give --peak_flops"
                                : "")
          : absl::StrCat("unknown (", mfu.peak_source, ")"),
      mfu.flops_per_token,
      steps.peak_rss() >= 0 ? absl::StrCat("; peak RSS ", Bytes(steps.peak_rss())) : "");
  if (!std::isnan(steps.last_val())) {
    std::cout << absl::StrFormat("val loss %.10g\n", steps.last_val());
  }
  if (!trace_path.empty()) {
    std::cout << "trace: " << trace_path << " (steps " << absl::GetFlag(FLAGS_trace_steps)
              << "; open in https://ui.perfetto.dev)\n";
  }
  if (!save_path.empty()) std::cout << "saved: " << save_path << "\n";
}

absl::Status PrintPlan(const Model& layout) {
  planner::PlanCliOptions plan_cli;
  plan_cli.profile = absl::GetFlag(FLAGS_plan_profile);
  if (plan_cli.profile.empty() && absl::GetFlag(FLAGS_device) != "cpu") {
    plan_cli.profile = "h100_node";
  }
  absl::StatusOr<std::string> plan = planner::PlanForTrainRun(
      layout, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_microbatches),
      absl::GetFlag(FLAGS_schedule), absl::GetFlag(FLAGS_virtual_stages), plan_cli);
  if (!plan.ok()) return plan.status();
  std::cout << *plan << std::endl;
  return absl::OkStatus();
}

}  // namespace shardmap
