// Scalar reference conversions. These favour obviousness over speed: the vectorised loops in reduce.cc carry their
// own branch-free versions, and the unit tests hold the two to bit-identical results.
#include "kernels/cpu/float_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <limits>

namespace chorus::kernels {
namespace {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;

// A binary floating format narrower than fp32: `mbits` stored mantissa bits and exponent bias `bias`.
struct Format {
  int mbits;
  int bias;
};
constexpr Format kHalf{10, 15};
constexpr Format kE4M3{3, 7};
constexpr Format kE5M2{2, 15};

// Rounds a finite, non-negative fp32 (given by its bits) to nearest-even in `fmt`, and returns the magnitude code
// (biased exponent << mbits | mantissa). The result is not clamped: codes past the format's largest finite value
// are the caller's to map to infinity or to saturate. Integer arithmetic only, so the result does not depend on the
// FPU's rounding mode or on flush-to-zero settings.
uint32_t round_magnitude(uint32_t abs_bits, Format fmt) {
  if (abs_bits == 0) return 0;
  const int biased = static_cast<int>(abs_bits >> 23);
  uint32_t sig = abs_bits & 0x7fffffu;
  int exp;  // value = sig * 2^(exp - 23)
  if (biased == 0) {
    exp = -126;
  } else {
    sig |= 0x800000u;
    exp = biased - 127;
  }
  const int min_normal_exp = 1 - fmt.bias;
  // The target's spacing at this magnitude is 2^(max(exp, min_normal_exp) - mbits); drop the bits below it.
  const int step_exp = std::max(exp, min_normal_exp) - fmt.mbits;
  const int shift = step_exp - (exp - 23);
  if (shift >= 25) return 0;  // sig < 2^24 is then below half of one step
  const uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  // In the subnormal range the code is the step count. In the normal range `rounded` includes the implicit bit, and
  // a carry out of the mantissa moves into the exponent field by plain addition.
  if (exp < min_normal_exp) return rounded;
  return (static_cast<uint32_t>(exp + fmt.bias - 1) << fmt.mbits) + rounded;
}

// 2^e for e in fp32's normal exponent range.
constexpr float pow2(int e) { return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); }

// Decodes the magnitude code of a finite value of an 8-bit format; NaN/inf codes are handled by the callers.
constexpr float decode_finite(uint32_t magnitude, Format fmt) {
  const uint32_t mant = magnitude & ((1u << fmt.mbits) - 1u);
  const int exp_field = static_cast<int>(magnitude >> fmt.mbits);
  if (exp_field == 0) return static_cast<float>(mant) * pow2(1 - fmt.bias - fmt.mbits);
  return static_cast<float>(mant | (1u << fmt.mbits)) * pow2(exp_field - fmt.bias - fmt.mbits);
}

// The fp8 tables are built at compile time so that no other translation unit's static initialiser can observe them
// before they are filled.
constexpr std::array<float, 256> build_e4m3_table() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t mag = c & 0x7fu;
    const float v = mag == 0x7fu ? std::numeric_limits<float>::quiet_NaN() : decode_finite(mag, kE4M3);
    t[c] = (c & 0x80u) ? -v : v;
  }
  return t;
}

constexpr std::array<float, 256> build_e5m2_table() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t mag = c & 0x7fu;
    // Like fp16, the all-ones exponent is inf (zero mantissa) or NaN, whose payload is kept as half_to_float does.
    const float v = mag >= 0x7cu ? std::bit_cast<float>(kF32Inf | (mag & 3u) << 21) : decode_finite(mag, kE5M2);
    t[c] = (c & 0x80u) ? -v : v;
  }
  return t;
}

constexpr std::array<float, 256> kE4M3Table = build_e4m3_table();
constexpr std::array<float, 256> kE5M2Table = build_e5m2_table();

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = kF32Inf | (mant << 13);  // keeps the NaN payload, including its quiet bit
  } else if (exp == 0) {
    // Subnormal (or zero): mant * 2^-24 is exact in fp32.
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(static_cast<float>(mant) * 0x1p-24f));
  } else {
    bits = ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(sign | bits);
}

uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x & kF32SignMask) >> 16;
  const uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | (ax & 0x7fffffu) >> 13);  // quiet, keep top payload
  const uint32_t code = std::min(round_magnitude(ax, kHalf), 0x7c00u);                      // overflow -> inf
  return static_cast<uint16_t>(sign | code);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet; rounding could reach inf
  // bf16 shares fp32's exponent range, so nearest-even is a carry into the upper half; a carry out of the largest
  // finite value gives infinity, as it should.
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float e4m3_to_float(uint8_t v) { return kE4M3Table[v]; }

uint8_t float_to_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x & kF32SignMask) >> 24;
  const uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return static_cast<uint8_t>(sign | 0x7fu);
  // No infinity: everything past 448 (infinity included) saturates, so code 0x7f is never produced for a number.
  return static_cast<uint8_t>(sign | std::min(round_magnitude(ax, kE4M3), 0x7eu));
}

float e5m2_to_float(uint8_t v) { return kE5M2Table[v]; }

uint8_t float_to_e5m2(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x & kF32SignMask) >> 24;
  const uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | std::min(round_magnitude(ax, kE5M2), 0x7cu));
}

}  // namespace chorus::kernels
