#include "models/components/trace_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shardmap {
namespace {

constexpr size_t kFlushBytes = 1 << 20;

absl::Status BadFilter(const std::string& text, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--trace_steps '", text, "': ", why,
      "; give steps and inclusive ranges separated by commas, e.g. \"2,5-7\" (steps count from "
      "0), or \"all\""));
}

bool ParseStep(absl::string_view s, int64_t* out) {
  s = absl::StripAsciiWhitespace(s);
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;  // no sign, no spaces inside
  }
  return absl::SimpleAtoi(s, out);
}

}  // namespace

absl::StatusOr<StepFilter> StepFilter::Parse(const std::string& text) {
  StepFilter f;
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty() || t == "all") return f;
  f.all_ = false;
  for (absl::string_view part : absl::StrSplit(t, ',')) {
    const std::string p(absl::StripAsciiWhitespace(part));
    if (p.empty()) return BadFilter(text, "an empty entry");
    const size_t dash = p.find('-');
    int64_t lo = 0, hi = 0;
    if (dash == std::string::npos) {
      if (!ParseStep(p, &lo)) {
        return BadFilter(text, absl::StrCat("'", p, "' is not a step number (>= 0)"));
      }
      hi = lo;
    } else {
      if (!ParseStep(absl::string_view(p).substr(0, dash), &lo) ||
          !ParseStep(absl::string_view(p).substr(dash + 1), &hi)) {
        return BadFilter(text, absl::StrCat("'", p, "' is not a range FIRST-LAST of steps >= 0"));
      }
      if (hi < lo) {
        return BadFilter(text, absl::StrCat("range '", p, "' ends before it starts"));
      }
    }
    f.ranges_.emplace_back(lo, hi);
  }
  std::sort(f.ranges_.begin(), f.ranges_.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : f.ranges_) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  f.ranges_ = std::move(merged);
  return f;
}

bool StepFilter::Contains(int64_t step) const {
  if (all_) return true;
  for (const auto& [lo, hi] : ranges_) {
    if (step >= lo && step <= hi) return true;
  }
  return false;
}

int64_t StepFilter::last() const { return all_ ? -1 : ranges_.back().second; }

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path,
                                                               double origin_us) {
  if (path.empty()) {
    return absl::InvalidArgumentError("--trace: the path is empty; give a file name");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    std::string fix = "give a writable file path";
    if (err == EISDIR) fix = "it is a directory; give a file path such as DIR/trace.json";
    if (err == ENOENT) fix = "its directory does not exist; create it first";
    if (err == EACCES) fix = "check the permissions of the file and its directory";
    return absl::FailedPreconditionError(absl::StrCat("--trace '", path, "': cannot create (",
                                                      std::strerror(err), "); ", fix));
  }
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, fd, origin_us));
  if (absl::Status s = w->WriteAll("["); !s.ok()) return s;
  return w;
}

TraceWriter::TraceWriter(std::string path, int fd, double origin_us)
    : path_(std::move(path)), fd_(fd), origin_us_(origin_us) {}

TraceWriter::~TraceWriter() { Close().IgnoreError(); }

absl::Status TraceWriter::WriteAll(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = absl::DataLossError(absl::StrCat("--trace '", path_, "': write failed (",
                                                std::strerror(errno),
                                                "); is the disk full?"));
      return error_;
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Write(nlohmann::json event) {
  if (!event.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--trace '", path_,
                                                   "': a trace event must be a JSON object, got ",
                                                   event.dump()));
  }
  if (event.contains("ts") && event["ts"].is_number()) {
    event["ts"] = event["ts"].get<double>() - origin_us_;
  }
  // Not-a-number values would be written as null; that is valid JSON, so no check here.
  std::string line = event.dump();
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok()) return error_;
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--trace '", path_, "': Write after Close"));
  }
  buffer_ += events_ == 0 ? "\n" : ",\n";
  buffer_ += line;
  ++events_;
  if (buffer_.size() >= kFlushBytes) return FlushLocked();
  return absl::OkStatus();
}

absl::Status TraceWriter::Span(const std::string& name, const std::string& category, int tid,
                               double start_us, double duration_us, nlohmann::json args) {
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "X"}, {"pid", 0},
                      {"tid", tid},   {"ts", start_us},  {"dur", duration_us}};
  if (!args.is_null()) e["args"] = std::move(args);
  return Write(std::move(e));
}

absl::Status TraceWriter::Instant(const std::string& name, const std::string& category, int tid,
                                  double at_us, nlohmann::json args) {
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "i"}, {"s", "t"},
                      {"pid", 0},     {"tid", tid},      {"ts", at_us}};
  if (!args.is_null()) e["args"] = std::move(args);
  return Write(std::move(e));
}

absl::Status TraceWriter::ThreadName(int tid, const std::string& name) {
  return Write({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                {"args", {{"name", name}}}});
}

absl::Status TraceWriter::FlushLocked() {
  if (!error_.ok()) return error_;
  if (fd_ < 0 || buffer_.empty()) return absl::OkStatus();
  std::string bytes;
  bytes.swap(buffer_);
  return WriteAll(bytes);
}

absl::Status TraceWriter::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  return FlushLocked();
}

absl::Status TraceWriter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return error_;
  absl::Status s = FlushLocked();
  if (s.ok()) s = WriteAll("\n]\n");
  if (::close(fd_) != 0 && s.ok()) {
    error_ = absl::DataLossError(
        absl::StrCat("--trace '", path_, "': close failed (", std::strerror(errno), ")"));
    s = error_;
  }
  fd_ = -1;
  return s;
}

int64_t TraceWriter::events_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

}  // namespace shardmap
