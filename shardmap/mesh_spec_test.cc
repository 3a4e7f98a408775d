#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/mesh.h"
#include "shardmap/partition_spec.h"
#include "shardmap/spmd_type.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

TEST(SpmdTypeTest, PrintsAndDuals) {
  SpmdType t(3);
  t[0] = AxisType::Sharded(0);
  t[2] = AxisType::I();
  std::vector<std::string> names = {"dp", "tp", "cp"};
  EXPECT_EQ(t.ToString(names), "{dp:S0,tp:R,cp:I}");
  EXPECT_EQ(Dual(t).ToString(names), "{dp:S0,tp:P,cp:I}");
  EXPECT_EQ(Dual(Dual(t)), t);
  EXPECT_NE(Dual(t), t);
  EXPECT_EQ(AxisType::V().ToString(), "V");
}

TEST(SpmdTypeTest, AxesOfKindIsAMaskInMeshOrder) {
  SpmdType t(4);
  t[0] = AxisType::Sharded(0);
  t[1] = AxisType::P();
  t[3] = AxisType::P();
  EXPECT_EQ(t.AxesOfKind(AxisKind::kP), 0b1010u);
  EXPECT_EQ(t.AxesOfKind(AxisKind::kV), 0b0001u);  // S(d) is a V
  EXPECT_EQ(t.AxesOfKind(AxisKind::kR), 0b0100u);
  EXPECT_EQ(t.AxesOfKind(AxisKind::kI), 0u);
  EXPECT_EQ(Dual(t).AxesOfKind(AxisKind::kP), 0b0100u);
  EXPECT_EQ(SpmdType().AxesOfKind(AxisKind::kR), 0u);
  Mesh m = *Mesh::Create({{"dp", 2}, {"tp", 3}, {"cp", 1}, {"ep", 5}});
  EXPECT_EQ(m.AxisNamesOf(t.AxesOfKind(AxisKind::kP)), (std::vector<std::string>{"tp", "ep"}));
  EXPECT_TRUE(m.AxisNamesOf(0).empty());
}

TEST(MeshTest, CoordsAndGroups) {
  Mesh m = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  EXPECT_EQ(m.size(), 6);
  EXPECT_EQ(m.Coords(4), (std::vector<int>{1, 1}));
  EXPECT_EQ(m.RankAt({1, 2}), 5);
  AxisMask tp = *m.Mask({"tp"});
  AxisMask dp = *m.Mask({"dp"});
  EXPECT_EQ(m.GroupSize(tp), 3);
  EXPECT_EQ(m.GroupColor(4, tp), 1);
  EXPECT_EQ(m.GroupIndex(4, tp), 1);
  EXPECT_EQ(m.GroupColor(4, dp), 1);
  EXPECT_EQ(m.GroupIndex(4, dp), 1);
  EXPECT_EQ(m.GroupMember(4, dp, 0), 1);
  EXPECT_EQ(m.GroupMember(0, tp | dp, 5), 5);
  EXPECT_EQ(m.MaskToString(tp | dp), "(dp,tp)");
  for (int r = 0; r < 6; ++r) EXPECT_EQ(m.RankAt(m.Coords(r)), r);
}

// Mesh prints as its ShortString through operator<<, absl::StrFormat and AbslStringify.
TEST(MeshTest, PrintsItsShortString) {
  Mesh m = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::ostringstream os;
  os << m << " / " << Mesh();
  EXPECT_EQ(os.str(), "Mesh{dp:2,tp:3} / " + Mesh().ShortString());
  EXPECT_EQ(absl::StrFormat("on %s", m), "on Mesh{dp:2,tp:3}");
  EXPECT_EQ(::testing::PrintToString(m), "Mesh{dp:2,tp:3}");  // gtest's messages
  struct Sink {
    void Append(absl::string_view s) { text.append(s.data(), s.size()); }
    std::string text;
  } sink;
  AbslStringify(sink, *m.Flatten({"dp", "tp"}, "world"));
  EXPECT_EQ(sink.text, "Mesh{world:6}");
}

TEST(MeshTest, Errors) {
  EXPECT_THAT(Mesh::Create({{"dp", 2}, {"dp", 3}}).status().message(), HasSubstr("used twice"));
  EXPECT_THAT(Mesh::Create({{"dp", 0}}).status().message(), HasSubstr("size 0"));
  EXPECT_THAT(Mesh::Create({{"", 2}}).status().message(), HasSubstr("non-empty"));
  Mesh m = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  EXPECT_THAT(m.Mask({"pp"}).status().message(), HasSubstr("unknown mesh axis 'pp'"));
  EXPECT_FALSE(m.Mask({"tp", "tp"}).ok());
}

TEST(MeshTest, SubmeshFlattenPrint) {
  Mesh m = *Mesh::Create({{"pp", 2}, {"dp", 2}, {"tp", 2}});
  Mesh f = *m.Flatten({"dp", "tp"}, "dp_tp");
  EXPECT_EQ(f.ShortString(), "Mesh{pp:2,dp_tp:4}");
  // Rank order kept: rank 5 = pp 1, dp 0, tp 1 -> dp_tp 1.
  EXPECT_EQ(f.Coords(5), (std::vector<int>{1, 1}));
  EXPECT_FALSE(m.Flatten({"pp", "tp"}, "x").ok());
  Mesh s = *m.Submesh({"tp", "pp"});
  EXPECT_EQ(s.ShortString(), "Mesh{pp:2,tp:2}");
  std::string text = m.ToString();
  EXPECT_THAT(text, HasSubstr("[pp=1]"));
  EXPECT_THAT(text, HasSubstr("7"));
}

TEST(PartitionSpecTest, SpellingAndTypes) {
  Mesh m = *Mesh::Create({{"dp", 2}, {"cp", 2}, {"tp", 3}});
  EXPECT_EQ(P("dp", None).ToString(), "P(dp,None)");
  PartitionSpec s = P({"dp", "cp"}, "tp");
  EXPECT_EQ(s.ToString(), "P((dp,cp),tp)");
  EXPECT_TRUE(s.Validate(m, {8, 6}, "w").ok());
  EXPECT_EQ(s.LocalShape(m, {8, 6}), (Shape{2, 2}));
  EXPECT_EQ(s.GlobalShape(m, {2, 2}), (Shape{8, 6}));
  // rank 7 = dp 1, cp 0, tp 1: block 2 of dim 0 (dp major), block 1 of dim 1.
  EXPECT_EQ(s.BlockIndex(m, 7, 0), 2);
  EXPECT_EQ(s.BlockIndex(m, 7, 1), 1);
  SpmdType t = s.InputType(m);
  EXPECT_EQ(t.ToString(m.axis_names()), "{dp:S0,cp:S0,tp:S1}");
  EXPECT_EQ(P(None, "tp").Unreduced({"dp"}).InputType(m, AxisType::I()).ToString(m.axis_names()),
            "{dp:P,cp:I,tp:S1}");
  EXPECT_EQ(P().size(), 0);
}

TEST(PartitionSpecTest, Errors) {
  Mesh m = *Mesh::Create({{"dp", 2}, {"tp", 4}});
  absl::Status s = P(None, "tp").Validate(m, {3, 10}, "w1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("while splitting dim 1 of 'w1' (size 10) over axes (tp) of "
                                     "product 4: 10 is not divisible by 4"));
  EXPECT_THAT(P("xx").Validate(m, {4}, "a").message(), HasSubstr("unknown mesh axis 'xx'"));
  EXPECT_THAT(P("dp", "dp").Validate(m, {4, 4}, "a").message(),
              HasSubstr("uses mesh axis 'dp' twice"));
  EXPECT_THAT(P("dp", "tp").Validate(m, {4}, "a").message(), HasSubstr("has rank 1"));
  EXPECT_THAT(P("dp").Unreduced({"dp"}).Validate(m, {4}, "a").message(), HasSubstr("twice"));
  EXPECT_THAT(P({"tp", "dp"}).Validate(m, {8}, "a").message(), HasSubstr("out of mesh order"));
}

}  // namespace
}  // namespace shardmap
