#include "collectives/backend_registry.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/internal/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(BackendRegistryTest, TheBuiltinsAreRegisteredWithWhatAProgramNeedsToPick) {
  EXPECT_THAT(BackendNames(), ::testing::IsSupersetOf({"inprocess", "gloo", "nccl", "shapeonly"}));
  const Backend* in = *FindBackend("inprocess");
  EXPECT_FALSE(in->process_per_rank);
  EXPECT_EQ(in->memory, BackendMemory::kHostOrDevice);
  const Backend* gloo = *FindBackend("gloo");
  EXPECT_TRUE(gloo->process_per_rank);
  EXPECT_EQ(gloo->memory, BackendMemory::kHost);
  EXPECT_TRUE(gloo->unavailable_reason().empty());
  const Backend* nccl = *FindBackend("nccl");
  EXPECT_TRUE(nccl->process_per_rank);
  EXPECT_EQ(nccl->memory, BackendMemory::kDevice);
  const Backend* shape = *FindBackend("shapeonly");
  EXPECT_FALSE(shape->moves_data);
  EXPECT_FALSE(shape->trains);
  for (const Backend* b : Backends()) {
    EXPECT_TRUE(b->run_world) << b->name;
    EXPECT_FALSE(b->description.empty()) << b->name;
    EXPECT_EQ(b->process_per_rank, static_cast<bool>(b->create_from_env)) << b->name;
  }
}

TEST(BackendRegistryTest, AnUnknownNameListsTheRegisteredOnes) {
  absl::StatusOr<const Backend*> b = FindBackend("mpi");
  ASSERT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(b.status()),
              AllOf(HasSubstr("--backend mpi: no such backend"),
                    HasSubstr("inprocess, gloo, nccl, shapeonly")));
}

TEST(BackendRegistryTest, FlagHelpHasEveryBackendOnItsLine) {
  const std::string help = BackendFlagHelp();
  for (const Backend* b : Backends()) {
    EXPECT_THAT(help, HasSubstr(absl::StrCat(b->name, " (", b->description))) << help;
  }
  EXPECT_THAT(help, HasSubstr("gloo (one process per rank over Gloo/TCP; host memory; started by "
                              "collectives/launch"));
}

TEST(BackendRegistryTest, RegisterRefusesBadEntries) {
  auto run = [](int, const RankFn&, const WorldOptions&) { return std::vector<absl::Status>(); };
  Backend b;
  b.run_world = run;
  EXPECT_THAT(Message(RegisterBackend(b)), HasSubstr("must be a non-empty word"));
  b.name = "two words";
  EXPECT_EQ(RegisterBackend(b).code(), absl::StatusCode::kInvalidArgument);
  b.name = "gloo";
  EXPECT_EQ(RegisterBackend(b).code(), absl::StatusCode::kAlreadyExists);
  b.name = "norun";
  b.run_world = nullptr;
  EXPECT_THAT(Message(RegisterBackend(b)), HasSubstr("run_world is not set"));
  b.run_world = run;
  b.process_per_rank = true;
  EXPECT_THAT(Message(RegisterBackend(b)), HasSubstr("needs create_from_env"));
  EXPECT_FALSE(FindBackend("norun").ok());
  b.process_per_rank = false;
  EXPECT_TRUE(RegisterBackend(b).ok());
  EXPECT_EQ(BackendNames().back(), "norun");
}

TEST(BackendRegistryTest, ConnectTrainingWorldChecksTheChoiceBeforeConnecting) {
  EXPECT_EQ(ConnectTrainingWorld("mpi", 2, false).status().code(), absl::StatusCode::kNotFound);
  absl::Status s = ConnectTrainingWorld("shapeonly", 2, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("cannot train; use one of inprocess, gloo, nccl"));
  EXPECT_THAT(Message(s), ::testing::Not(HasSubstr("nccl, shapeonly")));
  s = ConnectTrainingWorld("gloo", 2, /*device_cuda=*/true).status();
  EXPECT_THAT(Message(s), HasSubstr("--backend=gloo runs on CPU memory"));
  s = ConnectTrainingWorld("nccl", 2, /*device_cuda=*/false).status();
  EXPECT_THAT(Message(s),
              HasSubstr("--backend=nccl runs each process on a GPU: add --device=cuda"));
  // Threads of this process: the program makes its own world.
  absl::StatusOr<std::unique_ptr<Communicator>> in = ConnectTrainingWorld("inprocess", 4, false);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(*in, nullptr);
}

// A process a launcher started as one rank of several, left on a thread backend, would train
// alone: refused, naming its rank.
TEST(BackendRegistryTest, AThreadBackendInALaunchedWorldIsRefused) {
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}) unsetenv(v);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("SHARDMAP_STORE_TOKEN", "t", 1);
  absl::Status s = ConnectTrainingWorld("inprocess", 2, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("--backend=inprocess runs every rank as a thread"),
                                HasSubstr("rank 1 of 2"), HasSubstr("--backend=gloo")));
  setenv("WORLD_SIZE", "1", 1);  // one launched process: its ranks are its threads
  setenv("RANK", "0", 1);
  setenv("LOCAL_RANK", "0", 1);
  absl::StatusOr<std::unique_ptr<Communicator>> one = ConnectTrainingWorld("inprocess", 4, false);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, nullptr);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "SHARDMAP_STORE_TOKEN"}) {
    unsetenv(v);
  }
}

TEST(BackendRegistryTest, ConnectTrainingWorldConnectsALaunchedProcessAndChecksTheSize) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}) {
    unsetenv(v);
  }
  absl::Status s = ConnectTrainingWorld("gloo", 3, false).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), AllOf(HasSubstr("--backend=gloo: "),
                                HasSubstr("collectives/launch --nproc_per_node=3")));
  // One launched process (what collectives/launch --nproc_per_node=1 sets).
  absl::StatusOr<int> port = internal::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
  s = ConnectTrainingWorld("gloo", 2, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Message(s), HasSubstr("the world has 1 processes but the mesh has 2 ranks"));
  absl::StatusOr<std::unique_ptr<Communicator>> w = ConnectTrainingWorld("gloo", 1, false);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_NE(*w, nullptr);
  EXPECT_EQ((*w)->size(), 1);
  float x = 2;
  EXPECT_TRUE((*w)->AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(x, 2);
  // Rank 0 of 2 whose peer never comes: the rendezvous's own hint, said once.
  setenv("WORLD_SIZE", "2", 1);
  setenv("SHARDMAP_STORE_TOKEN", "test-token-0123456789abcdef", 1);
  absl::StatusOr<int> port2 = internal::PickFreePort();  // the one-process world keeps *port
  ASSERT_TRUE(port2.ok()) << port2.status();
  setenv("MASTER_PORT", std::to_string(*port2).c_str(), 1);
  s = ConnectTrainingWorld("gloo", 2, false, {.timeout = absl::Milliseconds(300)}).status();
  EXPECT_FALSE(s.ok());
  const std::string m = Message(s);
  EXPECT_THAT(m, AllOf(HasSubstr("--backend=gloo: "), HasSubstr("rank 1 of 2 did not join"),
                       HasSubstr("collectives/launch --nproc_per_node=2")));
  EXPECT_EQ(m.find("collectives/launch"), m.rfind("collectives/launch")) << m;
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "SHARDMAP_STORE_TOKEN"}) {
    unsetenv(v);
  }
}

}  // namespace
}  // namespace shardmap::collectives
