// CollectiveRecorder: records the collectives issued while it lives, like PyTorch's
// CommDebugMode. RAII; no options to copy, no ShardMap to rebuild.
//
// Around any global call, on the calling thread: every rank's collectives (the ranks of the
// shard_map, value_and_grad or RunSpmd calls started from this thread while it lives):
//
//   Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
//   ShardMap f = shard_map(mlp, mesh, in_specs, out_specs);   // no options needed
//   {
//     CollectiveRecorder rec;
//     absl::StatusOr<ShardMapGrads> r = value_and_grad(f)({x, w1, w2});
//     rec.records();        // rank 0's in program order: CollectiveRecord{op, axes, bytes,
//                           //   backward, dtype} per call, forward and backward
//     rec.records(4);       // rank 4's
//     rec.ranks();          // {0, 1, 2, 3, 4, 5}
//     rec.Count("all_reduce", *mesh.Mask({"tp"}), /*backward=*/true);   // rank 0's: 1
//     std::cout << rec.ToString();
//     //   all_reduce over tp: f32, 40 bytes
//     //   all_reduce over dp: f32, 4 bytes
//     //   all_reduce over dp: f32, 4 bytes (backward)
//     //   all_reduce over tp: f32, 40 bytes (backward)
//   }
//
// Inside per-rank code (a shard_map body, RunSpmd): that rank's collectives only, e.g. those
// of one layer:
//
//   ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
//     CollectiveRecorder layer;
//     Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
//     EXPECT_EQ(layer.records().size(), 1u);
//     return {y};
//   };
//
// Recorders nest (each records what was issued while it lived, an inner one's records are in
// the outer one's too), several may live on one thread, and the ranks of one program append to
// a shared outer recorder concurrently (it locks). A recorder made on one rank never sees
// another rank's collectives. Collectives of programs started from other threads are not
// recorded. Multi-process programs (RunOnCommunicator) record the ranks of this process.
#ifndef SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORDER_H_
#define SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORDER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "shardmap/mesh.h"
#include "shardmap/runtime/rank_context.h"

namespace shardmap {

class CollectiveRecorder;

namespace internal {
// Appends r (issued by `rank` of `mesh`) to every recorder active on this thread
// (RankContext::LogCollective calls it).
void RecordCollective(int rank, const Mesh& mesh, const CollectiveRecord& r);
// Whether a recorder is active on this thread (one thread-local read).
bool AnyRecorderActive();
}  // namespace internal

class CollectiveRecorder {
 public:
  // Starts recording on this thread (and on the ranks of the SPMD programs it starts).
  CollectiveRecorder();
  // Stops recording; the records stay readable until then.
  ~CollectiveRecorder();
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;

  // The rank this recorder was made on (inside per-rank code), or -1 (made outside).
  int home_rank() const { return home_rank_; }
  // The collectives `rank` issued while this recorder lived, in its program order (empty when
  // none).
  std::vector<CollectiveRecord> records(int rank) const;
  // records(home_rank()), or rank 0's for a recorder made outside per-rank code.
  std::vector<CollectiveRecord> records() const;
  // The ranks that issued at least one recorded collective, ascending.
  std::vector<int> ranks() const;
  // `rank`'s records of `op` over exactly `axes` in the given direction (rank -1: as records()).
  int Count(absl::string_view op, AxisMask axes, bool backward, int rank = -1) const;
  // The bytes `rank` contributed to its recorded collectives (rank -1: as records()).
  int64_t Bytes(int rank = -1) const;
  // One line per record of `rank` (rank -1: as records()), axes named by that rank's mesh:
  // "all_reduce over tp: f32, 96 bytes (backward)" ("(backward, recomputed)" for a collective of
  // a recomputed forward, autograd/checkpoint.h).
  std::string ToString(int rank = -1) const;
  // Drops the records so far; recording goes on.
  void Clear();

 private:
  friend void internal::RecordCollective(int rank, const Mesh& mesh, const CollectiveRecord& r);
  void Add(int rank, const Mesh& mesh, const CollectiveRecord& r);
  int RankOrDefault(int rank) const;

  int home_rank_;
  mutable std::mutex mu_;
  struct RankLog {
    Mesh mesh;  // of the program that issued them (names the axes in ToString)
    std::vector<CollectiveRecord> records;
  };
  std::map<int, RankLog> by_rank_;
};

namespace internal {

// The recorders live on this thread (innermost last), for the SPMD runners to hand to the
// threads of the ranks they start.
std::vector<CollectiveRecorder*> ActiveRecorders();

// Installs `recorders` as the active ones of this thread for its scope (the rank threads of
// RunSpmd: they record into the recorders of the thread that started the program).
class ScopedInheritedRecorders {
 public:
  explicit ScopedInheritedRecorders(std::vector<CollectiveRecorder*> recorders);
  ~ScopedInheritedRecorders();
  ScopedInheritedRecorders(const ScopedInheritedRecorders&) = delete;
  ScopedInheritedRecorders& operator=(const ScopedInheritedRecorders&) = delete;

 private:
  std::vector<CollectiveRecorder*> saved_;
};

}  // namespace internal

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORDER_H_
