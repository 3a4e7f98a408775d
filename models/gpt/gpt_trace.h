// Tracing a GPT training run: per-op spans of the forward (a tape recorder) and inside the
// backward pass (a tape observer), and the Chrome trace-event JSON of every rank's events
// (opens in Perfetto / chrome://tracing).
//
//   std::vector<TraceEvent> events;
//   BackwardTracer tracer(&events);            // on a rank's thread, inside RunSpmd
//   tape.set_backward_observer(&tracer);
//   tape.Backward(loss, seed, params);         // events += one "backward op" span per VJP, named
//                                              // by its forward op ("matmul", "all_gather", ...),
//                                              // and one "collective (backward)" span per
//                                              // collective the VJP ran, with its bytes
//   nlohmann::json j = TraceJson(mesh, all_ranks_events);  // {"traceEvents": [...]}
#ifndef SHARDMAP_MODELS_GPT_GPT_TRACE_H_
#define SHARDMAP_MODELS_GPT_GPT_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "autograd/tape.h"
#include "shardmap/context.h"
#include "shardmap/tape_hook.h"
#include "nlohmann/json.hpp"
#include "shardmap/mesh.h"

namespace shardmap {

// One span of a rank's timeline: a phase ("forward", "backward", "grad reduce", "optimizer",
// a pipeline tick "F3" / "B3"), a forward op (its time since the previous recorded op), a
// backward op (its VJP; category "backward op"), or a collective (bytes >= 0; category
// "collective" or "collective (backward)" on the rank's track, where it was issued; "in flight"
// or "in flight (backward)" on its collectives track, from its start to its completion).
struct TraceEvent {
  std::string name, category;
  int rank = 0;
  double start_us = 0, duration_us = 0;
  int64_t bytes = -1;
  // 0: the rank's compute track; 1: its collectives track (each collective from its start to
  // its completion, a started one to its Wait: CollectiveRecord's span), shown beside it.
  int track = 0;
};

// The trace's thread id of a rank's track (the collectives tracks after every rank's own).
inline constexpr int kCollectiveTrackBase = 1 << 20;
inline int TraceTid(const TraceEvent& e) {
  return e.track == 1 ? kCollectiveTrackBase + e.rank : e.rank;
}

// Microseconds on the steady clock (the time base of TraceEvent).
double TraceNowUs();

// Appends a span per VJP (category "backward op") and, for each collective the VJP issued (the
// rank's collective log grew), a span over the same interval (category "collective (backward)",
// named "op(axes)", bytes this rank contributed). Needs a RankContext on the calling thread.
class BackwardTracer : public BackwardObserver {
 public:
  explicit BackwardTracer(std::vector<TraceEvent>* events);
  void BeforeVjp(const char* op) override;
  void AfterVjp(const char* op) override;

 private:
  std::vector<TraceEvent>* events_;
  double start_us_ = 0;
  size_t logged_ = 0;
};

// Forwards every recorded op to the tape and, when tracing (events != nullptr), notes it as a
// span since the previous recorded op (ops that record nothing are folded into the next one);
// an op that issued a collective is named with its axes and bytes. Counts the bytes of the
// recorded ops' outputs (what the tape keeps for the backward, at most). Needs a RankContext.
class TracingRecorder : public TapeRecorder {
 public:
  TracingRecorder(Tape* tape, std::vector<TraceEvent>* events, int rank, double start_us);
  void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
              VjpFn vjp) override;
  // Log entries seen so far (those after it were issued outside the forward).
  size_t logged() const { return logged_; }
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t largest_activation() const { return largest_activation_; }

 private:
  Tape* tape_;
  std::vector<TraceEvent>* events_;
  int rank_;
  double last_;
  RankContext* ctx_;
  size_t logged_ = 0;
  int64_t activation_bytes_ = 0, largest_activation_ = 0;
};

// Chrome trace-event JSON: one track (tid) per rank named by its mesh coordinates; spans
// ("ph": "X") for phases, ops, backward ops and collectives with a duration, instants for
// collectives logged after the backward pass (gradient and norm reductions); bytes in "args".
// Timestamps start at 0 (the earliest event).
nlohmann::json TraceJson(const Mesh& mesh, const std::vector<TraceEvent>& events);
absl::Status WriteTrace(const std::string& path, const Mesh& mesh,
                        const std::vector<TraceEvent>& events);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_TRACE_H_
