// CUDA codecs (src/kernels/cuda/codec.cuh) against the CPU codecs (src/kernels/cpu/codec.h): for every kind, block
// length, error feedback on/off, stochastic rounding on/off, the Hadamard rotation on/off, counts that end inside a
// block, record and group, first_elem not a multiple of 4, and 16-byte aligned and merely 4-byte aligned buffers, the
// GPU must write the same message bytes, the same residual bits and count the same non-finite blocks; decode and
// decode_accumulate must give the CPU's values (bit for bit; NaN compared as NaN, since GPU arithmetic returns the
// canonical NaN). Inputs mix Gaussian data, all-zero blocks, NaN and Inf blocks, tiny (subnormal-range) and huge
// blocks. Fixed seeds.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/codec.h"
#include "kernels/cuda/codec.cuh"
#include "tests/gpu/gpu_test.h"

namespace chorus::kernels::codec {
namespace {

using gputest::DeviceBuffer;

Codec make(CodecKind kind, uint32_t block = 0, bool sr = false, uint64_t seed = 0) {
  Codec c;
  c.kind = kind;
  c.block = block;
  c.stochastic_rounding = sr;
  c.seed = seed;
  return c;
}

// Gaussian values, with whole 32-element stretches replaced by zeros, tiny values, huge values, and single NaN / Inf
// elements, so that blocks of every kind hit each special case.
std::vector<float> mixed_input(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  for (size_t s = 0; s * 32 < n; ++s) {
    const size_t lo = s * 32, hi = std::min(n, lo + 32);
    switch (s % 23) {
      case 3:
        for (size_t i = lo; i < hi; ++i) v[i] = 0.0f;
        break;
      case 5:
        for (size_t i = lo; i < hi; ++i) v[i] *= 1e-39f;
        break;  // subnormal range
      case 7:
        for (size_t i = lo; i < hi; ++i) v[i] *= 1e37f;
        break;
      case 11: v[lo + (hi - lo) / 2] = std::numeric_limits<float>::quiet_NaN(); break;
      case 13: v[lo] = -std::numeric_limits<float>::infinity(); break;
      case 17:
        for (size_t i = lo; i < hi; ++i) v[i] *= 3e-6f;
        break;
      case 19:
        for (size_t i = lo; i < hi; ++i) v[i] = -0.0f;
        break;
      default: break;
    }
  }
  return v;
}

bool same_float(uint32_t a, uint32_t b) {
  const bool na = (a & 0x7fffffffu) > 0x7f800000u, nb = (b & 0x7fffffffu) > 0x7f800000u;
  return a == b || (na && nb);
}

// First index where the two float arrays differ (NaN == NaN), or -1.
long float_mismatch(const std::vector<float>& want, const std::vector<float>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!same_float(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))) return static_cast<long>(i);
  }
  return -1;
}

long byte_mismatch(const std::vector<std::byte>& want, const std::vector<std::byte>& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) return static_cast<long>(i);
  }
  return -1;
}

struct Case {
  Codec c;
  size_t count;
  bool ef;
  uint64_t first_elem;
  size_t float_offset;  // elements: 0 keeps buffers 16-byte aligned, 1 makes them 4-byte aligned only
};

std::string describe(const Case& k) {
  return cat(codec_name(k.c.kind), " block ", k.c.block, " sr ", k.c.stochastic_rounding, " rotation ", k.c.rotation,
             " ef ", k.ef, " count ", k.count, " first_elem ", k.first_elem, " offset ", k.float_offset);
}

// Encodes on both sides and compares message, residual and non-finite count; then decodes and decode_accumulates the
// message on both sides and compares.
void check_case(const Case& k, unsigned seed) {
  const size_t n = k.count;
  const std::vector<float> x = mixed_input(n, seed);
  std::vector<float> res0(n);
  {
    std::mt19937 rng(seed + 7);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (auto& e : res0) e = d(rng);
  }
  EncodeCtx ctx;
  ctx.step = 0x100000007ull;
  ctx.rank = 3;
  ctx.first_elem = k.first_elem;
  const size_t bytes = encoded_bytes(k.c, n);

  std::vector<std::byte> want(bytes);
  std::vector<float> res_want = res0;
  EncodeCtx cpu_ctx = ctx;
  cpu_ctx.residual = k.ef ? res_want.data() : nullptr;
  const size_t bad_want = encode(k.c, x.data(), n, want.data(), cpu_ctx);

  const size_t off = k.float_offset * sizeof(float);
  DeviceBuffer din(n * 4), dres(n * 4), dmsg(bytes), dout(n * 4), dbad(8);
  ASSERT_TRUE(din.ok() && dres.ok() && dmsg.ok() && dout.ok() && dbad.ok());
  auto* in = reinterpret_cast<float*>(din.get(off));
  auto* res = reinterpret_cast<float*>(dres.get(off));
  auto* out = reinterpret_cast<float*>(dout.get(off));
  CHORUS_CUDA_OK(gputest::upload(in, x.data(), n * 4));
  CHORUS_CUDA_OK(gputest::upload(res, res0.data(), n * 4));
  CHORUS_CUDA_OK(cudaMemset(dmsg.get(), 0xa5, bytes));  // every byte must be written
  CHORUS_CUDA_OK(cudaMemset(dbad.get(), 0, 8));
  EncodeCtx gpu_ctx = ctx;
  gpu_ctx.residual = k.ef ? res : nullptr;
  cuda::encode(k.c, in, n, dmsg.get(), gpu_ctx, reinterpret_cast<unsigned long long*>(dbad.get()), nullptr);
  CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
  std::vector<std::byte> got(bytes);
  std::vector<float> res_got(n);
  unsigned long long bad_got = 0;
  CHORUS_CUDA_OK(gputest::download(got.data(), dmsg.get(), bytes));
  CHORUS_CUDA_OK(gputest::download(res_got.data(), res, n * 4));
  CHORUS_CUDA_OK(gputest::download(&bad_got, dbad.get(), 8));
  const long bm = byte_mismatch(want, got);
  ASSERT_EQ(bm, -1) << describe(k) << ": message byte " << bm << " cpu " << static_cast<int>(want[bm < 0 ? 0 : bm])
                    << " gpu " << static_cast<int>(got[bm < 0 ? 0 : bm]);
  EXPECT_EQ(bad_got, bad_want) << describe(k);
  if (k.ef) {
    const long rm = float_mismatch(res_want, res_got);
    EXPECT_EQ(rm, -1) << describe(k) << ": residual " << rm;
  }

  // Decode the (identical) message on both sides.
  std::vector<float> dec_want(n), dec_got(n);
  decode(k.c, want.data(), n, dec_want.data());
  cuda::decode(k.c, dmsg.get(), n, out, nullptr);
  CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
  CHORUS_CUDA_OK(gputest::download(dec_got.data(), out, n * 4));
  const long dm = float_mismatch(dec_want, dec_got);
  EXPECT_EQ(dm, -1) << describe(k) << ": decode element " << dm;

  // decode_accumulate onto x (any finite or special values will do).
  std::vector<float> acc_want = x, acc_got(n);
  decode_accumulate(k.c, want.data(), n, acc_want.data());
  cuda::decode_accumulate(k.c, dmsg.get(), n, in, nullptr);
  CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
  CHORUS_CUDA_OK(gputest::download(acc_got.data(), in, n * 4));
  const long am = float_mismatch(acc_want, acc_got);
  EXPECT_EQ(am, -1) << describe(k) << ": decode_accumulate element " << am;
}

std::vector<Codec> all_codecs() {
  std::vector<Codec> v;
  for (uint32_t b : {32u, 96u, 256u, 1024u}) {
    v.push_back(make(CodecKind::Int8, b));
    v.push_back(make(CodecKind::Int8, b, true, 42));
  }
  v.push_back(make(CodecKind::Fp8E4M3));
  v.push_back(make(CodecKind::Fp8E4M3, 32, true, 42));
  v.push_back(make(CodecKind::Int4));
  v.push_back(make(CodecKind::Int4, 32, true, 42));
  for (uint32_t b : {32u, 2048u, 4096u, 8192u}) v.push_back(make(CodecKind::Sign1, b));  // 8192: not staged
  v.push_back(make(CodecKind::SignVote));
  // The randomized Hadamard rotation, on every kind that takes it (records of 32 to 4096 elements).
  for (Codec c : {make(CodecKind::Int8, 32), make(CodecKind::Int8, 256, true, 42), make(CodecKind::Int8, 1024),
                  make(CodecKind::Fp8E4M3), make(CodecKind::Fp8E4M3, 32, true, 42), make(CodecKind::Int4),
                  make(CodecKind::Int4, 32, true, 42), make(CodecKind::Sign1, 32), make(CodecKind::Sign1),
                  make(CodecKind::Sign1, 4096)}) {
    c.rotation = true;
    c.seed = 0x5eed0000u + v.size();
    v.push_back(c);
  }
  return v;
}

TEST(CudaCodec, EncodeDecodeMatchCpuBitForBit) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 1;
  for (const Codec& c : all_codecs()) {
    for (size_t count : {size_t{1}, size_t{31}, size_t{33}, size_t{1001}, size_t{70001}, size_t{262144}}) {
      for (bool ef : {false, true}) {
        if (ef && c.kind == CodecKind::SignVote) continue;
        for (uint64_t first : {uint64_t{0}, uint64_t{5}}) {
          check_case({c, count, ef, first, 0}, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(CudaCodec, UnalignedFloatBuffersMatchCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 5000;
  for (const Codec& c : all_codecs()) {
    for (bool ef : {false, true}) {
      if (ef && c.kind == CodecKind::SignVote) continue;
      check_case({c, 5003, ef, 2, 1}, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaCodec, DecodeOfArbitraryBytesMatchesCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(99);
  for (const Codec& c : all_codecs()) {
    const size_t n = 4099;
    const size_t bytes = encoded_bytes(c, n);
    std::vector<std::byte> msg(bytes);
    for (auto& b : msg) b = static_cast<std::byte>(rng());
    std::vector<float> want(n), got(n);
    decode(c, msg.data(), n, want.data());
    DeviceBuffer dmsg(bytes), dout(n * 4);
    ASSERT_TRUE(dmsg.ok() && dout.ok());
    CHORUS_CUDA_OK(gputest::upload(dmsg.get(), msg.data(), bytes));
    cuda::decode(c, dmsg.get(), n, reinterpret_cast<float*>(dout.get()), nullptr);
    CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
    CHORUS_CUDA_OK(gputest::download(got.data(), dout.get(), n * 4));
    EXPECT_EQ(float_mismatch(want, got), -1) << codec_name(c.kind) << " block " << c.block;
  }
}

TEST(CudaCodec, MajorityVoteMatchesCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const size_t n = 10007;
  const Codec c = make(CodecKind::SignVote);
  std::mt19937 rng(5);
  std::vector<int32_t> votes(n);
  for (auto& v : votes) v = static_cast<int32_t>(rng() % 9) - 4;
  std::vector<std::byte> msg(encoded_bytes(c, n));
  encode(c, mixed_input(n, 3).data(), n, msg.data());

  std::vector<int32_t> acc_want = votes;
  vote_accumulate(msg.data(), n, acc_want.data());
  std::vector<float> fin_want(n);
  vote_finalize(acc_want.data(), n, fin_want.data());
  std::vector<std::byte> res_want(msg.size());
  vote_encode_result(acc_want.data(), n, res_want.data());

  DeviceBuffer dmsg(msg.size()), dvotes(n * 4), dfin(n * 4), dres(msg.size());
  ASSERT_TRUE(dmsg.ok() && dvotes.ok() && dfin.ok() && dres.ok());
  CHORUS_CUDA_OK(gputest::upload(dmsg.get(), msg.data(), msg.size()));
  CHORUS_CUDA_OK(gputest::upload(dvotes.get(), votes.data(), n * 4));
  auto* dv = reinterpret_cast<int32_t*>(dvotes.get());
  cuda::vote_accumulate(dmsg.get(), n, dv, nullptr);
  cuda::vote_finalize(dv, n, reinterpret_cast<float*>(dfin.get()), nullptr);
  cuda::vote_encode_result(dv, n, dres.get(), nullptr);
  CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
  std::vector<int32_t> acc_got(n);
  std::vector<float> fin_got(n);
  std::vector<std::byte> res_got(msg.size());
  CHORUS_CUDA_OK(gputest::download(acc_got.data(), dv, n * 4));
  CHORUS_CUDA_OK(gputest::download(fin_got.data(), dfin.get(), n * 4));
  CHORUS_CUDA_OK(gputest::download(res_got.data(), dres.get(), res_got.size()));
  EXPECT_EQ(acc_got, acc_want);
  EXPECT_EQ(float_mismatch(fin_want, fin_got), -1);
  EXPECT_EQ(byte_mismatch(res_want, res_got), -1);
}

// Argument errors are found on the host before anything is enqueued, so these run without a device.
TEST(CudaCodecArgs, RejectedBeforeAnyLaunch) {
  alignas(16) static float buf[1024];
  auto* bytes = reinterpret_cast<std::byte*>(buf);
  auto expect_invalid = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusInvalidArgument) << what << ": " << e.what();
    }
  };
  const Codec int8 = make(CodecKind::Int8);
  EncodeCtx with_res;
  with_res.residual = buf + 512;
  expect_invalid([&] { cuda::encode(make(CodecKind::Int8, 33), buf, 4, bytes + 1024, {}, nullptr, nullptr); },
                 "bad block");
  expect_invalid([&] { cuda::encode(make(CodecKind::Sign1, 0, true), buf, 4, bytes + 1024, {}, nullptr, nullptr); },
                 "sr for sign1");
  expect_invalid([&] { cuda::encode(int8, nullptr, 4, bytes + 1024, {}, nullptr, nullptr); }, "null in");
  expect_invalid([&] { cuda::encode(int8, buf, 64, bytes + 8, {}, nullptr, nullptr); }, "in/out overlap");
  expect_invalid([&] { cuda::encode(int8, buf, 4, bytes + 1026, {}, nullptr, nullptr); }, "misaligned out");
  expect_invalid([&] { cuda::encode(make(CodecKind::SignVote), buf, 4, bytes + 1024, with_res, nullptr, nullptr); },
                 "residual for sign_vote");
  expect_invalid([&] { cuda::decode(int8, nullptr, 4, buf, nullptr); }, "decode null in");
  expect_invalid([&] { cuda::decode_accumulate(int8, bytes, 4, nullptr, nullptr); }, "decode_accumulate null acc");
  expect_invalid([&] { cuda::vote_accumulate(bytes, 4, nullptr, nullptr); }, "vote_accumulate null votes");
  cuda::encode(int8, nullptr, 0, nullptr, {}, nullptr, nullptr);  // count 0: nothing to do, no error
}

}  // namespace
}  // namespace chorus::kernels::codec
