// How train_gpt prints quantities on its step and summary lines: bytes in B/KiB/MiB/GiB and
// durations as 12.3s, 4m05s, 2h07m or, past 100 days, in days.
//
//   Bytes(3 << 20);     // "3.0 MiB"
//   Duration(7384.0);   // "2h03m"
//   Duration(1e30);     // "3.2e+22 years" (a huge --steps gives an ETA, not an overflow)
#ifndef SHARDMAP_MODELS_TRAIN_RUN_FORMAT_H_
#define SHARDMAP_MODELS_TRAIN_RUN_FORMAT_H_

#include <cstdint>
#include <string>

namespace shardmap {

std::string Bytes(int64_t bytes);
// Seconds; negative or not finite: "?".
std::string Duration(double seconds);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_RUN_FORMAT_H_
