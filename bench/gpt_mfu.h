// Model FLOP utilisation of a GPT training step (PaLM / nanoGPT's estimate): FLOPs per token =
// 6 N (forward + backward matmuls with the N parameters, the position embedding excluded as
// nanoGPT's get_num_params does) + 12 L d T (attention scores and their weighting, forward +
// backward, causal masking not discounted), over the card's dense bf16 peak.
//
//   double flops = GptStepFlops(cfg, /*tokens=*/16 * 1024);
//   double peak = DenseBf16PeakFlops(CudaDeviceName(0));   // 989.4e12 on an H100/H200 SXM; 0 unknown
//   double mfu = flops / step_seconds / peak;
#ifndef SHARDMAP_BENCH_GPT_MFU_H_
#define SHARDMAP_BENCH_GPT_MFU_H_

#include <cstdint>
#include <string>

#include "models/gpt/gpt_model.h"

namespace shardmap::bench {

// Parameters counted by the 6N term: every parameter but wpe (tied lm_head counted once).
int64_t GptFlopParams(const GptConfig& cfg);
// FLOPs of one training step over `tokens` tokens (batch * seq).
double GptStepFlops(const GptConfig& cfg, int64_t tokens);

// The card's dense (no sparsity) bf16 tensor-core peak in FLOP/s by its CUDA device name; 0 for a
// card not in the table (MFU is then not reported). The table (NVIDIA datasheets):
//   H100 SXM ("NVIDIA H100 80GB HBM3"), H200 ("NVIDIA H200")   989.4 TFLOP/s
//   H100 PCIe ("NVIDIA H100 PCIe")                              756.0
//   A100 (SXM / PCIe)                                           312.0
//   L4                                                          121.0
double DenseBf16PeakFlops(const std::string& device_name);

// cudaGetDeviceProperties(device).name, or "" without CUDA / that device.
std::string CudaDeviceName(int device);

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_GPT_MFU_H_
