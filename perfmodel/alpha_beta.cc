#include "perfmodel/alpha_beta.h"

#include <stdexcept>
#include <string>

namespace shardmap::perfmodel {

AlphaBeta FitAlphaBeta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  const size_t n = bytes.size();
  if (n < 2 || seconds.size() != n) {
    throw std::invalid_argument("FitAlphaBeta: need >= 2 (bytes, seconds) pairs of equal count");
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += bytes[i] / n;
    my += seconds[i] / n;
  }
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxx += (bytes[i] - mx) * (bytes[i] - mx);
    sxy += (bytes[i] - mx) * (seconds[i] - my);
  }
  if (sxx == 0) throw std::invalid_argument("FitAlphaBeta: all sizes are the same");
  AlphaBeta ab;
  ab.seconds_per_byte = sxy / sxx;
  ab.alpha_s = my - ab.seconds_per_byte * mx;
  return ab;
}

CollectiveCost FittedCost(FittedTable table) {
  return [table = std::move(table)](CollectiveKind kind, int t, double bytes) {
    const auto it = table.find({kind, t});
    if (it == table.end()) {
      throw std::out_of_range(std::string("FittedCost: no fit for ") + CollectiveName(kind) +
                              " over " + std::to_string(t) + " ranks; measure it first");
    }
    return it->second.alpha_s + bytes * it->second.seconds_per_byte;
  };
}

}  // namespace shardmap::perfmodel
