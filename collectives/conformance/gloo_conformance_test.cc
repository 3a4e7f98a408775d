// The backend conformance suite on Gloo: each rank a thread with its own TcpStore client, Gloo
// context and loopback connections, as a launched process would have. A failed rank closes its
// connections, so its peers name the rank they lost but not its status (peers_get_failed_status).
#include "collectives/conformance/backend_conformance.h"

namespace shardmap::collectives::conformance {

INSTANTIATE_TEST_SUITE_P(Backend, BackendConformanceTest,
                         ::testing::Values(ConformanceTarget{.backend = "gloo",
                                                             .peers_get_failed_status = false}),
                         ConformanceTargetName);

}  // namespace shardmap::collectives::conformance
