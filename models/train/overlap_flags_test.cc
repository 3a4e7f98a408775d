#include "models/train/overlap_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

TEST(OverlapFlagsTest, OverlapTakesOnOffAndTrueFalse) {
  absl::FlagSaver saver;
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag("overlap");
  ASSERT_NE(flag, nullptr);
  std::string error;
  for (const char* off : {"off", "false", "0", "no", "OFF"}) {
    ASSERT_TRUE(flag->ParseFrom(off, &error)) << off << ": " << error;
    EXPECT_FALSE(absl::GetFlag(FLAGS_overlap).on) << off;
    EXPECT_EQ(flag->CurrentValue(), "off");  // what a run configuration stores
  }
  for (const char* on : {"on", "true", "1", "yes"}) {
    ASSERT_TRUE(flag->ParseFrom(on, &error)) << on;
    EXPECT_TRUE(absl::GetFlag(FLAGS_overlap).on) << on;
    EXPECT_EQ(flag->CurrentValue(), "on");
  }
  // Other text is refused with the other flags' checks (exit 2 and the fix, not Abseil's exit 1).
  ASSERT_TRUE(flag->ParseFrom("maybe", &error));
  EXPECT_EQ(flag->CurrentValue(), "maybe");
  absl::StatusOr<OverlapOptions> o = OverlapOptionsFromFlags();
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(), "--overlap='maybe': give on (the default) or off (or true / false)");
}

TEST(OverlapFlagsTest, TheDefaultsAreDdpsSchedule) {
  absl::StatusOr<OverlapOptions> o = OverlapOptionsFromFlags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->on);
  EXPECT_EQ(o->bucket_bytes, int64_t{25} << 20);
  EXPECT_EQ(o->fsdp_prefetch, 1);
}

TEST(OverlapFlagsTest, RefusesABadBucketOrPrefetchNamingTheFix) {
  for (double mb : {0.0, -1.0, 2e6, std::nan("")}) {
    absl::StatusOr<OverlapOptions> o = CheckOverlapSettings(true, mb, 1);
    ASSERT_FALSE(o.ok()) << mb;
    EXPECT_NE(o.status().message().find("--bucket_mb="), std::string::npos);
    EXPECT_NE(o.status().message().find("e.g. 25"), std::string::npos);
  }
  absl::StatusOr<OverlapOptions> p = CheckOverlapSettings(true, 25, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--fsdp_prefetch=0"), std::string::npos);
  absl::StatusOr<OverlapOptions> small = CheckOverlapSettings(false, 1e-9, 2);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->bucket_bytes, 1);  // at least a byte
  EXPECT_FALSE(small->on);
  EXPECT_EQ(small->fsdp_prefetch, 2);
}

}  // namespace
}  // namespace shardmap
