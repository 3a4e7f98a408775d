// Expect a program to be rejected: an error Status (or a thrown OpError) whose message contains
// every given fragment, within a bounded wait, so that a program that hangs (a collective
// called on only some ranks, a deadlock) fails the test instead of blocking it.
//
//   #include "spmd_testing/testing.h"
//   #include "autograd/value_and_grad.h"
//   #include "shardmap/ops.h"
//   #include "tensor/random.h"
//   using namespace shardmap;
//
//   TEST(Mlp, ForgettingTheAllReduceIsRejected) {
//     ShardFn forgot_all_reduce = [](const std::vector<Value>& in) -> std::vector<Value> {
//       return {gelu(in[0].matmul(in[1])).matmul(in[2])};   // a pending sum over tp
//     };
//     ShardMap f = shard_map(forgot_all_reduce, *Mesh::Create({{"tp", 2}}),
//                            {P(), P(None, "tp"), P("tp", None)}, {P()});
//     std::vector<Tensor> inputs = {RandomNormal({3, 4}, 1), RandomNormal({4, 6}, 2),
//                                   RandomNormal({6, 4}, 3)};
//     EXPECT_TRUE(spmd_testing::RejectedWith([&] { return f(inputs).status(); },
//                                            {"pending sum", "all_reduce"}));
//     // Any callable returning absl::Status or absl::StatusOr<T>, or throwing OpError:
//     EXPECT_TRUE(spmd_testing::RejectedWith([&] { return value_and_grad(f)(inputs); }, {"tp"},
//                                            absl::Seconds(10)));
//   }
//
// Failures say what happened instead: "accepted (OK)", "rejected, but the message lacks
// 'all_reduce': <message>", or "still running after 10s (a hang?)". A program that times out is
// left running on a detached thread (threads cannot be killed): the test fails at once, and
// the process ends with the test binary.
#ifndef SHARDMAP_SPMD_TESTING_REJECTION_H_
#define SHARDMAP_SPMD_TESTING_REJECTION_H_

#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace shardmap::spmd_testing {

inline constexpr absl::Duration kDefaultRejectionTimeout = absl::Seconds(60);

::testing::AssertionResult RejectedWithStatus(std::function<absl::Status()> program,
                                              const std::vector<std::string>& fragments,
                                              absl::Duration timeout = kDefaultRejectionTimeout);

// program: any callable returning absl::Status or absl::StatusOr<T> (or void: then only a thrown
// OpError can reject it).
template <typename F>
::testing::AssertionResult RejectedWith(F program, const std::vector<std::string>& fragments,
                                        absl::Duration timeout = kDefaultRejectionTimeout) {
  using R = std::invoke_result_t<F&>;
  return RejectedWithStatus(
      [program = std::move(program)]() mutable -> absl::Status {
        if constexpr (std::is_void_v<R>) {
          program();
          return absl::OkStatus();
        } else if constexpr (std::is_same_v<std::decay_t<R>, absl::Status>) {
          return program();
        } else {
          return program().status();
        }
      },
      fragments, timeout);
}

}  // namespace shardmap::spmd_testing

#endif  // SHARDMAP_SPMD_TESTING_REJECTION_H_
