#include "models/gpt/gpt_trace.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shardmap/context.h"
#include "shardmap/rank_context.h"

namespace shardmap {

double TraceNowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

BackwardTracer::BackwardTracer(std::vector<TraceEvent>* events) : events_(events) {}

void BackwardTracer::BeforeVjp(const char* /*op*/) {
  logged_ = RankContext::Get("BackwardTracer").collective_log().size();
  start_us_ = TraceNowUs();
}

void BackwardTracer::AfterVjp(const char* op) {
  const double end = TraceNowUs();
  RankContext& ctx = RankContext::Get("BackwardTracer");
  const int rank = ctx.rank();
  events_->push_back({op, "backward op", rank, start_us_, end - start_us_, -1});
  const std::vector<CollectiveRecord>& log = ctx.collective_log();
  for (size_t k = logged_; k < log.size(); ++k) {
    events_->push_back({absl::StrCat(log[k].op, "(", ctx.mesh().MaskToString(log[k].axes), ")"),
                        "collective (backward)", rank, start_us_, end - start_us_,
                        log[k].bytes});
  }
  logged_ = log.size();
}

TracingRecorder::TracingRecorder(Tape* tape, std::vector<TraceEvent>* events, int rank,
                                 double start_us)
    : tape_(tape), events_(events), rank_(rank), last_(start_us) {
  ctx_ = &RankContext::Get("TracingRecorder");
  logged_ = ctx_->collective_log().size();
}

void TracingRecorder::Record(const char* op, std::initializer_list<const Value*> inputs,
                             Value& out, VjpFn vjp) {
  tape_->Record(op, inputs, out, std::move(vjp));
  const int64_t bytes = static_cast<int64_t>(out.tensor.nbytes());
  activation_bytes_ += bytes;
  largest_activation_ = std::max(largest_activation_, bytes);
  if (events_ != nullptr) {
    const double now = TraceNowUs();
    const auto& log = ctx_->collective_log();
    if (log.size() > logged_) {
      const CollectiveRecord& r = log.back();
      events_->push_back({absl::StrCat(r.op, "(", ctx_->mesh().MaskToString(r.axes), ")"),
                          "collective", rank_, last_, now - last_, r.bytes});
    } else {
      events_->push_back({op, "op", rank_, last_, now - last_, -1});
    }
    last_ = now;
  }
  logged_ = ctx_->collective_log().size();
}

nlohmann::json TraceJson(const Mesh& mesh, const std::vector<TraceEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  double t0 = events.empty() ? 0 : events[0].start_us;
  for (const TraceEvent& e : events) t0 = std::min(t0, e.start_us);
  for (int r = 0; r < mesh.size(); ++r) {
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                   {"args", {{"name", RankDescription(mesh, r)}}}});
    out.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0},
                   {"tid", kCollectiveTrackBase + r},
                   {"args", {{"name", RankDescription(mesh, r) + " collectives"}}}});
  }
  for (const TraceEvent& e : events) {
    nlohmann::json ev = {{"name", e.name}, {"cat", e.category}, {"pid", 0}, {"tid", TraceTid(e)},
                         {"ts", e.start_us - t0}};
    if (e.duration_us > 0 || e.category != "collective") {
      ev["ph"] = "X";
      ev["dur"] = e.duration_us;
    } else {
      ev["ph"] = "i";  // a collective issued after the backward: an instant on its phase
      ev["s"] = "t";
    }
    if (e.bytes >= 0) ev["args"] = {{"bytes", e.bytes}};
    out.push_back(ev);
  }
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

absl::Status WriteTrace(const std::string& path, const Mesh& mesh,
                        const std::vector<TraceEvent>& events) {
  std::ofstream f(path);
  if (!f) return absl::FailedPreconditionError(absl::StrCat("cannot write --trace '", path, "'"));
  f << TraceJson(mesh, events).dump();
  return f ? absl::OkStatus()
           : absl::FailedPreconditionError(absl::StrCat("writing --trace '", path, "' failed"));
}

}  // namespace shardmap
