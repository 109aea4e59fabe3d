// Microbenchmarks of the compression codecs (src/kernels/cpu/codec.h). Sizes are bytes of fp32 input; every
// bytes_per_second counts those input bytes (count * 4) once per call, for encode, decode and decode_accumulate alike,
// so a row reads as "fp32 gradient bytes handled per second" and compares directly with the link rate it must beat
// (1 Gbit/s link = 0.125 GB/s of wire; 10x that rate of fp32 input is 1.25 GB/s). memcpy of the same fp32 buffer is
// the memory-speed reference, counted the same way (input bytes, not read + write). The counter `ratio` is fp32 bytes
// per encoded byte.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/codec.h"

namespace chorus::kernels::codec {
namespace {

constexpr int64_t kSmall = int64_t{1} << 20;
constexpr int64_t kMid = int64_t{8} << 20;
constexpr int64_t kLarge = int64_t{64} << 20;

// Gaussian data, like gradients; the rare special-value paths are not what is measured.
std::vector<float> make_data(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

enum class Op { Encode, EncodeEF, EncodeSR, Decode, DecodeAcc };

void BM_Codec(benchmark::State& state, CodecKind kind, uint32_t block, Op op, bool rotation = false) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  Codec c;
  c.kind = kind;
  c.block = block;
  c.stochastic_rounding = op == Op::EncodeSR;
  c.seed = 42;
  c.rotation = rotation;
  const std::vector<float> x = make_data(n, 1);
  std::vector<float> residual(op == Op::EncodeEF ? n : 0, 0.0f);
  std::vector<float> out(n, 0.0f);
  std::vector<std::byte> msg(encoded_bytes(c, n));
  EncodeCtx ctx;
  ctx.residual = op == Op::EncodeEF ? residual.data() : nullptr;
  encode(c, x.data(), n, msg.data(), ctx);
  for (auto _ : state) {
    switch (op) {
      case Op::Encode:
      case Op::EncodeEF:
      case Op::EncodeSR:
        ++ctx.step;
        benchmark::DoNotOptimize(encode(c, x.data(), n, msg.data(), ctx));
        benchmark::DoNotOptimize(msg.data());
        break;
      case Op::Decode:
        decode(c, msg.data(), n, out.data());
        benchmark::DoNotOptimize(out.data());
        break;
      case Op::DecodeAcc:
        decode_accumulate(c, msg.data(), n, out.data());
        benchmark::DoNotOptimize(out.data());
        break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["ratio"] = static_cast<double>(bytes) / static_cast<double>(msg.size());
}

void BM_VoteAccumulate(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  Codec c;
  c.kind = CodecKind::SignVote;
  const std::vector<float> x = make_data(n, 1);
  std::vector<std::byte> msg(encoded_bytes(c, n));
  encode(c, x.data(), n, msg.data());
  std::vector<int32_t> votes(n, 0);
  for (auto _ : state) {
    vote_accumulate(msg.data(), n, votes.data());
    benchmark::DoNotOptimize(votes.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const std::vector<float> src = make_data(bytes / sizeof(float), 1);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

#define CODEC_BENCH(name, kind, block, op) \
  BENCHMARK_CAPTURE(BM_Codec, name, kind, block, op)->Arg(kSmall)->Arg(kMid)->Arg(kLarge)->UseRealTime()

BENCHMARK(BM_Memcpy)->Arg(kSmall)->Arg(kMid)->Arg(kLarge)->UseRealTime();
CODEC_BENCH(int8_b256_encode, CodecKind::Int8, 256, Op::Encode);
CODEC_BENCH(int8_b256_encode_ef, CodecKind::Int8, 256, Op::EncodeEF);
CODEC_BENCH(int8_b256_encode_sr, CodecKind::Int8, 256, Op::EncodeSR);
CODEC_BENCH(int8_b256_decode, CodecKind::Int8, 256, Op::Decode);
CODEC_BENCH(int8_b256_decode_acc, CodecKind::Int8, 256, Op::DecodeAcc);
// With the randomized Hadamard rotation (Codec::rotation).
#define CODEC_BENCH_RHT(name, kind, block, op) \
  BENCHMARK_CAPTURE(BM_Codec, name, kind, block, op, true)->Arg(kSmall)->Arg(kMid)->Arg(kLarge)->UseRealTime()
CODEC_BENCH_RHT(int8_b256_rht_encode, CodecKind::Int8, 256, Op::Encode);
CODEC_BENCH_RHT(int8_b256_rht_encode_ef, CodecKind::Int8, 256, Op::EncodeEF);
CODEC_BENCH_RHT(int8_b256_rht_decode_acc, CodecKind::Int8, 256, Op::DecodeAcc);
CODEC_BENCH_RHT(int4_rht_encode, CodecKind::Int4, 0, Op::Encode);
CODEC_BENCH_RHT(int4_rht_decode_acc, CodecKind::Int4, 0, Op::DecodeAcc);
CODEC_BENCH_RHT(sign1_rht_encode_ef, CodecKind::Sign1, 0, Op::EncodeEF);
CODEC_BENCH_RHT(sign1_rht_decode_acc, CodecKind::Sign1, 0, Op::DecodeAcc);
CODEC_BENCH(int8_b32_encode, CodecKind::Int8, 32, Op::Encode);
CODEC_BENCH(int8_b32_decode_acc, CodecKind::Int8, 32, Op::DecodeAcc);
CODEC_BENCH(fp8_e4m3_encode, CodecKind::Fp8E4M3, 0, Op::Encode);
CODEC_BENCH(fp8_e4m3_encode_ef, CodecKind::Fp8E4M3, 0, Op::EncodeEF);
CODEC_BENCH(fp8_e4m3_encode_sr, CodecKind::Fp8E4M3, 0, Op::EncodeSR);
CODEC_BENCH(fp8_e4m3_decode, CodecKind::Fp8E4M3, 0, Op::Decode);
CODEC_BENCH(fp8_e4m3_decode_acc, CodecKind::Fp8E4M3, 0, Op::DecodeAcc);
CODEC_BENCH(int4_encode, CodecKind::Int4, 0, Op::Encode);
CODEC_BENCH(int4_encode_ef, CodecKind::Int4, 0, Op::EncodeEF);
CODEC_BENCH(int4_encode_sr, CodecKind::Int4, 0, Op::EncodeSR);
CODEC_BENCH(int4_decode, CodecKind::Int4, 0, Op::Decode);
CODEC_BENCH(int4_decode_acc, CodecKind::Int4, 0, Op::DecodeAcc);
CODEC_BENCH(sign1_encode, CodecKind::Sign1, 0, Op::Encode);
CODEC_BENCH(sign1_encode_ef, CodecKind::Sign1, 0, Op::EncodeEF);
CODEC_BENCH(sign1_decode, CodecKind::Sign1, 0, Op::Decode);
CODEC_BENCH(sign1_decode_acc, CodecKind::Sign1, 0, Op::DecodeAcc);
CODEC_BENCH(sign_vote_encode, CodecKind::SignVote, 0, Op::Encode);
CODEC_BENCH(sign_vote_decode_acc, CodecKind::SignVote, 0, Op::DecodeAcc);
BENCHMARK(BM_VoteAccumulate)->Arg(kSmall)->Arg(kMid)->Arg(kLarge)->UseRealTime();

}  // namespace
}  // namespace chorus::kernels::codec
