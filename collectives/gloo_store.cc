#include "collectives/gloo_store.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(store_.options().timeout)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  for (const std::string& k : keys) full.push_back(Key(k));
  absl::Status s = store_.Wait(full, absl::Milliseconds(timeout.count()));
  if (!s.ok()) Throw(s);
}

}  // namespace shardmap::collectives
