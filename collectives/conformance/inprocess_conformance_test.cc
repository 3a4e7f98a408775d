// The backend conformance suite on the in-process backend (ranks as threads of this process).
#include "collectives/conformance/backend_conformance.h"

namespace shardmap::collectives::conformance {

INSTANTIATE_TEST_SUITE_P(Backend, BackendConformanceTest,
                         ::testing::Values(ConformanceTarget{.backend = "inprocess"}),
                         ConformanceTargetName);

}  // namespace shardmap::collectives::conformance
