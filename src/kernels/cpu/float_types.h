// Conversions between fp32 and the 16/8-bit floating formats, round to nearest-even.
// Sources: IEEE 754-2008 binary16; bfloat16 (Google Brain); OCP 8-bit Floating Point Specification (OFP8) v1.0,
// E4M3 (no infinities, NaN = S.1111.111, max 448) and E5M2 (IEEE-like).
#pragma once

#include <cstdint>

namespace chorus::kernels {

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);
float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3(float f);  // saturates to +-448; NaN -> 0x7f
float e5m2_to_float(uint8_t v);
uint8_t float_to_e5m2(float f);  // overflow -> +-inf

}  // namespace chorus::kernels
