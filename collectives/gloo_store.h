// GlooStore: Gloo's rendezvous::Store interface over the project's TcpStore, so Gloo contexts
// rendezvous through the same store (and token) as every other multi-process backend.
//
//   GlooStore store(tcp_store, "gloo/world");        // keys become "gloo/world/<key>"
//   gloo_context->connectFullMesh(store, device);    // exchanges pair addresses through it
//
//   // A group formed later (a Split): a missing peer is named by its world rank, and not told
//   // to "start every rank" (it was started; it is stopped, hung or busy).
//   GlooStore split_store(tcp_store, "gloo/world/split#3/color0",
//                         GlooStoreGroup{{0, 2, 4}, "the rendezvous of Split() #3"});
//
// Gloo calls these methods from the thread that connects the context and expects exceptions on
// failure; errors of the TcpStore (timeout, lost server) are thrown as gloo::IoException with the
// store's message, so connectFullMesh unwinds and the caller turns it back into a Status.
#ifndef SHARDMAP_COLLECTIVES_GLOO_STORE_H_
#define SHARDMAP_COLLECTIVES_GLOO_STORE_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "collectives/tcp_store.h"
#include "gloo/rendezvous/store.h"

namespace shardmap::collectives {

// A group whose members all joined the job earlier: its rendezvous keys are group ranks.
struct GlooStoreGroup {
  std::vector<int> world_ranks;  // group rank -> world rank
  std::string what;              // the step that forms it: "the rendezvous of Split() #3"
};

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `store` must outlive this adapter. Without `group` it is the world's first rendezvous.
  GlooStore(TcpStore& store, std::string prefix, std::optional<GlooStoreGroup> group = {})
      : store_(store), prefix_(std::move(prefix)), group_(std::move(group)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  // Bounded by the store's timeout (the first form) or `timeout`.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  std::string GroupRanksDidNotArrive(const std::vector<int>& group_ranks,
                                     absl::Duration limit) const;

  TcpStore& store_;
  const std::string prefix_;
  const std::optional<GlooStoreGroup> group_;
};

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_GLOO_STORE_H_
