// Compression codecs (src/kernels/cpu/codec.h): message sizes and layout, round-trip error bounds derived from each
// format's definition, special values, stochastic rounding, error feedback over a gradient stream, majority vote,
// and argument errors. Every random input comes from a fixed seed, so every run checks the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/float_types.h"

namespace chorus::kernels::codec {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Codec make(CodecKind kind, uint32_t block = 0, bool sr = false, uint64_t seed = 0) {
  Codec c;
  c.kind = kind;
  c.block = block;
  c.stochastic_rounding = sr;
  c.seed = seed;
  return c;
}

const CodecKind kAllKinds[] = {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4, CodecKind::Sign1,
                               CodecKind::SignVote};

std::vector<float> gaussian(size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Student-t with 1.5 degrees of freedom (infinite variance: a few huge values per block), clipped at 1e4.
std::vector<float> heavy_tailed(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> d(1.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = std::clamp(d(rng), -1e4f, 1e4f);
  return v;
}

std::vector<std::byte> enc(const Codec& c, const std::vector<float>& x, const EncodeCtx& ctx = {}) {
  std::vector<std::byte> m(encoded_bytes(c, x.size()));
  encode(c, x.data(), x.size(), m.data(), ctx);
  return m;
}

std::vector<float> dec(const Codec& c, const std::vector<std::byte>& m, size_t n) {
  std::vector<float> y(n);
  decode(c, m.data(), n, y.data());
  return y;
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

double rel_l2(const std::vector<double>& ref, const std::vector<double>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

float block_amax(const std::vector<float>& x, size_t start, size_t n) {
  float m = 0;
  for (size_t i = start; i < start + n && i < x.size(); ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// The MX shared exponent from its definition: the smallest s with amax / 2^s <= 448 among
// floor(log2(amax)) - 8 and that plus one.
int mx_exponent(float amax) {
  const int e = std::ilogb(amax);
  const int s = e - 8;
  return std::ldexp(static_cast<double>(amax), -s) <= 448.0 ? s : s + 1;
}

template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected chorusInvalidArgument mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- Names, validation, sizes ----

TEST(CodecPhilox, Random123KnownAnswers) {
  const uint32_t ctrs[3][4] = {{0, 0, 0, 0},
                               {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                               {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  const uint32_t keys[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
  const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                               {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                               {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
  for (int t = 0; t < 3; ++t) {
    uint32_t out[4];
    philox4x32_10(ctrs[t], keys[t], out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], want[t][i]) << "vector " << t << " word " << i;
  }
}

TEST(CodecApi, NamesRoundTrip) {
  for (CodecKind k : kAllKinds) EXPECT_EQ(codec_kind_from_name(codec_name(k)), k);
  expect_invalid([] { codec_kind_from_name("int2"); }, "int2");
}

TEST(CodecApi, ValidateBlocks) {
  for (uint32_t b : {32u, 64u, 96u, 256u, 1000u - 8u, 1024u}) EXPECT_NO_THROW(validate(make(CodecKind::Int8, b)));
  for (uint32_t b : {1u, 16u, 33u, 1025u, 2048u}) expect_invalid([&] { validate(make(CodecKind::Int8, b)); }, "block");
  expect_invalid([] { validate(make(CodecKind::Fp8E4M3, 64)); }, "block 64");
  expect_invalid([] { validate(make(CodecKind::Int4, 16)); }, "block 16");
  expect_invalid([] { validate(make(CodecKind::Sign1, 48)); }, "block 48");
  EXPECT_NO_THROW(validate(make(CodecKind::Sign1, 1u << 20)));
  expect_invalid([] { validate(make(CodecKind::SignVote, 32)); }, "block");
  expect_invalid([] { validate(make(CodecKind::Sign1, 0, true)); }, "stochastic_rounding");
  expect_invalid([] { validate(make(CodecKind::SignVote, 0, true)); }, "stochastic_rounding");
  expect_invalid([] { validate(make(static_cast<CodecKind>(9))); }, "kind");
  EXPECT_EQ(block_elems(make(CodecKind::Int8)), 256u);
  EXPECT_EQ(block_elems(make(CodecKind::Fp8E4M3)), 32u);
  EXPECT_EQ(block_elems(make(CodecKind::Int4)), 32u);
  EXPECT_EQ(block_elems(make(CodecKind::Sign1)), 2048u);
}

TEST(CodecApi, ValidateDtypeAndOp) {
  for (CodecKind k : kAllKinds) {
    EXPECT_NO_THROW(validate(make(k), chorusFloat32, chorusSum));
    EXPECT_NO_THROW(validate(make(k), chorusFloat32, chorusAvg));
    expect_invalid([&] { validate(make(k), chorusInt32, chorusSum); }, "datatype int32");
    EXPECT_NO_THROW(validate(make(k), chorusFloat16, chorusSum));  // widened by the collective
    EXPECT_NO_THROW(validate(make(k), chorusBfloat16, chorusAvg));
    expect_invalid([&] { validate(make(k), chorusFloat64, chorusSum); }, "datatype double");
    expect_invalid([&] { validate(make(k), chorusFloat8e4m3, chorusSum); }, "datatype f8e4m3");
    expect_invalid([&] { validate(make(k), static_cast<chorusDataType_t>(77), chorusSum); }, "datatype invalid (77)");
    expect_invalid([&] { validate(make(k), chorusFloat32, chorusMax); }, "op max");
    expect_invalid([&] { validate(make(k), chorusFloat32, chorusProd); }, "op prod");
    expect_invalid([&] { validate(make(k), chorusFloat32, static_cast<chorusRedOp_t>(42)); }, "op");
  }
}

// The layout of codec.h / docs/compression.md, restated: records of R elements, each scales + codes, 4-aligned.
size_t expected_bytes(const Codec& c, size_t n) {
  const size_t b = block_elems(c);
  auto r4 = [](size_t v) { return (v + 3) / 4 * 4; };
  size_t total = 0;
  switch (c.kind) {
    case CodecKind::Int8:
      for (size_t i = 0; i < n; i += b) total += 4 + r4(std::min(b, n - i));
      return total;
    case CodecKind::Fp8E4M3:
      for (size_t i = 0; i < n; i += 128) total += 4 + r4(std::min<size_t>(128, n - i));
      return total;
    case CodecKind::Int4:
      for (size_t i = 0; i < n; i += 64) total += 4 + r4((std::min<size_t>(64, n - i) + 1) / 2);
      return total;
    case CodecKind::Sign1:
      for (size_t i = 0; i < n; i += b) total += 4 + 4 * ((std::min(b, n - i) + 31) / 32);
      return total;
    case CodecKind::SignVote: return 4 * ((n + 31) / 32);
  }
  return 0;
}

TEST(CodecLayout, EncodedBytesExactAndFullyWritten) {
  const std::vector<Codec> codecs = {make(CodecKind::Int8),      make(CodecKind::Int8, 32), make(CodecKind::Int8, 96),
                                     make(CodecKind::Fp8E4M3),   make(CodecKind::Int4),     make(CodecKind::Sign1),
                                     make(CodecKind::Sign1, 64), make(CodecKind::SignVote)};
  for (const Codec& c : codecs) {
    for (size_t n : {0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4101}) {
      const size_t bytes = encoded_bytes(c, n);
      ASSERT_EQ(bytes, expected_bytes(c, n)) << codec_name(c.kind) << " n=" << n;
      EXPECT_EQ(bytes % 4, 0u);
      const std::vector<float> x = gaussian(n, 7);
      // Encode into two differently pre-filled buffers with guard bytes: equal results mean every byte of the message
      // was written (padding included), untouched guards mean nothing beyond it was.
      std::vector<std::byte> a(bytes + 16, std::byte{0xab}), b(bytes + 16, std::byte{0x5c});
      encode(c, x.data(), n, a.data());
      encode(c, x.data(), n, b.data());
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<ptrdiff_t>(bytes), b.begin()))
          << codec_name(c.kind) << " n=" << n;
      for (size_t i = bytes; i < bytes + 16; ++i) {
        ASSERT_EQ(a[i], std::byte{0xab}) << codec_name(c.kind) << " n=" << n;
        ASSERT_EQ(b[i], std::byte{0x5c});
      }
    }
  }
}

// A message cut at a record boundary is the concatenation of the two halves' messages (with the SR offset and the
// residual advanced), which is what lets a schedule slice encoded chunks.
TEST(CodecLayout, SplitsAtRecordBoundaries) {
  const std::vector<Codec> codecs = {make(CodecKind::Int8, 0, true, 3),    make(CodecKind::Int8, 64),
                                     make(CodecKind::Fp8E4M3, 0, true, 5), make(CodecKind::Int4, 0, true, 9),
                                     make(CodecKind::Sign1, 128),          make(CodecKind::SignVote)};
  const size_t n = 1000;
  const std::vector<float> x = gaussian(n, 11);
  for (const Codec& c : codecs) {
    const bool ef = c.kind != CodecKind::SignVote;
    std::vector<float> r_whole = gaussian(n, 12, 0.1f), r_parts = r_whole;
    EncodeCtx whole;
    whole.step = 17;
    whole.rank = 3;
    whole.first_elem = 4096 + 2;  // not a multiple of 4: the Philox lanes must still line up
    whole.residual = ef ? r_whole.data() : nullptr;
    const std::vector<std::byte> m = enc(c, x, whole);
    const size_t k = record_elems(c) * 3;
    ASSERT_LT(k, n);
    std::vector<std::byte> parts(encoded_bytes(c, k) + encoded_bytes(c, n - k));
    ASSERT_EQ(parts.size(), m.size());
    EncodeCtx p1 = whole;
    p1.residual = ef ? r_parts.data() : nullptr;
    encode(c, x.data(), k, parts.data(), p1);
    EncodeCtx p2 = p1;
    p2.first_elem += k;
    p2.residual = ef ? r_parts.data() + k : nullptr;
    encode(c, x.data() + k, n - k, parts.data() + encoded_bytes(c, k), p2);
    EXPECT_EQ(std::memcmp(parts.data(), m.data(), m.size()), 0) << codec_name(c.kind);
    EXPECT_EQ(std::memcmp(r_whole.data(), r_parts.data(), n * sizeof(float)), 0) << codec_name(c.kind);
  }
}

// ---- Accuracy: per-element bounds from each format's definition, L2 errors on realistic data ----

// int8: |x - x'| <= scale / 2 (nearest rounding) with scale = block max / 127, for every block length and tail.
TEST(CodecInt8, PerElementBoundAllBlockSizes) {
  for (uint32_t b : {32u, 64u, 96u, 256u, 512u, 1024u}) {
    for (size_t n : {size_t{b} * 3, size_t{b} * 3 + 17, size_t{5}}) {
      for (int dist = 0; dist < 2; ++dist) {
        const std::vector<float> x = dist == 0 ? gaussian(n, b) : heavy_tailed(n, b);
        const Codec c = make(CodecKind::Int8, b);
        const std::vector<float> y = dec(c, enc(c, x), n);
        for (size_t i = 0; i < n; ++i) {
          const float scale = block_amax(x, i / b * b, b) / 127.0f;
          ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * scale * (1 + 1e-5f) + 1e-30f) << "block " << b << " i=" << i;
        }
      }
    }
  }
}

TEST(CodecInt8, RelativeL2Error) {
  const size_t n = 1 << 16;
  const std::vector<float> g = gaussian(n, 1);
  const double e256 = rel_l2(g, dec(make(CodecKind::Int8), enc(make(CodecKind::Int8), g), n));
  const double e32 = rel_l2(g, dec(make(CodecKind::Int8, 32), enc(make(CodecKind::Int8, 32), g), n));
  // Uniform rounding error of a step 2 * amax / 254: about 6.6e-3 (block 256) and 4.8e-3 (block 32) for Gaussians.
  EXPECT_LE(e256, 8e-3);
  EXPECT_LE(e32, 6e-3);
  EXPECT_LT(e32, e256);
  const std::vector<float> h = heavy_tailed(n, 2);
  const double h256 = rel_l2(h, dec(make(CodecKind::Int8), enc(make(CodecKind::Int8), h), n));
  const double h32 = rel_l2(h, dec(make(CodecKind::Int8, 32), enc(make(CodecKind::Int8, 32), h), n));
  // Heavy tails: an outlier coarsens its whole block, so short blocks help most there.
  EXPECT_LE(h32, 1.5e-2);
  EXPECT_LE(h32, h256 / 2);
}

// MX fp8: the scale is 2^s with s from the definition, every element is within half an E4M3 step of its value
// (relative 2^-4 in the normal range, 2^-10 * 2^s below it), and the block maximum never saturates.
TEST(CodecFp8, ScaleAndPerElementBound) {
  const Codec c = make(CodecKind::Fp8E4M3);
  for (int dist = 0; dist < 3; ++dist) {
    const size_t n = 32 * 200 + 7;
    std::vector<float> x = dist == 0 ? gaussian(n, 3) : heavy_tailed(n, 4);
    if (dist == 2) {
      // Block maxima right at and around the saturation edge: mantissas 1.75 and just above, at many exponents.
      std::mt19937 rng(5);
      for (size_t blk = 0; blk * 32 < n; ++blk) {
        const float mant = (blk % 3 == 0) ? 1.75f : (blk % 3 == 1) ? std::nextafter(1.75f, 2.0f) : 1.999f;
        const float amax = std::ldexp(mant, static_cast<int>(blk % 60) - 30);
        for (size_t j = blk * 32; j < std::min(n, blk * 32 + 32); ++j) {
          x[j] = amax * std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
        }
        x[blk * 32] = (blk & 1) ? -amax : amax;
      }
    }
    const std::vector<std::byte> m = enc(c, x);
    const std::vector<float> y = dec(c, m, n);
    for (size_t blk = 0; blk * 32 < n; ++blk) {
      const float amax = block_amax(x, blk * 32, 32);
      const int s = mx_exponent(amax);
      const size_t rec = blk / 4;
      const auto scale_code = static_cast<uint8_t>(m[rec * 132 + blk % 4]);
      ASSERT_EQ(static_cast<int>(scale_code) - 127, s) << "block " << blk << " amax " << amax;
      for (size_t j = blk * 32; j < std::min(n, blk * 32 + 32); ++j) {
        const uint8_t code = static_cast<uint8_t>(m[rec * 132 + 4 + (j - rec * 128)]);
        ASSERT_NE(code & 0x7f, 0x7f) << "NaN code for a finite value";
        const double err = std::fabs(static_cast<double>(y[j]) - x[j]);
        const double bound = std::max(std::ldexp(std::fabs(static_cast<double>(x[j])), -4), std::ldexp(1.0, s - 10));
        ASSERT_LE(err, bound * (1 + 1e-9)) << "j=" << j << " x=" << x[j] << " y=" << y[j];
      }
      // No saturation: the largest element is rounded, not clipped to 448 * 2^s.
      const float ymax = block_amax(y, blk * 32, 32);
      ASSERT_LE(std::fabs(ymax - amax), std::ldexp(amax, -4)) << "block " << blk;
    }
    if (dist == 0) {
      EXPECT_LE(rel_l2(x, y), 3e-2);  // 3 mantissa bits: about 2^-4 / sqrt(3) relative, less on average
    }
  }
}

// With the scale 1 (block maximum 448 or 256), the codes are exactly the OFP8 E4M3 encodings of the values, which
// float_types.cc computes independently (round to nearest-even, subnormals included).
TEST(CodecFp8, CodesMatchReferenceE4M3) {
  const Codec c = make(CodecKind::Fp8E4M3);
  std::vector<float> vals;
  for (uint32_t code = 0; code < 0x7f; ++code) {  // every finite magnitude, and the midpoints between neighbours
    const float v = e4m3_to_float(static_cast<uint8_t>(code));
    vals.push_back(v);
    vals.push_back(-v);
    if (code + 1 < 0x7f) {
      const float mid = (v + e4m3_to_float(static_cast<uint8_t>(code + 1))) / 2;
      vals.push_back(mid);
      vals.push_back(std::nextafter(mid, 0.0f));
      vals.push_back(-std::nextafter(mid, 1e9f));
    }
  }
  std::mt19937 rng(6);
  for (int i = 0; i < 2000; ++i) vals.push_back(std::uniform_real_distribution<float>(-448.0f, 448.0f)(rng));
  for (int i = 0; i < 200; ++i) vals.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), -7));
  std::vector<float> x;
  for (size_t i = 0; i < vals.size(); i += 31) {  // each block: 448 first (scale 2^0), then 31 values
    x.push_back(448.0f);
    for (size_t j = i; j < std::min(vals.size(), i + 31); ++j) x.push_back(vals[j]);
  }
  const std::vector<std::byte> m = enc(c, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t rec = i / 128;
    ASSERT_EQ(static_cast<uint8_t>(m[rec * 132 + (i % 128) / 32]), 127u);
    ASSERT_EQ(static_cast<uint8_t>(m[rec * 132 + 4 + i % 128]), float_to_e4m3(x[i])) << "x=" << x[i];
  }
}

// int4: scale = the smallest fp16 >= amax / 7 (so codes never clip), |x - x'| <= scale / 2.
TEST(CodecInt4, ScaleRoundedUpAndPerElementBound) {
  const Codec c = make(CodecKind::Int4);
  for (int dist = 0; dist < 3; ++dist) {
    const size_t n = 64 * 50 + 33;
    std::vector<float> x = dist == 0 ? gaussian(n, 8) : heavy_tailed(n, 9);
    if (dist == 2) {  // magnitudes from fp16-subnormal scales to the largest unclipped ones
      for (size_t i = 0; i < n; ++i) x[i] *= std::ldexp(1.0f, static_cast<int>((i / 32) % 40) - 26);
    }
    const std::vector<std::byte> m = enc(c, x);
    const std::vector<float> y = dec(c, m, n);
    for (size_t blk = 0; blk * 32 < n; ++blk) {
      const float t = block_amax(x, blk * 32, 32) / 7.0f;
      uint16_t h;
      std::memcpy(&h, &m[blk / 2 * 36 + 2 * (blk % 2)], 2);
      const float scale = half_to_float(h);
      ASSERT_GE(scale, t);
      if (h > 0) {
        ASSERT_LT(half_to_float(static_cast<uint16_t>(h - 1)), t) << "block " << blk;
      }
      for (size_t j = blk * 32; j < std::min(n, blk * 32 + 32); ++j) {
        ASSERT_LE(std::fabs(y[j] - x[j]), 0.5f * scale * (1 + 1e-6f)) << "j=" << j;
      }
    }
  }
}

TEST(CodecInt4, HugeBlocksClipAtTheLargestFp16Scale) {
  const Codec c = make(CodecKind::Int4);
  std::vector<float> x(32, 1.0f);
  x[0] = 1e6f;  // 1e6 / 7 > 65504
  const std::vector<std::byte> m = enc(c, x);
  uint16_t h;
  std::memcpy(&h, m.data(), 2);
  EXPECT_EQ(h, 0x7bffu);
  EXPECT_EQ(dec(c, m, 32)[0], 7.0f * 65504.0f);
}

// sign1: every element decodes to +-scale with its own sign (0 counts as +), scale = ||x||_2 / sqrt(n) per block,
// so the block's L2 norm is preserved.
TEST(CodecSign1, SignsAndNormPerBlock) {
  for (uint32_t b : {32u, 2048u}) {
    const Codec c = make(CodecKind::Sign1, b);
    const size_t n = 5000;
    std::vector<float> x = heavy_tailed(n, 10);
    x[3] = 0.0f;
    const std::vector<float> y = dec(c, enc(c, x), n);
    for (size_t s = 0; s < n; s += b) {
      const size_t m = std::min<size_t>(b, n - s);
      double nx = 0, ny = 0;
      for (size_t i = s; i < s + m; ++i) {
        nx += static_cast<double>(x[i]) * x[i];
        ny += static_cast<double>(y[i]) * y[i];
        ASSERT_EQ(y[i] < 0, x[i] < 0) << i;
        ASSERT_EQ(std::fabs(y[i]), std::fabs(y[s]));
      }
      EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), 1e-5 * std::sqrt(nx)) << "block at " << s;
    }
  }
}

// ---- Special values ----

TEST(CodecSpecial, ZeroBlocksAreExactAndAllZeroBytes) {
  for (CodecKind k : kAllKinds) {
    const Codec c = make(k);
    const size_t n = 4096 + 3;
    std::vector<float> x(n, 0.0f);
    for (size_t i = 0; i < n; i += 3) x[i] = -0.0f;
    const std::vector<std::byte> m = enc(c, x);
    if (k != CodecKind::SignVote) {
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](std::byte v) { return v == std::byte{0}; })) << codec_name(k);
      for (float v : dec(c, m, n)) ASSERT_EQ(v, 0.0f) << codec_name(k);
    }
    // One zero block between non-zero ones decodes to exact zeros too.
    std::vector<float> z = gaussian(3 * 2048, 12);
    const size_t b = block_elems(c);
    std::fill(z.begin() + static_cast<ptrdiff_t>(b), z.begin() + static_cast<ptrdiff_t>(2 * b), 0.0f);
    if (k != CodecKind::SignVote) {
      const std::vector<float> y = dec(c, enc(c, z), z.size());
      for (size_t i = b; i < 2 * b; ++i) ASSERT_EQ(y[i], 0.0f) << codec_name(k) << " " << i;
    }
  }
}

TEST(CodecSpecial, NonFiniteBlockDecodesToNaNAndKeepsItsResidual) {
  for (CodecKind k : {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4, CodecKind::Sign1}) {
    const Codec c = make(k, k == CodecKind::Sign1 ? 64 : 0);
    const size_t b = block_elems(c);
    const size_t n = 4 * b;
    for (float bad : {kNaN, kInf, -kInf}) {
      std::vector<float> x = gaussian(n, 13);
      x[b + 5] = bad;
      x[3 * b] = bad;
      std::vector<float> res = gaussian(n, 14, 0.01f);
      const std::vector<float> res0 = res;
      EncodeCtx ctx;
      ctx.residual = res.data();
      std::vector<std::byte> m(encoded_bytes(c, n));
      EXPECT_EQ(encode(c, x.data(), n, m.data(), ctx), 2u) << codec_name(k);
      const std::vector<float> y = dec(c, m, n);
      for (size_t i = 0; i < n; ++i) {
        const bool poisoned = (i >= b && i < 2 * b) || i >= 3 * b;
        if (poisoned) {
          ASSERT_TRUE(std::isnan(y[i])) << codec_name(k) << " i=" << i;
          ASSERT_EQ(res[i], res0[i]) << "residual of a non-finite block changed";
        } else {
          ASSERT_TRUE(std::isfinite(y[i])) << codec_name(k) << " i=" << i;
          ASSERT_TRUE(std::isfinite(res[i]));
        }
      }
    }
  }
}

TEST(CodecSpecial, VoteTreatsNaNAsPlusAndInfAsItsSign) {
  const Codec c = make(CodecKind::SignVote);
  std::vector<float> x = {kNaN, -kInf, kInf, -0.0f, 0.0f, -1.0f, 2.0f};
  x.resize(70, 1.0f);
  x[40] = -kNaN;
  std::vector<std::byte> m(encoded_bytes(c, x.size()));
  EXPECT_EQ(encode(c, x.data(), x.size(), m.data()), 2u);  // two words hold a NaN
  const std::vector<float> y = dec(c, m, x.size());
  const float want[] = {1, -1, 1, 1, 1, -1, 1};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(y[i], want[i]) << i;
  EXPECT_EQ(y[40], 1.0f);
}

// Any bytes decode (no undefined behaviour for codes encode never writes): NaN scales and the E4M3 NaN code are NaN.
TEST(CodecSpecial, ArbitraryBytesDecode) {
  std::mt19937 rng(15);
  for (CodecKind k : kAllKinds) {
    const Codec c = make(k);
    const size_t n = 1000;
    std::vector<std::byte> m(encoded_bytes(c, n));
    for (auto& v : m) v = static_cast<std::byte>(rng());
    std::vector<float> y(n);
    decode(c, m.data(), n, y.data());
  }
  const Codec f = make(CodecKind::Fp8E4M3);
  std::vector<std::byte> m(encoded_bytes(f, 64), std::byte{0});
  m[0] = std::byte{0xff};       // block 0: NaN scale
  m[1] = std::byte{127};        // block 1: scale 1
  m[4 + 32] = std::byte{0x7f};  // block 1, element 0: NaN code
  m[4 + 33] = std::byte{0x7e};  // 448
  const std::vector<float> y = dec(f, m, 64);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[32]));
  EXPECT_EQ(y[33], 448.0f);
}

// ---- decode_accumulate ----

TEST(CodecDecode, AccumulateEqualsDecodeThenAdd) {
  for (const Codec& c : {make(CodecKind::Int8), make(CodecKind::Int8, 32), make(CodecKind::Fp8E4M3),
                         make(CodecKind::Int4), make(CodecKind::Sign1), make(CodecKind::SignVote)}) {
    const size_t n = 3000 + 13;
    const std::vector<float> x = gaussian(n, 16);
    const std::vector<std::byte> m = enc(c, x);
    const std::vector<float> y = dec(c, m, n);
    std::vector<float> acc = gaussian(n, 17);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = acc[i] + y[i];
    decode_accumulate(c, m.data(), n, acc.data());
    EXPECT_EQ(std::memcmp(acc.data(), want.data(), n * sizeof(float)), 0) << codec_name(c.kind);
  }
}

// ---- Stochastic rounding ----

TEST(CodecStochastic, DeterministicPerKeyAndVariesWithIt) {
  for (CodecKind k : {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4}) {
    const Codec c = make(k, 0, true, 99);
    const std::vector<float> x = gaussian(2000, 18);
    EncodeCtx ctx;
    ctx.step = 5;
    ctx.rank = 2;
    const std::vector<std::byte> a = enc(c, x, ctx), b = enc(c, x, ctx);
    EXPECT_EQ(a, b) << codec_name(k);
    EncodeCtx other = ctx;
    other.step = 6;
    EXPECT_NE(enc(c, x, other), a) << codec_name(k) << ": step is part of the key";
    other = ctx;
    other.rank = 3;
    EXPECT_NE(enc(c, x, other), a) << codec_name(k) << ": rank is part of the key";
    Codec c2 = c;
    c2.seed = 100;
    EXPECT_NE(enc(c2, x, ctx), a) << codec_name(k) << ": seed is part of the key";
  }
}

// The mean of the decoded values over many steps converges to the input (unbiased), where nearest rounding keeps a
// fixed error of up to half a step.
TEST(CodecStochastic, UnbiasedOverManySteps) {
  for (CodecKind k : {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4}) {
    const Codec c = make(k, 0, true, 7);
    const size_t n = 256;
    const int steps = 2000;
    std::vector<float> x = gaussian(n, 19);
    std::vector<double> mean(n, 0.0);
    EncodeCtx ctx;
    for (int s = 0; s < steps; ++s) {
      ctx.step = static_cast<uint64_t>(s);
      const std::vector<float> y = dec(c, enc(c, x, ctx), n);
      for (size_t i = 0; i < n; ++i) mean[i] += y[i] / steps;
    }
    const std::vector<float> rne = dec(make(k), enc(make(k), x), n);
    double sr_err = 0, rne_err = 0;
    for (size_t i = 0; i < n; ++i) {
      // The gap between the grid points around x_i (an upper bound): one stochastic rounding has variance at most
      // gap^2 / 4, so the mean over `steps` lies within 5 gap / (2 sqrt(steps)) of x_i but for about 1 in 10^6.
      double gap = 0;
      if (k == CodecKind::Int8) gap = block_amax(x, 0, n) / 127.0;
      if (k == CodecKind::Int4) gap = block_amax(x, i / 32 * 32, 32) / 7.0 * 1.001;
      if (k == CodecKind::Fp8E4M3) {
        const int s = mx_exponent(block_amax(x, i / 32 * 32, 32));
        gap = std::max(std::ldexp(1.0, std::ilogb(x[i]) - 3), std::ldexp(1.0, s - 9));
      }
      ASSERT_LE(std::fabs(mean[i] - x[i]), 5 * gap / (2 * std::sqrt(steps))) << codec_name(k) << " i=" << i;
      sr_err += std::fabs(mean[i] - x[i]);
      rne_err += std::fabs(static_cast<double>(rne[i]) - x[i]);
    }
    EXPECT_LT(sr_err, rne_err / 4) << codec_name(k) << ": the mean of stochastic rounding beats nearest rounding";
  }
}

// ---- Error feedback over a gradient stream ----

// The codec a collective uses at step t: with the rotation, D drawn from (seed, t).
Codec at_step(Codec c, int t) {
  if (c.rotation) c.seed = rotation_seed_for_step(c.seed, static_cast<uint64_t>(t));
  return c;
}

// 100 steps of g_t = m + noise_t (a persistent direction plus step noise, unit variance each): the running sum of
// the decoded values against the exact running sum (in double), with and without the residual.
double stream_error(const Codec& codec, bool ef, size_t n = 1 << 14, int steps = 100) {
  const std::vector<float> mean = gaussian(n, 20);
  std::vector<float> res(n, 0.0f);
  std::vector<double> exact(n, 0.0), got(n, 0.0);
  std::vector<std::byte> m(encoded_bytes(codec, n));
  std::vector<float> y(n);
  for (int t = 0; t < steps; ++t) {
    const Codec c = at_step(codec, t);
    std::vector<float> g = gaussian(n, 100 + static_cast<unsigned>(t));
    for (size_t i = 0; i < n; ++i) g[i] += mean[i];
    EncodeCtx ctx;
    ctx.step = static_cast<uint64_t>(t);
    ctx.residual = ef ? res.data() : nullptr;
    encode(c, g.data(), n, m.data(), ctx);
    decode(c, m.data(), n, y.data());
    for (size_t i = 0; i < n; ++i) {
      exact[i] += g[i];
      got[i] += y[i];
    }
  }
  if (ef) {
    // The telescoping identity behind error feedback: sum of decoded = sum of inputs - final residual, up to fp32
    // rounding of each step's y = g + e and y - Q(y).
    std::vector<double> corrected(n);
    for (size_t i = 0; i < n; ++i) corrected[i] = got[i] + res[i];
    EXPECT_LE(rel_l2(exact, corrected), 1e-5) << codec_name(codec.kind);
  }
  return rel_l2(exact, got);
}

TEST(CodecErrorFeedback, Int4TracksTheRunningSum) {
  const double with = stream_error(make(CodecKind::Int4), true);
  const double without = stream_error(make(CodecKind::Int4), false);
  EXPECT_LE(with, 3e-3) << "without " << without;
  EXPECT_GE(without, 5 * with) << "with " << with << " without " << without;
}

TEST(CodecErrorFeedback, Sign1TracksTheRunningSum) {
  const double with = stream_error(make(CodecKind::Sign1), true);
  const double without = stream_error(make(CodecKind::Sign1), false);
  EXPECT_LE(with, 3e-2) << "without " << without;
  EXPECT_GE(without, 5 * with) << "with " << with << " without " << without;
}

TEST(CodecErrorFeedback, Int8AndFp8TrackTheRunningSum) {
  for (CodecKind k : {CodecKind::Int8, CodecKind::Fp8E4M3}) {
    const double with = stream_error(make(k), true, 4096);
    EXPECT_LE(with, 1e-3) << codec_name(k);
    EXPECT_LT(with, stream_error(make(k), false, 4096)) << codec_name(k);
  }
}

// 1-bit Adam's two-level feedback, as a schedule uses it: 4 ranks, each encodes every shard of its gradient with its
// worker residual (whole buffer); the owner of shard j decode_accumulates the 4 messages, averages, and re-encodes
// with its server residual (its shard); every rank decodes the owner's message. The running sum of that result
// tracks the running sum of the exact average.
double sign1_two_level_error(const Codec& c0, bool ef) {
  constexpr int kRanks = 4;
  const size_t shard = 4096, n = shard * kRanks;
  std::vector<std::vector<float>> worker(kRanks, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> server(kRanks, std::vector<float>(shard, 0.0f));
  const std::vector<float> mean = gaussian(n, 200);  // data parallel: every rank's gradient has the same mean
  std::vector<double> exact(n, 0.0), got(n, 0.0);
  const size_t mb = encoded_bytes(c0, shard);
  std::vector<std::byte> msgs(static_cast<size_t>(kRanks) * kRanks * mb), out(mb);
  for (int t = 0; t < 100; ++t) {
    const Codec c = at_step(c0, t);
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> g = gaussian(n, 1000 + static_cast<unsigned>(t * kRanks + r));
      for (size_t i = 0; i < n; ++i) {
        g[i] += mean[i];
        exact[i] += g[i] / kRanks;
      }
      for (int j = 0; j < kRanks; ++j) {
        EncodeCtx ctx;
        ctx.residual = ef ? worker[r].data() + j * shard : nullptr;
        encode(c, g.data() + j * shard, shard, &msgs[(static_cast<size_t>(r) * kRanks + j) * mb], ctx);
      }
    }
    for (int j = 0; j < kRanks; ++j) {  // owner j
      std::vector<float> acc(shard, 0.0f);
      for (int r = 0; r < kRanks; ++r) {
        decode_accumulate(c, &msgs[(static_cast<size_t>(r) * kRanks + j) * mb], shard, acc.data());
      }
      for (auto& v : acc) v /= kRanks;
      EncodeCtx ctx;
      ctx.residual = ef ? server[j].data() : nullptr;
      encode(c, acc.data(), shard, out.data(), ctx);
      std::vector<float> y(shard);
      decode(c, out.data(), shard, y.data());
      for (size_t i = 0; i < shard; ++i) got[j * shard + i] += y[i];
    }
  }
  if (ef) {
    // Two-level telescoping: sum of results = sum of exact averages - mean of the worker residuals - the server
    // residual (up to fp32 rounding), which checks that each residual is updated where it should be.
    std::vector<double> corrected(n);
    for (size_t i = 0; i < n; ++i) {
      double w = 0;
      for (int r = 0; r < kRanks; ++r) w += worker[r][i];
      corrected[i] = got[i] + w / kRanks + server[i / shard][i % shard];
    }
    EXPECT_LE(rel_l2(exact, corrected), 1e-5);
  }
  return rel_l2(exact, got);
}

TEST(CodecErrorFeedback, Sign1TwoLevelAcrossRanks) {
  // Without the rotation, a coordinate where the persistent mean is larger than the block's scale (L2 norm /
  // sqrt(block)) falls behind every step, until the residuals have grown the scale up to the largest |mean| of the
  // block (about 3.5 sigma for 1024 Gaussian elements): two residuals that size hold back about 4e-2 of the sum.
  // A fresh rotation every step moves the mean onto other coordinates each step, and the residuals stay small.
  const Codec plain = make(CodecKind::Sign1, 1024);
  Codec rot = plain;
  rot.rotation = true;
  const double plain_with = sign1_two_level_error(plain, true), plain_without = sign1_two_level_error(plain, false);
  const double rot_with = sign1_two_level_error(rot, true), rot_without = sign1_two_level_error(rot, false);
  std::printf("1-bit two-level, running sum after 100 steps: %.2e with feedback, %.2e without; rotated %.2e, %.2e\n",
              plain_with, plain_without, rot_with, rot_without);
  EXPECT_LE(rot_with, 3e-2);
  EXPECT_GE(rot_without, 5 * rot_with);
  EXPECT_LE(plain_with, 5e-2);
  EXPECT_GE(plain_without, 5 * plain_with);
}

// ---- Majority vote ----

TEST(CodecVote, MajorityOfRanks) {
  const Codec c = make(CodecKind::SignVote);
  const size_t n = 1000 + 7;
  for (int ranks : {1, 2, 3, 4, 7}) {
    std::vector<int32_t> votes(n, 0), want(n, 0);
    std::vector<float> facc(n, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> x = gaussian(n, 300 + static_cast<unsigned>(r));
      for (size_t i = 0; i < n; ++i) want[i] += x[i] < 0 ? -1 : 1;
      const std::vector<std::byte> m = enc(c, x);
      vote_accumulate(m.data(), n, votes.data());
      decode_accumulate(c, m.data(), n, facc.data());
    }
    EXPECT_EQ(votes, want);
    std::vector<float> sign(n);
    vote_finalize(votes.data(), n, sign.data());
    std::vector<std::byte> result(encoded_bytes(c, n));
    vote_encode_result(votes.data(), n, result.data());
    const std::vector<float> bits = dec(c, result, n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(facc[i], static_cast<float>(want[i]));
      const float s = static_cast<float>((want[i] > 0) - (want[i] < 0));
      ASSERT_EQ(sign[i], s);
      ASSERT_EQ(bits[i], s == 0 ? 1.0f : s) << "ties become +1 in the result message";
    }
  }
}

// ---- Bad arguments: a clear error and nothing written ----

TEST(CodecArgs, BadArgumentsChangeNothing) {
  const Codec c = make(CodecKind::Int8);
  std::vector<float> x(300, 1.0f), res(300, 0.5f);
  std::vector<std::byte> out(encoded_bytes(c, 300), std::byte{0x11});
  const std::vector<std::byte> out0 = out;
  const std::vector<float> res0 = res;
  expect_invalid([&] { encode(c, nullptr, 300, out.data()); }, "in is null");
  expect_invalid([&] { encode(c, x.data(), 300, nullptr); }, "out is null");
  expect_invalid([&] { encode(make(CodecKind::Int8, 33), x.data(), 300, out.data()); }, "block 33");
  EncodeCtx ctx;
  ctx.residual = res.data();
  expect_invalid([&] { encode(make(CodecKind::SignVote), x.data(), 300, out.data(), ctx); }, "residual");
  ctx.residual = x.data() + 10;
  expect_invalid([&] { encode(c, x.data(), 300, out.data(), ctx); }, "overlap");
  expect_invalid([&] { encode(c, x.data(), 300, reinterpret_cast<std::byte*>(x.data() + 1)); }, "overlap");
  EXPECT_EQ(out, out0);
  EXPECT_EQ(res, res0);
  std::vector<float> y(300, 2.0f);
  expect_invalid([&] { decode(c, nullptr, 300, y.data()); }, "in is null");
  expect_invalid([&] { decode_accumulate(c, out.data(), 300, nullptr); }, "acc is null");
  expect_invalid([&] { decode(make(CodecKind::Fp8E4M3, 16), out.data(), 300, y.data()); }, "block 16");
  expect_invalid([&] { vote_accumulate(out.data(), 300, nullptr); }, "votes is null");
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 2.0f; }));
  // Zero elements: nothing to do, null buffers are fine.
  EXPECT_EQ(encode(c, nullptr, 0, nullptr), 0u);
  EXPECT_NO_THROW(decode(c, nullptr, 0, nullptr));
}

// ---- Randomized Hadamard rotation ----

Codec rotated(CodecKind kind, uint32_t block = 0, uint64_t seed = 7) {
  Codec c = make(kind, block, false, seed);
  c.rotation = true;
  return c;
}

// Student-t with 4 degrees of freedom (finite variance, outliers of 10 sigma and more every few thousand elements).
std::vector<float> student_t4(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> d(4.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CodecRotation, HeavyTailedDataQuantizesAboutAsWellAsNormalData) {
  const size_t n = 1 << 16;
  const std::vector<float> g = gaussian(n, 11), h = student_t4(n, 12);
  for (const Codec& plain :
       {make(CodecKind::Int8), make(CodecKind::Int8, 32), make(CodecKind::Fp8E4M3), make(CodecKind::Int4)}) {
    Codec rot = plain;
    rot.rotation = true;
    rot.seed = 3;
    const double g_plain = rel_l2(g, dec(plain, enc(plain, g), n)), g_rot = rel_l2(g, dec(rot, enc(rot, g), n));
    const double h_plain = rel_l2(h, dec(plain, enc(plain, h), n)), h_rot = rel_l2(h, dec(rot, enc(rot, h), n));
    std::printf("%-8s block %4u: normal %.2e plain, %.2e rotated; t(4) %.2e plain, %.2e rotated\n",
                codec_name(plain.kind), block_elems(plain), g_plain, g_rot, h_plain, h_rot);
    // Rotated Gaussian data is Gaussian: the same error within 15%. On t(4) data the rotation removes most of the
    // outliers' cost of the integer codecs: within 15% of the normal-data error, and clearly below the unrotated
    // error. fp8 keeps relative precision per element, so an outlier costs it little and the rotation gains nothing.
    EXPECT_LE(g_rot, 1.15 * g_plain) << codec_name(plain.kind);
    EXPECT_LE(h_rot, 1.15 * g_plain) << codec_name(plain.kind);
    if (plain.kind != CodecKind::Fp8E4M3) {
      EXPECT_LT(h_rot, 0.9 * h_plain) << codec_name(plain.kind);
    }
  }
}

TEST(CodecRotation, DeterministicPerSeedAndExactForZeros) {
  const std::vector<float> x = student_t4(4096, 5);
  EXPECT_EQ(enc(rotated(CodecKind::Int8, 0, 1), x), enc(rotated(CodecKind::Int8, 0, 1), x));
  EXPECT_NE(enc(rotated(CodecKind::Int8, 0, 1), x), enc(rotated(CodecKind::Int8, 0, 2), x));
  const std::vector<float> zeros(1000, 0.0f);
  for (CodecKind k : {CodecKind::Int8, CodecKind::Fp8E4M3, CodecKind::Int4, CodecKind::Sign1}) {
    const Codec c = rotated(k, k == CodecKind::Sign1 ? 256 : 0);
    for (float v : dec(c, enc(c, zeros), zeros.size())) ASSERT_EQ(v, 0.0f) << codec_name(k);
  }
}

TEST(CodecRotation, ShortLastRecordAndAccumulate) {
  // 3 whole records of 256 and a short one of 232 (not rotated): each part decodes within the int8 bound.
  const size_t n = 1000;
  const Codec c = rotated(CodecKind::Int8);
  const std::vector<float> x = gaussian(n, 8);
  const std::vector<std::byte> m = enc(c, x);
  ASSERT_EQ(m.size(), encoded_bytes(make(CodecKind::Int8), n));  // the layout is unchanged
  const std::vector<float> y = dec(c, m, n);
  EXPECT_LE(rel_l2(x, y), 8e-3);
  // The short record is exactly the unrotated codec's.
  const std::vector<float> tail(x.begin() + 768, x.end());
  const std::vector<std::byte> mt = enc(make(CodecKind::Int8), tail);
  EXPECT_TRUE(std::equal(mt.begin(), mt.end(), m.end() - static_cast<long>(mt.size())));
  std::vector<float> acc(n, 1.5f);
  decode_accumulate(c, m.data(), n, acc.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], 1.5f + y[i]) << i;
}

TEST(CodecRotation, ErrorFeedbackKeepsTheTelescopingIdentity) {
  // stream_error checks sum(decoded) + residual == sum(inputs) with the rotation in the loop.
  const double with = stream_error(rotated(CodecKind::Int4), true, 4000);
  const double without = stream_error(rotated(CodecKind::Int4), false, 4000);
  EXPECT_LE(with, 3e-3);
  EXPECT_GE(without, 5 * with);
}

TEST(CodecRotation, NonFiniteRecordDecodesToNaNAndKeepsItsResidual) {
  const Codec c = rotated(CodecKind::Int8);
  std::vector<float> x = gaussian(768, 9);
  x[256 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> res(768, 0.25f);
  std::vector<std::byte> m(encoded_bytes(c, x.size()));
  EncodeCtx ctx;
  ctx.residual = res.data();
  EXPECT_EQ(encode(c, x.data(), x.size(), m.data(), ctx), 1u);
  const std::vector<float> y = dec(c, m, x.size());
  for (size_t i = 0; i < 768; ++i) {
    const bool in_bad = i >= 256 && i < 512;
    ASSERT_EQ(std::isnan(y[i]), in_bad) << i;
    if (in_bad) {
      ASSERT_EQ(res[i], 0.25f) << i;
    }
  }
}

TEST(CodecRotation, MagnitudesTooLargeToRotateDecodeToNaNInsteadOfWrongValues) {
  const Codec c = rotated(CodecKind::Int8);
  std::vector<float> x = gaussian(768, 21);
  for (size_t i = 0; i < 256; ++i) x[i] *= 1e33f;     // record 0: below 2^115, rotates and stays accurate
  for (size_t i = 256; i < 512; ++i) x[i] = 1.5e38f;  // record 1: would overflow once rotated
  std::vector<std::byte> m(encoded_bytes(c, x.size()));
  EXPECT_EQ(encode(c, x.data(), x.size(), m.data()), 1u);  // counted like a non-finite record
  const std::vector<float> y = dec(c, m, x.size());
  const std::vector<float> r0(x.begin(), x.begin() + 256), y0(y.begin(), y.begin() + 256);
  EXPECT_LE(rel_l2(r0, y0), 8e-3);
  for (size_t i = 256; i < 512; ++i) ASSERT_TRUE(std::isnan(y[i])) << i;
  for (size_t i = 512; i < 768; ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
}

// The unnormalised transform of a 4096-element record sums 2^12 magnitudes: a record at 2^116 (below the 2^120 a
// norm bound would allow) is not rotated, counts as non-finite, and keeps its error-feedback residual.
TEST(CodecRotation, RecordsThatCouldOverflowTheTransformAreNotRotatedAndKeepTheirResidual) {
  const Codec c = rotated(CodecKind::Sign1, 4096);
  std::vector<float> x = gaussian(8192, 23);
  for (size_t i = 0; i < 4096; ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * 0x1p116f;  // record 0
  std::vector<float> res(x.size(), 0.25f), res0 = res;
  std::vector<std::byte> m(encoded_bytes(c, x.size()));
  EncodeCtx ctx;
  ctx.residual = res.data();
  EXPECT_EQ(encode(c, x.data(), x.size(), m.data(), ctx), 1u);
  const std::vector<float> y = dec(c, m, x.size());
  for (size_t i = 0; i < 4096; ++i) {
    ASSERT_TRUE(std::isnan(y[i])) << i;
    ASSERT_EQ(res[i], res0[i]) << "the residual of a record that was not rotated is kept, element " << i;
  }
  for (size_t i = 4096; i < 8192; ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << i;
    ASSERT_TRUE(std::isfinite(res[i])) << i;
  }
}

TEST(CodecRotation, OnlyForScaledCodecsAndPowerOfTwoBlocks) {
  validate(rotated(CodecKind::Sign1));  // block 2048
  validate(rotated(CodecKind::Sign1, 4096));
  expect_invalid([] { validate(rotated(CodecKind::Sign1, 8192)); }, "power of two up to 4096");
  expect_invalid([] { validate(rotated(CodecKind::Sign1, 96)); }, "power of two up to 4096");
  expect_invalid([] { validate(rotated(CodecKind::SignVote)); }, "rotation");
  expect_invalid([] { validate(rotated(CodecKind::Int8, 96)); }, "power of two");
  validate(make(CodecKind::Int8, 96));  // without the rotation any multiple of 32
  validate(rotated(CodecKind::Int8, 1024));
}

}  // namespace
}  // namespace chorus::kernels::codec
