// CPU kernels: the scalar conversions of float_types.cc against the formats' definitions (IEEE 754 binary16, bfloat16,
// OCP OFP8 E4M3/E5M2), and the vectorised Reducer against a plain scalar reference computed in double (floats) or
// with unsigned wraparound (integers).
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
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/float_types.h"
#include "kernels/cpu/reduce.h"

namespace chorus::kernels {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- The narrow float formats, described from their definitions rather than from the code under test ----

struct Narrow {
  const char* name;
  chorusDataType_t dtype;
  int bits;
  int mbits;
  int bias;
  bool ieee_specials;  // all-ones exponent holds inf and NaN; otherwise (E4M3) only S.1111.111 is NaN, no inf
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);

  uint32_t mag_mask() const { return (1u << (bits - 1)) - 1u; }
  uint32_t sign_bit() const { return 1u << (bits - 1); }
  uint32_t inf_code() const { return mag_mask() >> mbits << mbits; }
  uint32_t num_codes() const { return 1u << bits; }
  bool is_nan(uint32_t c) const {
    const uint32_t m = c & mag_mask();
    return ieee_specials ? m > inf_code() : m == mag_mask();
  }
  bool is_inf(uint32_t c) const { return ieee_specials && (c & mag_mask()) == inf_code(); }
  // The value of code c: (-1)^s * 2^(e - bias) * 1.m, or 2^(1 - bias) * 0.m for e == 0. Exact in double.
  double value(uint32_t c) const {
    if (is_nan(c)) return kNaN;
    const uint32_t m = c & mag_mask();
    const int e = static_cast<int>(m >> mbits);
    const double mant = static_cast<double>(m & ((1u << mbits) - 1u));
    double v = is_inf(c) ? kInf
               : e == 0  ? std::ldexp(mant, 1 - bias - mbits)
                         : std::ldexp(mant + std::ldexp(1.0, mbits), e - bias - mbits);
    return (c & sign_bit()) ? -v : v;
  }
};

float decode_half(uint32_t c) { return half_to_float(static_cast<uint16_t>(c)); }
uint32_t encode_half(float f) { return float_to_half(f); }
float decode_bf16(uint32_t c) { return bf16_to_float(static_cast<uint16_t>(c)); }
uint32_t encode_bf16(float f) { return float_to_bf16(f); }
float decode_e4m3(uint32_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); }
uint32_t encode_e4m3(float f) { return float_to_e4m3(f); }
float decode_e5m2(uint32_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); }
uint32_t encode_e5m2(float f) { return float_to_e5m2(f); }

// name, dtype, bits, mantissa bits, bias, IEEE specials, decode, encode
const Narrow kHalfFmt{"fp16", chorusFloat16, 16, 10, 15, true, decode_half, encode_half};
const Narrow kBf16Fmt{"bf16", chorusBfloat16, 16, 7, 127, true, decode_bf16, encode_bf16};
const Narrow kE4M3Fmt{"e4m3", chorusFloat8e4m3, 8, 3, 7, false, decode_e4m3, encode_e4m3};
const Narrow kE5M2Fmt{"e5m2", chorusFloat8e5m2, 8, 2, 15, true, decode_e5m2, encode_e5m2};
const Narrow* const kNarrow[] = {&kHalfFmt, &kBf16Fmt, &kE4M3Fmt, &kE5M2Fmt};

const Narrow* narrow_of(chorusDataType_t dt) {
  for (const Narrow* f : kNarrow) {
    if (f->dtype == dt) return f;
  }
  return nullptr;
}

// Round-to-nearest-even by search: the representable value nearest to x, ties to the even code. Overflow follows
// IEEE (past the midpoint between the largest finite value and the next power of two: inf) for formats with inf,
// and saturation for E4M3.
class NearestEven {
 public:
  explicit NearestEven(const Narrow& f) : f_(f) {
    for (uint32_t c = 0; c <= f.mag_mask(); ++c) {
      if (f.is_nan(c) || f.is_inf(c)) continue;
      values_.push_back(f.value(c));
      codes_.push_back(c);
    }
    top_step_ = values_.back() - values_[values_.size() - 2];
  }
  uint32_t operator()(float x) const {
    const uint32_t sign = std::signbit(x) ? f_.sign_bit() : 0u;
    const double a = std::fabs(static_cast<double>(x));
    if (a > values_.back()) {
      if (!f_.ieee_specials) return sign | codes_.back();
      return sign | (a >= values_.back() + top_step_ / 2 ? f_.inf_code() : codes_.back());
    }
    const size_t hi = static_cast<size_t>(std::lower_bound(values_.begin(), values_.end(), a) - values_.begin());
    if (values_[hi] == a) return sign | codes_[hi];
    const size_t lo = hi - 1;
    const double dlo = a - values_[lo];
    const double dhi = values_[hi] - a;
    if (dlo != dhi) return sign | codes_[dlo < dhi ? lo : hi];
    return sign | codes_[(codes_[lo] & 1u) == 0 ? lo : hi];
  }
  const std::vector<double>& values() const { return values_; }

 private:
  const Narrow& f_;
  std::vector<double> values_;
  std::vector<uint32_t> codes_;
  double top_step_;
};

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- Conversions ----

TEST(FloatTypes, DecodeMatchesDefinitionForEveryCode) {
  for (const Narrow* f : kNarrow) {
    for (uint32_t c = 0; c < f->num_codes(); ++c) {
      const float got = f->decode(c);
      const double want = f->value(c);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << f->name << " code " << hex(c);
        ASSERT_EQ(std::signbit(got), (c & f->sign_bit()) != 0) << f->name << " code " << hex(c);
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << f->name << " code " << hex(c);
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << f->name << " code " << hex(c);
      }
    }
  }
}

TEST(FloatTypes, EveryCodeRoundTrips) {
  for (const Narrow* f : kNarrow) {
    for (uint32_t c = 0; c < f->num_codes(); ++c) {
      const uint32_t back = f->encode(f->decode(c));
      if (f->is_nan(c)) {
        ASSERT_TRUE(f->is_nan(back)) << f->name << " NaN code " << hex(c) << " came back as " << hex(back);
        ASSERT_EQ(back & f->sign_bit(), c & f->sign_bit()) << f->name << " code " << hex(c);
      } else {
        ASSERT_EQ(back, c) << f->name;
      }
    }
  }
}

TEST(FloatTypes, FloatNaNStaysNaN) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),     -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN(), std::bit_cast<float>(0x7f800001u),
                        std::bit_cast<float>(0xffffffffu),           std::bit_cast<float>(0x7fc00001u)};
  for (const Narrow* f : kNarrow) {
    for (float x : nans) {
      const uint32_t c = f->encode(x);
      EXPECT_TRUE(f->is_nan(c)) << f->name << " from " << hex(std::bit_cast<uint32_t>(x)) << " gave " << hex(c);
      EXPECT_EQ((c & f->sign_bit()) != 0, std::signbit(x)) << f->name;
    }
  }
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

// Every midpoint between neighbouring values (exactly, and one fp32 ulp either side), plus a sweep over fp32.
TEST(FloatTypes, EncodeIsNearestEven) {
  std::mt19937_64 rng(1234);
  for (const Narrow* f : kNarrow) {
    const NearestEven ref(*f);
    std::vector<float> xs;
    const auto& v = ref.values();
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      const float mid = static_cast<float>((v[i] + v[i + 1]) / 2);
      ASSERT_EQ(static_cast<double>(mid), (v[i] + v[i + 1]) / 2) << "midpoint not exact in fp32";
      xs.push_back(mid);
      xs.push_back(std::nextafter(mid, 0.0f));
      xs.push_back(std::nextafter(mid, kInf));
      xs.push_back(static_cast<float>(v[i]));
    }
    const float top = static_cast<float>(v.back());
    const float step = static_cast<float>(v.back() - v[v.size() - 2]);
    for (float x : {top, top + step / 2, std::nextafter(top + step / 2, 0.0f), top + step, 1e30f,
                    std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 0.0f}) {
      xs.push_back(x);
    }
    for (uint64_t bits = 0; bits < 0x7f800000u; bits += 4099) xs.push_back(std::bit_cast<float>(uint32_t(bits)));
    for (int i = 0; i < 200000; ++i) xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x7f7fffffu));
    for (float x : xs) {
      for (float s : {x, -x}) {
        ASSERT_EQ(f->encode(s), ref(s)) << f->name << " of " << s << " (" << hex(std::bit_cast<uint32_t>(s)) << ")";
      }
    }
  }
}

TEST(FloatTypes, HalfSpotChecks) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);      // tie, even stays
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, odd rounds up
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // tie between max and 2^16: even is inf
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);             // tie with zero
  EXPECT_EQ(float_to_half(0x1.000002p-25f), 0x0001);      // just past the tie
  EXPECT_EQ(float_to_half(3 * 0x1p-25f), 0x0002);         // tie between 1 and 2 steps
  EXPECT_EQ(float_to_half(0x1p-14f - 0x1p-25f), 0x0400);  // tie between largest subnormal and smallest normal
  EXPECT_EQ(float_to_half(1e-30f), 0x0000);
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));
}

TEST(FloatTypes, Bf16SpotChecks) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);                     // tie, even stays
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);                 // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest finite
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie, odd rounds up
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(FloatTypes, E4M3SpotChecks) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xfe);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);  // would round to S.1111.111, which is NaN: saturates
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);       // smallest subnormal
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);      // tie with zero
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);  // tie between 1 and 2 steps
  EXPECT_EQ(float_to_e4m3(7 * 0x1p-9f), 0x07);   // largest subnormal
  EXPECT_EQ(float_to_e4m3(0x1p-6f), 0x08);       // smallest normal
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);       // tie, even stays
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);       // tie, odd rounds up
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent 1111 is a normal binade in E4M3
}

TEST(FloatTypes, E5M2SpotChecks) {
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7b);  // largest finite
  EXPECT_EQ(float_to_e5m2(61439.996f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7c);  // tie between max and 2^16: even is inf
  EXPECT_EQ(float_to_e5m2(-1e9f), 0xfc);
  EXPECT_EQ(float_to_e5m2(std::numeric_limits<float>::infinity()), 0x7c);
  EXPECT_EQ(float_to_e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(float_to_e5m2(0x1p-17f), 0x00);  // tie with zero
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3c);    // tie, even stays
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3e);    // tie, odd rounds up
  EXPECT_TRUE(std::isinf(e5m2_to_float(0x7c)));
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7d)));
  EXPECT_EQ(e5m2_to_float(0x7b), 57344.0f);
}

// ---- Reducer: reference model ----

struct TypeInfo {
  chorusDataType_t dtype;
  size_t size;
  bool is_float;
  bool is_signed;
};

TypeInfo info_of(chorusDataType_t dt) {
  const bool sgn = dt == chorusInt8 || dt == chorusInt32 || dt == chorusInt64;
  return {dt, dtype_size(dt), dtype_is_float(dt), sgn};
}

// Elements as raw bits in the low bytes of a uint64_t (little-endian host). Fixed-size copies, which compile to
// plain loads and stores.
template <size_t kSize>
uint64_t load_sized(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, kSize);
  return v;
}
uint64_t load_raw(const std::vector<uint8_t>& buf, size_t i, size_t size) {
  const uint8_t* p = buf.data() + i * size;
  switch (size) {
    case 1: return load_sized<1>(p);
    case 2: return load_sized<2>(p);
    case 4: return load_sized<4>(p);
    default: return load_sized<8>(p);
  }
}
void store_raw(std::vector<uint8_t>& buf, size_t i, size_t size, uint64_t v) {
  uint8_t* p = buf.data() + i * size;
  switch (size) {
    case 1: std::memcpy(p, &v, 1); break;
    case 2: std::memcpy(p, &v, 2); break;
    case 4: std::memcpy(p, &v, 4); break;
    default: std::memcpy(p, &v, 8); break;
  }
}

double decode(chorusDataType_t dt, uint64_t raw) {
  switch (dt) {
    case chorusFloat32: return std::bit_cast<float>(static_cast<uint32_t>(raw));
    case chorusFloat64: return std::bit_cast<double>(raw);
    default: return narrow_of(dt)->decode(static_cast<uint32_t>(raw));
  }
}
uint64_t encode(chorusDataType_t dt, double v) {
  switch (dt) {
    case chorusFloat32: return std::bit_cast<uint32_t>(static_cast<float>(v));
    case chorusFloat64: return std::bit_cast<uint64_t>(v);
    default: return narrow_of(dt)->encode(static_cast<float>(v));
  }
}
// Rounds to the compute type: fp64 for fp64, fp32 for everything else. Rounding an exact double result of one
// +, * or / of fp32 operands to fp32 equals the fp32 operation (double has more than 2 * 24 + 2 bits).
double to_calc(chorusDataType_t dt, double v) {
  return dt == chorusFloat64 ? v : static_cast<double>(static_cast<float>(v));
}

double ref_max(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return kNaN;
  if (x == y) return std::signbit(x) ? y : x;  // +0 > -0
  return x > y ? x : y;
}
double ref_min(double x, double y) {
  if (std::isnan(x) || std::isnan(y)) return kNaN;
  if (x == y) return std::signbit(x) ? x : y;
  return x < y ? x : y;
}

struct Case {
  ReduceSpec spec;
  bool input = false;  // b_is_input / src_is_input
  bool final = false;
};

uint64_t mask_of(size_t size) { return size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1; }
int64_t sign_extend(uint64_t v, size_t size) {
  if (size == 8) return static_cast<int64_t>(v);
  const int shift = 64 - 8 * static_cast<int>(size);
  return static_cast<int64_t>(v << shift) >> shift;
}

// One result element: combine (or, for copy, pass through) a and b.
uint64_t reference(const Case& c, const TypeInfo& t, uint64_t a, uint64_t b, bool is_copy) {
  const ReduceSpec& s = c.spec;
  const bool pm = s.premul && c.input;
  const bool dv = c.final && s.avg_divisor > 0;
  if (t.is_float) {
    const chorusDataType_t dt = t.dtype;
    double y = decode(dt, b);
    if (pm) y = to_calc(dt, y * to_calc(dt, s.scalar_f));
    // A product added to a partial is rounded to the type first, as the copy of it that a peer receives is.
    if (pm && !is_copy) y = decode(dt, encode(dt, y));
    double r = y;
    if (!is_copy) {
      const double x = decode(dt, a);
      switch (s.kind) {
        case ReduceKind::Sum: r = to_calc(dt, x + y); break;
        case ReduceKind::Prod: r = to_calc(dt, x * y); break;
        case ReduceKind::Max: r = ref_max(x, y); break;
        case ReduceKind::Min: r = ref_min(x, y); break;
      }
    }
    // A reduction's average divides the sum as the type holds it (rounded, saturated or overflowed).
    if (dv && !is_copy) r = decode(dt, encode(dt, r));
    if (dv) r = to_calc(dt, r / s.avg_divisor);
    return encode(dt, r);
  }
  const uint64_t mask = mask_of(t.size);
  uint64_t y = b;
  if (pm) y = (y * static_cast<uint64_t>(s.scalar_i)) & mask;
  uint64_t r = y;
  if (!is_copy) {
    const bool less = t.is_signed ? sign_extend(a, t.size) < sign_extend(y, t.size) : a < y;
    switch (s.kind) {
      case ReduceKind::Sum: r = (a + y) & mask; break;
      case ReduceKind::Prod: r = (a * y) & mask; break;
      case ReduceKind::Max: r = less ? y : a; break;
      case ReduceKind::Min: r = less ? a : y; break;
    }
  }
  if (dv) {
    if (t.is_signed) {
      r = static_cast<uint64_t>(sign_extend(r, t.size) / s.avg_divisor) & mask;  // C++ truncates toward zero
    } else {
      r = r / static_cast<uint64_t>(s.avg_divisor);
    }
  }
  return r;
}

bool same_result(const TypeInfo& t, uint64_t got, uint64_t want) {
  if (got == want) return true;
  return t.is_float && std::isnan(decode(t.dtype, got)) && std::isnan(decode(t.dtype, want));
}

// Mostly moderate values, some random bit patterns (NaN, inf, subnormals, extremes), and exact specials.
std::vector<uint8_t> random_data(const TypeInfo& t, size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> buf(n * t.size);
  std::uniform_real_distribution<double> moderate(-4.0, 4.0);
  const double specials[] = {0.0, -0.0, kInf, -kInf, kNaN, -kNaN, 1e-40, 448.0, 65504.0, 1e38, -3e38};
  for (size_t i = 0; i < n; ++i) {
    uint64_t raw = rng();
    if (t.is_float) {
      const uint64_t pick = raw % 64;
      if (pick < 2) {
        raw = encode(t.dtype, specials[(raw >> 8) % std::size(specials)]);
      } else if (pick < 8) {
        raw = (raw >> 8) & mask_of(t.size);
      } else {
        raw = encode(t.dtype, moderate(rng));
      }
    } else if (raw % 4 == 0) {
      raw = static_cast<uint64_t>(static_cast<int64_t>(raw >> 2) % 9 - 4) & mask_of(t.size);  // small, both signs
    }
    store_raw(buf, i, t.size, raw & mask_of(t.size));
  }
  return buf;
}

enum class Alias { None, DstIsA, DstIsB };

const char* kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Prod: return "prod";
    case ReduceKind::Max: return "max";
    case ReduceKind::Min: return "min";
  }
  return "?";
}

std::string describe(const Case& c, Alias alias, size_t n) {
  return cat(dtype_name(c.spec.dtype), " ", kind_name(c.spec.kind), " premul=", c.spec.premul, " input=", c.input,
             " avg_divisor=", c.spec.avg_divisor, " final=", c.final, " alias=", static_cast<int>(alias), " n=", n);
}

// Runs one reduce per aliasing mode and checks every element; returns false after the first reported mismatch.
bool check_reduce(const Case& c, const std::vector<uint8_t>& a0, const std::vector<uint8_t>& b0, size_t n) {
  const TypeInfo t = info_of(c.spec.dtype);
  // Kept across calls: reallocating megabytes per case costs more in page faults than the checks themselves.
  static std::vector<uint64_t> want;
  static std::vector<uint8_t> a, b, out;
  want.resize(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = reference(c, t, load_raw(a0, i, t.size), load_raw(b0, i, t.size), /*is_copy=*/false);
  }
  const Reducer r(c.spec);
  EXPECT_EQ(r.elem_size(), t.size);
  for (Alias alias : {Alias::None, Alias::DstIsA, Alias::DstIsB}) {
    a.assign(a0.begin(), a0.begin() + static_cast<ptrdiff_t>(n * t.size));
    b.assign(b0.begin(), b0.begin() + static_cast<ptrdiff_t>(n * t.size));
    out.assign(n * t.size, 0xa5);
    std::vector<uint8_t>& dst = alias == Alias::DstIsA ? a : alias == Alias::DstIsB ? b : out;
    // n == 0 passes null pointers: nothing may be touched.
    const auto ptr = [n](std::vector<uint8_t>& v) { return n == 0 ? nullptr : v.data(); };
    r.reduce(ptr(dst), ptr(a), ptr(b), n, c.input, c.final);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t got = load_raw(dst, i, t.size);
      if (!same_result(t, got, want[i])) {
        ADD_FAILURE() << describe(c, alias, n) << ": element " << i << " a=" << hex(load_raw(a0, i, t.size))
                      << " b=" << hex(load_raw(b0, i, t.size)) << " got " << hex(got) << " want " << hex(want[i]);
        return false;
      }
    }
  }
  return true;
}

bool check_copy(const Case& c, bool in_place, const std::vector<uint8_t>& src0, size_t n) {
  const TypeInfo t = info_of(c.spec.dtype);
  static std::vector<uint8_t> src, out;
  src.assign(src0.begin(), src0.begin() + static_cast<ptrdiff_t>(n * t.size));
  out.assign(n * t.size, 0x5a);
  std::vector<uint8_t>& dst = in_place ? src : out;
  const Reducer r(c.spec);
  r.copy(n == 0 ? nullptr : dst.data(), n == 0 ? nullptr : src.data(), n, c.input, c.final);
  const bool transform = (c.spec.premul && c.input) || (c.final && c.spec.avg_divisor > 0);
  if (!transform) {  // a memcpy: every bit, NaN payloads included
    const bool same = std::equal(dst.begin(), dst.end(), src0.begin());
    EXPECT_TRUE(same) << describe(c, Alias::None, n) << " plain copy is not bitwise";
    return same;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t want = reference(c, t, 0, load_raw(src0, i, t.size), /*is_copy=*/true);
    const uint64_t got = load_raw(dst, i, t.size);
    if (!same_result(t, got, want)) {
      ADD_FAILURE() << describe(c, Alias::None, n) << " copy in_place=" << in_place << ": element " << i
                    << " src=" << hex(load_raw(src0, i, t.size)) << " got " << hex(got) << " want " << hex(want);
      return false;
    }
  }
  return true;
}

ReduceSpec spec_for(chorusDataType_t dt, ReduceKind kind, bool premul, bool avg) {
  ReduceSpec s;
  s.dtype = dt;
  s.kind = kind;
  s.premul = premul;
  s.scalar_f = 0.3;                   // not exact in any format: the rounding of the scalar itself is exercised
  s.scalar_i = 0x123456789abcdef3ll;  // used modulo 2^bits
  s.avg_divisor = avg ? 3 : 0;
  return s;
}

// 1000003 = 15625 blocks of 64 and a tail of 3; 200 = 3 blocks and a tail of 8.
constexpr size_t kLarge = 1000003;
const size_t kSmallCounts[] = {0, 1, 7, 200};
const ReduceKind kKinds[] = {ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min};

class ReducerTest : public ::testing::TestWithParam<chorusDataType_t> {};

// Every kind x premul (off, on for input, on but operand not from input) x avg (off, final, divisor but not final)
// x aliasing, for small counts (tail-only and block paths).
TEST_P(ReducerTest, MatchesReferenceSmall) {
  const TypeInfo t = info_of(GetParam());
  std::mt19937_64 rng(42 + t.dtype);
  const auto a = random_data(t, 256, rng);
  const auto b = random_data(t, 256, rng);
  for (ReduceKind kind : kKinds) {
    for (int pm = 0; pm < 3; ++pm) {
      for (int avg = 0; avg < 3; ++avg) {
        Case c{spec_for(t.dtype, kind, pm > 0, avg > 0), pm == 1, avg == 1};
        for (size_t n : kSmallCounts) {
          if (!check_reduce(c, a, b, n)) return;
        }
      }
    }
  }
}

TEST_P(ReducerTest, MatchesReferenceLarge) {
  const TypeInfo t = info_of(GetParam());
  std::mt19937_64 rng(7 + t.dtype);
  const auto a = random_data(t, kLarge, rng);
  const auto b = random_data(t, kLarge, rng);
  for (ReduceKind kind : kKinds) {
    for (bool transform : {false, true}) {
      Case c{spec_for(t.dtype, kind, transform, transform), transform, transform};
      if (!check_reduce(c, a, b, kLarge)) return;
    }
  }
}

TEST_P(ReducerTest, CopyMatchesReference) {
  const TypeInfo t = info_of(GetParam());
  std::mt19937_64 rng(99 + t.dtype);
  const auto src = random_data(t, kLarge, rng);
  for (int pm = 0; pm < 3; ++pm) {
    for (int avg = 0; avg < 3; ++avg) {
      Case c{spec_for(t.dtype, ReduceKind::Sum, pm > 0, avg > 0), pm == 1, avg == 1};
      for (bool in_place : {false, true}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{200}, kLarge}) {
          // Specs whose premul or divisor does not apply are covered by the small counts.
          if (n == kLarge && (pm == 2 || avg == 2)) continue;
          if (!check_copy(c, in_place, src, n)) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReducerTest,
                         ::testing::Values(chorusInt8, chorusUint8, chorusInt32, chorusUint32, chorusInt64,
                                           chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16,
                                           chorusFloat8e4m3, chorusFloat8e5m2),
                         [](const ::testing::TestParamInfo<chorusDataType_t>& p) {
                           return std::string(dtype_name(p.param));
                         });

// ---- Reducer: targeted properties ----

// The vectorised codecs against the scalar ones: every code through sum with -0 (which leaves every value as it
// is), and every code times a spread of scalars (which reaches arbitrary fp32 values, ties and overflow).
TEST(Reducer, VectorCodecsMatchScalarForEveryCode) {
  std::mt19937_64 rng(5);
  for (const Narrow* f : kNarrow) {
    const size_t n = std::max<size_t>(f->num_codes(), 1024);
    const TypeInfo t = info_of(f->dtype);
    std::vector<uint8_t> codes(n * t.size);
    std::vector<uint8_t> neg_zero(n * t.size);
    for (size_t i = 0; i < n; ++i) {
      store_raw(codes, i, t.size, i % f->num_codes());
      store_raw(neg_zero, i, t.size, f->sign_bit());
    }
    std::vector<uint8_t> out(n * t.size);
    Reducer(spec_for(f->dtype, ReduceKind::Sum, false, false))
        .reduce(out.data(), codes.data(), neg_zero.data(), n, false, false);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t c = load_raw(codes, i, t.size);
      const uint64_t got = load_raw(out, i, t.size);
      if (f->is_nan(static_cast<uint32_t>(c))) {
        ASSERT_TRUE(f->is_nan(static_cast<uint32_t>(got))) << f->name << " code " << hex(c);
      } else {
        ASSERT_EQ(got, c) << f->name;
      }
    }
    std::vector<double> scalars = {1.0, -1.0, 0.5, 3.0, 1.0 / 3, 1.0000001, 0.9999999, 0x1p-10, 0x1p-20, 1e4, 1e-30};
    for (int i = 0; i < 100; ++i) {
      scalars.push_back(
          std::ldexp(std::uniform_real_distribution<double>(1.0, 2.0)(rng), static_cast<int>(rng() % 40) - 20));
    }
    for (double s : scalars) {
      ReduceSpec spec = spec_for(f->dtype, ReduceKind::Sum, true, false);
      spec.scalar_f = s;
      Reducer(spec).copy(out.data(), codes.data(), n, true, false);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t c = load_raw(codes, i, t.size);
        const float product = static_cast<float>(static_cast<double>(f->decode(static_cast<uint32_t>(c))) *
                                                 static_cast<double>(static_cast<float>(s)));
        const uint64_t want = f->encode(product);
        const uint64_t got = load_raw(out, i, t.size);
        ASSERT_TRUE(same_result(t, got, want))
            << f->name << " code " << hex(c) << " * " << s << ": got " << hex(got) << " want " << hex(want);
      }
    }
  }
}

// The bulk conversions (compressed collectives on fp16/bf16 data) give the scalar conversions' bits: every code
// widened, and random floats (NaN, inf, subnormals, ties) narrowed.
TEST(Reducer, BulkWidenAndNarrowMatchTheScalarConversions) {
  std::mt19937_64 rng(11);
  for (const Narrow* f : kNarrow) {
    const TypeInfo t = info_of(f->dtype);
    const size_t n = f->num_codes() + 7;  // not a multiple of any vector length
    std::vector<uint8_t> codes(n * t.size);
    for (size_t i = 0; i < n; ++i) store_raw(codes, i, t.size, i % f->num_codes());
    std::vector<float> wide(n);
    widen_to_float(f->dtype, codes.data(), wide.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float want = f->decode(static_cast<uint32_t>(i % f->num_codes()));
      ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(want)) << f->name << " code " << i;
    }
    std::vector<float> x(4099);
    for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    x[0] = kNaN;
    x[1] = -kInf;
    x[2] = 0x1p-140f;
    std::vector<uint8_t> narrow(x.size() * t.size);
    narrow_from_float(f->dtype, x.data(), narrow.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint64_t got = load_raw(narrow, i, t.size), want = f->encode(x[i]);
      if (f->is_nan(static_cast<uint32_t>(want))) {
        ASSERT_TRUE(f->is_nan(static_cast<uint32_t>(got))) << f->name << " " << x[i];
      } else {
        ASSERT_EQ(got, want) << f->name << " " << x[i];
      }
    }
  }
  std::vector<float> out(4);
  const int32_t ints[4] = {1, 2, 3, 4};
  EXPECT_THROW(widen_to_float(chorusInt32, ints, out.data(), 4), Error);
  EXPECT_THROW(narrow_from_float(chorusFloat64, out.data(), out.data(), 2), Error);
}

TEST(Reducer, MinMaxPropagateNaN) {
  for (chorusDataType_t dt :
       {chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16, chorusFloat8e4m3, chorusFloat8e5m2}) {
    const TypeInfo t = info_of(dt);
    const size_t n = 1000;  // blocks and a tail
    std::vector<uint8_t> a(n * t.size), b(n * t.size), out(n * t.size);
    for (size_t i = 0; i < n; ++i) {
      const double x = i % 3 == 0 ? kNaN : 1.0;
      const double y = i % 5 == 0 ? -kNaN : -2.0;
      store_raw(a, i, t.size, encode(dt, x));
      store_raw(b, i, t.size, encode(dt, y));
    }
    for (ReduceKind kind : {ReduceKind::Max, ReduceKind::Min}) {
      Reducer(spec_for(dt, kind, false, false)).reduce(out.data(), a.data(), b.data(), n, false, false);
      for (size_t i = 0; i < n; ++i) {
        const double got = decode(dt, load_raw(out, i, t.size));
        if (i % 3 == 0 || i % 5 == 0) {
          ASSERT_TRUE(std::isnan(got)) << dtype_name(dt) << " " << kind_name(kind) << " element " << i;
        } else {
          ASSERT_EQ(got, kind == ReduceKind::Max ? 1.0 : -2.0) << dtype_name(dt);
        }
      }
    }
  }
}

// -0 < +0, so min/max do not depend on the operand order.
TEST(Reducer, MinMaxOrderSignedZeros) {
  for (chorusDataType_t dt :
       {chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16, chorusFloat8e4m3, chorusFloat8e5m2}) {
    const TypeInfo t = info_of(dt);
    const size_t n = 130;
    std::vector<uint8_t> a(n * t.size), b(n * t.size), out(n * t.size);
    for (size_t i = 0; i < n; ++i) {
      store_raw(a, i, t.size, encode(dt, i % 2 ? 0.0 : -0.0));
      store_raw(b, i, t.size, encode(dt, i % 2 ? -0.0 : 0.0));
    }
    for (ReduceKind kind : {ReduceKind::Max, ReduceKind::Min}) {
      Reducer(spec_for(dt, kind, false, false)).reduce(out.data(), a.data(), b.data(), n, false, false);
      for (size_t i = 0; i < n; ++i) {
        const double got = decode(dt, load_raw(out, i, t.size));
        ASSERT_EQ(got, 0.0);
        ASSERT_EQ(std::signbit(got), kind == ReduceKind::Min) << dtype_name(dt) << " " << kind_name(kind) << " " << i;
      }
    }
  }
}

template <typename T>
void check_int_avg_truncates() {
  const chorusDataType_t dt = std::is_same_v<T, int8_t>    ? chorusInt8
                              : std::is_same_v<T, int32_t> ? chorusInt32
                                                           : chorusInt64;
  const size_t n = 100;
  std::vector<T> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(-7 - static_cast<int>(i % 50));
    b[i] = static_cast<T>(i % 2);
  }
  ReduceSpec spec = spec_for(dt, ReduceKind::Sum, false, true);
  spec.avg_divisor = 2;
  Reducer(spec).reduce(out.data(), a.data(), b.data(), n, false, true);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sum = static_cast<int64_t>(a[i]) + b[i];
    ASSERT_EQ(out[i], static_cast<T>(sum / 2)) << dtype_name(dt) << " " << i;
    ASSERT_LE(out[i], 0);
    if (sum % 2 != 0) {
      ASSERT_EQ(static_cast<int64_t>(out[i]) * 2 - 1, sum);  // -7/2 == -3, not -4
    }
  }
}

TEST(Reducer, IntegerAvgTruncatesTowardZero) {
  check_int_avg_truncates<int8_t>();
  check_int_avg_truncates<int32_t>();
  check_int_avg_truncates<int64_t>();
  // The sum wraps first: 100 + 100 is -56 in int8, halved to -28.
  int8_t a = 100, b = 100, out = 0;
  ReduceSpec spec = spec_for(chorusInt8, ReduceKind::Sum, false, true);
  spec.avg_divisor = 2;
  Reducer(spec).reduce(&out, &a, &b, 1, false, true);
  EXPECT_EQ(out, -28);
}

TEST(Reducer, IntegerWideDivisor) {
  // A divisor that does not fit the element type.
  std::vector<uint8_t> a(100, 200), b(100, 50), out(100);
  ReduceSpec spec = spec_for(chorusUint8, ReduceKind::Sum, false, true);
  spec.avg_divisor = 1000;
  Reducer(spec).reduce(out.data(), a.data(), b.data(), a.size(), false, true);
  for (uint8_t v : out) EXPECT_EQ(v, 0);
  spec.avg_divisor = 300;
  std::vector<int32_t> x(100, 1 << 30), y(100, 1 << 29), z(100);
  spec.dtype = chorusInt32;
  Reducer(spec).reduce(z.data(), x.data(), y.data(), x.size(), false, true);
  for (int32_t v : z) EXPECT_EQ(v, ((1 << 30) + (1 << 29)) / 300);
}

TEST(Reducer, Fp8SaturatesAndOverflows) {
  const size_t n = 70;
  std::vector<uint8_t> a(n, float_to_e4m3(448.0f)), b(n, float_to_e4m3(448.0f)), out(n);
  Reducer(spec_for(chorusFloat8e4m3, ReduceKind::Sum, false, false))
      .reduce(out.data(), a.data(), b.data(), n, false, false);
  for (uint8_t v : out) EXPECT_EQ(v, 0x7e);
  std::fill(a.begin(), a.end(), float_to_e5m2(57344.0f));
  std::fill(b.begin(), b.end(), float_to_e5m2(57344.0f));
  Reducer(spec_for(chorusFloat8e5m2, ReduceKind::Sum, false, false))
      .reduce(out.data(), a.data(), b.data(), n, false, false);
  for (uint8_t v : out) EXPECT_EQ(v, 0x7c);
}

TEST(Reducer, NarrowPremulRoundsTheProductAsAPeersCopyOfItIs) {
  // b * s = 2^-11 + 2^-22 rounds (a tie) to 2^-11 in fp16, and 1 + 2^-11 again ties down to 1. Kept in fp32, as the
  // reduction used to, it made 1 + 2^-11 + 2^-22, past the tie, which rounds up to 1 + 2^-10: then the rank that
  // adds its own input got another sum than the one that receives the product as a copy (rounded), and results
  // depended on which rank reduced an element (helper-78).
  const size_t n = 65;
  std::vector<uint16_t> a(n, float_to_half(1.0f)), b(n, float_to_half(1.0f)), out(n), sent(n), got(n);
  ReduceSpec spec = spec_for(chorusFloat16, ReduceKind::Sum, true, false);
  spec.scalar_f = 0x1p-11 + 0x1p-22;
  Reducer(spec).reduce(out.data(), a.data(), b.data(), n, true, false);
  for (uint16_t v : out) EXPECT_EQ(v, 0x3c00);
  Reducer(spec).copy(sent.data(), b.data(), n, true, false);  // what a peer sends
  Reducer(spec).reduce(got.data(), a.data(), sent.data(), n, false, false);
  EXPECT_EQ(got, out);
}

// Dividing by one is the identity, so a final copy with nothing else to apply is a plain (bitwise) copy.
TEST(Reducer, AvgOverOneRankIsIdentity) {
  std::vector<uint32_t> src(100), dst(100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0x7f800001u + static_cast<uint32_t>(i);  // signalling NaNs
  ReduceSpec spec = spec_for(chorusFloat32, ReduceKind::Sum, false, true);
  spec.avg_divisor = 1;
  Reducer(spec).copy(dst.data(), src.data(), src.size(), false, true);
  EXPECT_EQ(dst, src);
  std::vector<int32_t> a(100, -7), b(100, 2), out(100);
  spec.dtype = chorusInt32;
  Reducer(spec).reduce(out.data(), a.data(), b.data(), a.size(), false, true);
  for (int32_t v : out) EXPECT_EQ(v, -5);
}

TEST(Reducer, InvalidArgumentsThrow) {
  for (int dt : {static_cast<int>(chorusNumTypes), 15}) {
    ReduceSpec spec;
    spec.dtype = static_cast<chorusDataType_t>(dt);
    try {
      Reducer r(spec);
      ADD_FAILURE() << "dtype " << dt << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusInvalidArgument);
      EXPECT_EQ(e.subsys(), Subsys::Kernels);
    }
  }
  ReduceSpec spec;
  spec.avg_divisor = -1;
  EXPECT_THROW(Reducer{spec}, Error);
}

}  // namespace
}  // namespace chorus::kernels
