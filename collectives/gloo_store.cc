#include "collectives/gloo_store.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gloo/common/error.h"

namespace shardmap::collectives {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw gloo::IoException(std::string("rendezvous through the TCP store failed: ") +
                          std::string(s.message()));
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_.Set(Key(key), absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_.Get(Key(key));
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) (void)get(k);
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) {
  wait(keys);
}

}  // namespace shardmap::collectives
