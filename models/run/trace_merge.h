// A multi-process run's trace: each process writes its own track to a part beside the trace
// (<trace>.rank<R>); after training rank 0 merges them into the trace, so one Perfetto file shows
// every rank.
#ifndef SHARDMAP_MODELS_RUN_TRACE_MERGE_H_
#define SHARDMAP_MODELS_RUN_TRACE_MERGE_H_

#include <string>

#include "absl/status/status.h"

namespace shardmap {

// Rank r's part of a multi-process trace: "<trace>.rank<r>".
std::string TracePartPath(const std::string& trace, int rank);

// Rank 0, after every process closed its trace: the parts' events appended to the trace (one
// JSON array: each process's track under its rank's tid), written to an exclusive temporary and
// renamed over the trace (models/components/atomic_file.h), the parts removed.
absl::Status MergeTraceParts(const std::string& trace, int processes);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_TRACE_MERGE_H_
