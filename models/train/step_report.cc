#include "models/train/step_report.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "shardmap/collective_ops.h"
#include "shardmap/sharding.h"

namespace shardmap {

void AppendStepEvents(const Mesh& mesh, int rank, const RunPlan& plan, const StepTimes& times,
                      const std::vector<PipelineSpan>& spans,
                      const std::vector<CollectiveRecord>& log, size_t logged,
                      std::vector<TraceEvent>* events) {
  std::vector<std::pair<std::string, double>> phases;  // name, start; each ends at the next
  if (plan.pipelined) {
    // One span per forward / backward of a microbatch ("F3", "B3"; interleaved "F3.1": on
    // chunk 1; the bubble is the gaps).
    const bool chunks = plan.timetable != nullptr && plan.timetable->virtual_stages() > 1;
    for (const PipelineSpan& sp : spans) {
      events->push_back({absl::StrCat(sp.action.kind == PipeAction::kForward ? "F" : "B",
                                      sp.action.microbatch,
                                      chunks ? absl::StrCat(".", sp.action.chunk) : ""),
                         "pipeline", rank, sp.start_us, sp.duration_us, -1});
    }
    phases = {{"pipeline (forwards + backwards)", times.start}};
  } else if (plan.accum > 1) {
    phases = {{absl::StrCat("forward + backward (", plan.accum, " microsteps)"), times.start}};
  } else {
    phases = {{"forward", times.start}, {"backward", times.backward}};
  }
  phases.push_back({"grad reduce + clip", times.reduce});
  phases.push_back({"optimizer", times.optimizer});
  phases.push_back({"", times.end});
  for (size_t k = 0; k + 1 < phases.size(); ++k) {
    events->push_back({phases[k].first, "phase", rank, phases[k].second,
                       phases[k + 1].second - phases[k].second, -1});
  }
  // Collectives after the backward pass (gradient and norm reductions); the backward ones are
  // spans of the backward tracer.
  for (size_t k = logged; k < log.size(); ++k) {
    const CollectiveRecord& r = log[k];
    events->push_back({absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")"), "collective",
                       rank, times.reduce, 0, r.bytes});
  }
}

void AppendCollectiveSpans(const Mesh& mesh, int rank, const std::vector<CollectiveRecord>& log,
                           std::vector<TraceEvent>* events) {
  for (const CollectiveRecord& r : log) {
    if (r.end_us <= 0) continue;
    std::string name = absl::StrCat(r.op, "(", mesh.MaskToString(r.axes), ")");
    if (r.recomputed) absl::StrAppend(&name, " recomputed");
    events->push_back({std::move(name), r.backward ? "in flight (backward)" : "in flight", rank,
                       r.start_us, std::max(r.end_us - r.start_us, 0.0), r.bytes, /*track=*/1});
  }
}

absl::Status WriteStepEvents(TraceWriter& writer, const std::vector<TraceEvent>& events) {
  for (const TraceEvent& e : events) {
    nlohmann::json args = e.bytes >= 0 ? nlohmann::json{{"bytes", e.bytes}} : nullptr;
    const int tid = TraceTid(e);
    absl::Status s =
        e.duration_us > 0 || e.category != "collective"
            ? writer.Span(e.name, e.category, tid, e.start_us, e.duration_us, args)
            : writer.Instant(e.name, e.category, tid, e.start_us, args);
    if (!s.ok()) return s;
  }
  return writer.Flush();
}

MoeCounts ReduceMoeCounts(const Model& layout, const MoeStats& stats, const Device& dev) {
  MoeCounts counts;
  if (!layout.shape().moe.on()) return counts;
  counts = {stats.dropped, stats.assignments, stats.dropped_tokens};
  if (layout.batch_axes().empty()) return counts;
  const Mesh& mesh = layout.mesh();
  const Axes batch(layout.batch_axes());
  SpmdType vt(mesh.num_axes());
  for (const std::string& a : layout.batch_axes()) vt[mesh.AxisIndex(a)] = AxisType::V();
  Value local(Tensor::FromVector<double>({3}, {static_cast<double>(stats.dropped),
                                               static_cast<double>(stats.assignments),
                                               static_cast<double>(stats.dropped_tokens)})
                  .To(dev),
              vt);
  std::vector<double> sum = all_reduce(reinterpret(local, batch), batch).tensor.ToVector<double>();
  return {static_cast<int64_t>(sum[0]), static_cast<int64_t>(sum[1]),
          static_cast<int64_t>(sum[2])};
}

absl::Status AssembleFinalTensors(const Model& layout, const RunPlan& plan,
                                  const std::vector<std::vector<Tensor>>& final_locals,
                                  TrainResult* result) {
  const Mesh& mesh = layout.mesh();
  const size_t np = layout.params().size();
  const int p = plan.stages;
  std::vector<std::string> inner_axes;
  for (const std::string& a : mesh.axis_names()) {
    if (plan.pp_index < 0 || a != axis::kPp) inner_axes.push_back(a);
  }
  absl::StatusOr<Mesh> inner =
      plan.pp_index < 0
          ? absl::StatusOr<Mesh>(mesh)
          : (inner_axes.empty() ? absl::StatusOr<Mesh>(Mesh()) : mesh.Submesh(inner_axes));
  if (!inner.ok()) return inner.status();
  const int inner_size = mesh.size() / p;
  for (size_t k = 0; k < 3 * np; ++k) {
    const ParamInfo& pi = layout.params()[k % np];
    const int owner = plan.stage_plan.owner[k % np];
    std::vector<Tensor> locals;
    for (int r = 0; r < inner_size; ++r) locals.push_back(final_locals[owner * inner_size + r][k]);
    if (!locals[0].defined()) continue;  // no moments without a step
    absl::StatusOr<Tensor> g = Assemble(*inner, pi.spec, locals, pi.spec.InputType(*inner));
    if (!g.ok()) return g.status();
    AddFinalTensor(layout, k, *g, result);
  }
  return absl::OkStatus();
}

}  // namespace shardmap
