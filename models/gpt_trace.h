// Tracing a GPT training run: per-op spans inside the backward pass (a tape observer), and the
// Chrome trace-event JSON of every rank's events (opens in Perfetto / chrome://tracing).
//
//   std::vector<TraceEvent> events;
//   BackwardTracer tracer(&events);            // on a rank's thread, inside RunSpmd
//   tape.set_backward_observer(&tracer);
//   tape.Backward(loss, seed, params);         // events += one "backward op" span per VJP, named
//                                              // by its forward op ("matmul", "all_gather", ...),
//                                              // and one "collective (backward)" span per
//                                              // collective the VJP ran, with its bytes
//   nlohmann::json j = TraceJson(mesh, all_ranks_events);  // {"traceEvents": [...]}
#ifndef SHARDMAP_MODELS_GPT_TRACE_H_
#define SHARDMAP_MODELS_GPT_TRACE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "autograd/tape.h"
#include "models/gpt.h"
#include "nlohmann/json.hpp"
#include "shardmap/mesh.h"

namespace shardmap {

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

// Chrome trace-event JSON: one track (tid) per rank named by its mesh coordinates; spans
// ("ph": "X") for phases, ops, backward ops and collectives with a duration, instants for
// collectives logged after the backward pass (gradient and norm reductions); bytes in "args".
// Timestamps start at 0 (the earliest event).
nlohmann::json TraceJson(const Mesh& mesh, const std::vector<TraceEvent>& events);
absl::Status WriteTrace(const std::string& path, const Mesh& mesh,
                        const std::vector<TraceEvent>& events);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_TRACE_H_
