#include "collectives/gloo_threads.h"

#include <exception>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "collectives/internal/free_port.h"
#include "collectives/tcp_store.h"

namespace shardmap::collectives {

std::vector<absl::Status> RunGlooThreadsEach(int world_size,
                                             const std::function<absl::Status(Communicator&)>& fn,
                                             const GlooOptions& options) {
  if (world_size < 1) {
    return {absl::InvalidArgumentError(
        absl::StrCat("RunGlooThreads: world_size must be >= 1, got ", world_size))};
  }
  absl::StatusOr<int> port = internal::PickFreePort();
  if (!port.ok()) return std::vector<absl::Status>(world_size, port.status());
  absl::StatusOr<std::string> token = NewStoreToken();
  if (!token.ok()) return std::vector<absl::Status>(world_size, token.status());
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      TcpStoreOptions so;
      so.port = *port;
      so.rank = r;
      so.world_size = world_size;
      so.timeout = options.timeout;
      so.token = *token;
      absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(so);
      if (!store.ok()) {
        results[r] = store.status();
        return;
      }
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          CreateGlooCommunicator(std::shared_ptr<TcpStore>(std::move(*store)), options);
      if (!comm.ok()) {
        results[r] = comm.status();
        return;
      }
      try {
        results[r] = fn(**comm);
      } catch (const std::exception& e) {
        results[r] = absl::InternalError(absl::StrCat("threw an exception: ", e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

absl::Status RunGlooThreads(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                            const GlooOptions& options) {
  std::vector<absl::Status> all = RunGlooThreadsEach(world_size, fn, options);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok()) {
      return absl::Status(all[r].code(), absl::StrCat("rank ", r, ": ", all[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardmap::collectives
