// Forwarding header: the host-wait counter moved to base/host_waits.h (a leaf package, so that
// tensor/cuda can count its waits without depending on collectives/). Include that instead.
#ifndef SHARDMAP_COLLECTIVES_HOST_WAITS_H_
#define SHARDMAP_COLLECTIVES_HOST_WAITS_H_

#include "base/host_waits.h"

namespace shardmap::collectives {

using ::shardmap::base::CountHostWait;
using ::shardmap::base::HostWait;
using ::shardmap::base::HostWaitCounts;
using ::shardmap::base::HostWaitName;
using ::shardmap::base::HostWaitSnapshot;
using ::shardmap::base::HostWaitSnapshotThisThread;
using ::shardmap::base::kHostWaitKinds;

}  // namespace shardmap::collectives

#endif  // SHARDMAP_COLLECTIVES_HOST_WAITS_H_
