// Chrome trace-event JSON written as the run goes (the JSON Array Format that Perfetto and
// chrome://tracing open), and the step filter of --trace_steps.
//
//   absl::StatusOr<StepFilter> steps = StepFilter::Parse("2,5-7");  // steps 2, 5, 6, 7
//   absl::StatusOr<std::unique_ptr<TraceWriter>> w = TraceWriter::Open("run.json");  // before
//   if (!w.ok()) return w.status();                                   // step 1: path checked now
//   (*w)->ThreadName(/*tid=*/0, "rank 0 (dp=0,tp=0)");
//   if (steps->Contains(step)) {
//     (*w)->Span("forward", "phase", /*tid=*/rank, start_us, duration_us);
//     (*w)->Write({{"name", "all_reduce(dp)"}, {"ph", "i"}, {"s", "t"}, {"pid", 0},
//                  {"tid", rank}, {"ts", t}});                        // any event object
//     (*w)->Flush();                                                  // e.g. at the step's end
//   }
//   absl::Status ok = (*w)->Close();                                  // writes the closing "]"
//
// The file is "[" then one event per line, separated by commas, then "]" at Close(). Events are
// buffered and written to the file whole (at Flush(), or when the buffer passes 1 MiB), so a run
// killed before Close() leaves "[" + complete events, which Perfetto's and the Chrome trace
// viewer's lenient JSON importers read (they add the missing "]"). Nothing is held in memory
// beyond the buffer. Timestamps: ts (and start_us) are microseconds; `origin_us` given to Open is
// subtracted from them so the trace starts near 0. Thread-safe: ranks may write concurrently.
#ifndef SHARDMAP_MODELS_COMPONENTS_TRACE_WRITER_H_
#define SHARDMAP_MODELS_COMPONENTS_TRACE_WRITER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace shardmap {

// Which steps to trace (StepInfo::step numbers, 0-based): "2,5-7" -> 2, 5, 6, 7; "all" or ""
// -> every step. InvalidArgument (quoting the text and the bad part) for anything else:
// negative or non-numeric steps, a range whose end is before its start, empty parts.
class StepFilter {
 public:
  static absl::StatusOr<StepFilter> Parse(const std::string& text);
  StepFilter() = default;  // every step

  bool Contains(int64_t step) const;
  bool all() const { return all_; }
  // The last step to trace (-1 with all()): tracing can stop after it.
  int64_t last() const;
  // Inclusive ranges, sorted and merged.
  const std::vector<std::pair<int64_t, int64_t>>& ranges() const { return ranges_; }

 private:
  bool all_ = true;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

class TraceWriter {
 public:
  // Creates (truncates) `path` and writes "[" now, so a bad path fails before training:
  // FailedPrecondition naming the path, the reason and the fix.
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Open(const std::string& path,
                                                           double origin_us = 0);
  ~TraceWriter();  // Close()s (errors are then lost: call Close() to see them)
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // One event object (must be a JSON object; "ts", when a number, is shifted by origin_us).
  // FailedPrecondition after Close() or after a failed write (the error repeats).
  absl::Status Write(nlohmann::json event);
  // A complete span ("ph": "X") on process 0, thread `tid`; args added when not null.
  absl::Status Span(const std::string& name, const std::string& category, int tid,
                    double start_us, double duration_us, nlohmann::json args = nullptr);
  // Thread-scoped instant ("ph": "i").
  absl::Status Instant(const std::string& name, const std::string& category, int tid,
                       double at_us, nlohmann::json args = nullptr);
  // Names a track: the metadata event thread_name.
  absl::Status ThreadName(int tid, const std::string& name);

  // Writes the buffered events to the file (whole events only).
  absl::Status Flush();
  // Flushes, writes "]" and closes; the file is then valid JSON. Idempotent.
  absl::Status Close();

  const std::string& path() const { return path_; }
  int64_t events_written() const;  // events accepted so far

 private:
  TraceWriter(std::string path, int fd, double origin_us);
  absl::Status FlushLocked();
  absl::Status WriteAll(const std::string& bytes);

  std::string path_;
  int fd_ = -1;
  double origin_us_ = 0;
  mutable std::mutex mu_;
  std::string buffer_;
  int64_t events_ = 0;
  absl::Status error_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_TRACE_WRITER_H_
