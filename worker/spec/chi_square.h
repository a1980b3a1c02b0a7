// Test support: Pearson's chi-square goodness-of-fit test, for checking that
// sampled token distributions match the exact target distribution.
//
// Cells whose expected count is below 5 are pooled into one cell (dropped
// when the pool is still below 5). The p-value uses the Wilson–Hilferty
// normal approximation of the chi-square distribution, accurate to a few
// percent of the p-value at the significance levels used here (df >= 3).
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::spec {

struct ChiSquareResult {
  double statistic = 0;
  int degrees_of_freedom = 0;
  double p_value = 1;
};

// `observed[i]` draws fell in cell i, whose probability is `expected[i]`
// (summing to 1).
inline ChiSquareResult ChiSquareGoodnessOfFit(const std::vector<int64_t>& observed,
                                              const std::vector<double>& expected) {
  int64_t n = 0;
  for (int64_t o : observed) n += o;
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = expected[i] * n;
    if (e < 5) {
      pooled_e += e;
      pooled_o += observed[i];
      continue;
    }
    stat += (observed[i] - e) * (observed[i] - e) / e;
    ++cells;
  }
  if (pooled_e >= 5) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  } else if (pooled_o > pooled_e + 20) {
    // Mass where (almost) none was expected: count it against the fit.
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1.0);
    ++cells;
  }
  ChiSquareResult r;
  r.statistic = stat;
  r.degrees_of_freedom = std::max(1, cells - 1);
  const double k = r.degrees_of_freedom;
  const double z = (std::cbrt(stat / k) - (1 - 2 / (9 * k))) / std::sqrt(2 / (9 * k));
  r.p_value = 0.5 * std::erfc(z / std::sqrt(2.0));
  return r;
}

}  // namespace tessera::spec
