#include "collectives/distributed_env.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

absl::StatusOr<DistributedEnv> Parse(const std::map<std::string, std::string>& vars) {
  return ParseDistributedEnv([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistributedEnvTest, Torchrun) {
  auto env = Parse({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"},
                    {"SHARDMAP_STORE_TOKEN", kToken}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "node7");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->source, "torchrun");
  EXPECT_EQ(env->store_token, kToken);
  const TcpStoreOptions o = env->store_options(absl::Seconds(7));
  EXPECT_EQ(o.host, "node7");
  EXPECT_EQ(o.port, 29500);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.timeout, absl::Seconds(7));
  EXPECT_EQ(o.token, kToken);
}

TEST(DistributedEnvTest, AllowAllInterfacesIsOptIn) {
  std::map<std::string, std::string> vars = {{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                             {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "0.0.0.0"},
                                             {"MASTER_PORT", "29500"},
                                             {"SHARDMAP_STORE_TOKEN", kToken}};
  auto env = Parse(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(env->store_options().allow_all_interfaces);
  vars["SHARDMAP_STORE_ALLOW_ALL_INTERFACES"] = "1";
  env = Parse(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE(env->store_options().allow_all_interfaces);
  vars["SHARDMAP_STORE_ALLOW_ALL_INTERFACES"] = "0";
  EXPECT_FALSE(Parse(vars)->store_options().allow_all_interfaces);
  vars["SHARDMAP_STORE_ALLOW_ALL_INTERFACES"] = "yes";
  EXPECT_THAT(Parse(vars).status().ToString(),
              HasSubstr("SHARDMAP_STORE_ALLOW_ALL_INTERFACES='yes': expected 1"));
}

TEST(DistributedEnvTest, Slurm) {
  auto env = Parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "2"},
                    {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"},
                    {"SHARDMAP_STORE_TOKEN", kToken}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 6);
  EXPECT_EQ(env->local_rank, 2);
  EXPECT_EQ(env->source, "slurm");
  EXPECT_EQ(env->store_options().token, kToken);
}

TEST(DistributedEnvTest, SingleProcessNeedsNoMaster) {
  auto env = Parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->store_token, "");  // TcpStore makes one up for a one-rank store
}

TEST(DistributedEnvTest, ClearErrors) {
  struct Case {
    std::map<std::string, std::string> vars;
    const char* expect;
  };
  const std::map<std::string, std::string> good = {{"RANK", "1"}, {"WORLD_SIZE", "2"},
                                                    {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "h"},
                                                    {"MASTER_PORT", "29500"},
                                                    {"SHARDMAP_STORE_TOKEN", kToken}};
  auto without = [&](const char* k) { auto v = good; v.erase(k); return v; };
  auto with = [&](const char* k, const char* x) { auto v = good; v[k] = x; return v; };
  const std::vector<Case> cases = {
      {{}, "no distributed environment found"},
      {without("WORLD_SIZE"), "WORLD_SIZE is not set"},
      {without("MASTER_ADDR"), "MASTER_ADDR is not set"},
      {without("MASTER_PORT"), "MASTER_PORT is not set"},
      {without("LOCAL_RANK"), "LOCAL_RANK is not set"},
      {with("RANK", "two"), "RANK='two' is not an integer"},
      {with("RANK", "2"), "RANK=2 is outside [0, 1] (WORLD_SIZE=2)"},
      {with("WORLD_SIZE", "0"), "WORLD_SIZE=0 is outside"},
      {with("MASTER_PORT", "70000"), "MASTER_PORT=70000 is outside [1, 65535]"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}},
       "MASTER_ADDR is not set"},
      {without("SHARDMAP_STORE_TOKEN"), "SHARDMAP_STORE_TOKEN is not set: the rendezvous store "
                                        "refuses ranks without the job's token"},
      {with("SHARDMAP_STORE_TOKEN", "short"), "SHARDMAP_STORE_TOKEN: the store token has 5 "
                                              "characters; use 16 to 256"},
      {with("SHARDMAP_STORE_TOKEN", "0123456789 abcdef"),
       "SHARDMAP_STORE_TOKEN: the store token may hold only printable ASCII without spaces"},
      {with("SHARDMAP_STORE_TOKEN", ""), "the store token has 0 characters"},
  };
  for (const Case& c : cases) {
    auto env = Parse(c.vars);
    ASSERT_FALSE(env.ok()) << c.expect;
    EXPECT_THAT(std::string(env.status().message()), HasSubstr(c.expect));
    // The secret never appears in an error message.
    EXPECT_THAT(std::string(env.status().message()), Not(HasSubstr("0123456789")));
  }
}

}  // namespace
}  // namespace shardmap::collectives
