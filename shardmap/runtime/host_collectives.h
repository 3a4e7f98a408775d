// Collectives on host buffers over any communicator, staged through device memory when the
// communicator works on a GPU.
//
//   int64_t mine = n, all[4];
//   absl::Status s = AllGatherHost(comm, &mine, all, 1, collectives::DataType::kI64);
#ifndef SHARDMAP_SHARDMAP_RUNTIME_HOST_COLLECTIVES_H_
#define SHARDMAP_SHARDMAP_RUNTIME_HOST_COLLECTIVES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "collectives/communicator.h"

namespace shardmap {

// Collectives on host buffers (shape records, hashes, small masks) over any communicator: when
// comm works on device memory, the buffers are staged through device memory on this thread's
// current stream of that device (the rank's stream inside RunSpmd / RunOnCommunicator).
absl::Status AllGatherHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t send_count, collectives::DataType dtype);
absl::Status AllReduceHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t count, collectives::DataType dtype, collectives::ReduceOp op);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_HOST_COLLECTIVES_H_
