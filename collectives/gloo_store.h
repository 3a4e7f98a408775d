// GlooStore: Gloo's rendezvous::Store interface over the project's TcpStore, so Gloo contexts
// rendezvous through the same store (and token) as every other multi-process backend.
//
//   GlooStore store(tcp_store, "gloo/world");        // keys become "gloo/world/<key>"
//   gloo_context->connectFullMesh(store, device);    // exchanges pair addresses through it
//
// Gloo calls these methods from the thread that connects the context and expects exceptions on
// failure; errors of the TcpStore (timeout, lost server) are thrown as gloo::IoException with the
// store's message, so connectFullMesh unwinds and the caller turns it back into a Status.
#ifndef SHARDMAP_COLLECTIVES_GLOO_STORE_H_
#define SHARDMAP_COLLECTIVES_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "collectives/tcp_store.h"
#include "gloo/rendezvous/store.h"

namespace shardmap::collectives {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `store` must outlive this adapter.
  GlooStore(TcpStore& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Bounded by the store's timeout (the first form) or `timeout`.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  TcpStore& store_;
  const std::string prefix_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_GLOO_STORE_H_
