// Compressed collectives through the executor (ranks as threads): accuracy against an fp64 reference on normal
// and heavy-tailed data, every rank ending with the same bits, error feedback over a stream of gradients, the
// majority vote, and bad options.
#include <gtest/gtest.h>

#include <chorus/chorus.h>
#include <chorus/chorus.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tests/common/world.h"

namespace chorus::test {
namespace {

// Rank r's contribution: normal, or heavy-tailed (Student t with 4 degrees of freedom: finite variance, outliers
// of 10 sigma and more in every few thousand elements).
std::vector<float> contribution(int r, size_t count, bool heavy, uint64_t salt = 0) {
  std::mt19937_64 rng(1000003 * static_cast<uint64_t>(r) + 17 * salt + (heavy ? 7 : 0));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::chi_squared_distribution<double> chi2(4.0);
  std::vector<float> x(count);
  for (float& v : x) v = static_cast<float>(heavy ? normal(rng) / std::sqrt(chi2(rng) / 4.0) : normal(rng));
  return x;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// One case of the narrow-type test, for failure messages.
std::string cat_case(int n, chorusDataType_t dt, const char* coll, const char* algo, bool inplace, bool feedback) {
  return std::string("n=") + std::to_string(n) + (dt == chorusFloat16 ? " float16 " : " bfloat16 ") + coll + " " +
         (algo ? algo : "default") + (inplace ? " in place" : "") + (feedback ? " error feedback" : "");
}

struct Result {
  double error = 0;  // rank 0's relative L2 error
  bool identical = true;
};

// All-reduce (sum) of every rank's contribution with `codec` and schedule `algo` (nullptr: default).
Result compressed_allreduce(World& w, size_t count, bool heavy, chorusCodec_t codec, uint32_t block, const char* algo,
                            bool stochastic = false, bool rotation = false) {
  const int n = w.size();
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  std::vector<double> want(count, 0.0);
  for (int r = 0; r < n; ++r) {
    std::vector<float> x = contribution(r, count, heavy);
    for (size_t i = 0; i < count; ++i) want[i] += x[i];
  }
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> x = contribution(r, count, heavy);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(codec);
    z.block = block;
    z.stochastic_rounding = stochastic;
    z.seed = 42;
    z.rotation = rotation ? 1 : 0;
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.algorithm = algo;
    o.compression = &z;
    ASSERT_EQ(chorusAllReduceEx(x.data(), out[r].data(), count, chorusFloat32, chorusSum, &o, c, nullptr),
              chorusSuccess)
        << chorusGetLastError(c);
  });
  Result res;
  res.error = rel_l2(out[0], want);
  for (int r = 1; r < n; ++r) res.identical &= std::memcmp(out[r].data(), out[0].data(), count * sizeof(float)) == 0;
  return res;
}

TEST(Compression, Int8QuantizeOnceAccuracyAndSameBitsOnEveryRank) {
  const size_t count = 48 * 1024 + 77;  // not a multiple of the block or of the ranks
  for (int n : {2, 4, 8, 16}) {
    World& w = World::get(n);
    for (bool heavy : {false, true}) {
      Result q256 = compressed_allreduce(w, count, heavy, chorusCodecInt8, 256, "qonce");
      Result q32 = compressed_allreduce(w, count, heavy, chorusCodecInt8, 32, "qonce");
      Result ring = compressed_allreduce(w, count, heavy, chorusCodecInt8, 256, "ring");
      Result r256 = compressed_allreduce(w, count, heavy, chorusCodecInt8, 256, "qonce", false, true);
      Result r32 = compressed_allreduce(w, count, heavy, chorusCodecInt8, 32, "qonce", false, true);
      std::printf(
          "n=%-2d %-6s int8 rel L2 error: qonce block 256 %.2e (rotated %.2e), qonce block 32 %.2e (rotated "
          "%.2e), re-quantizing ring block 256 %.2e\n",
          n, heavy ? "heavy" : "normal", q256.error, r256.error, q32.error, r32.error, ring.error);
      // The issue's targets: block 256 <= 1.2e-2, block 32 <= 9e-3. Unrotated they hold on normal data; on
      // Student-t(4) data one outlier sets its whole block's scale (two quantizations at about the int8 absmax
      // limit each: block 256 measures 1.4-1.7e-2, block 32 about 9e-3 to 1e-2), bounded here at what it is. With the
      // Hadamard rotation an outlier is spread over its block and both targets hold on both kinds of data.
      EXPECT_LE(q256.error, heavy ? 2e-2 : 1.2e-2) << "n=" << n << " heavy=" << heavy;
      EXPECT_LE(q32.error, heavy ? 1.2e-2 : 9e-3) << "n=" << n << " heavy=" << heavy;
      EXPECT_LE(r256.error, 1.2e-2) << "n=" << n << " heavy=" << heavy;
      EXPECT_LE(r32.error, 9e-3) << "n=" << n << " heavy=" << heavy;
      EXPECT_GT(q256.error, 0.0);  // it did compress
      EXPECT_TRUE(q256.identical && q32.identical && ring.identical && r256.identical && r32.identical) << "n=" << n;
    }
  }
}

TEST(Compression, EveryCodecAndScheduleGivesTheSameBitsOnEveryRank) {
  World& w = World::get(4);
  const size_t count = 10000;
  struct Case {
    chorusCodec_t codec;
    double bound;  // relative L2 error on normal data, quantize once
  };
  for (Case k : {Case{chorusCodecInt8, 1.2e-2}, Case{chorusCodecFp8E4M3, 6e-2}, Case{chorusCodecInt4, 0.2},
                 Case{chorusCodecSign1, 1.0}}) {
    for (const char* algo : {"qonce", "ring"}) {
      for (bool sr : {false, true}) {
        if (sr && k.codec == chorusCodecSign1) continue;
        Result res = compressed_allreduce(w, count, false, k.codec, 0, algo, sr);
        EXPECT_TRUE(res.identical) << k.codec << " " << algo << " sr=" << sr;
        if (std::string(algo) == "qonce") {
          // Stochastic rounding is unbiased but adds variance: up to twice the squared error.
          EXPECT_LE(res.error, sr ? 1.5 * k.bound : k.bound) << k.codec << " sr=" << sr;
        }
        std::printf("codec %d %-5s stochastic=%d: rel L2 error %.2e\n", k.codec, algo, sr, res.error);
      }
    }
  }
}

TEST(Compression, SeveralHostsEveryScheduleWithTheSameBitsEverywhere) {
  // nullptr: the default, qonce (two-level: exact inside a host, quantize once across hosts).
  for (const std::vector<int>& shape : {std::vector<int>{2, 2}, std::vector<int>{3, 2, 3}}) {
    World& w = World::get_with_hosts(shape);
    for (const char* algo : {static_cast<const char*>(nullptr), "qonce-flat", "hier"}) {
      for (bool heavy : {false, true}) {
        Result res = compressed_allreduce(w, 30000, heavy, chorusCodecInt8, 256, algo);
        Result rot = compressed_allreduce(w, 30000, heavy, chorusCodecInt8, 256, algo, false, true);
        std::printf("hosts of %zu ranks %-10s %-6s int8 rel L2 error %.2e (rotated %.2e)\n", shape.size(),
                    algo ? algo : "(qonce)", heavy ? "heavy" : "normal", res.error, rot.error);
        EXPECT_TRUE(res.identical && rot.identical) << (algo ? algo : "default");
        EXPECT_LE(res.error, heavy ? 2e-2 : 1.2e-2) << (algo ? algo : "default");
        if (algo == nullptr) {
          EXPECT_LE(rot.error, 1.2e-2);
        }
        EXPECT_GT(res.error, 0.0);
      }
    }
  }
}

TEST(Compression, ReduceScatterAndAllGather) {
  World& w = World::get(4);
  const int n = 4;
  const size_t count = 5000;  // per rank
  std::vector<std::vector<float>> x(n);
  for (int r = 0; r < n; ++r) x[r] = contribution(r, count * n, false);
  std::vector<std::vector<float>> rs(n, std::vector<float>(count)), ag(n, std::vector<float>(count * n));
  w.run([&](int r, chorusComm_t c) {
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    ASSERT_EQ(chorusReduceScatterEx(x[r].data(), rs[r].data(), count, chorusFloat32, chorusSum, &o, c, nullptr),
              chorusSuccess)
        << chorusGetLastError(c);
    ASSERT_EQ(chorusAllGatherEx(x[r].data(), ag[r].data(), count, chorusFloat32, &o, c, nullptr), chorusSuccess)
        << chorusGetLastError(c);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<double> want(count, 0.0);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) want[i] += x[q][r * count + i];
    EXPECT_LE(rel_l2(rs[r], want), 9e-3) << "reduce-scatter rank " << r;  // one quantization per contribution
    std::vector<double> gathered;
    for (int q = 0; q < n; ++q) gathered.insert(gathered.end(), x[q].begin(), x[q].begin() + count);
    EXPECT_LE(rel_l2(ag[r], gathered), 9e-3) << "all-gather rank " << r;
    EXPECT_EQ(std::memcmp(ag[r].data(), ag[0].data(), ag[0].size() * sizeof(float)), 0) << "rank " << r;
  }
}

TEST(Compression, SignMajorityVote) {
  for (int n : {3, 4}) {
    World& w = World::get(n);
    const size_t count = 4099;
    std::vector<std::vector<float>> x(n), out(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r) x[r] = contribution(r, count, true);
    w.run([&](int r, chorusComm_t c) {
      chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecSignVote);
      chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
      o.compression = &z;
      ASSERT_EQ(chorusAllReduceEx(x[r].data(), out[r].data(), count, chorusFloat32, chorusSum, &o, c, nullptr),
                chorusSuccess)
          << chorusGetLastError(c);
    });
    for (size_t i = 0; i < count; ++i) {
      int votes = 0;
      for (int r = 0; r < n; ++r) votes += x[r][i] < 0 ? -1 : 1;
      const float want = votes < 0 ? -1.0f : 1.0f;  // a tie is +1 (the message has no zero)
      for (int r = 0; r < n; ++r) ASSERT_EQ(out[r][i], want) << "n=" << n << " element " << i << " rank " << r;
    }
  }
}

// The same stream of gradients all-reduced for 100 steps: the running sum of the compressed results against the
// exact running sum, with and without error feedback.
double running_sum_error(World& w, chorusCodec_t codec, bool feedback, bool rotation = false) {
  const int n = w.size();
  const size_t count = 8192;
  std::vector<double> exact(count, 0.0), got(count, 0.0);
  std::vector<std::vector<float>> residual(n, std::vector<float>(2 * count, 0.0f));
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  // Data parallelism: every rank's gradient is the same expected gradient plus its own noise of the same size.
  const std::vector<float> mean = contribution(0, count, false, 99);
  for (int step = 0; step < 100; ++step) {
    std::vector<std::vector<float>> g(n);
    for (int r = 0; r < n; ++r) {
      g[r] = contribution(r, count, false, static_cast<uint64_t>(step) + 1);
      for (size_t i = 0; i < count; ++i) g[r][i] += mean[i];
      for (size_t i = 0; i < count; ++i) exact[i] += g[r][i];
    }
    w.run([&](int r, chorusComm_t c) {
      chorusCompression_t z = CHORUS_COMPRESSION_INIT(codec);
      z.rotation = rotation ? 1 : 0;
      z.step = static_cast<uint64_t>(step);
      if (feedback) {
        z.error_feedback = residual[r].data();
        z.error_feedback_elems = residual[r].size();
      }
      chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
      o.algorithm = "qonce";
      o.compression = &z;
      ASSERT_EQ(chorusAllReduceEx(g[r].data(), out[r].data(), count, chorusFloat32, chorusSum, &o, c, nullptr),
                chorusSuccess)
          << chorusGetLastError(c);
    });
    for (size_t i = 0; i < count; ++i) got[i] += out[0][i];
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    num += (got[i] - exact[i]) * (got[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

TEST(Compression, ErrorFeedbackKeepsTheRunningSumClose) {
  World& w = World::get(4);
  const double int4_ef = running_sum_error(w, chorusCodecInt4, true);
  const double int4 = running_sum_error(w, chorusCodecInt4, false);
  // 1-bit: with the rotation (a fresh one every step, from z.step) and without.
  const double sign_ef = running_sum_error(w, chorusCodecSign1, true, true);
  const double sign = running_sum_error(w, chorusCodecSign1, false, true);
  const double plain_ef = running_sum_error(w, chorusCodecSign1, true);
  const double plain = running_sum_error(w, chorusCodecSign1, false);
  std::printf(
      "running sum after 100 steps, relative L2 error: int4 %.2e with feedback, %.2e without; "
      "1-bit rotated %.2e with feedback, %.2e without; 1-bit unrotated %.2e with feedback, %.2e without\n",
      int4_ef, int4, sign_ef, sign, plain_ef, plain);
  EXPECT_LE(int4_ef, 3e-3);
  EXPECT_GE(int4 / int4_ef, 5.0);
  EXPECT_LE(sign_ef, 3e-2);
  EXPECT_GE(sign / sign_ef, 5.0);
  // Unrotated, the residuals must grow until the block's scale reaches the largest persistent |mean| of the block
  // (codec_test.cc, CodecErrorFeedback.Sign1TwoLevelAcrossRanks): 3.7e-2 to 3.9e-2 measured.
  EXPECT_LE(plain_ef, 5e-2);
  EXPECT_GE(plain / plain_ef, 5.0);
}

TEST(Compression, NonBlockingExFormsGiveTheBlockingFormsBits) {
  World& w = World::get(4);
  const size_t count = 3000;  // per rank of the reduce-scatter and all-gather
  w.run([&](int r, chorusComm_t c) {
    const std::vector<float> x = contribution(r, count * 4, false);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    z.rotation = 1;
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.algorithm = "qonce";
    o.compression = &z;
    std::vector<float> ar(count * 4), ar_nb(count * 4), rs(count), rs_nb(count), ag(count * 4), ag_nb(count * 4);
    ASSERT_EQ(chorusAllReduceEx(x.data(), ar.data(), count * 4, chorusFloat32, chorusSum, &o, c, nullptr),
              chorusSuccess);
    ASSERT_EQ(chorusReduceScatterEx(x.data(), rs.data(), count, chorusFloat32, chorusSum, &o, c, nullptr),
              chorusSuccess);
    ASSERT_EQ(chorusAllGatherEx(x.data(), ag.data(), count, chorusFloat32, &o, c, nullptr), chorusSuccess);
    chorusRequest_t req[3] = {nullptr, nullptr, nullptr};
    ASSERT_EQ(chorusIallReduceEx(x.data(), ar_nb.data(), count * 4, chorusFloat32, chorusSum, &o, c, &req[0]),
              chorusSuccess)
        << chorusGetLastError(c);
    ASSERT_EQ(chorusIreduceScatterEx(x.data(), rs_nb.data(), count, chorusFloat32, chorusSum, &o, c, &req[1]),
              chorusSuccess);
    ASSERT_EQ(chorusIallGatherEx(x.data(), ag_nb.data(), count, chorusFloat32, &o, c, &req[2]), chorusSuccess);
    for (chorusRequest_t q : req) {
      EXPECT_EQ(chorusWait(q, -1), chorusSuccess);
      EXPECT_EQ(chorusRequestFree(q), chorusSuccess);
    }
    EXPECT_EQ(ar, ar_nb);
    EXPECT_EQ(rs, rs_nb);
    EXPECT_EQ(ag, ag_nb);
    // Bad options are reported by the call itself, and no request is made.
    z.codec = chorusCodecSignVote;
    chorusRequest_t bad = nullptr;
    EXPECT_EQ(chorusIallGatherEx(x.data(), ag_nb.data(), count, chorusFloat32, &o, c, &bad), chorusInvalidArgument);
    EXPECT_EQ(bad, nullptr);
  });
}

// A compressed call on fp16 or bf16 data is the float32 call on the same values (widened exactly), rounded to the
// caller's type once: bit for bit, on every rank, for each collective and schedule, in and out of place, with error
// feedback (the residual stays float32 and gets the same bits), blocking and non-blocking.
TEST(Compression, Float16AndBfloat16DataGetTheFloat32ResultRoundedOnce) {
  struct Case {
    const char* coll;
    const char* algo;
    bool inplace;
    bool feedback;
  };
  const std::vector<Case> cases = {
      {"allreduce", "qonce", false, false},     {"allreduce", "qonce", true, false},
      {"allreduce", "ring", false, false},      {"allreduce", nullptr, false, true},
      {"reducescatter", nullptr, false, false}, {"reducescatter", nullptr, true, true},
      {"allgather", nullptr, false, false},     {"allgather", nullptr, true, false},
      {"iallreduce", "qonce", false, true},
  };
  for (int n : {3, 4}) {
    World& w = World::get(n);
    const size_t count = 2 * 1024 + 37;  // per rank (reduce-scatter, all-gather) or in all (all-reduce)
    for (chorusDataType_t dt : {chorusFloat16, chorusBfloat16}) {
      const size_t ts = chorusTypeSize(dt);
      for (const Case& k : cases) {
        const std::string coll = k.coll;
        const bool rs = coll == "reducescatter", ag = coll == "allgather";
        const size_t in_elems = rs ? count * n : count, out_elems = ag ? count * n : count;
        const size_t ef_elems = rs ? count * n : 2 * count;
        std::vector<std::vector<uint8_t>> got(n);
        std::vector<std::vector<float>> want(n), ef_got(n), ef_want(n);
        w.run([&](int r, chorusComm_t c) {
          // This rank's input in the narrow type, and the same values as float32.
          const std::vector<float> x = contribution(r, in_elems, true, 5);
          std::vector<uint8_t> xn(in_elems * ts);
          std::vector<float> xw(in_elems);
          kernels::narrow_from_float(dt, x.data(), xn.data(), in_elems);
          kernels::widen_to_float(dt, xn.data(), xw.data(), in_elems);
          chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
          z.rotation = 1;
          chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
          o.algorithm = k.algo;
          o.compression = &z;
          auto call = [&](const void* in, void* out, chorusDataType_t t) {
            if (coll == "allreduce") return chorusAllReduceEx(in, out, count, t, chorusAvg, &o, c, nullptr);
            if (rs) return chorusReduceScatterEx(in, out, count, t, chorusSum, &o, c, nullptr);
            if (ag) return chorusAllGatherEx(in, out, count, t, &o, c, nullptr);
            chorusRequest_t q = nullptr;
            chorusResult_t res = chorusIallReduceEx(in, out, count, t, chorusSum, &o, c, &q);
            if (res != chorusSuccess) return res;
            res = chorusWait(q, -1);
            chorusRequestFree(q);
            return res;
          };
          // In place as NCCL defines it: all-gather's input at rank * count of the output, reduce-scatter's output
          // at rank * count of the input.
          const size_t in_at = ag ? r * count : 0, out_at = rs ? r * count : 0;
          const size_t buf_elems = std::max(in_elems, out_elems);
          std::vector<float> fw(buf_elems, -3.0f);
          if (k.feedback) {
            ef_want[r].assign(ef_elems, 0.0f);
            z.error_feedback = ef_want[r].data();
            z.error_feedback_elems = ef_elems;
          }
          if (k.inplace) {
            std::copy(xw.begin(), xw.end(), fw.begin() + in_at);
            ASSERT_EQ(call(fw.data() + in_at, fw.data() + out_at, chorusFloat32), chorusSuccess)
                << chorusGetLastError(c);
            want[r].assign(fw.begin() + out_at, fw.begin() + out_at + out_elems);
          } else {
            want[r].resize(out_elems);
            ASSERT_EQ(call(xw.data(), want[r].data(), chorusFloat32), chorusSuccess) << chorusGetLastError(c);
          }
          if (k.feedback) {
            ef_got[r].assign(ef_elems, 0.0f);
            z.error_feedback = ef_got[r].data();
          }
          std::vector<uint8_t> buf(buf_elems * ts, 0xa5);
          if (k.inplace) {
            std::copy(xn.begin(), xn.end(), buf.begin() + in_at * ts);
            ASSERT_EQ(call(buf.data() + in_at * ts, buf.data() + out_at * ts, dt), chorusSuccess)
                << chorusGetLastError(c);
            got[r].assign(buf.begin() + out_at * ts, buf.begin() + (out_at + out_elems) * ts);
          } else {
            got[r].assign(out_elems * ts, 0xa5);
            ASSERT_EQ(call(xn.data(), got[r].data(), dt), chorusSuccess) << chorusGetLastError(c);
          }
        });
        const std::string what = cat_case(n, dt, k.coll, k.algo, k.inplace, k.feedback);
        for (int r = 0; r < n; ++r) {
          std::vector<uint8_t> rounded(out_elems * ts);
          kernels::narrow_from_float(dt, want[r].data(), rounded.data(), out_elems);
          ASSERT_EQ(got[r], rounded) << what << " rank " << r;
          if (!rs) {
            ASSERT_EQ(got[r], got[0]) << what << " rank " << r;
          }
          if (k.feedback) {
            ASSERT_EQ(ef_got[r], ef_want[r]) << what << " rank " << r;
          }
        }
      }
    }
  }
}

// Ranks that pass different datatypes to one compressed call get an error on every rank instead of decoding
// each other's messages.
TEST(Compression, RanksWithDifferentDatatypesGetAnError) {
  World w(2);
  std::vector<std::string> errors(2);
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> x(4096, 1.0f), y(4096, 7.0f);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    // Same count: rank 0's float32 call and rank 1's bfloat16 call would send messages of the same size.
    const chorusDataType_t dt = r == 0 ? chorusFloat32 : chorusBfloat16;
    EXPECT_NE(chorusAllReduceEx(x.data(), y.data(), 2048, dt, chorusSum, &o, c, nullptr), chorusSuccess);
    errors[r] = chorusGetLastError(c);
  });
  // At least one side sees the other's call (the other may fail first, on the aborted connection).
  auto both = [](const std::string& e) {
    return e.find("count=2048, float,") != std::string::npos && e.find("count=2048, bfloat16,") != std::string::npos;
  };
  const bool named = both(errors[0]) || both(errors[1]);
  EXPECT_TRUE(named) << errors[0] << " | " << errors[1];
}

TEST(Compression, BadOptionsAreClearErrorsAndChangeNothing) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> x(1000, 1.0f), y(1000, 7.0f);
    std::vector<int32_t> xi(1000, 1), yi(1000, 7);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    auto expect_bad = [&](chorusResult_t res, const char* needle) {
      EXPECT_EQ(res, chorusInvalidArgument) << needle;
      EXPECT_NE(std::string(chorusGetLastError(c)).find(needle), std::string::npos) << chorusGetLastError(c);
    };
    expect_bad(chorusAllReduceEx(xi.data(), yi.data(), 1000, chorusInt32, chorusSum, &o, c, nullptr), "int32");
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusMax, &o, c, nullptr), "max");
    expect_bad(chorusAllToAllEx(x.data(), y.data(), 500, chorusFloat32, &o, c, nullptr), "compression");
    o.algorithm = "tree";
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "qonce");
    o.algorithm = nullptr;
    z.block = 100;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "block");
    z.block = 0;
    z.codec = static_cast<chorusCodec_t>(9);
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "codec=9");
    z.codec = chorusCodecSignVote;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusAvg, &o, c, nullptr), "sign_vote");
    expect_bad(chorusAllGatherEx(x.data(), y.data(), 500, chorusFloat32, &o, c, nullptr), "sign_vote");
    expect_bad(chorusReduceScatterEx(x.data(), y.data(), 500, chorusFloat32, chorusSum, &o, c, nullptr), "qonce");
    o.algorithm = "ring";
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "majority");
    o.algorithm = "hier";  // one host: nothing would be compressed
    z.codec = chorusCodecInt8;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "one host");
    o.algorithm = nullptr;
    z.codec = chorusCodecSign1;
    z.block = 1 << 20;  // a record of 4 MiB of float32 does not fit a slice
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "CHORUS_SLICE_BYTES");
    z.block = 0;
    z.codec = chorusCodecInt8;
    std::vector<float> ef(1999, 0.0f);
    z.error_feedback = ef.data();
    z.error_feedback_elems = ef.size();
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "error_feedback_elems=1999");
    z.error_feedback_elems = 2000;
    z.error_feedback = y.data();
    expect_bad(chorusAllReduceEx(x.data(), y.data() + 1000, 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "overlaps");
    z.error_feedback = ef.data();
    o.algorithm = "ring";
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "qonce");
    z.rotation = 2;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "rotation=2");
    z.rotation = 1;
    z.codec = chorusCodecSign1;
    z.block = 8192;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "power of two up to 4096");
    z.codec = chorusCodecSignVote;
    z.block = 0;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "rotation applies to");
    z.codec = chorusCodecInt8;
    z.block = 96;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr), "power of two");
    z.block = 0;
    z.rotation = 0;
    z.size = 8;
    expect_bad(chorusAllReduceEx(x.data(), y.data(), 1000, chorusFloat32, chorusSum, &o, c, nullptr),
               "CHORUS_COMPRESSION_INIT");
    for (float v : y) ASSERT_EQ(v, 7.0f);  // nothing was written
    for (int32_t v : yi) ASSERT_EQ(v, 7);
    for (float v : ef) ASSERT_EQ(v, 0.0f);
    // The communicator is still usable.
    ASSERT_EQ(chorusAllReduce(x.data(), y.data(), 1000, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    EXPECT_EQ(y[0], 2.0f) << "rank " << r;
  });
}

}  // namespace
}  // namespace chorus::test

namespace chorus::test {
namespace {

TEST(Compression, CppOptionsWithErrorFeedback) {
  chorus::UniqueId id = chorus::UniqueId::create();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      chorus::Comm comm(2, id, r);
      // Values with one distinct magnitude per block of 256, so int8 with one scale per block is exact.
      std::vector<float> x(512, 0.0f), y(512);
      for (size_t i = 0; i < x.size(); ++i) x[i] = (i < 256 ? 0.5f : -3.0f) * static_cast<float>(r + 1);
      std::vector<float> residual(2 * x.size(), 0.0f);
      chorusCompression_t z = chorus::Compression(chorusCodecInt8);
      z.error_feedback = residual.data();
      z.error_feedback_elems = residual.size();
      comm.all_reduce(std::span<const float>(x), std::span<float>(y), chorus::Op::Sum, {"qonce", &z});
      EXPECT_EQ(y[0], 1.5f);
      EXPECT_EQ(y[511], -9.0f);
      for (float e : residual) ASSERT_EQ(e, 0.0f);  // exact codes leave nothing behind
      chorusCompression_t bad = chorus::Compression(chorusCodecInt8);
      EXPECT_THROW(comm.all_reduce(std::span<float>(y), chorus::Op::Max, {nullptr, &bad}), chorus::CommError);
    });
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace chorus::test

namespace chorus::test {
namespace {

TEST(Compression, RanksWithDifferentCodecsGetAnErrorNamingBoth) {
  World w(2);
  std::vector<std::string> errors(2);
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> x(4096, 1.0f), y(4096);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(r == 0 ? chorusCodecInt8 : chorusCodecInt4);
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    EXPECT_NE(chorusAllReduceEx(x.data(), y.data(), x.size(), chorusFloat32, chorusSum, &o, c, nullptr), chorusSuccess);
    errors[r] = chorusGetLastError(c);
  });
  // At least one side sees the other's call (the other may fail first, on the aborted connection).
  const bool named = (errors[0].find("int8") != std::string::npos && errors[0].find("int4") != std::string::npos) ||
                     (errors[1].find("int8") != std::string::npos && errors[1].find("int4") != std::string::npos);
  EXPECT_TRUE(named) << errors[0] << " | " << errors[1];
  // Neither uses a seed: no seed/step hash is shown (it would differ with the block, pointing at the wrong field).
  for (const std::string& e : errors) EXPECT_EQ(e.find("seed/step#"), std::string::npos) << e;
}

TEST(Compression, RanksThatDifferOnlyInRotationGetAnErrorSayingSo) {
  World w(2);
  std::vector<std::string> errors(2);
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> x(4096, 1.0f), y(4096, 7.0f);
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    z.rotation = r == 0 ? 1 : 0;
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    EXPECT_EQ(chorusAllReduceEx(x.data(), y.data(), x.size(), chorusFloat32, chorusSum, &o, c, nullptr),
              chorusRemoteError);
    errors[r] = chorusGetLastError(c);
  });
  const bool named = errors[0].find("block=256 rotation") != std::string::npos ||
                     errors[1].find("block=256 rotation") != std::string::npos;
  EXPECT_TRUE(named) << errors[0] << " | " << errors[1];
}

}  // namespace
}  // namespace chorus::test
