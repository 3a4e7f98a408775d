// What a training step reports: its trace events (phases, pipeline spans, the collectives after
// the backward), the MoE drop counts summed over the batch axes, and the run's result assembled
// from every rank's final tensors.
//
//   StepTimes times{t0, bp.forward_end_us, t2, t3, t4};
//   AppendStepEvents(mesh, rank, PhaseKind(plan), times, bp.spans, log, logged, &events);
//   if (writer) WriteStepEvents(*writer, events);   // streamed, then cleared
#ifndef SHARDMAP_MODELS_TRAIN_STEP_REPORT_H_
#define SHARDMAP_MODELS_TRAIN_STEP_REPORT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "models/components/trace_writer.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/gpt_trace.h"
#include "models/parallel/pipeline.h"
#include "models/train/run_plan.h"
#include "models/train/trainer.h"
#include "shardmap/context.h"

namespace shardmap {

// When a step's phases began (TraceNowUs): the step, the backward (one program), the gradient
// reduction + clipping, the optimizer, and the step's end.
struct StepTimes {
  double start = 0, backward = 0, reduce = 0, optimizer = 0, end = 0;
};

// Appends the step's events: one span per phase (a pipeline's forwards and backwards as one
// phase plus a span per microbatch's forward "F3" and backward "B3"; accum microsteps as one),
// and an instant per collective logged after the backward (log[logged..]).
void AppendStepEvents(const Mesh& mesh, int rank, const RunPlan& plan, const StepTimes& times,
                      const std::vector<PipelineSpan>& spans,
                      const std::vector<CollectiveRecord>& log, size_t logged,
                      std::vector<TraceEvent>* events);

// Writes the events to the streamed trace and flushes it.
// One span per collective of the step's log on the rank's collectives track (TraceEvent::
// track 1), from its start to its completion (a started collective: to its Wait), so the
// trace shows which compute each one ran beside.
void AppendCollectiveSpans(const Mesh& mesh, int rank, const std::vector<CollectiveRecord>& log,
                           std::vector<TraceEvent>* events);

// Writes the events to the trace, each on its track (TraceTid: the rank's, or its collectives').
absl::Status WriteStepEvents(TraceWriter& writer, const std::vector<TraceEvent>& events);

// The step's MoE counts (dropped assignments, all assignments, dropped tokens) summed over the
// batch axes (tp ranks route the same tokens); -1 each without MoE.
struct MoeCounts {
  int64_t dropped = -1, assignments = -1, dropped_tokens = -1;
};
MoeCounts ReduceMoeCounts(const Model& layout, const MoeStats& stats, const Device& dev);

// The run's global tensors into `result` from every rank's local ones (final_locals[rank], index
// k as AddFinalTensor's): each from its owner stage's ranks (pp is the major axis: stage s holds
// ranks [s*inner, (s+1)*inner)).
absl::Status AssembleFinalTensors(const Model& layout, const RunPlan& plan,
                                  const std::vector<std::vector<Tensor>>& final_locals,
                                  TrainResult* result);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_STEP_REPORT_H_
