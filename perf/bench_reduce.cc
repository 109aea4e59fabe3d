// Microbenchmarks of the CPU reduction kernels. Sizes are bytes per buffer. bytes_per_second counts the memory
// traffic: two reads and one write for a reduce, one read and one write for the memcpy baseline, so the two are
// directly comparable and the gap is the cost of the arithmetic (and, for 16/8-bit types, of the conversions).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/cpu/reduce.h"

namespace chorus::kernels {
namespace {

constexpr int64_t kSmall = int64_t{1} << 20;
constexpr int64_t kLarge = int64_t{64} << 20;

// Moderate values that neither overflow nor underflow when summed, so no special-case path is measured.
std::vector<uint8_t> make_data(chorusDataType_t dt, size_t bytes, int seed) {
  std::vector<uint8_t> buf(bytes);
  size_t i = 0;
  for (int k = seed; i < bytes; ++k) {
    const float v = static_cast<float>(k % 97) * 0.03125f - 1.5f;
    uint16_t h = 0;
    switch (dt) {
      case chorusFloat32:
        std::memcpy(&buf[i], &v, 4);
        i += 4;
        break;
      case chorusFloat16:
        h = float_to_half(v);
        std::memcpy(&buf[i], &h, 2);
        i += 2;
        break;
      case chorusBfloat16:
        h = float_to_bf16(v);
        std::memcpy(&buf[i], &h, 2);
        i += 2;
        break;
      case chorusFloat8e4m3: buf[i++] = float_to_e4m3(v); break;
      default: buf[i++] = static_cast<uint8_t>(k); break;
    }
  }
  return buf;
}

void BM_ReduceSum(benchmark::State& state, chorusDataType_t dt, bool in_place) {
  const auto bytes = static_cast<size_t>(state.range(0));
  ReduceSpec spec;
  spec.dtype = dt;
  spec.kind = ReduceKind::Sum;
  const Reducer reducer(spec);
  const size_t n = bytes / reducer.elem_size();
  std::vector<uint8_t> a = make_data(dt, bytes, 1);
  const std::vector<uint8_t> b = make_data(dt, bytes, 2);
  std::vector<uint8_t> out(bytes);
  void* dst = in_place ? a.data() : out.data();
  for (auto _ : state) {
    reducer.reduce(dst, a.data(), b.data(), n, false, false);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<int64_t>(bytes));
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t> src = make_data(chorusUint8, bytes, 1);
  std::vector<uint8_t> dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(bytes));
}

BENCHMARK(BM_Memcpy)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, fp32, chorusFloat32, false)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, fp32_in_place, chorusFloat32, true)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, bf16, chorusBfloat16, false)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, fp16, chorusFloat16, false)->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(BM_ReduceSum, fp8e4m3, chorusFloat8e4m3, false)->Arg(kSmall)->Arg(kLarge);

}  // namespace
}  // namespace chorus::kernels
