// The correctness matrix over the local transport (ranks as threads): every collective x every algorithm of the
// table x ranks {1,2,3,4,5,7,8} x
// counts {0, 1, nranks-1, large} x in place and out of place x root {0, last} x every dtype and op where defined.
// Every rank holds distinct data and checks its own result. "large" is 1000003 elements in the largest buffer of a
// rank: the count itself for all-reduce, broadcast and reduce; ceil(1000003 / nranks) per rank for all-gather,
// reduce-scatter and all-to-all(v), whose buffers hold nranks blocks. The ranks are spread over emulated hosts
// (CHORUS_TOPO_FILE, uneven where the count allows: 3 + 5 for 8 ranks) so the hierarchical programs run with real
// host boundaries; the algorithm is forced per call (chorusCollOptions_t).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/dtype.h"
#include "kernels/cpu/reduce.h"
#include "runtime/executor.h"
#include "tests/common/data.h"
#include "tests/common/world.h"

namespace chorus::test {
namespace {

enum class CollT { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, AllToAllv, Gather, Scatter };
const char* coll_t_name(CollT c) {
  static const char* n[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                            "AllToAll",  "AllToAllv", "Gather", "Scatter"};
  return n[static_cast<int>(c)];
}
bool reduces(CollT c) { return c == CollT::AllReduce || c == CollT::Reduce || c == CollT::ReduceScatter; }
bool rooted(CollT c) {
  return c == CollT::Broadcast || c == CollT::Reduce || c == CollT::Gather || c == CollT::Scatter;
}

constexpr size_t kLarge = 1000003;

// Buffers reused across cases: fresh pages cost far more than the collectives (MACHINE-NOTES.md).
struct Pool {
  std::vector<std::vector<std::byte>> in, out, want;
  void size(int n, size_t in_bytes, size_t out_bytes) {
    in.resize(n);
    out.resize(n);
    want.resize(n);
    for (int r = 0; r < n; ++r) {
      if (in[r].size() < in_bytes + 64) in[r].resize(in_bytes + 64);
      if (out[r].size() < out_bytes + 64) out[r].resize(out_bytes + 64);
      if (want[r].size() < out_bytes + 64) want[r].resize(out_bytes + 64);
    }
  }
};
Pool& pool() {
  static Pool p;
  return p;
}

// all-to-allv: elements rank i sends to rank j.
size_t v_count(size_t count, int i, int j) { return count == 0 ? 0 : count * (1 + (i + 2 * j) % 3) / 2 + (i * j) % 2; }

// Values of one (collective, nranks, count, op) shared by every dtype, in place or not, and root: each rank's
// inputs and, for reductions, the exact reduced value of every element of the reduced vector.
struct Prepared {
  std::vector<std::vector<int8_t>> vals;  // [rank][element of the input]
  std::vector<int64_t> reduced;           // [element] (all-reduce/reduce: count; reduce-scatter: n * count)
  bool uns = false;
};

struct Case {
  CollT coll;
  int n;
  size_t count;  // per the API: all-gather and gather sendcount, reduce-scatter and scatter recvcount, all-to-all
                 // per peer
  bool in_place;
  int root;
  chorusDataType_t t;
  TestOp op;
  std::string algo;
  std::string str() const {
    return std::string(coll_t_name(coll)) + "/" + algo + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
           (in_place ? " in-place" : " out-of-place") + " root=" + std::to_string(root) + " " +
           std::to_string(static_cast<int>(t)) + "/" + test_op_name(op);
  }
};

void prepare(Prepared& pr, CollT coll, int n, size_t in_elems, size_t reduced_elems, TestOp op, bool uns) {
  pr.uns = uns;
  pr.vals.assign(n, std::vector<int8_t>(in_elems));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < in_elems; ++i) pr.vals[r][i] = static_cast<int8_t>(test_value(op, r, i, uns));
  pr.reduced.clear();
  if (!reduces(coll)) return;
  pr.reduced.resize(reduced_elems);
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < reduced_elems; ++i) {
    for (int q = 0; q < n; ++q) v[q] = pr.vals[q][i];
    pr.reduced[i] = reduce_values(op, v.data(), n);
  }
}

void run_case(World& w, const Case& c, const Prepared& pr) {
  const int n = c.n;
  const size_t esz = type_size(c.t), count = c.count;
  // Elements of each rank's input and output buffers.
  size_t in_elems = count, out_elems = count;
  std::vector<std::vector<size_t>> sdispl(n, std::vector<size_t>(n)), rdispl(n, std::vector<size_t>(n));
  std::vector<std::vector<size_t>> scount(n, std::vector<size_t>(n)), rcount(n, std::vector<size_t>(n));
  switch (c.coll) {
    case CollT::AllGather:
    case CollT::Gather: out_elems = count * n; break;
    case CollT::ReduceScatter:
    case CollT::Scatter: in_elems = count * n; break;
    case CollT::AllToAll: in_elems = out_elems = count * n; break;
    case CollT::AllToAllv: {
      // Blocks packed with a one-element gap, so displacements matter.
      in_elems = out_elems = 0;
      for (int i = 0; i < n; ++i) {
        size_t s = 0, r = 0;
        for (int j = 0; j < n; ++j) {
          scount[i][j] = v_count(count, i, j);
          sdispl[i][j] = s;
          s += scount[i][j] + 1;
          rcount[i][j] = v_count(count, j, i);
          rdispl[i][j] = r;
          r += rcount[i][j] + 1;
        }
        in_elems = std::max(in_elems, s);
        out_elems = std::max(out_elems, r);
      }
      break;
    }
    default: break;
  }
  Pool& p = pool();
  p.size(n, in_elems * esz, std::max(in_elems, out_elems) * esz);
  // Inputs (the in-place forms put them where the API expects them).
  for (int r = 0; r < n; ++r) {
    void* in = p.in[r].data();
    for (size_t i = 0; i < in_elems; ++i) store(c.t, in, i, pr.vals[r][i]);
    std::memset(p.out[r].data(), 0xA5, std::max(in_elems, out_elems) * esz);
    if (c.in_place) {
      switch (c.coll) {
        case CollT::AllGather:
        case CollT::Gather: std::memcpy(p.out[r].data() + r * count * esz, in, count * esz); break;
        case CollT::Broadcast:
        case CollT::Reduce: std::memcpy(p.out[r].data(), in, count * esz); break;
        default: std::memcpy(p.out[r].data(), in, in_elems * esz); break;
      }
    }
  }
  // Expected outputs.
  for (int r = 0; r < n; ++r) {
    void* want = p.want[r].data();
    switch (c.coll) {
      case CollT::AllReduce:
      case CollT::Reduce:
        if (c.coll == CollT::Reduce && r != c.root) {
          // Untouched: the sentinel, or the input in place.
          std::memcpy(want, c.in_place ? p.in[r].data() : p.out[r].data(), count * esz);
          break;
        }
        for (size_t i = 0; i < count; ++i) store_result(c.t, c.op, pr.reduced[i], n, want, i);
        break;
      case CollT::ReduceScatter:
        for (size_t i = 0; i < count; ++i) store_result(c.t, c.op, pr.reduced[r * count + i], n, want, i);
        break;
      case CollT::Broadcast: std::memcpy(want, p.in[c.root].data(), count * esz); break;
      case CollT::AllGather:
        for (int b = 0; b < n; ++b)
          std::memcpy(static_cast<std::byte*>(want) + b * count * esz, p.in[b].data(), count * esz);
        break;
      case CollT::AllToAll:
        for (int b = 0; b < n; ++b)
          std::memcpy(static_cast<std::byte*>(want) + b * count * esz, p.in[b].data() + r * count * esz, count * esz);
        break;
      case CollT::AllToAllv:
        std::memset(want, 0xA5, out_elems * esz);
        for (int b = 0; b < n; ++b)
          std::memcpy(static_cast<std::byte*>(want) + rdispl[r][b] * esz, p.in[b].data() + sdispl[b][r] * esz,
                      rcount[r][b] * esz);
        break;
      case CollT::Gather:
        if (r != c.root) {
          std::memcpy(want, p.out[r].data(), out_elems * esz);  // untouched: the sentinel (and the input in place)
          break;
        }
        for (int b = 0; b < n; ++b)
          std::memcpy(static_cast<std::byte*>(want) + b * count * esz, p.in[b].data(), count * esz);
        break;
      case CollT::Scatter: std::memcpy(want, p.in[c.root].data() + r * count * esz, count * esz); break;
    }
  }

  w.run([&](int r, chorusComm_t comm) {
    std::byte* in = p.in[r].data();
    std::byte* out = p.out[r].data();
    chorusRedOp_t op = chorusSum;
    if (reduces(c.coll)) {
      switch (c.op) {
        case TestOp::Sum: op = chorusSum; break;
        case TestOp::Prod: op = chorusProd; break;
        case TestOp::Max: op = chorusMax; break;
        case TestOp::Min: op = chorusMin; break;
        case TestOp::Avg: op = chorusAvg; break;
        case TestOp::PreMulSum: {
          std::byte scalar[8];
          store(c.t, scalar, 0, kPreMulScalar);
          ASSERT_EQ(chorusRedOpCreatePreMulSum(&op, scalar, c.t, chorusScalarHostImmediate, comm), chorusSuccess)
              << chorusGetLastError(comm);
          break;
        }
      }
    }
    const void* send = c.in_place ? out : in;
    chorusResult_t res = chorusInternalError;
    chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
    opt.algorithm = c.algo.c_str();
    switch (c.coll) {
      case CollT::AllReduce: res = chorusAllReduceEx(send, out, count, c.t, op, &opt, comm, nullptr); break;
      case CollT::Broadcast: res = chorusBroadcastEx(send, out, count, c.t, c.root, &opt, comm, nullptr); break;
      case CollT::Reduce: res = chorusReduceEx(send, out, count, c.t, op, c.root, &opt, comm, nullptr); break;
      case CollT::AllGather:
        res = chorusAllGatherEx(c.in_place ? out + r * count * esz : in, out, count, c.t, &opt, comm, nullptr);
        break;
      case CollT::ReduceScatter:
        res = chorusReduceScatterEx(c.in_place ? out : in, c.in_place ? out + r * count * esz : out, count, c.t, op,
                                    &opt, comm, nullptr);
        break;
      case CollT::AllToAll: res = chorusAllToAllEx(send, out, count, c.t, &opt, comm, nullptr); break;
      case CollT::AllToAllv:
        res = chorusAllToAllv(in, scount[r].data(), sdispl[r].data(), out, rcount[r].data(), rdispl[r].data(), c.t,
                              comm, nullptr);
        break;
      case CollT::Gather:  // in place: the input at its block of the output, on every rank (only the root's counts)
        res = chorusGatherEx(c.in_place ? out + r * count * esz : in, out, count, c.t, c.root, &opt, comm, nullptr);
        break;
      case CollT::Scatter:  // in place: the output at its block of the input
        res = chorusScatterEx(c.in_place ? out : in, c.in_place ? out + r * count * esz : out, count, c.t, c.root, &opt,
                              comm, nullptr);
        break;
    }
    if (c.op == TestOp::PreMulSum && reduces(c.coll)) {
      EXPECT_EQ(chorusRedOpDestroy(op, comm), chorusSuccess);
    }
    ASSERT_EQ(res, chorusSuccess) << c.str() << " rank " << r << ": " << chorusGetLastError(comm);
    const bool block_out = c.coll == CollT::ReduceScatter || c.coll == CollT::Scatter;
    const std::byte* got = block_out && c.in_place ? out + r * count * esz : out;
    size_t check = block_out ? count : out_elems;
    int64_t bad = first_mismatch(c.t, c.op, got, p.want[r].data(), check);
    ASSERT_EQ(bad, -1) << c.str() << " rank " << r << ": element " << bad << " is " << load(c.t, got, bad)
                       << ", expected " << load(c.t, p.want[r].data(), bad);
  });
}

// A run of chunks is one contiguous range: across the blocks of a uniform buffer, inside one block of explicit ones.
TEST(Layout, ARunOfChunksIsOneContiguousRange) {
  std::vector<float> buf(3 * 10);
  Layout l;
  l.elem_size = sizeof(float);
  l.set_uniform(algo::BufKind::Input, buf.data(), 3, 10, 4);  // parts of 2, 3, 2, 3 elements
  auto at = [&](Span s) { return static_cast<size_t>(reinterpret_cast<float*>(s.ptr) - buf.data()); };
  Span one = l.chunk({algo::BufKind::Input, 5, 1});  // block 1, part 1: elements 12..14
  EXPECT_EQ(at(one), 12u);
  EXPECT_EQ(one.elems, 3u);
  Span run = l.chunk({algo::BufKind::Input, 3, 4});  // block 0 part 3 to block 1 part 2: elements 7..16
  EXPECT_EQ(at(run), 7u);
  EXPECT_EQ(run.elems, 10u);
  Span all = l.chunk({algo::BufKind::Input, 0, 12});
  EXPECT_EQ(at(all), 0u);
  EXPECT_EQ(all.elems, 30u);
  std::vector<float> a(7), b(5);
  l.set_blocks(algo::BufKind::Output, {reinterpret_cast<std::byte*>(a.data()), reinterpret_cast<std::byte*>(b.data())},
               {7, 5}, 2);
  Span in_b = l.chunk({algo::BufKind::Output, 2, 2});  // all of block 1
  EXPECT_EQ(reinterpret_cast<float*>(in_b.ptr), b.data());
  EXPECT_EQ(in_b.elems, 5u);
}

algo::Coll to_coll(CollT c) {
  switch (c) {
    case CollT::AllReduce: return algo::Coll::AllReduce;
    case CollT::Broadcast: return algo::Coll::Broadcast;
    case CollT::Reduce: return algo::Coll::Reduce;
    case CollT::AllGather: return algo::Coll::AllGather;
    case CollT::ReduceScatter: return algo::Coll::ReduceScatter;
    case CollT::AllToAll: return algo::Coll::AllToAll;
    case CollT::AllToAllv: return algo::Coll::AllToAllv;
    case CollT::Gather: return algo::Coll::Gather;
    case CollT::Scatter: return algo::Coll::Scatter;
  }
  return algo::Coll::Count;
}

// Emulated hosts for n ranks: one host for 1, else two or three hosts, uneven where possible.
std::vector<int> host_shape(int n) {
  switch (n) {
    case 1: return {1};
    case 7: return {2, 2, 3};
    case 8: return {3, 5};
    default: return {n / 2, n - n / 2};
  }
}

using Param = std::tuple<CollT, int, std::string>;
class Collectives : public ::testing::TestWithParam<Param> {};

TEST_P(Collectives, Matrix) {
  const auto [coll, n, algorithm] = GetParam();
  World& w = World::get_with_hosts(host_shape(n));
  std::vector<size_t> counts = {0, 1, static_cast<size_t>(n - 1)};
  const bool blocks = coll == CollT::AllGather || coll == CollT::ReduceScatter || coll == CollT::AllToAll ||
                      coll == CollT::AllToAllv || coll == CollT::Gather || coll == CollT::Scatter;
  counts.push_back(blocks ? (kLarge + n - 1) / n : kLarge);
  std::vector<int> roots = {0};
  if (rooted(coll) && n > 1) roots.push_back(n - 1);
  // Gather's and scatter's blocks wrap around the root's buffer: a root in the middle too.
  if ((coll == CollT::Gather || coll == CollT::Scatter) && n > 2) roots.push_back(n / 2);
  for (size_t count : counts) {
    const size_t in_elems = (coll == CollT::ReduceScatter || coll == CollT::AllToAll || coll == CollT::Scatter)
                                ? count * n
                            : coll == CollT::AllToAllv ? 2 * count * n + n
                                                       : count;
    const size_t reduced_elems = coll == CollT::ReduceScatter ? count * n : count;
    for (TestOp op : kAllOps) {
      if (!reduces(coll) && op != TestOp::Sum) continue;
      Prepared pr[2];  // signed and unsigned values (they differ for min/max only)
      const bool minmax = op == TestOp::Max || op == TestOp::Min;
      prepare(pr[0], coll, n, in_elems, reduced_elems, op, false);
      if (minmax) prepare(pr[1], coll, n, in_elems, reduced_elems, op, true);
      for (chorusDataType_t t : kAllTypes) {
        for (bool in_place : {false, true}) {
          if (in_place && coll == CollT::AllToAllv) continue;  // not supported (documented)
          for (int root : roots) {
            Case c{coll, n, count, in_place, root, t, op, algorithm};
            SCOPED_TRACE(c.str());
            run_case(w, c, pr[minmax && is_unsigned(t) ? 1 : 0]);
            if (HasFatalFailure() || HasFailure()) return;
          }
        }
      }
    }
  }
}

std::vector<Param> every_algorithm() {
  std::vector<Param> v;
  for (CollT c : {CollT::AllReduce, CollT::Broadcast, CollT::Reduce, CollT::AllGather, CollT::ReduceScatter,
                  CollT::AllToAll, CollT::AllToAllv, CollT::Gather, CollT::Scatter})
    for (const algo::AlgorithmInfo& a : algo::algorithm_table())
      if (a.coll == to_coll(c))
        for (int n : {1, 2, 3, 4, 5, 7, 8}) v.emplace_back(c, n, a.name);
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Param>& info) {
  std::string s = coll_t_name(std::get<0>(info.param));
  s.append("_").append(std::get<2>(info.param)).append("_");
  s.append(std::to_string(std::get<1>(info.param))).append("ranks");
  return s;
}

// An average of 16/8-bit floats divides the sum as the type holds it, whichever algorithm (and so whichever step)
// divides: every algorithm, at sizes on both sides of the selector's thresholds, gives the same bits. The inputs are
// equal on every rank and their partial sums exact or saturated, so only the division could tell programs apart
// (it did: an e4m3 average of 8 x 448 was 56 with oneshot and 112 with the others; an fp16 one of 2 x 65504 was
// inf for small counts and 65504 for large ones).
TEST(Average, NarrowFloatsGiveTheSameBitsWithEveryAlgorithmAndSize) {
  struct Case {
    chorusDataType_t dtype;
    float value;
    int n;
  };
  for (Case k : {Case{chorusFloat8e4m3, 448.0f, 8}, Case{chorusFloat8e4m3, 448.0f, 2}, Case{chorusFloat16, 65504.0f, 2},
                 Case{chorusFloat16, 1.333984375f, 3}, Case{chorusFloat8e5m2, 57344.0f, 3}}) {
    World& w = World::get(k.n);
    const size_t ts = chorusTypeSize(k.dtype);
    // The sum the type holds (the partial sums before it are exact or already saturated), divided, rounded.
    uint16_t v = 0, sum = 0, want = 0;
    kernels::narrow_from_float(k.dtype, &k.value, &v, 1);
    const float exact = k.value * static_cast<float>(k.n);
    float held = 0;
    kernels::narrow_from_float(k.dtype, &exact, &sum, 1);
    kernels::widen_to_float(k.dtype, &sum, &held, 1);
    const float avg = held / static_cast<float>(k.n);
    kernels::narrow_from_float(k.dtype, &avg, &want, 1);
    const std::vector<std::pair<algo::Coll, std::vector<const char*>>> algos = {
        {algo::Coll::AllReduce, {nullptr, "ring", "oneshot", "tree", "rhd", "hier"}},
        {algo::Coll::ReduceScatter, {nullptr, "ring", "rhd", "pat", "hier"}},
        {algo::Coll::Reduce, {nullptr, "ring", "tree"}},
    };
    for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{65536}}) {
      for (const auto& [coll, names] : algos) {
        for (const char* name : names) {
          w.run([&](int r, chorusComm_t c) {
            const size_t in_elems = coll == algo::Coll::ReduceScatter ? count * k.n : count;
            std::vector<uint8_t> in(in_elems * ts), out(count * ts, 0);
            for (size_t i = 0; i < in_elems; ++i) std::memcpy(in.data() + i * ts, &v, ts);
            chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
            o.algorithm = name;
            chorusResult_t res = chorusSuccess;
            if (coll == algo::Coll::AllReduce)
              res = chorusAllReduceEx(in.data(), out.data(), count, k.dtype, chorusAvg, &o, c, nullptr);
            else if (coll == algo::Coll::ReduceScatter)
              res = chorusReduceScatterEx(in.data(), out.data(), count, k.dtype, chorusAvg, &o, c, nullptr);
            else
              res = chorusReduceEx(in.data(), out.data(), count, k.dtype, chorusAvg, k.n - 1, &o, c, nullptr);
            ASSERT_EQ(res, chorusSuccess) << chorusGetLastError(c);
            if (coll == algo::Coll::Reduce && r != k.n - 1) return;
            for (size_t i = 0; i < count; ++i) {
              uint16_t got = 0;
              std::memcpy(&got, out.data() + i * ts, ts);
              ASSERT_EQ(got, want) << algo::coll_name(coll) << " " << (name ? name : "(selector)") << " "
                                   << dtype_name(k.dtype) << " " << k.value << " x " << k.n << " count " << count
                                   << " rank " << r << " element " << i;
            }
          });
        }
      }
    }
  }
}

// A pre-multiplied 16-bit sum rounds every input's product to the type once, whichever rank adds it: a peer's
// product arrives rounded (it was sent as the type), and the rank's own used to enter unrounded, so an element's
// bits depended on which rank reduced its chunk, and so on its position and the count (helper-78, also under
// CHORUS_DETERMINISTIC=1). With 2 ranks the result is round(round(s x0) + round(s x1)) for every algorithm.
TEST(PreMulSum, NarrowFloatsRoundEveryProductOnceWhicheverRankAddsIt) {
  World& w = World::get(2);
  for (chorusDataType_t dtype : {chorusFloat16, chorusBfloat16}) {
    uint16_t scalar = 0;
    const float s = 0.3f;
    kernels::narrow_from_float(dtype, &s, &scalar, 1);
    float sf = 0;
    kernels::widen_to_float(dtype, &scalar, &sf, 1);
    auto round_to = [&](float v) {
      uint16_t h = 0;
      kernels::narrow_from_float(dtype, &v, &h, 1);
      return h;
    };
    auto wide = [&](uint16_t h) {
      float v = 0;
      kernels::widen_to_float(dtype, &h, &v, 1);
      return v;
    };
    // Element i of rank r: 1000 + 7 i on rank 0 and 0.27 + i / 64 on rank 1, where the two roundings matter.
    auto input = [&](int r, size_t i) {
      return round_to(r == 0 ? 1000.0f + 7.0f * (i % 97) : 0.27f + (i % 61) / 64.0f);
    };
    auto want = [&](size_t i) {
      return round_to(wide(round_to(sf * wide(input(0, i)))) + wide(round_to(sf * wide(input(1, i)))));
    };
    for (size_t count : {size_t{1}, size_t{2}, size_t{7}, size_t{4099}, size_t{70001}}) {
      for (const char* name : {static_cast<const char*>(nullptr), "ring", "oneshot", "tree", "rhd", "hier"}) {
        w.run([&](int r, chorusComm_t c) {
          std::vector<uint16_t> in(count), out(count, 0);
          for (size_t i = 0; i < count; ++i) in[i] = input(r, i);
          chorusRedOp_t op;
          ASSERT_EQ(chorusRedOpCreatePreMulSum(&op, &scalar, dtype, chorusScalarHostImmediate, c), chorusSuccess);
          chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
          o.algorithm = name;
          ASSERT_EQ(chorusAllReduceEx(in.data(), out.data(), count, dtype, op, &o, c, nullptr), chorusSuccess)
              << chorusGetLastError(c);
          ASSERT_EQ(chorusRedOpDestroy(op, c), chorusSuccess);
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(out[i], want(i)) << dtype_name(dtype) << " " << (name ? name : "(selector)") << " count " << count
                                       << " rank " << r << " element " << i;
        });
      }
    }
  }
}

// One-shot all-reduce: every rank evaluates the sum itself, so every rank's own contribution must enter it exactly
// as the others receive it. It did not: a pre-multiplied fp16 product was rounded on the wire but not at home
// (ranks differed in the last bit), and rank 0 added its operands in the other order (two NaNs: ranks kept
// different payloads).
TEST(OneShot, EveryRankEndsWithTheSameBits) {
  for (int n : {2, 3, 5, 8}) {
    World& w = World::get(n);
    const size_t count = 997;
    std::vector<std::vector<uint16_t>> half(n, std::vector<uint16_t>(count));
    std::vector<std::vector<uint32_t>> nan_sum(n, std::vector<uint32_t>(2)), nan_max(n, std::vector<uint32_t>(2));
    w.run([&](int r, chorusComm_t c) {
      std::vector<uint16_t> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<uint16_t>(0x3c00 + (i * 7 + r * 13) % 64);  // 1.0..
      uint16_t scalar = 0x3e00;                                                                         // 1.5
      chorusRedOp_t op;
      ASSERT_EQ(chorusRedOpCreatePreMulSum(&op, &scalar, chorusFloat16, chorusScalarHostImmediate, c), chorusSuccess);
      chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
      o.algorithm = "oneshot";
      ASSERT_EQ(chorusAllReduceEx(x.data(), half[r].data(), count, chorusFloat16, op, &o, c, nullptr), chorusSuccess)
          << chorusGetLastError(c);
      ASSERT_EQ(chorusRedOpDestroy(op, c), chorusSuccess);
      // Every rank a NaN with its own payload and sign, in both elements.
      const uint32_t mine = (r % 2 ? 0xffc00000u : 0x7fc00000u) | static_cast<uint32_t>(r + 1);
      std::vector<uint32_t> v = {mine, mine};
      ASSERT_EQ(chorusAllReduceEx(v.data(), nan_sum[r].data(), 2, chorusFloat32, chorusSum, &o, c, nullptr),
                chorusSuccess);
      ASSERT_EQ(chorusAllReduceEx(v.data(), nan_max[r].data(), 2, chorusFloat32, chorusMax, &o, c, nullptr),
                chorusSuccess);
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(half[r], half[0]) << "n=" << n << " rank " << r;
      EXPECT_EQ(nan_sum[r], nan_sum[0]) << "n=" << n << " rank " << r;
      EXPECT_EQ(nan_max[r], nan_max[0]) << "n=" << n << " rank " << r;
    }
    for (uint32_t v : nan_sum[0]) EXPECT_EQ(v & 0x7fc00000u, 0x7fc00000u) << "n=" << n;  // a NaN
  }
}

INSTANTIATE_TEST_SUITE_P(Local, Collectives, ::testing::ValuesIn(every_algorithm()), case_name);

}  // namespace
}  // namespace chorus::test
