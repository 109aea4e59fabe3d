// CPU compression codecs for compressed collectives: block-scaled int8, MX fp8 (E4M3 with E8M0 scales), int4 with
// an fp16 scale, 1-bit sign with a norm-preserving scale, and sign majority vote. docs/compression.md describes the
// formats byte by byte, their error bounds and the NaN/Inf policy.
//
// Shapes and units: `count` is always a number of fp32 elements; sizes of encoded messages are bytes. Input is fp32
// only (fp16/bf16 input is not supported yet: validate() rejects it). A message covers the elements of one encode
// call; its first block starts at element 0 of that call, so a schedule that encodes each rank's shard (or each
// slice of it) separately never has a block straddle two shards.
//
// Message layout: a sequence of records, each `record_elems(c)` elements (the last one may be shorter), each a
// multiple of 4 bytes long: the record's scales, then its codes. Hence, for any k that is a multiple of
// record_elems(c), the message of elements [0, n) is the message of [0, k) followed by that of [k, n) (encoded with
// first_elem += k and the residual advanced by k), and encoded_bytes(c, n) = encoded_bytes(c, k) +
// encoded_bytes(c, n - k). A schedule may cut a message at any record boundary. Scales and words are stored
// little-endian through memcpy, so no buffer needs any alignment.
//
// Error feedback (EF; Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "EF-SGD"): with a residual e of
// `count` floats, encode quantizes y = x + e and stores e := y - Q(y), so that the sum over steps of the decoded
// values tracks the sum of the inputs up to the current residual. 1-bit Adam's two-level feedback (Tang et al. 2021,
// Algorithm 1; also the compressed all-reduce of its code) uses two residuals per rank, both through encode():
//   - the worker residual: length = the rank's whole buffer, passed when the rank encodes its own gradient (every
//     shard it sends, each call with the residual advanced to that shard);
//   - the server residual: length = the shard this rank owns, passed when the owner re-encodes the reduced
//     (decode_accumulate'd, averaged) shard before sending it back out.
// The caller owns both buffers (they are plain floats: save and restore them with a checkpoint).
//
// Stochastic rounding (int8, fp8 e4m3, int4): the uniform variate for global element g = first_elem + i of a call
// is lane g % 4 of Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") at counter
// (g / 4 as 64 bits, step as 64 bits) under a 64-bit key mixed from (seed, rank). Equal (seed, step, rank, g) give
// equal bits on every machine; the rounding is unbiased up to 2^-16 of a quantisation step (fp32 addition drops
// the variate's last bits).
//
// Non-finite input: a block that holds a NaN or an Inf decodes entirely to NaN (its scale is stored as NaN: fp32
// NaN, fp16 NaN, or E8M0 0xFF as the OCP MX spec defines), so the failure stays visible after the sum, where an
// overflow check (e.g. a loss scaler's) sees it; the block's residual is left unchanged; encode() returns the number
// of such blocks. sign_vote has no scale: NaN votes +1, +-Inf vote their sign, and encode() returns the number of
// 32-element words that held a NaN. An all-zero block stores scale 0 (MX: scale code 0, i.e. 2^-127) and zero codes,
// and decodes to exact zeros.
//
// Thread-safety: every function is pure apart from its output arguments; concurrent calls on disjoint outputs are
// safe. Nothing allocates heap memory; encode uses up to about 64 KiB of stack (stochastic rounding's draws, and a
// rotated record with its signs).
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace chorus::kernels::codec {

enum class CodecKind : uint8_t {
  Int8,     // symmetric int8 [-127, 127], one fp32 scale (block max / 127) per block; block 32..1024, default 256
  Fp8E4M3,  // OCP MX (Microscaling Formats spec v1.0) MXFP8-E4M3: one E8M0 power-of-two scale per 32 elements
  Int4,     // symmetric int4 [-7, 7], one fp16 scale (block max / 7, rounded up) per 32 elements
  Sign1,    // 1 bit per element, one fp32 scale (L2 norm / sqrt(n)) per block (1-bit Adam's compressor)
  SignVote  // 1 bit per element, no scale: signSGD with majority vote (Bernstein et al. 2019)
};

// "int8", "fp8_e4m3", "int4", "sign1", "sign_vote".
const char* codec_name(CodecKind kind);
// The kind named `name` (codec_name's spellings); chorusInvalidArgument listing the known names otherwise.
CodecKind codec_kind_from_name(std::string_view name);
// The kind of the API's codec `c` (chorusCodecInt8 .. chorusCodecSignVote); the caller has checked the range.
CodecKind codec_kind(chorusCodec_t c);

struct Codec {
  CodecKind kind = CodecKind::Int8;
  // Elements per scale. 0 = the kind's default. int8: a multiple of 32 in [32, 1024] (default 256). fp8_e4m3 and
  // int4: 32 only (fixed by their formats). sign1: a multiple of 32 in [32, 2^30] (default 2048; a block at least
  // as long as the call gives one scale per call, 1-bit Adam's per-chunk scale). sign_vote: 0 only.
  uint32_t block = 0;
  bool stochastic_rounding = false;  // int8, fp8_e4m3, int4 only
  uint64_t seed = 0;                 // stochastic rounding key (with the rank); the rotation's signs
  // Randomized Hadamard rotation (int8, fp8_e4m3, int4, sign1): each whole record of R = record_elems() elements
  // (a power of two: int8 blocks 32, 64, ..., 1024; sign1 blocks 32, ..., 4096) is quantized as z = H D y / sqrt(R)
  // and decoded as y' = D H z' / sqrt(R), where H is the R x R Walsh-Hadamard matrix and D a diagonal of +-1 drawn
  // from `seed` (the same on every rank). The rotation is orthonormal, so the squared error is unchanged in total,
  // but an outlier is spread over the record instead of setting its block's scale: on heavy-tailed data the error
  // falls to about that of normal data (Suresh et al. 2017, "Distributed mean estimation with limited
  // communication"; the same preconditioning as QuaRot, Ashkboos et al. 2024). A collective draws D afresh every
  // step (the seed mixed with chorusCompression_t::step), which matters for error feedback with sign1: a direction
  // that persists over steps lands on other coordinates each step, so no coordinate's residual has to grow until
  // the block's scale reaches it. A shorter last record is quantized unrotated. Costs O(log R) operations per element
  // on each side; a non-finite value makes its whole record NaN, and so does a magnitude of 2^115 or more (the
  // unnormalised transform sums up to R = 2^12 magnitudes, which must stay below FLT_MAX); both count as non-finite.
  bool rotation = false;
};

// Per-call context of encode().
struct EncodeCtx {
  // Error-feedback residual: `count` floats, read and updated in place (e := x + e - Q(x + e)); nullptr = none.
  // Must not overlap `in` or `out`. Not allowed for sign_vote.
  float* residual = nullptr;
  uint64_t step = 0;        // stochastic rounding counter: the training step (or collective sequence number)
  uint32_t rank = 0;        // stochastic rounding key: the encoding rank
  uint64_t first_elem = 0;  // stochastic rounding counter: index of in[0] in the rank's buffer
};

// The seed a collective's codec draws its rotation from at training step `step` (Codec::rotation): a mix of both,
// so each step gets another D, and every rank that passes the same (seed, step) the same one.
uint64_t rotation_seed_for_step(uint64_t seed, uint64_t step);

// Throws chorus::Error(chorusInvalidArgument, Kernels) naming the bad field (kind, block, stochastic_rounding).
void validate(const Codec& c);
// validate(c), and also that the collective's dtype and op can use the codec: fp32, fp16 or bf16 (the codecs
// themselves read and write fp32: a compressed collective widens fp16/bf16 input first); sum or avg (codecs
// compress addends; prod, max, min are not sums and are refused).
void validate(const Codec& c, chorusDataType_t dtype, chorusRedOp_t op);

// The resolved block length in elements (the default applied); 32 for sign_vote (bits per word). Validates c.
uint32_t block_elems(const Codec& c);
// Elements per record of the message layout (int8, sign1: the block; fp8_e4m3: 128; int4: 64; sign_vote: 32).
size_t record_elems(const Codec& c);
// Exact size in bytes of the message for `count` elements (0 for count 0); always a multiple of 4.
size_t encoded_bytes(const Codec& c, size_t count);

// Encodes in[0, count) into out[0, encoded_bytes(c, count)). Returns the number of non-finite blocks (see above).
// Errors (chorusInvalidArgument, nothing written): an invalid codec, null in/out with count > 0, a residual for
// sign_vote, overlapping in / out / residual.
size_t encode(const Codec& c, const float* in, size_t count, std::byte* out, const EncodeCtx& ctx = {});
// out[i] = the decoded value of element i of a message of `count` elements. Any bytes decode without undefined
// behaviour (a code or scale that encode never writes decodes to its format's value, NaN included).
void decode(const Codec& c, const std::byte* in, size_t count, float* out);
// acc[i] += the decoded value (the product code * scale is rounded to fp32, then added: no fused multiply-add, so
// every machine gets the same bits). The owner of a shard accumulates each rank's message this way.
void decode_accumulate(const Codec& c, const std::byte* in, size_t count, float* acc);

// Majority vote (signSGD, Bernstein et al. 2019), for sign_vote messages:
// votes[i] += +1 or -1, the sign carried by element i of the message.
void vote_accumulate(const std::byte* in, size_t count, int32_t* votes);
// out[i] = +1 if votes[i] > 0, -1 if votes[i] < 0, 0 on a tie.
void vote_finalize(const int32_t* votes, size_t count, float* out);
// The majority as a sign_vote message of `count` elements (encoded_bytes(sign_vote, count) bytes): bit set where
// votes[i] < 0. A tie becomes +1 here (the message has no zero), so a schedule that all-gathers this message gets
// the same values on every rank only if the owner decodes it too instead of using vote_finalize's zeros.
void vote_encode_result(const int32_t* votes, size_t count, std::byte* out);

// Philox4x32-10 (Salmon et al. 2011): the block cipher behind stochastic rounding, exposed for its known-answer test.
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

}  // namespace chorus::kernels::codec
