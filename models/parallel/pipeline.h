// Pipeline parallelism over a mesh axis (conventionally "pp"): the model's layers are cut into
// stages (stage s on pp index s), each step's batch into microbatches, and a lockstep timetable
// says what every stage does at every tick: the forward or the backward of one microbatch, or
// nothing (the bubble).
//
//   absl::StatusOr<Timetable> tt = MakeTimetable(Schedule::kOneFOneB, /*stages=*/4,
//                                                /*microbatches=*/8);
//   // tt->at(tick, stage): {kForward, 3} = "F3"; tt->ToString() draws it, one row per stage.
//   PipelineStage stage{.forward = [&](int mb, int chunk, const Value& x,
//                                      const std::vector<Value>& p) {
//                         return s == 0 ? embed(mb, p) : blocks(x, p); },   // last: the loss
//                       .boundary_shape = {rows, d}, .boundary_dtype = DType::kF64,
//                       .boundary_type = x_type};
//   PipelineResult r = RunPipeline(*tt, "pp", stage, my_params);   // inside RunSpmd
//   // r.grads: the stage's gradients summed over the microbatches (the tape's dual types).
//
// Schedules (both finish in 2(m+p-1) ticks when forward and backward take one tick each):
//   GPipe  every stage runs all m forwards, then all m backwards (in microbatch order); each
//          stage holds the activations of all m microbatches at once.
//   1F1B   (PipeDream-Flush) stage s runs min(p-1-s, m) warm-up forwards, then alternates one
//          forward and one backward, then drains; it holds at most min(p-s, m) microbatches.
//   Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's forward_backward_pipelining_with_
//          interleaving) each rank holds v model chunks (virtual stages): chunk c of stage s is
//          virtual stage c*p + s, so a microbatch visits every rank v times. Forwards run in
//          groups of p microbatches per chunk; stage s warms up with (p-1-s)*2 + (v-1)*p
//          forwards (all m*v when m == p), then alternates, then drains. m must be a multiple
//          of p. The bubble shrinks to (p-1)/(v*m) of the ideal time, at v times the
//          boundary transfers.
// Bubble: each stage idles (p-1)/(m+p-1) of the ticks in GPipe and 1F1B.
// RunPipeline runs all three. Interleaved: the rank's forward callback is told the chunk it runs
// (with that chunk's parameters, PipelineStage::param_chunks), virtual stage c*p + s sends to
// c*p + s + 1 (the last stage's chunk c to stage 0's chunk c+1: the transfers go round a ring),
// the loss is on the last virtual stage (stage p-1, chunk v-1), and a chunk's parameters are
// final after that chunk's last backward on the rank.
//
// Communication. Stage boundaries are typed ops on the stage's tape: pp_send(y) (to the next
// stage) and pp_recv (from the previous stage). Their transposes swap roles, as for
// ppermute_start/Wait: the VJP of pp_recv hands the input's cotangent to the previous stage, the
// VJP of pp_send takes the output's cotangent from the next stage; so the gradients that cross
// stages are whatever the tape's backward pass produces, and a stage's backward of microbatch m
// is one Tape::BackwardAndRelease seeded at its pp_send (its loss on the last stage). The data
// move at the end of each tick in lockstep: one typed ppermute over the axis forwards
// (s -> s+1) when some stage ran a forward with a successor, one backwards (s -> s-1) when some
// stage ran a backward with a predecessor (pairs from those stages only); every rank knows the
// timetable, so all call the same collectives (with chunks the pairs are (s, s+1 mod p) and
// (s, s-1 mod p) of the virtual stages that have a successor or predecessor). A tick's received
// tensors wait in an inbox keyed by (microbatch, chunk) until used. Every
// boundary carries the same shape, dtype and type (what boundary_* say); a stage output that
// differs is an OpError naming both (V and S(d) count as one kind: a stage's ops may forget the
// S dim of a per-device value; the boundary keeps its declared one).
#ifndef SHARDMAP_MODELS_PARALLEL_PIPELINE_H_
#define SHARDMAP_MODELS_PARALLEL_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "autograd/tape.h"
#include "shardmap/context.h"
#include "shardmap/spmd_type.h"
#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

enum class Schedule : uint8_t { kGpipe, kOneFOneB, kInterleaved1F1B };

// "gpipe", "1f1b" or "interleaved_1f1b"; InvalidArgument names the choices.
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);
const char* ScheduleName(Schedule s);

struct PipeAction {
  enum Kind : uint8_t { kIdle, kForward, kBackward };
  Kind kind = kIdle;
  int microbatch = -1;
  int chunk = 0;  // the model chunk (interleaved schedules; 0 otherwise)
};

// Stage `stage`'s actions in its schedule's order (what MakeTimetable places on ticks, and what
// an asynchronous executor runs one after another). virtual_stages > 1 only with
// kInterleaved1F1B. InvalidArgument for stages, microbatches or virtual_stages < 1, a stage
// outside [0, stages), virtual stages with another schedule, or an interleaved schedule whose
// microbatches are not a multiple of the stages.
absl::StatusOr<std::vector<PipeAction>> StageActions(Schedule schedule, int stages,
                                                     int microbatches, int stage,
                                                     int virtual_stages = 1);

class Timetable {
 public:
  int stages() const { return stages_; }
  int microbatches() const { return microbatches_; }
  int virtual_stages() const { return virtual_stages_; }
  Schedule schedule() const { return schedule_; }
  int num_ticks() const { return static_cast<int>(ticks_.size()); }
  const PipeAction& at(int tick, int stage) const { return ticks_[tick][stage]; }
  // One row per stage, one column per tick: "F0 F1 .. B0 ..", "." for idle (interleaved:
  // "F0.1" is microbatch 0's forward on chunk 1).
  std::string ToString() const;
  // Most microbatches whose forward ran and whose backward did not yet, on `stage`.
  int MaxInFlight(int stage) const;
  // The idle fraction of the ticks on every stage, (p-1)/(m+p-1).
  double TheoreticalBubble() const;

 private:
  friend absl::StatusOr<Timetable> MakeTimetable(Schedule, int, int, int);
  int stages_ = 0, microbatches_ = 0, virtual_stages_ = 1;
  Schedule schedule_ = Schedule::kGpipe;
  std::vector<std::vector<PipeAction>> ticks_;  // ticks_[t][stage]
};

// The lockstep timetable: each stage runs its schedule's order of actions, each at the first
// tick where its inputs exist (the forward of the previous (virtual) stage, the backward of the
// next, at an earlier tick). InvalidArgument as StageActions.
absl::StatusOr<Timetable> MakeTimetable(Schedule schedule, int stages, int microbatches,
                                        int virtual_stages = 1);

// Layers per stage: `sizes` when given (must sum to `layers`, each >= 1), else as even as
// possible with the first stages taking the extra layers (4 over 3: 2,1,1). InvalidArgument when
// layers < stages (a stage without layers).
absl::StatusOr<std::vector<int64_t>> SplitLayers(int64_t layers, int stages,
                                                 const std::vector<int64_t>& sizes = {});

struct PipelineStage {
  // The forward of microbatch `mb` on this stage's model chunk `chunk` (virtual stage chunk * p
  // + stage; always 0 without interleaving), recorded on the executor's tape: `input` is what
  // the previous virtual stage sent (undefined on virtual stage 0), `params` the watched
  // parameters of that chunk (in RunPipeline's params order). Returns the activation for the
  // next virtual stage, or on the last one the loss (its share of the step's loss; V on the
  // pipeline axis is taken as this stage's share, P).
  std::function<Value(int mb, int chunk, const Value& input, const std::vector<Value>& params)>
      forward;
  // The chunk of each of RunPipeline's params (its size), in [0, virtual_stages); empty: every
  // parameter on chunk 0 (required when the timetable has more than one chunk per stage and
  // the stage has parameters). A parameter belongs to one chunk.
  std::vector<int> param_chunks;
  Shape boundary_shape;
  DType boundary_dtype = DType::kF32;
  SpmdType boundary_type;  // V on the pipeline axis
  // Optional: told of every VJP of the stage's backward passes (a tracer), as Tape's.
  BackwardObserver* backward_observer = nullptr;
  // Optional: told, during the last backward of a parameter's chunk on this stage, of its
  // gradient (summed over the microbatches) as soon as it is final (Tape::Backward's on_ready;
  // k indexes RunPipeline's params): overlapped gradient reduction. PipelineResult::grads then
  // stays empty.
  std::function<void(int k, const Value& grad)> on_final_grad;
};

// One action of a rank's timetable as it ran: a forward or backward of one microbatch.
struct PipelineSpan {
  PipeAction action;
  double start_us = 0, duration_us = 0;  // steady clock (TraceNowUs's base)
};

struct PipelineResult {
  std::vector<Value> grads;   // per parameter, summed over microbatches
  Value loss;  // last stage (its last chunk): the losses summed over microbatches, else undefined
  double busy_us = 0;         // time in forwards and backwards
  double total_us = 0;        // the whole timetable, transfers included
  int64_t peak_saved_bytes = 0;  // the tape's peak (activations held for backward)
  int64_t recorded_bytes = 0;    // all activations the step recorded, and the largest one
  int64_t largest_recorded_bytes = 0;
  std::vector<PipelineSpan> spans;  // this rank's forwards and backwards, in order
};

// Creates every sub-axis communicator of the mesh now, in one order on every rank. Stages issue
// different collectives (tp inside the embedding on one, inside the loss on another), and a
// communicator is otherwise made at first use by a world-wide split, which all ranks must then
// reach in the same order; then numbers collectives per axis set
// (RankContext::set_number_per_axis_set). RunPipeline calls it; call it first where
// stage-dependent collectives run before RunPipeline.
void CreateAllCommunicators(RankContext& ctx);

// Runs one step of `timetable` on this rank (inside RunSpmd / shard_map; the axis must have
// timetable.stages() devices; stage = axis_index(axis); a one-stage timetable may name no axis,
// "", and then only accumulates over the microbatches, or with chunks hands each chunk's output
// to the next on itself). Throws OpError, also for param_chunks that do not fit the timetable.
PipelineResult RunPipeline(const Timetable& timetable, const std::string& axis,
                           const PipelineStage& stage, const std::vector<Value>& params);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_PIPELINE_H_
