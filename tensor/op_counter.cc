#include "tensor/op_counter.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_format.h"
#include "tensor/internal/accounting.h"

namespace shardmap {

OpCounter::OpCounter(Timing timing)
    : outer_(internal::tls_accounting.counter), timed_(timing == kTimed) {
  internal::tls_accounting.counter = this;
}

OpCounter::~OpCounter() {
  if (internal::tls_accounting.counter != this) {  // a dangling pointer otherwise: fail loudly
    std::fprintf(stderr, "OpCounter destroyed out of order or on another thread\n");
    std::abort();
  }
  internal::tls_accounting.counter = outer_;
}

namespace {

// Grows by 4x rather than the vector's 2x: a shape-only step records thousands of ops, and
// each regrowth moves every record (with its name) so far.
void Append(std::vector<OpCount>& ops, OpCount count) {
  if (ops.size() == ops.capacity()) ops.reserve(std::max<size_t>(256, 4 * ops.capacity()));
  ops.push_back(std::move(count));
}

}  // namespace

void RecordOpCount(OpCount count) {
  OpCounter* c = internal::tls_accounting.counter;
  if (c == nullptr) return;
  for (; c->outer_ != nullptr; c = c->outer_) Append(c->ops_, count);
  Append(c->ops_, std::move(count));
}

double OpCounter::flops() const {
  double f = 0;
  for (const OpCount& o : ops_) f += o.flops;
  return f;
}

double OpCounter::gemm_flops() const {
  double f = 0;
  for (const OpCount& o : ops_) f += o.gemm ? o.gemm->flops() : 0;
  return f;
}

double OpCounter::bytes() const {
  double b = 0;
  for (const OpCount& o : ops_) b += o.bytes;
  return b;
}

std::string OpCounter::Summary() const {
  struct Total {
    int64_t count = 0;
    double flops = 0, bytes = 0;
  };
  std::map<std::string, Total> by_name;
  for (const OpCount& o : ops_) {
    Total& t = by_name[o.op];
    ++t.count;
    t.flops += o.flops;
    t.bytes += o.bytes;
  }
  std::vector<std::pair<std::string, Total>> rows(by_name.begin(), by_name.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.flops > b.second.flops; });
  std::string out =
      absl::StrFormat("%-28s %8s %14s %14s %8s\n", "op", "count", "GFLOP", "MB", "flop/B");
  for (const auto& [name, t] : rows) {
    absl::StrAppendFormat(&out, "%-28s %8d %14.4f %14.4f %8.2f\n", name, t.count, t.flops / 1e9,
                          t.bytes / 1e6, t.bytes > 0 ? t.flops / t.bytes : 0.0);
  }
  absl::StrAppendFormat(&out, "%-28s %8d %14.4f %14.4f\n", "total", ops_.size(), flops() / 1e9,
                        bytes() / 1e6);
  return out;
}

}  // namespace shardmap
