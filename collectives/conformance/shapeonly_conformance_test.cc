// The backend conformance suite on the shape-only backend: every data case runs its calls (each
// must return OK; outputs are not compared: no data moves), bad arguments must be refused; the
// cases that need peers (Split, failures, timeouts, mismatches) skip, saying why.
#include "collectives/conformance/backend_conformance.h"

namespace shardmap::collectives::conformance {

INSTANTIATE_TEST_SUITE_P(Backend, BackendConformanceTest,
                         ::testing::Values(ConformanceTarget{.backend = "shapeonly"}),
                         ConformanceTargetName);

}  // namespace shardmap::collectives::conformance
