// Inputs and host-side reference results shared by the GPU collective tests (collectives_cuda_test.cc, threads) and
// the process worker (gpu_mp_worker.cc): small integers that every dtype holds exactly.
#pragma once

#include <chorus/chorus.h>

#include <algorithm>
#include <cstddef>

namespace chorus::gputest {

// Rank r's input element j: 1 or 2 for a product (so 8 ranks stay within every type), else (7r + 3j) mod 5, minus 2
// for signed types.
inline double value(int r, size_t j, chorusRedOp_t op, bool is_signed) {
  if (op == chorusProd) return static_cast<double>((static_cast<size_t>(r) + j) % 2 + 1);
  const double v = static_cast<double>((static_cast<size_t>(r) * 7 + j * 3) % 5);
  return is_signed ? v - 2 : v;
}

// a op b (avg as a sum: the caller divides at the end).
inline double combine(chorusRedOp_t op, double a, double b) {
  switch (op) {
    case chorusSum:
    case chorusAvg: return a + b;
    case chorusProd: return a * b;
    case chorusMax: return std::max(a, b);
    default: return std::min(a, b);
  }
}

}  // namespace chorus::gputest
