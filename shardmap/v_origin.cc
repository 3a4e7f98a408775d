#include "shardmap/v_origin.h"

#include <deque>
#include <limits>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace shardmap {
namespace {

struct Table {
  std::mutex mu;
  std::deque<VOrigin> records;  // id i is records[i - 1]; a deque keeps pointers stable
  absl::flat_hash_map<std::string, uint16_t> ids;
};

Table& TheTable() {
  static auto* t = new Table();
  return *t;
}

}  // namespace

uint16_t RecordVOrigin(const VOrigin& o) {
  Table& t = TheTable();
  std::string key = absl::StrCat(o.op, "\x1f", o.reason, "\x1f", o.operands, "\x1f", o.fix,
                                 static_cast<int>(o.kind));
  std::lock_guard<std::mutex> lock(t.mu);
  if (auto it = t.ids.find(key); it != t.ids.end()) return it->second;
  if (t.records.size() >= std::numeric_limits<uint16_t>::max()) return 0;
  t.records.push_back(o);
  const uint16_t id = static_cast<uint16_t>(t.records.size());
  t.ids.emplace(std::move(key), id);
  return id;
}

const VOrigin* FindVOrigin(uint16_t id) {
  if (id == 0) return nullptr;
  Table& t = TheTable();
  std::lock_guard<std::mutex> lock(t.mu);
  return id <= t.records.size() ? &t.records[id - 1] : nullptr;
}

std::string DescribeVOrigin(const char* operand, const std::string& axis, const VOrigin& o) {
  return absl::StrCat(operand, " is V (layout unknown) on '", axis, "' since ", o.op, ": ",
                      o.reason, " (its operands: ", o.operands, ")");
}

}  // namespace shardmap
