// The MFU arithmetic against hand counts: GPT-2 124M's 6N + 12LdT per token (nanoGPT's
// 124M figure: N = 124.4M without wpe) and the peak table.
#include "bench/gpt_mfu.h"

#include "gtest/gtest.h"

namespace shardmap::bench {
namespace {

TEST(GptMfuTest, FlopsAreSixNPlusAttentionPerToken) {
  GptConfig c;
  c.layers = 1;
  c.d_model = 4;
  c.heads = 2;
  c.vocab = 10;
  c.seq = 3;
  // wte 10*4, per block: ln 2*4*2, c_attn 4*12+12, c_proj 16+4, c_fc 4*16+16, c_proj 64+4; ln_f 8.
  const int64_t n = 40 + 16 + 60 + 20 + 80 + 68 + 8;
  EXPECT_EQ(GptFlopParams(c), n);
  EXPECT_DOUBLE_EQ(GptStepFlops(c, 6), (6.0 * n + 12.0 * 1 * 4 * 3) * 6);
}

TEST(GptMfuTest, Gpt2SmallHasNanoGptsParameterCount) {
  GptConfig c;
  c.layers = 12;
  c.d_model = 768;
  c.heads = 12;
  c.vocab = 50304;
  c.seq = 1024;
  EXPECT_EQ(GptFlopParams(c), 123653376 + (50304 - 50257) * 768);  // nanoGPT: 123.65M at 50257
}

TEST(GptMfuTest, PeakTable) {
  EXPECT_DOUBLE_EQ(DenseBf16PeakFlops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(DenseBf16PeakFlops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(DenseBf16PeakFlops("NVIDIA H100 PCIe"), 756.0e12);
  EXPECT_DOUBLE_EQ(DenseBf16PeakFlops("NVIDIA A100-SXM4-80GB"), 312.0e12);
  EXPECT_EQ(DenseBf16PeakFlops("Some CPU"), 0);
  EXPECT_EQ(DenseBf16PeakFlops(""), 0);
}

}  // namespace
}  // namespace shardmap::bench
