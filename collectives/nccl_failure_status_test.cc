// The NCCL backend's failure-to-status mapping (internal::ResolveNcclFailure, NcclCallRecord),
// host-side: runs with or without CUDA and a GPU. The multi-process behaviour is in
// nccl_multiprocess_test (needs two GPUs).
#include <optional>
#include <string>

#include "collectives/internal/free_port.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_failure_board.h"
#include "collectives/self_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const absl::Status kTimeout = absl::DeadlineExceededError("timed out after 3s waiting for NCCL");
const absl::Status kRemote = absl::InternalError("asynchronous NCCL error: remote process exited");

TEST(ResolveNcclFailureTest, ALocalFailureIsReportedAsIsAndPublished) {
  const absl::Status bad_root = absl::InvalidArgumentError("root 7 is not a rank of this group");
  const PeerFailure peer{2, absl::UnavailableError("lost")};
  for (const std::optional<PeerFailure>& first : {std::optional<PeerFailure>(), std::optional(peer)}) {
    ResolvedNcclFailure r = ResolveNcclFailure(bad_root, FailureOrigin::kLocal, 0, first,
                                               std::nullopt);
    EXPECT_EQ(r.status, bad_root);
    EXPECT_TRUE(r.publish);
  }
}

TEST(ResolveNcclFailureTest, APeersPublishedFailureGivesItsCodeAndMessage) {
  const PeerFailure peer{2, absl::InvalidArgumentError("NCCL Broadcast(f32, count=4) on group "
                                                       "'nccl world(3)' (rank 2 of 3) failed: "
                                                       "root 7 is not a rank")};
  for (const absl::Status& own : {kTimeout, kRemote}) {
    ResolvedNcclFailure r = ResolveNcclFailure(own, FailureOrigin::kPeer, 0, peer, std::nullopt);
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
    EXPECT_THAT(std::string(r.status.message()), StartsWith("rank 2 failed: NCCL Broadcast"));
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(std::string(own.message())));
    EXPECT_FALSE(r.publish);  // the peer told it already
  }
}

TEST(ResolveNcclFailureTest, APeersFailureWinsOverAMismatchSeenLater) {
  const PeerFailure peer{1, absl::ResourceExhaustedError("out of memory")};
  ResolvedNcclFailure r = ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 0, peer,
                                             absl::InvalidArgumentError("mismatched"));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(r.publish);
}

TEST(ResolveNcclFailureTest, AMismatchFoundHereIsInvalidArgumentAndPublished) {
  const absl::Status mismatch = absl::InvalidArgumentError(
      "mismatched collectives on group 'nccl world(3)': rank 0 called AllReduce(f32, count=4, "
      "sum) #2 but rank 2 called AllReduce(f32, count=5, sum) #2");
  ResolvedNcclFailure r =
      ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 1, std::nullopt, mismatch);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()), StartsWith(std::string(mismatch.message())));
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("found at: timed out"));
  EXPECT_TRUE(r.publish);
}

TEST(ResolveNcclFailureTest, NothingPublishedGivesTheOwnErrorPublishedForThePeers) {
  ResolvedNcclFailure r =
      ResolveNcclFailure(kRemote, FailureOrigin::kPeer, 1, std::nullopt, std::nullopt);
  EXPECT_EQ(r.status, kRemote);
  EXPECT_TRUE(r.publish);
}

// Another group of this process published first (the same world rank): its own error, and not
// published twice.
TEST(ResolveNcclFailureTest, ItsOwnEarlierPublicationIsNotRepeated) {
  const PeerFailure self{3, absl::InvalidArgumentError("bad count")};
  ResolvedNcclFailure r = ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 3, self, std::nullopt);
  EXPECT_EQ(r.status, kTimeout);
  EXPECT_FALSE(r.publish);
}

TEST(AbortNcclWorldTest, RefusesANonNcclCommunicator) {
  SelfCommunicator self;
  absl::Status s = AbortNcclWorld(self, absl::InternalError("x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not an NCCL communicator"));
}

TEST(CreateNcclCommunicatorTest, RefusesANegativePeerFailureWaitOrANullStore) {
  if (!NcclCompiledIn()) GTEST_SKIP() << "built without CUDA: the factory is Unimplemented";
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  TcpStoreOptions o;
  o.port = *port;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions options;
  options.peer_failure_wait = absl::Seconds(-1);
  auto comm = CreateNcclCommunicator(std::shared_ptr<TcpStore>(*std::move(store)), options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("peer_failure_wait"));
  EXPECT_EQ(CreateNcclCommunicator(std::shared_ptr<TcpStore>(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCallRecordTest, NamesTheCallAndItsNumber) {
  EXPECT_EQ(NcclCallRecord("AllReduce(f32, count=4, sum)", 2), "AllReduce(f32, count=4, sum) #2");
  EXPECT_NE(NcclCallRecord("Barrier()", 1), NcclCallRecord("Barrier()", 2));
}

}  // namespace
}  // namespace shardmap::collectives::internal
