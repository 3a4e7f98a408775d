// The llama3 registration: a model's ShapeMetadata read back by args_from_metadata rebuilds the
// same model (what `sample` does with a checkpoint), and damaged metadata names its key.
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "models/llama/llama_model.h"
#include "models/model/registry.h"
#include "models/parallel/parallel_dims.h"

namespace shardmap {
namespace {

TEST(Llama3SpecTest, MetadataRebuildsTheModel) {
  const ModelSpec* spec = *FindModel("llama3");
  ModelArgs args{.preset = "llama3_debug"};
  args.layers = 2;
  args.kv_heads = 4;
  args.dtype = "bf16";
  std::unique_ptr<Model> m = *CreateModel("llama3", args, *ParseMesh("tp=2"), true);
  absl::StatusOr<ModelArgs> back = spec->args_from_metadata(m->ShapeMetadata());
  ASSERT_TRUE(back.ok()) << back.status();
  std::unique_ptr<Model> again = *spec->create(*back, Mesh(), false);
  EXPECT_EQ(again->Describe(), m->Describe());
  EXPECT_EQ(again->shape().compute_dtype(), DType::kBF16);
  EXPECT_EQ(again->ShapeMetadata(), m->ShapeMetadata());
  EXPECT_EQ(*ModelNameInMetadata(m->ShapeMetadata()), "llama3");
}

TEST(Llama3SpecTest, DamagedMetadataNamesTheKey) {
  const ModelSpec* spec = *FindModel("llama3");
  std::unique_ptr<Model> m = *CreateModel("llama3", ModelArgs{.preset = "llama3_debug"}, Mesh(),
                                          false);
  std::map<std::string, std::string> meta = m->ShapeMetadata();
  meta.erase("llama3.kv_heads");
  absl::Status s = spec->args_from_metadata(meta).status();
  EXPECT_NE(s.message().find("lacks 'llama3.kv_heads'"), std::string::npos) << s;
  meta = m->ShapeMetadata();
  meta["llama3.rope_theta"] = "nan";
  s = spec->args_from_metadata(meta).status();
  EXPECT_NE(s.message().find("'llama3.rope_theta' = 'nan' is not a finite number"),
            std::string::npos)
      << s;
  meta = m->ShapeMetadata();
  meta["llama3.layers"] = "0";
  EXPECT_FALSE(spec->args_from_metadata(meta).ok());
}

}  // namespace
}  // namespace shardmap
