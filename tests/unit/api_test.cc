// The public API beyond the collective matrix: bad input (a test per case, each a clear error naming the argument
// and no buffer touched), use after destroy, non-blocking requests, split, groups, misuse from two threads, and the
// C++ layer.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <chorus/chorus.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/config.h"
#include "core/error.h"
#include "kernels/cpu/reduce.h"
#include "tests/common/world.h"

namespace chorus::test {
namespace {

// A fresh communicator of N ranks, all in this process, each joining from its own thread.
template <size_t N>
void init_ranks(chorusComm_t (&c)[N]) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<std::thread> init;
  for (int r = 0; r < static_cast<int>(N); ++r)
    init.emplace_back([&, r] { ASSERT_EQ(chorusCommInitRank(&c[r], static_cast<int>(N), id, r), chorusSuccess); });
  for (auto& t : init) t.join();
}

void init_pair(chorusComm_t (&c)[2]) { init_ranks(c); }

// A fresh communicator of N ranks and a second one split from it (same ranks, same order).
template <size_t N>
void init_ranks_and_split(chorusComm_t (&world)[N], chorusComm_t (&other)[N]) {
  init_ranks(world);
  std::vector<std::thread> split;
  for (int r = 0; r < static_cast<int>(N); ++r)
    split.emplace_back([&, r] { ASSERT_EQ(chorusCommSplit(world[r], 0, r, &other[r]), chorusSuccess); });
  for (auto& t : split) t.join();
  for (chorusComm_t c : other) ASSERT_NE(c, nullptr);
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A buffer whose every byte is a sentinel, so "no buffer touched" can be checked.
struct Guarded {
  explicit Guarded(size_t n) : bytes(n, std::byte{0x5A}) {}
  bool untouched() const {
    for (std::byte b : bytes)
      if (b != std::byte{0x5A}) return false;
    return true;
  }
  std::vector<std::byte> bytes;
  void* data() { return bytes.data(); }
};

// Runs `call` on every rank of a 2-rank world; every rank must get `code` with `needle` in the error text and no
// buffer touched.
void expect_bad(const std::function<chorusResult_t(int, chorusComm_t, Guarded&, Guarded&)>& call, chorusResult_t code,
                const std::string& needle) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t comm) {
    Guarded in(4096), out(4096);
    chorusResult_t res = call(r, comm, in, out);
    EXPECT_EQ(res, code) << chorusGetLastError(comm);
    std::string text = chorusGetLastError(comm);
    EXPECT_NE(text.find(needle), std::string::npos) << "error text: " << text;
    EXPECT_TRUE(in.untouched());
    EXPECT_TRUE(out.untouched());
  });
  // The communicators are still healthy afterwards: bad input changes nothing.
  w.run([&](int r, chorusComm_t comm) {
    float v = 1.0f;
    ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    EXPECT_EQ(v, 2.0f);
  });
}

TEST(BadInput, NullSendBufferWithCount) {
  expect_bad(
      [](int, chorusComm_t c, Guarded&, Guarded& out) {
        return chorusAllReduce(nullptr, out.data(), 16, chorusFloat32, chorusSum, c, nullptr);
      },
      chorusInvalidArgument, "sendbuff");
}

TEST(BadInput, NullRecvBufferWithCount) {
  expect_bad([](int, chorusComm_t c, Guarded& in,
                Guarded&) { return chorusAllGather(in.data(), nullptr, 16, chorusFloat32, c, nullptr); },
             chorusInvalidArgument, "recvbuff");
}

TEST(BadInput, InvalidDatatype) {
  // Negative values too: the enum's bounds make every int a value of the type (no undefined load under UBSan).
  for (const int dtype : {42, -3}) {
    expect_bad(
        [dtype](int, chorusComm_t c, Guarded& in, Guarded& out) {
          return chorusAllReduce(in.data(), out.data(), 16, static_cast<chorusDataType_t>(dtype), chorusSum, c,
                                 nullptr);
        },
        chorusInvalidArgument, "datatype");
  }
}

TEST(BadInput, InvalidOp) {
  for (const int op : {77, -1}) {
    expect_bad(
        [op](int, chorusComm_t c, Guarded& in, Guarded& out) {
          return chorusReduceScatter(in.data(), out.data(), 16, chorusFloat32, static_cast<chorusRedOp_t>(op), c,
                                     nullptr);
        },
        chorusInvalidArgument, "op");
  }
}

TEST(BadInput, RootOutOfRange) {
  expect_bad([](int, chorusComm_t c, Guarded& in,
                Guarded& out) { return chorusBroadcast(in.data(), out.data(), 16, chorusFloat32, 2, c, nullptr); },
             chorusInvalidArgument, "root");
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded& out) {
        return chorusReduce(in.data(), out.data(), 16, chorusFloat32, chorusSum, -1, c, nullptr);
      },
      chorusInvalidArgument, "root");
}

TEST(BadInput, PeerOutOfRange) {
  expect_bad([](int, chorusComm_t c, Guarded& in,
                Guarded&) { return chorusSend(in.data(), 16, chorusFloat32, 5, c, nullptr); },
             chorusInvalidArgument, "peer");
  expect_bad([](int, chorusComm_t c, Guarded&,
                Guarded& out) { return chorusRecv(out.data(), 16, chorusFloat32, -1, c, nullptr); },
             chorusInvalidArgument, "peer");
}

// A send to itself needs a receive from itself of the same size, in the same call or group: checked before anything
// runs, so the communicator stays usable.
TEST(BadInput, SendToSelfWithoutAMatchingReceiveFromSelf) {
  expect_bad(
      [](int r, chorusComm_t c, Guarded& in, Guarded&) { return chorusSend(in.data(), 3, chorusInt32, r, c, nullptr); },
      chorusInvalidArgument, "send(s) to itself but 0 receive(s)");
  expect_bad(
      [](int r, chorusComm_t c, Guarded& in, Guarded& out) {
        chorusGroupStart();
        chorusSend(in.data(), 3, chorusInt32, r, c, nullptr);
        chorusRecv(out.data(), 2, chorusInt32, r, c, nullptr);
        return chorusGroupEnd();
      },
      chorusInvalidArgument, "to itself of 12 bytes meets a receive of 8 bytes");
}

TEST(BadInput, ErrorsNameTheRank) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    float x = 0;
    ASSERT_EQ(chorusSend(&x, 1, chorusFloat32, 5, c, nullptr), chorusInvalidArgument);
    const std::string text = chorusGetLastError(c);
    EXPECT_EQ(text.rfind("rank " + std::to_string(r) + ": peer=5", 0), 0u) << text;
  });
}

TEST(BadInput, UnknownAlgorithmOrOptionsSize) {
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded& out) {
        chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
        opt.algorithm = "bruck";  // an all-gather / all-to-all algorithm, not an all-reduce one
        return chorusAllReduceEx(in.data(), out.data(), 16, chorusFloat32, chorusSum, &opt, c, nullptr);
      },
      chorusInvalidArgument, "options->algorithm='bruck' is not an algorithm for AllReduce (known: ring, oneshot");
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded& out) {
        chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
        opt.size = 4;
        return chorusAllGatherEx(in.data(), out.data(), 4, chorusFloat32, &opt, c, nullptr);
      },
      chorusInvalidArgument, "options->size=4");
}

// One-shot is generated for at most 64 ranks: forcing it on 65 is a bad argument of that call, and the
// communicator keeps working.
TEST(BadInput, PerCallAlgorithmThatDoesNotApplyLeavesTheCommunicatorUsable) {
  World w(65);
  w.run([&](int r, chorusComm_t c) {
    float x = 1.0f;
    chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
    opt.algorithm = "oneshot";
    EXPECT_EQ(chorusAllReduceEx(&x, &x, 1, chorusFloat32, chorusSum, &opt, c, nullptr), chorusInvalidArgument);
    const std::string err = chorusGetLastError(c);
    EXPECT_NE(err.find("does not apply"), std::string::npos) << err;
    EXPECT_EQ(x, 1.0f);
    ASSERT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(x, 65.0f);
  });
}

TEST(BadInput, BadAlgoOverridesFailInitNamingTheVariable) {
  ScopedEnv algo("CHORUS_ALGO", "allreduce:0-64K:tree,64K-:nosuch");
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t comm = nullptr;
  EXPECT_EQ(chorusCommInitRank(&comm, 1, id, 0), chorusInvalidArgument);
  const std::string err = chorusGetLastError(nullptr);
  EXPECT_NE(err.find("CHORUS_ALGO"), std::string::npos) << err;
  EXPECT_NE(err.find("nosuch"), std::string::npos) << err;
}

// Settings read at a call's time used to pass init whatever their value (CHORUS_CUDA_DIRECT=abc would have failed
// every CUDA collective instead), and a topology dump that cannot be written did not say which setting named it.
TEST(BadInput, EverySettingIsCheckedAtInitAndNamed) {
  for (const auto& [name, value, text] :
       {std::make_tuple("CHORUS_CUDA_DIRECT", "7", "CHORUS_CUDA_DIRECT=7 must be 0 or 1"),
        std::make_tuple("CHORUS_CUDA_DIRECT", "abc", "CHORUS_CUDA_DIRECT='abc'"),
        std::make_tuple("CHORUS_TOPO_DUMP_FILE", "/nonexistent/dir/t.json",
                        "CHORUS_TOPO_DUMP_FILE=/nonexistent/dir/t.json: ")}) {
    ScopedEnv env(name, value);
    chorusUniqueId id;
    ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
    chorusComm_t comm = nullptr;
    EXPECT_EQ(chorusCommInitRank(&comm, 1, id, 0), chorusInvalidArgument) << name << "=" << value;
    const std::string err = chorusGetLastError(nullptr);
    EXPECT_NE(err.find(text), std::string::npos) << err;
  }
}

// A CHORUS_* variable that is not a setting changes nothing, so it is reported (a warning at init, the perf tools'
// header, chorus-info) with the setting nearest in spelling when one is close.
TEST(Settings, VariablesThatAreNoSettingAreFoundWithTheNearestName) {
  ScopedEnv typo("CHORUS_FP32_PARTIAL", "1");
  ScopedEnv swapped("CHORUS_TIMOEUT_MS", "5");
  ScopedEnv lower("CHORUS_nchannels", "2");
  ScopedEnv tie("CHORUS_NRANK", "4");
  ScopedEnv far("CHORUS_QQQQQQQQQQQQQ", "1");
  ScopedEnv empty("CHORUS_FIFODEPTH", "");
  ScopedEnv known("CHORUS_NCHANNELS", "2");
  ScopedEnv scripts("CHORUS_BUILD", "build/release");
  const std::vector<std::string> set_here = {typo.name_, swapped.name_, lower.name_, tie.name_,
                                             far.name_,  empty.name_,   known.name_, scripts.name_};
  std::vector<std::pair<std::string, std::string>> found;  // of the variables set here (the caller's may add more)
  for (const chorus::UnknownSetting& u : chorus::unknown_settings())
    if (std::find(set_here.begin(), set_here.end(), u.name) != set_here.end())
      found.emplace_back(u.name, u.suggestion());
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"CHORUS_FIFODEPTH", "did you mean CHORUS_FIFO_DEPTH?"},
      {"CHORUS_FP32_PARTIAL", "did you mean CHORUS_FP32_PARTIALS?"},
      {"CHORUS_NRANK", "did you mean CHORUS_RANK or CHORUS_NRANKS?"},
      {"CHORUS_QQQQQQQQQQQQQ", ""},
      {"CHORUS_TIMOEUT_MS", "did you mean CHORUS_TIMEOUT_MS?"},
      {"CHORUS_nchannels", "did you mean CHORUS_NCHANNELS?"},
  };
  EXPECT_EQ(found, expected);
}

// Ranks that force different algorithms for one call are told so (both fingerprints name the algorithm) instead of
// exchanging messages of two different programs.
TEST(Communicator, DifferentAlgorithmsForOneCallAreAMismatch) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  World w(3);
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> v(4096, 1.0f);
    chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
    opt.algorithm = r == 0 ? "ring" : "tree";
    chorusResult_t res = chorusAllReduceEx(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, &opt, c, nullptr);
    EXPECT_NE(res, chorusSuccess);
    const std::string err = chorusGetLastError(c);
    EXPECT_NE(err.find("algorithm="), std::string::npos) << err;
  });
}

TEST(BadInput, CountWhoseByteSizeOverflows) {
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded& out) {
        return chorusAllReduce(in.data(), out.data(), std::numeric_limits<size_t>::max() / 2, chorusFloat64, chorusSum,
                               c, nullptr);
      },
      chorusInvalidArgument, "overflows");
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded& out) {
        // sendcount * nranks overflows even though sendcount alone fits.
        return chorusAllGather(in.data(), out.data(), std::numeric_limits<size_t>::max() / 3 * 2, chorusInt8, c,
                               nullptr);
      },
      chorusInvalidArgument, "overflows");
}

TEST(BadInput, AllToAllvInPlace) {
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded&) {
        size_t counts[2] = {1, 1}, displs[2] = {0, 1};
        return chorusAllToAllv(in.data(), counts, displs, in.data(), counts, displs, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument, "in place");
}

TEST(BadInput, AllToAllvReceiveRegionsThatOverlap) {
  // Each element of the receive buffer is written at most once; touching regions are fine, and so are send regions
  // that overlap (they are only read).
  size_t counts[2] = {3, 2}, same[2] = {0, 0}, stride[2] = {0, 2};
  expect_bad(
      [&](int, chorusComm_t c, Guarded& in, Guarded& out) {
        return chorusAllToAllv(in.data(), counts, same, out.data(), counts, same, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument,
      "the receive regions of ranks 0 and 1 overlap (rdispls[0]=0, recvcounts[0]=3; rdispls[1]=0, recvcounts[1]=2)");
  expect_bad(
      [&](int, chorusComm_t c, Guarded& in, Guarded& out) {
        return chorusAllToAllv(in.data(), counts, same, out.data(), counts, stride, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument, "the receive regions of ranks 0 and 1 overlap");
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    size_t sc[2] = {2, 2}, sd[2] = {0, 0}, rc[2] = {2, 2}, rd[2] = {2, 0};
    const float in[2] = {static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
    float out[4] = {-1, -1, -1, -1};
    ASSERT_EQ(chorusAllToAllv(in, sc, sd, out, rc, rd, chorusFloat32, c, nullptr), chorusSuccess)
        << chorusGetLastError(c);
    // From rank 1 at 0..1, from rank 0 at 2..3; both ranks sent the same two elements to everyone.
    EXPECT_EQ(out[0], 10.0f);
    EXPECT_EQ(out[1], 11.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 1.0f);
  });
}

TEST(BadInput, OverlapThatIsNotTheInPlaceForm) {
  expect_bad(
      [](int, chorusComm_t c, Guarded& in, Guarded&) {
        auto* p = static_cast<std::byte*>(in.data());
        return chorusAllReduce(p, p + 8, 16, chorusFloat32, chorusSum, c, nullptr);
      },
      chorusInvalidArgument, "overlap");
  expect_bad(
      [](int r, chorusComm_t c, Guarded& in, Guarded&) {
        auto* p = static_cast<std::byte*>(in.data());
        // In place would be recvbuff == sendbuff + rank * recvcount * 4.
        return chorusReduceScatter(p, p + (1 - r) * 64, 16, chorusFloat32, chorusSum, c, nullptr);
      },
      chorusInvalidArgument, "in-place form");
}

TEST(BadInput, GatherAndScatterNameTheirArgumentsAtTheRoot) {
  for (int root : {2, -1}) {
    expect_bad(
        [root](int, chorusComm_t c, Guarded& in, Guarded& out) {
          return chorusGather(in.data(), out.data(), 16, chorusFloat32, root, c, nullptr);
        },
        chorusInvalidArgument, "root=");
    expect_bad(
        [root](int, chorusComm_t c, Guarded& in, Guarded& out) {
          return chorusScatter(in.data(), out.data(), 16, chorusFloat32, root, c, nullptr);
        },
        chorusInvalidArgument, "root=");
  }
  // Every rank its own root, so that every rank refuses the call (no peer is left waiting).
  expect_bad([](int r, chorusComm_t c, Guarded& in,
                Guarded&) { return chorusGather(in.data(), nullptr, 16, chorusFloat32, r, c, nullptr); },
             chorusInvalidArgument, "recvbuff is NULL");
  expect_bad([](int r, chorusComm_t c, Guarded&,
                Guarded& out) { return chorusScatter(nullptr, out.data(), 16, chorusFloat32, r, c, nullptr); },
             chorusInvalidArgument, "sendbuff is NULL");
  expect_bad(
      [](int r, chorusComm_t c, Guarded& in, Guarded&) {
        auto* p = static_cast<std::byte*>(in.data());
        return chorusGather(p + (1 - r) * 64, p, 16, chorusFloat32, r, c, nullptr);
      },
      chorusInvalidArgument, "sendbuff == recvbuff + root * sendcount");
  expect_bad(
      [](int r, chorusComm_t c, Guarded& in, Guarded&) {
        auto* p = static_cast<std::byte*>(in.data());
        return chorusScatter(p, p + (1 - r) * 64, 16, chorusFloat32, r, c, nullptr);
      },
      chorusInvalidArgument, "recvbuff == sendbuff + root * recvcount");
}

TEST(GatherScatter, TheBuffersOnlyTheRootUsesAreIgnoredElsewhere) {
  // MPI's and RCCL's rule: recvbuff of a gather and sendbuff of a scatter matter at the root only.
  World& w = World::get(3);
  w.run([&](int r, chorusComm_t comm) {
    const int root = 1;
    std::vector<int32_t> block(5), all(15, -1);
    for (int i = 0; i < 5; ++i) block[i] = 100 * r + i;
    ASSERT_EQ(chorusGather(block.data(), r == root ? all.data() : nullptr, 5, chorusInt32, root, comm, nullptr),
              chorusSuccess)
        << chorusGetLastError(comm);
    if (r == root) {
      for (int i = 0; i < 15; ++i) EXPECT_EQ(all[i], 100 * (i / 5) + i % 5) << i;
    }
    std::vector<int32_t> mine(5, -1);
    ASSERT_EQ(chorusScatter(r == root ? all.data() : nullptr, mine.data(), 5, chorusInt32, root, comm, nullptr),
              chorusSuccess)
        << chorusGetLastError(comm);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(mine[i], 100 * r + i) << i;
  });
}

// A one-rank init under `name`=`value` fails with chorusInvalidArgument, and the error contains "rank 0: " `needle`.
void expect_init_refused(const char* name, const char* value, const char* needle) {
  ScopedEnv bad(name, value);
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c = nullptr;
  EXPECT_EQ(chorusCommInitRank(&c, 1, id, 0), chorusInvalidArgument);
  // Each process of a launch prints its own error, so it names the rank.
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find(std::string("rank 0: ") + needle), std::string::npos)
      << chorusGetLastError(nullptr);
}

TEST(BadInput, TimeoutsBeyondTheClockAreNeverAndYieldOutOfRangeIsRefused) {
  {
    // About 317 years: a wait without end, not an overflow that ends every wait at once.
    ScopedEnv timeout("CHORUS_TIMEOUT_MS", "10000000000000");
    World w(2);
    w.run([&](int r, chorusComm_t c) {
      float x = 1.0f + r;
      ASSERT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess)
          << chorusGetLastError(c);
      EXPECT_EQ(x, 3.0f);
    });
  }
  expect_init_refused("CHORUS_YIELD_US", "4294967296", "CHORUS_YIELD_US=4294967296");  // 2^32: not truncated to 0
  // The whole text is the number (and a size's suffix): no space or '+' before it, as none is taken after it.
  expect_init_refused("CHORUS_NCHANNELS", " 2", "CHORUS_NCHANNELS=' 2' is not an integer");
  expect_init_refused("CHORUS_NCHANNELS", "+2", "CHORUS_NCHANNELS='+2' is not an integer");
  expect_init_refused("CHORUS_SLICE_BYTES", " 64K", "CHORUS_SLICE_BYTES=' 64K' is not a non-negative size");
  expect_init_refused("CHORUS_SLICE_BYTES", "64K ", "CHORUS_SLICE_BYTES='64K ' has an unknown suffix 'K '");
  expect_init_refused("CHORUS_TIMEOUT_MS", "99999999999999999999",
                      "CHORUS_TIMEOUT_MS='99999999999999999999' is out of range");
}

TEST(BadInput, EveryNullArgumentIsNamed) {
  EXPECT_EQ(chorusGetVersion(nullptr), chorusInvalidArgument);
  EXPECT_EQ(std::string(chorusGetLastError(nullptr)), "version is NULL");
  // All-to-allv: the array that is NULL, and the entry whose end overflows.
  size_t counts[2] = {1, 1}, displs[2] = {0, 1};
  expect_bad(
      [&](int, chorusComm_t c, Guarded& in, Guarded& out) {
        return chorusAllToAllv(in.data(), counts, displs, out.data(), counts, nullptr, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument, "rdispls is NULL");
  expect_bad(
      [&](int, chorusComm_t c, Guarded& in, Guarded& out) {
        size_t far[2] = {0, std::numeric_limits<size_t>::max()};
        return chorusAllToAllv(in.data(), counts, displs, out.data(), counts, far, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument, "rdispls[1] + recvcounts[1] overflows");
  expect_bad(
      [&](int, chorusComm_t c, Guarded& in, Guarded& out) {
        size_t huge[2] = {1, std::numeric_limits<size_t>::max() / 2};
        return chorusAllToAllv(in.data(), huge, displs, out.data(), counts, displs, chorusFloat32, c, nullptr);
      },
      chorusInvalidArgument, "sendcounts[1]=");
  // A device-resident scalar is refused in every build, saying what to use instead.
  expect_bad(
      [&](int, chorusComm_t c, Guarded&, Guarded&) {
        float scalar = 2.0f;
        chorusRedOp_t op;
        return chorusRedOpCreatePreMulSum(&op, &scalar, chorusFloat32, chorusScalarDevice, c);
      },
      chorusNotSupported, "pass the scalar's value with chorusScalarHostImmediate");
}

TEST(BadInput, NullCommunicator) {
  float v = 0;
  EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, nullptr, nullptr), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("comm"), std::string::npos);
  EXPECT_EQ(chorusCommDestroy(nullptr), chorusSuccess);  // as ncclCommDestroy(NULL)
}

// A forked child's copies of its parent's communicators and requests are refused, whatever it calls, and its calls
// leave the parent's communicators working.
TEST(Fork, AChildCannotUseDestroyOrAbortItsParentsCommunicators) {
  chorusComm_t c[2];
  ASSERT_EQ(chorusCommInitAll(c, 2), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<float> v0(64, 1.0f), v1(64, 2.0f);
  chorusRequest_t req = nullptr;
  ASSERT_EQ(chorusIallReduce(v0.data(), v0.data(), v0.size(), chorusFloat32, chorusSum, c[0], &req), chorusSuccess);
  const pid_t child = fork();
  if (child == 0) {
    // The exit status says which check failed (this child of a multithreaded process allocates: fine with glibc).
    int n = 0, done = 0;
    float x = 0;
    if (chorusCommCount(c[0], &n) != chorusInvalidUsage) _exit(2);
    if (chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c[1], nullptr) != chorusInvalidUsage) _exit(3);
    if (std::string(chorusGetLastError(nullptr)).find("forked") == std::string::npos) _exit(4);
    if (chorusTest(req, &done) != chorusInvalidUsage || chorusWait(req, -1) != chorusInvalidUsage) _exit(5);
    if (chorusRequestFree(req) != chorusInvalidUsage) _exit(6);
    if (chorusCommDestroy(c[0]) != chorusInvalidUsage || chorusCommAbort(c[1]) != chorusInvalidUsage) _exit(7);
    _exit(0);
  }
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ASSERT_EQ(chorusAllReduce(v1.data(), v1.data(), v1.size(), chorusFloat32, chorusSum, c[1], nullptr), chorusSuccess)
      << chorusGetLastError(c[1]);
  ASSERT_EQ(chorusWait(req, -1), chorusSuccess) << chorusGetLastError(c[0]);
  EXPECT_EQ(chorusRequestFree(req), chorusSuccess);
  EXPECT_EQ(v0, std::vector<float>(64, 3.0f));
  EXPECT_EQ(v1, std::vector<float>(64, 3.0f));
  std::thread t([&] { EXPECT_EQ(chorusCommDestroy(c[1]), chorusSuccess); });
  EXPECT_EQ(chorusCommDestroy(c[0]), chorusSuccess);
  t.join();
}

// chorusCommInitAll makes every rank of a job from one call, and one thread then drives them all in a group.
TEST(InitAll, EveryRankFromOneCallAndOneThreadDrivesThemInAGroup) {
  constexpr int N = 4;
  constexpr size_t count = 1000;
  chorusComm_t c[N] = {};
  ASSERT_EQ(chorusCommInitAll(c, N), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<std::vector<float>> data(N, std::vector<float>(count));
  for (int r = 0; r < N; ++r) {
    int rank = -1, n = 0;
    ASSERT_EQ(chorusCommUserRank(c[r], &rank), chorusSuccess);
    ASSERT_EQ(chorusCommCount(c[r], &n), chorusSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(n, N);
    for (size_t i = 0; i < count; ++i) data[r][i] = static_cast<float>((r + 1) * 1000 + i);
  }
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < N; ++r)
    ASSERT_EQ(chorusAllReduce(data[r].data(), data[r].data(), count, chorusFloat32, chorusSum, c[r], nullptr),
              chorusSuccess);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < N; ++r) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(data[r][i], static_cast<float>(10000 + 4 * i)) << "rank " << r << " element " << i;
    }
  }
  for (chorusComm_t comm : c) EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);
  // The C++ layer: element r is rank r.
  std::vector<chorus::Comm> comms = chorus::Comm::all(3);
  ASSERT_EQ(comms.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(comms[static_cast<size_t>(r)].rank(), r);
}

TEST(BadInput, InitAllNamesItsArgumentsAndLeavesCommsUntouched) {
  chorusComm_t c[2] = {reinterpret_cast<chorusComm_t>(0x1), reinterpret_cast<chorusComm_t>(0x2)};
  EXPECT_EQ(chorusCommInitAll(c, 0), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("nranks=0"), std::string::npos);
  EXPECT_EQ(chorusCommInitAll(nullptr, 2), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("comms is NULL"), std::string::npos);
  {
    // Every rank fails here (a bad setting): none is kept, the error is the rank's own code and names it.
    ScopedEnv algo("CHORUS_ALGO", "allreduce:0-:nosuch");
    EXPECT_EQ(chorusCommInitAll(c, 2), chorusInvalidArgument);
    const std::string err = chorusGetLastError(nullptr);
    EXPECT_NE(err.find(" of 2 failed to initialise: rank "), std::string::npos) << err;
    EXPECT_NE(err.find("CHORUS_ALGO"), std::string::npos) << err;
  }
  EXPECT_EQ(c[0], reinterpret_cast<chorusComm_t>(0x1));
  EXPECT_EQ(c[1], reinterpret_cast<chorusComm_t>(0x2));
}

// Two threads init as rank 1 of a 2-rank job. Whenever the second arrives (0-3 ms late: before the rendezvous
// completes, after, or after the job has ended and its root stopped), it is told it is a second rank 1 or that the
// rendezvous ended without it: never a lost root (chorusSystemError) or a timeout (helper-82).
TEST(BadInput, ARankThatJoinsTwiceIsToldSoWheneverItArrives) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "30000");
  for (int trial = 0; trial < 8; ++trial) {
    chorusUniqueId id;
    ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
    const int ranks[3] = {0, 1, 1};
    chorusResult_t result[3];
    std::string text[3];
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        if (t == 2) std::this_thread::sleep_for(std::chrono::milliseconds(trial % 4));  // arrive at other moments
        chorusComm_t c = nullptr;
        result[t] = chorusCommInitRank(&c, 2, id, ranks[t]);
        text[t] = chorusGetLastError(nullptr);
        if (result[t] == chorusSuccess) {
          EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
        }
      });
    for (auto& t : threads) t.join();
    int ok = 0;
    for (int t = 0; t < 3; ++t) {
      if (result[t] == chorusSuccess) {
        ++ok;
        continue;
      }
      EXPECT_TRUE(result[t] == chorusInvalidUsage || result[t] == chorusRemoteError)
          << "trial " << trial << " thread " << t << ": " << chorusGetErrorString(result[t]) << ": " << text[t];
      EXPECT_TRUE(text[t].find("rank 1 has already joined") != std::string::npos ||
                  text[t].find("have joined") != std::string::npos ||
                  text[t].find("ended while this rank was joining") != std::string::npos ||
                  text[t].find("this unique id was already used") != std::string::npos)
          << "trial " << trial << " thread " << t << ": " << text[t];
    }
    EXPECT_TRUE(ok == 0 || ok == 2) << "trial " << trial;
  }
}

TEST(BadInput, InvalidRankAtInit) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c = nullptr;
  EXPECT_EQ(chorusCommInitRank(&c, 2, id, 2), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("rank"), std::string::npos);
  EXPECT_EQ(chorusCommInitRank(&c, 0, id, 0), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("nranks"), std::string::npos);
  chorusUniqueId junk;
  std::memset(&junk, 0x42, sizeof(junk));
  EXPECT_EQ(chorusCommInitRank(&c, 1, junk, 0), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("unique id"), std::string::npos);
}

TEST(Communicator, UseAfterDestroyIsAnError) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c = nullptr;
  ASSERT_EQ(chorusCommInitRank(&c, 1, id, 0), chorusSuccess) << chorusGetLastError(nullptr);
  ASSERT_EQ(chorusCommDestroy(c), chorusSuccess);
  float v = 1;
  EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c, nullptr), chorusInvalidUsage);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("used after chorusCommDestroy or chorusCommAbort"),
            std::string::npos);
  int n = 0;
  EXPECT_EQ(chorusCommCount(c, &n), chorusInvalidUsage);
  EXPECT_EQ(chorusCommDestroy(c), chorusInvalidUsage);
}

TEST(Communicator, AbortFromAnotherThreadRacesCallsDestroyAndAbortSafely) {
  // chorusCommAbort may be called from any thread: against a loop of calls (which end with an error, then
  // chorusInvalidUsage, never a use after free: run under ASan), against a second abort, against a destroy (no
  // hang). 2-rank communicators, so calls really wait.
  for (int mode = 0; mode < 3; ++mode) {
    for (int it = 0; it < 20; ++it) {
      chorusComm_t c[2] = {nullptr, nullptr};
      init_pair(c);
      std::atomic<bool> go{false};
      std::vector<std::thread> threads;
      if (mode == 0) {
        // Rank 1 loops all-reduces with rank 0's loop; a watchdog aborts rank 0 while both are busy.
        for (int r = 0; r < 2; ++r)
          threads.emplace_back([&, r] {
            std::vector<float> x(64, 1.0f);
            while (!go) std::this_thread::yield();
            for (int k = 0; k < 2000; ++k) {
              const chorusResult_t rc =
                  chorusAllReduce(x.data(), x.data(), 64, chorusFloat32, chorusSum, c[r], nullptr);
              if (rc == chorusInvalidUsage) break;       // rank 0's handle after the abort
              if (rc != chorusSuccess && r == 1) break;  // rank 1 sees rank 0 fail
              ASSERT_TRUE(rc == chorusSuccess || r == 0) << rc;
            }
          });
        threads.emplace_back([&, it] {
          while (!go) std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::microseconds(50 + it * 37));
          EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
        });
      } else {
        for (int k = 0; k < 2; ++k)
          threads.emplace_back([&, k] {
            while (!go) std::this_thread::yield();
            const chorusResult_t rc = (mode == 2 && k == 1) ? chorusCommDestroy(c[0]) : chorusCommAbort(c[0]);
            EXPECT_TRUE(rc == chorusSuccess || rc == chorusInvalidUsage) << rc;
          });
      }
      go = true;
      for (auto& t : threads) t.join();
      float v = 1;
      EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c[0], nullptr), chorusInvalidUsage);
      chorusCommAbort(c[1]);
    }
  }
}

TEST(Communicator, ACallLongerThanTheTimeoutWhileDataMovesSaysSo) {
  // CHORUS_TIMEOUT_MS bounds a whole call. One that runs past it while its slices still arrive (here a large
  // all-reduce over tcp in 16 KiB slices under a 250 ms timeout: about 0.5 s on the 2-core machine) used to read
  // like a stopped peer ("it is not receiving"); it now says data still moved and what to raise (helper-79, a slow
  // link between emulated hosts).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "250");
  ScopedEnv tcp("CHORUS_TRANSPORTS", "tcp");
  ScopedEnv slices("CHORUS_SLICE_BYTES", "16K");
  chorusComm_t c[2];
  init_pair(c);
  const size_t count = size_t{128} << 20;  // 512 MiB of floats per rank
  std::vector<chorusResult_t> warm(2), res(2);
  std::vector<std::string> err(2);
  std::vector<std::thread> ranks;
  std::barrier filled(2);
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      std::vector<float> x(count, 1.0f);
      filled.arrive_and_wait();  // then connect, within the timeout
      float one = 1;
      warm[r] = chorusAllReduce(&one, &one, 1, chorusFloat32, chorusSum, c[r], nullptr);
      if (warm[r] != chorusSuccess) return;
      res[r] = chorusAllReduce(x.data(), x.data(), count, chorusFloat32, chorusSum, c[r], nullptr);
      err[r] = chorusGetLastError(c[r]);
    });
  for (auto& t : ranks) t.join();
  for (chorusComm_t comm : c) chorusCommAbort(comm);
  if (warm[0] != chorusSuccess || warm[1] != chorusSuccess)
    GTEST_SKIP() << "this machine is too loaded to connect within 250 ms";
  if (res[0] == chorusSuccess && res[1] == chorusSuccess) GTEST_SKIP() << "512 MiB over tcp took under 250 ms here";
  bool said = false;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(res[r] == chorusTimeout || res[r] == chorusRemoteError) << err[r];  // the first to time out tells
    said |= err[r].find("data still moved") != std::string::npos &&
            err[r].find("CHORUS_TIMEOUT_MS bounds each whole call") != std::string::npos;
  }
  EXPECT_TRUE(said) << err[0] << "\n" << err[1];
}

TEST(Communicator, ACallThatAnAbortEndsSaysSo) {
  // Rank 0 waits in an all-reduce that rank 1 never calls; a watchdog aborts rank 0. The call's error is the abort
  // (chorusInvalidUsage), not a remote error blaming rank 1 for the closed bootstrap connection, as it sometimes was.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  for (int it = 0; it < 5; ++it) {
    chorusComm_t c[2];
    init_pair(c);
    std::thread watchdog([&, it] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200 + 40 * it));
      EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
    });
    float x = 1;
    EXPECT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c[0], nullptr), chorusInvalidUsage);
    const std::string err = chorusGetLastError(nullptr);
    // (On a loaded machine the abort may come before the call starts: then the handle is already gone.)
    EXPECT_TRUE(err.find("communicator was aborted") != std::string::npos ||
                err.find("not a live communicator") != std::string::npos)
        << err;
    EXPECT_EQ(err.find("rank 1"), std::string::npos) << err;
    watchdog.join();
    EXPECT_EQ(chorusCommAbort(c[1]), chorusSuccess);
  }
}

TEST(Communicator, AnAbortEndsADestroyThatWaitsForQueuedWork) {
  // Rank 0 queues an all-reduce rank 1 never joins, then destroys: the destroy waits for the queued work. A
  // watchdog's abort must end that wait at once (it used to find the handle retired, chorusInvalidUsage, and the
  // destroy waited out the timeout).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  chorusComm_t c[2];
  init_pair(c);
  float x = 1;
  chorusRequest_t req = nullptr;
  ASSERT_EQ(chorusIallReduce(&x, &x, 1, chorusFloat32, chorusSum, c[0], &req), chorusSuccess);
  const auto start = std::chrono::steady_clock::now();
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess) << chorusGetLastError(nullptr);
  });
  const chorusResult_t rc = chorusCommDestroy(c[0]);
  watchdog.join();
  EXPECT_TRUE(rc == chorusSuccess || rc == chorusInvalidUsage) << rc;  // whichever of the two freed it
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the destroy waited out the timeout";
  int done = 0;
  EXPECT_NE(chorusTest(req, &done), chorusSuccess);  // failed by the abort
  EXPECT_EQ(done, 1);
  EXPECT_EQ(chorusRequestFree(req), chorusSuccess);
  EXPECT_EQ(chorusCommAbort(c[1]), chorusSuccess);
}

TEST(Communicator, ASplitAfterAPeerDestroyedItsCommunicatorFailsAtOnceNamingIt) {
  // Rank 2 destroys its communicator while ranks 0 and 1 split: the split's exchange can never complete, and the
  // root tells them so at once (it used to wait until the timeout).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  chorusComm_t c[3] = {nullptr, nullptr, nullptr};
  init_ranks(c);
  ASSERT_EQ(chorusCommDestroy(c[2]), chorusSuccess);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> split;
  for (int r = 0; r < 2; ++r)
    split.emplace_back([&, r] {
      chorusComm_t sub = nullptr;
      EXPECT_EQ(chorusCommSplit(c[r], 0, r, &sub), chorusRemoteError);
      const std::string err = chorusGetLastError(c[r]);
      EXPECT_NE(err.find("rank(s) 2 left (destroyed the communicator)"), std::string::npos) << err;
      EXPECT_EQ(sub, nullptr);
    });
  for (auto& t : split) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the split waited out the timeout";
  for (int r = 0; r < 2; ++r) EXPECT_EQ(chorusCommAbort(c[r]), chorusSuccess);
}

TEST(PointToPoint, ASendToAPeerThatDestroyedItsCommunicatorFailsAtOnceNamingIt) {
  // Ranks 2 and then 1 destroy their communicators; rank 0 then sends to rank 1: the send fails at once naming it
  // (it used to wait for the connection until the timeout, blaming a collective it had not called). Rank 1's leave
  // note equals rank 2's, so the root does not pass it on as they leave: rank 0 learns it from the root's answer to
  // its connection request.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  chorusComm_t c[3] = {nullptr, nullptr, nullptr};
  init_ranks(c);
  ASSERT_EQ(chorusCommDestroy(c[2]), chorusSuccess);
  ASSERT_EQ(chorusCommDestroy(c[1]), chorusSuccess);
  const auto start = std::chrono::steady_clock::now();
  int32_t x = 7;
  EXPECT_EQ(chorusSend(&x, 1, chorusInt32, 1, c[0], nullptr), chorusRemoteError);
  std::string err = chorusGetLastError(c[0]);
  EXPECT_NE(err.find("rank 1 destroyed its communicator"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the send waited out the timeout";
  EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
}

TEST(PointToPoint, AReceiveFromAPeerThatDestroyedItsCommunicatorSinceTheirLastExchangeNamesIt) {
  // Ranks 0 and 1 exchange (so they are connected), then rank 1 destroys its communicator and rank 0 waits to
  // receive from it: the error says rank 1 left (it said only "timed out waiting for data from rank 1", or over tcp
  // "closed by the peer (process died or aborted)": point-to-point errors did not read the leave notes).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "3000");
  chorusComm_t c[2] = {nullptr, nullptr};
  init_pair(c);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      int32_t out = r, in = -1;
      ASSERT_EQ(chorusGroupStart(), chorusSuccess);
      chorusSend(&out, 1, chorusInt32, 1 - r, c[r], nullptr);
      chorusRecv(&in, 1, chorusInt32, 1 - r, c[r], nullptr);
      ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c[r]);
      EXPECT_EQ(in, 1 - r);
    });
  for (auto& t : ranks) t.join();
  ASSERT_EQ(chorusCommDestroy(c[1]), chorusSuccess);
  int32_t in = -1;
  EXPECT_NE(chorusRecv(&in, 1, chorusInt32, 1, c[0], nullptr), chorusSuccess);
  const std::string err = chorusGetLastError(c[0]);
  EXPECT_NE(err.find("rank 1 destroyed its communicator"), std::string::npos) << err;
  EXPECT_EQ(in, -1);
  EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
}

TEST(PointToPoint, ASendWaitingForAPeerThatThenDestroysItsCommunicatorFailsNamingIt) {
  // As above, but rank 0's send already waits (its connection request was relayed to rank 1) when rank 1 destroys
  // its communicator. Rank 1's leave note equals rank 2's, so it is not passed to every rank; the root passes it to
  // the ranks that had messages relayed to or from rank 1. Without that the send waited out the timeout.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  chorusComm_t c[3] = {nullptr, nullptr, nullptr};
  init_ranks(c);
  ASSERT_EQ(chorusCommDestroy(c[2]), chorusSuccess);
  const auto start = std::chrono::steady_clock::now();
  chorusResult_t sent = chorusSuccess;
  std::string err;
  std::thread sender([&] {
    int32_t x = 7;
    sent = chorusSend(&x, 1, chorusInt32, 1, c[0], nullptr);
    err = chorusGetLastError(c[0]);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the send's request reaches rank 1 first
  ASSERT_EQ(chorusCommDestroy(c[1]), chorusSuccess);
  sender.join();
  EXPECT_EQ(sent, chorusRemoteError);
  EXPECT_NE(err.find("rank 1 destroyed its communicator"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the send waited out the timeout";
  EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
}

TEST(Communicator, InitFromEnvOnABusyPortNamesTheVariablesItCameFrom) {
  // Rank 0 serves the rendezvous on MASTER_PORT; when that port is taken the error used to say only "cannot bind".
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  ScopedEnv a("MASTER_ADDR", "127.0.0.1"), p("MASTER_PORT", port.c_str()), r("RANK", "0"), w("WORLD_SIZE", "1"),
      secret("CHORUS_SECRET", "00112233445566778899aabbccddeeff");
  chorusComm_t comm = nullptr;
  EXPECT_NE(chorusCommInitFromEnv(&comm), chorusSuccess);
  const std::string err = chorusGetLastError(nullptr);
  EXPECT_NE(err.find("rank 0 cannot serve the rendezvous on the port that MASTER_ADDR/MASTER_PORT give(s)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(port), std::string::npos) << err;
  EXPECT_EQ(comm, nullptr);
  close(fd);
}

TEST(Communicator, ReusingAUniqueIdIsRefusedAtOnce) {
  // A unique id serves one rendezvous; a second init with it used to retry the closed port until the timeout.
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c[2] = {nullptr, nullptr};
  std::thread peer([&] { ASSERT_EQ(chorusCommInitRank(&c[1], 2, id, 1), chorusSuccess); });
  ASSERT_EQ(chorusCommInitRank(&c[0], 2, id, 0), chorusSuccess);
  peer.join();
  for (int round = 0; round < 2; ++round) {  // while the communicator lives, then after it is gone
    chorusComm_t again = nullptr;
    EXPECT_EQ(chorusCommInitRank(&again, 2, id, 1), chorusInvalidUsage);
    const std::string err = chorusGetLastError(nullptr);
    EXPECT_NE(err.find("this unique id was already used: its rendezvous at "), std::string::npos) << err;
    EXPECT_NE(err.find("completed (all 2 ranks joined)"), std::string::npos) << err;
    EXPECT_EQ(again, nullptr);
    if (round == 0) {
      std::thread destroy_peer([&] { EXPECT_EQ(chorusCommDestroy(c[1]), chorusSuccess); });
      EXPECT_EQ(chorusCommDestroy(c[0]), chorusSuccess);
      destroy_peer.join();
    }
  }
}

TEST(Communicator, SplitUnderATopologyFileTakesItsParentsView) {
  // CHORUS_TOPO_FILE describes the parent's 4 ranks; a 2-rank child used to re-read it and fail ("places 4 ranks
  // but the communicator has 2").
  ScopedEnv topo("CHORUS_TOPO_FILE", CHORUS_SOURCE_DIR "/topologies/emu-2x2.json");
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      chorusComm_t c = nullptr, child = nullptr;
      ASSERT_EQ(chorusCommInitRank(&c, 4, id, r), chorusSuccess) << chorusGetLastError(nullptr);
      ASSERT_EQ(chorusCommSplit(c, r % 2, r, &child), chorusSuccess) << chorusGetLastError(c);
      std::vector<float> x(1000, static_cast<float>(r));
      ASSERT_EQ(chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, child, nullptr), chorusSuccess)
          << chorusGetLastError(child);
      EXPECT_EQ(x[999], r % 2 == 0 ? 2.0f : 4.0f);  // 0 + 2, 1 + 3
      EXPECT_EQ(chorusCommDestroy(child), chorusSuccess);
      EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
    });
  for (auto& t : threads) t.join();
}

TEST(Communicator, LastErrorOfACommunicatorAndOfThisThread) {
  // chorusGetLastError(comm) is the communicator's, from whichever thread; NULL gives this thread's last error, and
  // asking about a communicator does not change it. Errors on a communicator start with its rank.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    EXPECT_EQ(chorusCommUserRank(c, nullptr), chorusInvalidArgument);
    const std::string on_comm = chorusGetLastError(c);
    EXPECT_EQ(on_comm, "rank " + std::to_string(r) + ": rank is NULL");
    EXPECT_EQ(chorusGetUniqueId(nullptr), chorusInvalidArgument);
    EXPECT_EQ(std::string(chorusGetLastError(c)), on_comm);
    EXPECT_EQ(std::string(chorusGetLastError(nullptr)), "uniqueId is NULL");
  });
}

TEST(Communicator, RankAndSize) {
  World& w = World::get(3);
  w.run([&](int r, chorusComm_t c) {
    int rank = -1, n = -1;
    ASSERT_EQ(chorusCommUserRank(c, &rank), chorusSuccess);
    ASSERT_EQ(chorusCommCount(c, &n), chorusSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(n, 3);
  });
}

TEST(Communicator, TheProgramsOnlyItUsedAreReleasedWithIt) {
  // 7 ranks: no other test makes a communicator of that size, so the cached programs for 7 ranks are this test's.
  const size_t before = chorus::algo::cached_program_count(7);
  {
    World w(7);
    w.run([&](int r, chorusComm_t c) {
      float v = 1.0f;
      ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess)
          << chorusGetLastError(c);
      EXPECT_EQ(v, 7.0f);
      int32_t b = r == 3 ? 42 : 0;
      ASSERT_EQ(chorusBroadcast(&b, &b, 1, chorusInt32, 3, c, nullptr), chorusSuccess) << chorusGetLastError(c);
      EXPECT_EQ(b, 42);
    });
    // The selector simulated several all-reduce and broadcast programs (every candidate), held by the communicators.
    EXPECT_GT(chorus::algo::cached_program_count(7), before + 2);
    // A second communicator of the same ranks shares them; destroying it releases none of them.
    std::vector<chorusComm_t> dup(7, nullptr);
    w.run([&](int r, chorusComm_t c) {
      ASSERT_EQ(chorusCommSplit(c, 0, r, &dup[r]), chorusSuccess) << chorusGetLastError(c);
      float v = 2.0f;
      ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, dup[r], nullptr), chorusSuccess);
      EXPECT_EQ(v, 14.0f);
    });
    const size_t during = chorus::algo::cached_program_count(7);
    w.run([&](int r, chorusComm_t) { EXPECT_EQ(chorusCommDestroy(dup[r]), chorusSuccess); });
    EXPECT_EQ(chorus::algo::cached_program_count(7), during);
    // Still usable, on the cached programs.
    w.run([&](int, chorusComm_t c) {
      float v = 3.0f;
      ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
      EXPECT_EQ(v, 21.0f);
    });
  }
  EXPECT_EQ(chorus::algo::cached_program_count(7), before);
}

TEST(Communicator, SplitByColorAndKey) {
  World& w = World::get(5);
  w.run([&](int r, chorusComm_t c) {
    // Even and odd ranks; keys reverse the order; rank 4 opts out.
    int color = r == 4 ? CHORUS_SPLIT_NOCOLOR : r % 2;
    chorusComm_t sub = nullptr;
    ASSERT_EQ(chorusCommSplit(c, color, -r, &sub), chorusSuccess) << chorusGetLastError(c);
    if (r == 4) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    int rank = -1, n = -1;
    chorusCommUserRank(sub, &rank);
    chorusCommCount(sub, &n);
    EXPECT_EQ(n, 2);
    // Keys are -r, so the higher old rank comes first.
    EXPECT_EQ(rank, (r == 2 || r == 3) ? 0 : 1);
    int64_t v = r, sum = 0;
    ASSERT_EQ(chorusAllReduce(&v, &sum, 1, chorusInt64, chorusSum, sub, nullptr), chorusSuccess)
        << chorusGetLastError(sub);
    EXPECT_EQ(sum, r % 2 == 0 ? 0 + 2 : 1 + 3);
    EXPECT_EQ(chorusCommDestroy(sub), chorusSuccess);
  });
}

TEST(Communicator, ASplitWithABadArgumentOnOneRankFailsOnEveryRankNamingIt) {
  // Rank 2 passes a negative color, rank 3 a NULL newcomm: each gets its own error, and the others fail at once
  // naming both instead of waiting for them until the timeout. Nothing is created, and the parent stays usable.
  World& w = World::get(4);
  w.run([&](int r, chorusComm_t c) {
    chorusComm_t sub = nullptr;
    const chorusResult_t rc = chorusCommSplit(c, r == 2 ? -7 : 0, r, r == 3 ? nullptr : &sub);
    EXPECT_EQ(rc, chorusInvalidArgument);
    EXPECT_EQ(sub, nullptr);
    const std::string err = chorusGetLastError(c);
    const char* expected = r == 2 ? "color=-7" : r == 3 ? "newcomm is NULL" : "rank(s) 2, 3 passed an invalid argument";
    EXPECT_NE(err.find(expected), std::string::npos) << err;
    int64_t v = r, sum = 0;
    ASSERT_EQ(chorusAllReduce(&v, &sum, 1, chorusInt64, chorusSum, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(sum, 0 + 1 + 2 + 3);
    ASSERT_EQ(chorusCommSplit(c, r % 2, r, &sub), chorusSuccess) << chorusGetLastError(c);
    ASSERT_EQ(chorusAllReduce(&v, &sum, 1, chorusInt64, chorusSum, sub, nullptr), chorusSuccess)
        << chorusGetLastError(sub);
    EXPECT_EQ(sum, r % 2 == 0 ? 0 + 2 : 1 + 3);
    EXPECT_EQ(chorusCommDestroy(sub), chorusSuccess);
  });
}

TEST(NonBlocking, RequestsCompleteInOrderAndOverlap) {
  World& w = World::get(3);
  w.run([&](int r, chorusComm_t c) {
    const size_t n = 100000;
    std::vector<float> a(n, static_cast<float>(r + 1)), b(n * 3), d(n, 1.0f);
    chorusRequest_t ra = nullptr, rb = nullptr;
    ASSERT_EQ(chorusIallReduce(a.data(), a.data(), n, chorusFloat32, chorusSum, c, &ra), chorusSuccess);
    ASSERT_EQ(chorusIallGather(d.data(), b.data(), n, chorusFloat32, c, &rb), chorusSuccess);
    // A blocking call after queued ones runs after them.
    float one = 1.0f;
    ASSERT_EQ(chorusAllReduce(&one, &one, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    EXPECT_EQ(one, 3.0f);
    int done = 0;
    ASSERT_EQ(chorusTest(ra, &done), chorusSuccess);
    EXPECT_EQ(done, 1);
    ASSERT_EQ(chorusWait(rb, 10000), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(a[n - 1], 6.0f);
    EXPECT_EQ(b[3 * n - 1], 1.0f);
    EXPECT_EQ(chorusRequestFree(ra), chorusSuccess);
    EXPECT_EQ(chorusRequestFree(rb), chorusSuccess);
  });
}

TEST(NonBlocking, WaitTimesOutWhileAPeerIsLate) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    float v = 1.0f;
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    chorusRequest_t req = nullptr;
    ASSERT_EQ(chorusIallReduce(&v, &v, 1, chorusFloat32, chorusSum, c, &req), chorusSuccess);
    if (r == 0) {
      EXPECT_EQ(chorusWait(req, 10), chorusInProgress);  // rank 1 has not joined yet: still running
      EXPECT_EQ(std::string(chorusGetLastError(c)).find("still running"), std::string::npos);  // not an error
    }
    EXPECT_EQ(chorusWait(req, -1), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(v, 2.0f);
    chorusRequestFree(req);
  });
}

TEST(NonBlocking, AWaitWithoutATimeoutEndsWithTheErrorThatNamesAMissingRank) {
  // The wait does not give up before the operation's own deadline, whose error says who did not take part.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "700");
  World w(2);  // its own world: the timeout breaks the communicators
  std::atomic<bool> done{false};
  w.run([&](int r, chorusComm_t c) {
    if (r == 1) {  // never joins
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    float v = 1.0f;
    chorusRequest_t req = nullptr;
    ASSERT_EQ(chorusIallReduce(&v, &v, 1, chorusFloat32, chorusSum, c, &req), chorusSuccess);
    const chorusResult_t rc = chorusWait(req, -1);
    const std::string text = chorusGetLastError(c);
    EXPECT_EQ(rc, chorusTimeout) << text;
    EXPECT_NE(text.find("AllReduce #1"), std::string::npos) << text;
    EXPECT_NE(text.find("rank(s) 1"), std::string::npos) << text;
    EXPECT_NE(text.find("had not called collective #1"), std::string::npos) << text;
    EXPECT_EQ(chorusRequestFree(req), chorusSuccess);
    done = true;
  });
}

TEST(NonBlocking, ARequestUsedAfterItWasFreedIsInvalidUsage) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    float v = static_cast<float>(r + 1);
    chorusRequest_t req = nullptr;
    ASSERT_EQ(chorusIallReduce(&v, &v, 1, chorusFloat32, chorusSum, c, &req), chorusSuccess);
    int done = -1;
    EXPECT_EQ(chorusTest(req, nullptr), chorusInvalidArgument);
    EXPECT_EQ(std::string(chorusGetLastError(c)), "rank " + std::to_string(r) + ": done is NULL");
    EXPECT_EQ(chorusTest(nullptr, &done), chorusInvalidArgument);
    EXPECT_EQ(std::string(chorusGetLastError(nullptr)), "request is NULL");
    ASSERT_EQ(chorusRequestFree(req), chorusSuccess);  // waits for it
    EXPECT_EQ(v, 3.0f);
    const std::string freed = "request is not a live request (used after chorusRequestFree?)";
    EXPECT_EQ(chorusTest(req, &done), chorusInvalidUsage);
    EXPECT_EQ(std::string(chorusGetLastError(nullptr)), freed);
    EXPECT_EQ(done, -1);
    EXPECT_EQ(chorusWait(req, -1), chorusInvalidUsage);
    EXPECT_EQ(std::string(chorusGetLastError(nullptr)), freed);
    EXPECT_EQ(chorusRequestFree(req), chorusInvalidUsage);
    EXPECT_EQ(std::string(chorusGetLastError(nullptr)), freed);
    EXPECT_EQ(chorusRequestFree(nullptr), chorusSuccess);
    // Nothing else changed.
    ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(v, 6.0f);
  });
}

TEST(PreMulSum, AnOpIsRefusedOnAnotherCommunicator) {
  chorusComm_t world[2], other[2];
  init_ranks_and_split(world, other);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      float two = 2.0f, three = 3.0f;
      chorusRedOp_t by2 = chorusSum, by3 = chorusSum;
      ASSERT_EQ(chorusRedOpCreatePreMulSum(&by2, &two, chorusFloat32, chorusScalarHostImmediate, world[r]),
                chorusSuccess);
      ASSERT_EQ(chorusRedOpCreatePreMulSum(&by3, &three, chorusFloat32, chorusScalarHostImmediate, other[r]),
                chorusSuccess);
      EXPECT_NE(by2, by3);
      float x = 1.0f, y = -1.0f;
      EXPECT_EQ(chorusAllReduce(&x, &y, 1, chorusFloat32, by2, other[r], nullptr), chorusInvalidArgument);
      const std::string text = chorusGetLastError(other[r]);
      EXPECT_NE(text.find("is not a valid chorusRedOp_t or a live pre-multiplied sum of this communicator"),
                std::string::npos)
          << text;
      EXPECT_EQ(y, -1.0f);
      EXPECT_EQ(chorusRedOpDestroy(by2, other[r]), chorusInvalidArgument);
      ASSERT_EQ(chorusAllReduce(&x, &y, 1, chorusFloat32, by3, other[r], nullptr), chorusSuccess)
          << chorusGetLastError(other[r]);
      EXPECT_EQ(y, 6.0f);
      ASSERT_EQ(chorusAllReduce(&x, &y, 1, chorusFloat32, by2, world[r], nullptr), chorusSuccess)
          << chorusGetLastError(world[r]);
      EXPECT_EQ(y, 4.0f);
      EXPECT_EQ(chorusRedOpDestroy(by2, world[r]), chorusSuccess);
      EXPECT_EQ(chorusRedOpDestroy(by3, other[r]), chorusSuccess);
    });
  for (auto& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      EXPECT_EQ(chorusCommDestroy(other[r]), chorusSuccess);
      EXPECT_EQ(chorusCommDestroy(world[r]), chorusSuccess);
    });
  for (auto& t : threads) t.join();
}

TEST(Communicator, ErrorsOfASplitCommunicatorSayWhereItCameFrom) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  World& w = World::get(4);
  w.run([&](int r, chorusComm_t c) {
    chorusComm_t sub = nullptr, subsub = nullptr;
    ASSERT_EQ(chorusCommSplit(c, 0, -r, &sub), chorusSuccess) << chorusGetLastError(c);        // rank 3 - r there
    ASSERT_EQ(chorusCommSplit(sub, 1, r, &subsub), chorusSuccess) << chorusGetLastError(sub);  // rank r again
    // Rank 1 calls with another count: every rank's error leads with where its communicator came from.
    std::vector<float> v(r == 1 ? 5 : 4, 1.0f);
    EXPECT_NE(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, subsub, nullptr), chorusSuccess);
    const std::string text = chorusGetLastError(subsub);
    const std::string lead = "rank " + std::to_string(r) + " (split color 1 of rank " + std::to_string(3 - r) +
                             " (split color 0 of rank " + std::to_string(r) + ")): ";
    EXPECT_EQ(text.rfind(lead, 0), 0u) << text;
    EXPECT_NE(text.find("mismatched collective"), std::string::npos) << text;
    // The same error again, as every later call of a broken communicator returns: from a split too.
    chorusComm_t never = nullptr;
    EXPECT_NE(chorusCommSplit(subsub, 0, 0, &never), chorusSuccess);
    EXPECT_EQ(std::string(chorusGetLastError(subsub)), text);
    EXPECT_EQ(never, nullptr);
    EXPECT_EQ(chorusCommDestroy(subsub), chorusSuccess);
    EXPECT_EQ(chorusCommDestroy(sub), chorusSuccess);
    int64_t x = r, sum = 0;  // the parent is healthy
    ASSERT_EQ(chorusAllReduce(&x, &sum, 1, chorusInt64, chorusSum, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(sum, 6);
  });
}

TEST(PointToPoint, GroupedExchangeInBothDirections) {
  World& w = World::get(4);
  w.run([&](int r, chorusComm_t c) {
    const int n = 4;
    const size_t count = 300001;  // several slices
    std::vector<int32_t> to_next(count, r), to_prev(count, 100 + r), from_prev(count), from_next(count);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    // Receives first: inside a group the order across peers does not matter.
    chorusRecv(from_prev.data(), count, chorusInt32, (r + n - 1) % n, c, nullptr);
    chorusRecv(from_next.data(), count, chorusInt32, (r + 1) % n, c, nullptr);
    chorusSend(to_next.data(), count, chorusInt32, (r + 1) % n, c, nullptr);
    chorusSend(to_prev.data(), count, chorusInt32, (r + n - 1) % n, c, nullptr);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(from_prev[count - 1], (r + n - 1) % n);
    EXPECT_EQ(from_next[0], 100 + (r + 1) % n);
  });
}

TEST(PointToPoint, AGroupSpanningTwoCommunicatorsRunsThemAtOnce) {
  // Each rank calls the communicators in its own order: issued one after another, rank 0 would wait in `a` for rank
  // 1, which waits in `b` for rank 0. Messages of several slices, so a send cannot complete before its receive.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t b = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &b), chorusSuccess) << chorusGetLastError(a);
    const size_t count = 300001;
    std::vector<int32_t> to_a(count, 10 + r), to_b(count, 20 + r), from_a(count, -1), from_b(count, -1);
    auto exchange = [&](chorusComm_t c, std::vector<int32_t>& out, std::vector<int32_t>& in) {
      ASSERT_EQ(chorusSend(out.data(), count, chorusInt32, 1 - r, c, nullptr), chorusSuccess);
      ASSERT_EQ(chorusRecv(in.data(), count, chorusInt32, 1 - r, c, nullptr), chorusSuccess);
    };
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    if (r == 0) {
      exchange(a, to_a, from_a);
      exchange(b, to_b, from_b);
    } else {
      exchange(b, to_b, from_b);
      exchange(a, to_a, from_a);
    }
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(a) << " / " << chorusGetLastError(b);
    EXPECT_EQ(from_a.front(), 10 + (1 - r));
    EXPECT_EQ(from_a.back(), 10 + (1 - r));
    EXPECT_EQ(from_b.front(), 20 + (1 - r));
    EXPECT_EQ(from_b.back(), 20 + (1 - r));
    EXPECT_EQ(chorusCommDestroy(b), chorusSuccess);
  });
}

// Starts a group whose first call sends from rank `r` to itself on `b` with no receive to match: chorusGroupEnd
// finds it before anything runs ("send(s) to itself but 0 receive(s)"). The caller adds calls on other communicators.
void start_group_failing_on(chorusComm_t b, int r) {
  static const int64_t self = 3;
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusSend(&self, 1, chorusInt64, r, b, nullptr), chorusSuccess);
}

TEST(PointToPoint, AGroupSpanningTwoCommunicatorsReportsEachOnesError) {
  // A bad group on `b` (a send to itself without a receive) fails before anything runs; the calls on `a` still run,
  // and the error is `b`'s.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t b = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &b), chorusSuccess) << chorusGetLastError(a);
    int64_t mine = 7 + r, theirs = -1;
    start_group_failing_on(b, r);
    ASSERT_EQ(chorusSend(&mine, 1, chorusInt64, 1 - r, a, nullptr), chorusSuccess);
    ASSERT_EQ(chorusRecv(&theirs, 1, chorusInt64, 1 - r, a, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(b)).find("send(s) to itself but 0 receive(s)"), std::string::npos)
        << chorusGetLastError(b);
    EXPECT_EQ(theirs, 7 + (1 - r));
    int64_t v = 1;  // both communicators are still usable
    ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusInt64, chorusSum, b, nullptr), chorusSuccess) << chorusGetLastError(b);
    EXPECT_EQ(v, 2);
    EXPECT_EQ(chorusCommDestroy(b), chorusSuccess);
  });
}

TEST(PointToPoint, AGroupWhoseTwoCommunicatorsFailReportsTheTextOfTheErrorItReturns) {
  // `b` fails first (a send to itself without a receive, found before anything runs), then `a` fails while it runs
  // (rank 1 takes twice what rank 0 sends). chorusGroupEnd returns b's code: the thread's error text is b's too.
  World w(2);
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t b = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &b), chorusSuccess) << chorusGetLastError(a);
    int64_t buf[2] = {1, 2};
    start_group_failing_on(b, r);
    if (r == 0)
      ASSERT_EQ(chorusSend(buf, 1, chorusInt64, 1, a, nullptr), chorusSuccess);
    else
      ASSERT_EQ(chorusRecv(buf, 2, chorusInt64, 0, a, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    const std::string thread_text = chorusGetLastError(nullptr), b_text = chorusGetLastError(b);
    EXPECT_EQ(thread_text, b_text);
    EXPECT_NE(b_text.find("send(s) to itself but 0 receive(s)"), std::string::npos) << b_text;
    if (r == 1) {
      EXPECT_NE(std::string(chorusGetLastError(a)), b_text);  // a failed on its own
    }
    EXPECT_EQ(chorusCommDestroy(b), chorusSuccess);
  });
}

TEST(PointToPoint, AGroupKeepsItsErrorTextWhileAnotherThreadFailsACallOnTheSameCommunicator) {
  // `b` fails validation at once; `a` then waits for rank 1, which comes 300 ms late. Meanwhile another thread of
  // rank 0 makes a bad call on `b`, which rewrites b's error text: the group end still reports its own (review).
  World w(2);
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t b = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &b), chorusSuccess) << chorusGetLastError(a);
    int64_t mine = 5 + r, theirs = -1;
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::thread meddler([&] {
      if (r != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_EQ(chorusCommCount(b, nullptr), chorusInvalidArgument);
    });
    start_group_failing_on(b, r);
    ASSERT_EQ(chorusSend(&mine, 1, chorusInt64, 1 - r, a, nullptr), chorusSuccess);
    ASSERT_EQ(chorusRecv(&theirs, 1, chorusInt64, 1 - r, a, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    meddler.join();
    const std::string text = chorusGetLastError(nullptr);
    EXPECT_NE(text.find("send(s) to itself but 0 receive(s)"), std::string::npos) << text;
    EXPECT_EQ(theirs, 5 + (1 - r));
    EXPECT_EQ(chorusCommDestroy(b), chorusSuccess);
  });
}

TEST(PointToPoint, AGroupEndReturnsACallItRefusedAfterRunningTheOthers) {
  // A caller that checks only chorusGroupEnd (as NCCL code often does) learns of a call refused inside the group;
  // the group's other calls still ran, so the peer was not left waiting.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    int64_t mine = 20 + r, theirs = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusSend(&mine, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusSend(&mine, 1, chorusInt64, 5, c, nullptr), chorusInvalidArgument);
    ASSERT_EQ(chorusRecv(&theirs, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    // A later refusal (a non-blocking collective) does not replace the first.
    float f = 1.0f;
    chorusRequest_t req = nullptr;
    EXPECT_EQ(chorusIallReduce(&f, &f, 1, chorusFloat32, chorusSum, c, &req), chorusInvalidUsage);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    const std::string text = chorusGetLastError(nullptr);
    EXPECT_NE(text.find("chorusGroupEnd: the group ran without a call it refused when it was made"), std::string::npos)
        << text;
    EXPECT_NE(text.find("peer=5 is out of range"), std::string::npos) << text;
    EXPECT_EQ(theirs, 20 + (1 - r));
    // A non-blocking collective alone in a group: its refusal is the group end's result.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusIallReduce(&f, &f, 1, chorusFloat32, chorusSum, c, &req), chorusInvalidUsage);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidUsage);
    // The next group starts clean.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusSend(&mine, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusRecv(&theirs, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  });
}

TEST(PointToPoint, AnotherThreadIsRefusedAWhileAGroupSpanningItRuns) {
  // Rank 0's group spans the world and `a`; its receive on `a` waits for rank 1, which sends only later. Meanwhile a
  // second thread of rank 0 calls a send on `a`: it is refused (as while a group on `a` alone runs), not queued
  // behind the group, where its message would meet rank 1's next receive.
  chorusComm_t world[2] = {nullptr, nullptr}, a[2] = {nullptr, nullptr};
  ASSERT_NO_FATAL_FAILURE(init_ranks_and_split(world, a));
  std::atomic<bool> second_done{false};
  chorusResult_t second = chorusSuccess;
  std::string second_err;
  std::thread rank0([&] {
    int32_t mine = 5, theirs = -1, late = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusSend(&mine, 1, chorusInt32, 1, world[0], nullptr);
    chorusRecv(&theirs, 1, chorusInt32, 1, world[0], nullptr);
    chorusRecv(&late, 1, chorusInt32, 1, a[0], nullptr);
    EXPECT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(a[0]);
    EXPECT_EQ(theirs, 6);
    EXPECT_EQ(late, 7);
    EXPECT_TRUE(second_done.load());
  });
  std::thread rank0_second([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    int32_t x = 9;
    second = chorusSend(&x, 1, chorusInt32, 1, a[0], nullptr);
    second_err = chorusGetLastError(a[0]);
    second_done = true;
  });
  std::thread rank1([&] {
    int32_t mine = 6, theirs = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusSend(&mine, 1, chorusInt32, 0, world[1], nullptr);
    chorusRecv(&theirs, 1, chorusInt32, 0, world[1], nullptr);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(world[1]);
    EXPECT_EQ(theirs, 5);
    while (!second_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    int32_t late = 7;
    ASSERT_EQ(chorusSend(&late, 1, chorusInt32, 0, a[1], nullptr), chorusSuccess) << chorusGetLastError(a[1]);
  });
  rank0.join();
  rank0_second.join();
  rank1.join();
  EXPECT_EQ(second, chorusInvalidUsage);
  EXPECT_NE(second_err.find("two threads at once"), std::string::npos) << second_err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(chorusCommDestroy(a[r]), chorusSuccess);
    EXPECT_EQ(chorusCommDestroy(world[r]), chorusSuccess);
  }
}

TEST(PointToPoint, AnAbortOfOneCommunicatorOfAGroupDoesNotWaitForTheOthers) {
  // Rank 0's group spans the world, where its receive waits for rank 1, and `b`, where it exchanges with itself
  // and is done at once. Another thread aborts `b`: it returns without waiting for the world's part (rank 1 sends
  // only once the abort returned, or after 30 s).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "120000");
  chorusComm_t world[2] = {nullptr, nullptr}, b[2] = {nullptr, nullptr};
  ASSERT_NO_FATAL_FAILURE(init_ranks_and_split(world, b));
  std::atomic<bool> aborted{false};
  bool rank1_saw_abort = false;
  std::thread rank0([&] {
    int32_t theirs = -1, self_in = 3, self_out = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusRecv(&theirs, 1, chorusInt32, 1, world[0], nullptr);
    chorusSend(&self_in, 1, chorusInt32, 0, b[0], nullptr);
    chorusRecv(&self_out, 1, chorusInt32, 0, b[0], nullptr);
    EXPECT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(world[0]);
    EXPECT_EQ(theirs, 8);
    EXPECT_EQ(self_out, 3);
  });
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(chorusCommAbort(b[0]), chorusSuccess);
    aborted = true;
  });
  std::thread rank1([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!aborted.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    rank1_saw_abort = aborted.load();
    int32_t mine = 8;
    EXPECT_EQ(chorusSend(&mine, 1, chorusInt32, 0, world[1], nullptr), chorusSuccess) << chorusGetLastError(world[1]);
  });
  rank0.join();
  aborter.join();
  rank1.join();
  EXPECT_TRUE(rank1_saw_abort) << "the abort of b waited for the group's part on the world";
  EXPECT_EQ(chorusCommAbort(b[1]), chorusSuccess);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(chorusCommDestroy(world[r]), chorusSuccess);
}

TEST(PointToPoint, CallsThatWouldWaitOrDropTheGroupAreRefusedInsideIt) {
  // A destroy inside a group used to be accepted and drop the queued calls (the group's end then failed on a dead
  // handle); a split would wait for peers that wait for this group's end.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    int64_t mine = 10 + r, theirs = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusSend(&mine, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusRecv(&theirs, 1, chorusInt64, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusCommDestroy(c), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("chorusCommDestroy inside a group"), std::string::npos)
        << chorusGetLastError(nullptr);
    // The communicator's own error text has it too, with the rank.
    EXPECT_EQ(
        std::string(chorusGetLastError(c)).rfind("rank " + std::to_string(r) + ": chorusCommDestroy inside a group", 0),
        0u)
        << chorusGetLastError(c);
    chorusComm_t other = nullptr;
    EXPECT_EQ(chorusCommSplit(c, 0, r, &other), chorusInvalidUsage);
    EXPECT_EQ(other, nullptr);
    int n = 0;
    EXPECT_EQ(chorusCommCount(c, &n), chorusSuccess);  // a query is fine
    // The group's calls run; its end returns the first refusal too.
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(nullptr))
                  .find("refused when it was made: rank " + std::to_string(r) + ": chorusCommDestroy inside a group"),
              std::string::npos)
        << chorusGetLastError(nullptr);
    EXPECT_EQ(theirs, 10 + (1 - r));
  });
}

TEST(PointToPoint, AnInitInsideAGroupWorksWithOneRankPerThread) {
  // NCCL code often wraps its init in a group; each rank on its own thread does so here.
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      chorusComm_t c = nullptr;
      ASSERT_EQ(chorusGroupStart(), chorusSuccess);
      ASSERT_EQ(chorusCommInitRank(&c, 2, id, r), chorusSuccess) << chorusGetLastError(nullptr);
      ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
      int64_t v = r + 1;
      ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusInt64, chorusSum, c, nullptr), chorusSuccess);
      EXPECT_EQ(v, 3);
      EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
    });
  for (auto& t : ranks) t.join();
}

TEST(PointToPoint, SendAndReceiveInOneBuffer) {
  World& w = World::get(3);
  w.run([&](int r, chorusComm_t c) {
    const int n = 3;
    std::vector<int64_t> buf(200003, 1000 + r);  // several slices
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusSend(buf.data(), buf.size(), chorusInt64, (r + 1) % n, c, nullptr);
    chorusRecv(buf.data(), buf.size(), chorusInt64, (r + n - 1) % n, c, nullptr);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(buf.front(), 1000 + (r + n - 1) % n);
    EXPECT_EQ(buf.back(), 1000 + (r + n - 1) % n);
  });
}

TEST(PointToPoint, SendToSelfInAGroup) {
  World& w = World::get(1);
  w.run([&](int, chorusComm_t c) {
    double a = 4.5, b = 0;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusSend(&a, 1, chorusFloat64, 0, c, nullptr);
    chorusRecv(&b, 1, chorusFloat64, 0, c, nullptr);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(b, 4.5);
    // Chained: every send reads its buffer as it was when the group was issued, also when an earlier receive from
    // itself writes it (c got a's value when the self-copies were made in order without staging).
    double x = 1, y = 2, z = 0;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    chorusSend(&x, 1, chorusFloat64, 0, c, nullptr);
    chorusRecv(&y, 1, chorusFloat64, 0, c, nullptr);
    chorusSend(&y, 1, chorusFloat64, 0, c, nullptr);
    chorusRecv(&z, 1, chorusFloat64, 0, c, nullptr);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(y, 1.0);
    EXPECT_EQ(z, 2.0);
  });
}

// Collectives inside a group (as NCCL takes them): a communicator's collectives run in the order they were called,
// then its point-to-point calls; a group spanning several communicators runs them at once.
TEST(GroupedCollectives, OneThreadDrivesEveryRanksCommunicator) {
  // The test's thread calls every rank's communicator: issued one after another outside a group, rank 0's
  // all-reduce would wait for rank 1's, which is never called. Several slices per message.
  constexpr int n = 4;
  World w(n);
  const size_t count = 100003;
  std::vector<std::vector<int32_t>> sum(n), gathered(n), scattered(n), bcast(n), a2a_in(n), a2a_out(n), ring(n);
  std::vector<int64_t> from_prev(n, -1);
  const std::vector<int64_t> mine = {100, 101, 102, 103};
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    chorusComm_t c = w.comm(r);
    sum[r].assign(count, r + 1);
    gathered[r].assign(count * n, -1);
    scattered[r].assign(count * n, 0);
    for (size_t i = 0; i < scattered[r].size(); ++i) scattered[r][i] = static_cast<int32_t>(i % 7) * (r + 1);
    bcast[r].assign(count, r == 2 ? 77 : -1);
    a2a_in[r].resize(n * 3);
    for (int j = 0; j < n * 3; ++j) a2a_in[r][j] = 1000 * r + j;
    a2a_out[r].assign(n * 3, -1);
    // A point-to-point ring too, called before the collectives on odd ranks and after them on even ones.
    if (r % 2 == 1) {
      ASSERT_EQ(chorusSend(&mine[r], 1, chorusInt64, (r + 1) % n, c, nullptr), chorusSuccess);
      ASSERT_EQ(chorusRecv(&from_prev[r], 1, chorusInt64, (r + n - 1) % n, c, nullptr), chorusSuccess);
    }
    ASSERT_EQ(chorusAllReduce(sum[r].data(), sum[r].data(), count, chorusInt32, chorusSum, c, nullptr), chorusSuccess)
        << chorusGetLastError(c);
    ASSERT_EQ(chorusAllGather(sum[r].data() + 0, gathered[r].data(), count, chorusInt32, c, nullptr), chorusSuccess)
        << chorusGetLastError(c);
    ASSERT_EQ(chorusReduceScatter(scattered[r].data(), scattered[r].data() + r * count, count, chorusInt32, chorusMax,
                                  c, nullptr),
              chorusSuccess)
        << chorusGetLastError(c);
    ASSERT_EQ(chorusBroadcast(bcast[r].data(), bcast[r].data(), count, chorusInt32, 2, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusAllToAll(a2a_in[r].data(), a2a_out[r].data(), 3, chorusInt32, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusBarrier(c, nullptr), chorusSuccess);
    if (r % 2 == 0) {
      ASSERT_EQ(chorusRecv(&from_prev[r], 1, chorusInt64, (r + n - 1) % n, c, nullptr), chorusSuccess);
      ASSERT_EQ(chorusSend(&mine[r], 1, chorusInt64, (r + 1) % n, c, nullptr), chorusSuccess);
    }
  }
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The all-gather ran after the all-reduce (called in that order), so it gathered the sums.
    EXPECT_EQ(std::count(sum[r].begin(), sum[r].end(), 10), static_cast<ptrdiff_t>(count));
    EXPECT_EQ(std::count(gathered[r].begin(), gathered[r].end(), 10), static_cast<ptrdiff_t>(count * n));
    for (size_t i = 0; i < count; ++i) {
      const size_t at = r * count + i;
      ASSERT_EQ(scattered[r][at], static_cast<int32_t>(at % 7) * n) << at;
    }
    EXPECT_EQ(std::count(bcast[r].begin(), bcast[r].end(), 77), static_cast<ptrdiff_t>(count));
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < 3; ++k) EXPECT_EQ(a2a_out[r][j * 3 + k], 1000 * j + r * 3 + k);
    EXPECT_EQ(from_prev[r], mine[(r + n - 1) % n]);
  }
}

TEST(GroupedCollectives, EachRanksThreadGroupsCollectivesWithPointToPoint) {
  // Rank 0 calls its send before the all-reduce, rank 1 its receive after it: the collectives run first on both.
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    const size_t count = 300001;  // several slices: a send cannot complete before its receive is posted
    std::vector<float> x(count, 1.5f * (r + 1)), to_peer(count, 3.0f + r), from_peer(count, -1);
    double y = r == 0 ? 2.0 : 5.0;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    if (r == 0) {
      ASSERT_EQ(chorusSend(to_peer.data(), count, chorusFloat32, 1, c, nullptr), chorusSuccess);
    }
    ASSERT_EQ(chorusAllReduce(x.data(), x.data(), count, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusAllReduce(&y, &y, 1, chorusFloat64, chorusProd, c, nullptr), chorusSuccess);
    if (r == 1) {
      ASSERT_EQ(chorusRecv(from_peer.data(), count, chorusFloat32, 0, c, nullptr), chorusSuccess);
    }
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(std::count(x.begin(), x.end(), 4.5f), static_cast<ptrdiff_t>(count));
    EXPECT_EQ(y, 10.0);
    if (r == 1) {
      EXPECT_EQ(std::count(from_peer.begin(), from_peer.end(), 3.0f), static_cast<ptrdiff_t>(count));
    }
  });
}

// A communicator with collectives in a group runs all of its calls or none: left out, a refused collective would let
// the next one meet the peers' refused one (same kind and size: silently wrong values, helper-75).
TEST(GroupedCollectives, ARefusalOnACommunicatorWithCollectivesRunsNoneOfItsCalls) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    int32_t v = r + 1, u = 10 * (r + 1);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusInt32, chorusSum, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusAllReduce(&v, nullptr, 1, chorusInt32, chorusSum, c, nullptr), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("recvbuff is NULL"), std::string::npos) << chorusGetLastError(c);
    chorusRequest_t req = nullptr;
    EXPECT_EQ(chorusIallReduce(&u, &u, 1, chorusInt32, chorusSum, c, &req), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("a non-blocking collective inside a group"), std::string::npos)
        << chorusGetLastError(c);
    EXPECT_EQ(chorusAllReduce(&u, &u, 1, chorusInt32, chorusMax, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    const std::string text = chorusGetLastError(nullptr);
    EXPECT_NE(text.find("recvbuff is NULL"), std::string::npos) << text;
    EXPECT_NE(text.find("none of this communicator's calls in the group ran"), std::string::npos) << text;
    EXPECT_EQ(v, r + 1);
    EXPECT_EQ(u, 10 * (r + 1));
    EXPECT_EQ(req, nullptr);
    // The same when the group's sends and receives fail their check at chorusGroupEnd (a send to itself without a
    // receive): its all-reduce does not run either, and the error says so.
    const int32_t self = 5;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusInt32, chorusSum, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusSend(&self, 1, chorusInt32, r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
    const std::string end_text = chorusGetLastError(nullptr);
    EXPECT_NE(end_text.find("send(s) to itself but 0 receive(s)"), std::string::npos) << end_text;
    EXPECT_NE(end_text.find("none of this communicator's calls in the group ran, its collectives neither"),
              std::string::npos)
        << end_text;
    EXPECT_EQ(v, r + 1);
    // The communicator is still usable.
    ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusInt32, chorusSum, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(v, 3);
  });
}

TEST(GroupedCollectives, ARefusalOnOneRankOfAGroupDrivingThemAllEndsEveryRanksCalls) {
  // One thread drives three ranks; rank 1's first all-reduce is refused. Its second one used to run against the
  // others' first; now rank 1 runs neither, and the other two ranks of that communicator, in the same group, run
  // nothing either instead of waiting for rank 1 until the timeout.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");  // were they to wait, not for 300 s
  constexpr int n = 3;
  World w(n);
  std::vector<float> a(n), b(n);
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    a[r] = r + 1.0f;
    b[r] = 10.0f * (r + 1);
    const chorusResult_t first =
        chorusAllReduce(&a[r], r == 1 ? nullptr : &a[r], 1, chorusFloat32, chorusSum, w.comm(r), nullptr);
    EXPECT_EQ(first, r == 1 ? chorusInvalidArgument : chorusSuccess);
    EXPECT_EQ(chorusAllReduce(&b[r], &b[r], 1, chorusFloat32, chorusSum, w.comm(r), nullptr), chorusSuccess);
  }
  EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);
  for (int r : {0, 2}) {
    const std::string text = chorusGetLastError(w.comm(r));
    EXPECT_NE(text.find("rank 1 of this communicator, in this group too, runs none of its calls"), std::string::npos)
        << text;
    EXPECT_NE(text.find("recvbuff is NULL"), std::string::npos) << text;
    EXPECT_EQ(text.find("timed out"), std::string::npos) << text;
  }
  EXPECT_NE(std::string(chorusGetLastError(w.comm(1))).find("recvbuff is NULL"), std::string::npos)
      << chorusGetLastError(w.comm(1));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(a[r], r + 1.0f);
    EXPECT_EQ(b[r], 10.0f * (r + 1));
  }
  // Nothing ran and nothing broke: the communicators still work.
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(chorusAllReduce(&b[r], &b[r], 1, chorusFloat32, chorusSum, w.comm(r), nullptr), chorusSuccess);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_EQ(b[r], 60.0f);
}

TEST(GroupedCollectives, ARefusalOfARanksOnlyCallInAGroupDrivingThemAllEndsEveryRanksCalls) {
  // As above, but the refused call is the bad rank's only one, so it has nothing queued: the others' all-reduces
  // used to run and wait for it until the timeout (helper-82), breaking their communicators.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  constexpr int n = 3;
  World w(n);
  for (int bad = 0; bad < n; ++bad) {
    std::vector<float> a(n);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (int r = 0; r < n; ++r) {
      a[r] = r + 1.0f;
      EXPECT_EQ(chorusAllReduce(&a[r], &a[r], 1, chorusFloat32, r == bad ? static_cast<chorusRedOp_t>(42) : chorusSum,
                                w.comm(r), nullptr),
                r == bad ? chorusInvalidArgument : chorusSuccess);
    }
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument) << chorusGetLastError(nullptr);
    for (int r = 0; r < n; ++r) {
      const std::string text = chorusGetLastError(w.comm(r));
      if (r != bad) {
        EXPECT_NE(text.find(cat("rank ", bad, " of this communicator, in this group too, runs none of its calls")),
                  std::string::npos)
            << text;
      }
      EXPECT_NE(text.find("op=42 is not a valid chorusRedOp_t"), std::string::npos) << text;
      EXPECT_EQ(text.find("timed out"), std::string::npos) << text;
      EXPECT_EQ(a[r], r + 1.0f);
    }
    // Nothing ran and nothing broke.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(chorusAllReduce(&a[r], &a[r], 1, chorusFloat32, chorusSum, w.comm(r), nullptr), chorusSuccess);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
    for (int r = 0; r < n; ++r) EXPECT_EQ(a[r], 6.0f);
  }
}

TEST(GroupedCollectives, ARefusedSendInAGroupDrivingEveryRankOfARingRunsNoneOfTheirCalls) {
  // One thread drives a send/receive ring of 4 ranks; rank 1's send is refused (NULL buffer). With only sends and
  // receives in the group, the other ranks' calls used to run and wait for rank 1 until the timeout (helper-86),
  // writing some buffers and breaking the communicator. Now none runs, at once. The same for a self-send and
  // self-receive of different sizes, which the group refuses as a whole.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  constexpr int n = 4;
  chorusComm_t c[n];
  ASSERT_EQ(chorusCommInitAll(c, n), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<int32_t> out(n), in(n, -1);
  for (int bad_case = 0; bad_case < 2; ++bad_case) {
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (int r = 0; r < n; ++r) {
      out[r] = 100 + r;
      const bool bad = r == 1 && bad_case == 0;
      EXPECT_EQ(chorusSend(bad ? nullptr : &out[r], 1, chorusInt32, (r + 1) % n, c[r], nullptr),
                bad ? chorusInvalidArgument : chorusSuccess);
      EXPECT_EQ(chorusRecv(&in[r], 1, chorusInt32, (r + n - 1) % n, c[r], nullptr), chorusSuccess);
    }
    int32_t self[2] = {0, 0};
    if (bad_case == 1) {  // 4 bytes sent to itself, 8 expected
      EXPECT_EQ(chorusSend(&self[0], 1, chorusInt32, 0, c[0], nullptr), chorusSuccess);
      EXPECT_EQ(chorusRecv(self, 2, chorusInt32, 0, c[0], nullptr), chorusSuccess);
    }
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument) << chorusGetLastError(nullptr);
    const int bad_rank = bad_case == 0 ? 1 : 0;
    for (int r = 0; r < n; ++r) {
      const std::string text = chorusGetLastError(c[r]);
      if (r != bad_rank) {
        EXPECT_NE(text.find(cat("rank ", bad_rank, " of this communicator, in this group too, runs none of its calls")),
                  std::string::npos)
            << text;
      }
      EXPECT_EQ(text.find("timed out"), std::string::npos) << text;
      EXPECT_EQ(in[r], -1) << "rank " << r;
    }
  }
  // Nothing ran and nothing broke: the ring runs.
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(chorusSend(&out[r], 1, chorusInt32, (r + 1) % n, c[r], nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(&in[r], 1, chorusInt32, (r + n - 1) % n, c[r], nullptr), chorusSuccess);
  }
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_EQ(in[r], 100 + (r + n - 1) % n);
  for (chorusComm_t comm : c) EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);
}

TEST(GroupedCollectives, ARefusedCollectiveKeepsTheSendsAndReceivesOfItsCommunicatorFromRunning) {
  // Rank 0's only collective is refused; its sends and receives would meet rank 1's all-reduce (helper-76). They do
  // not run: rank 0's group end says so, and rank 1's all-reduce times out naming rank 0.
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "1500");
  World w(2);
  w.run([&](int r, chorusComm_t c) {
    int32_t v = 7, mine = 100 + r, theirs = -1;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusAllReduce(&v, r == 0 ? nullptr : &v, 1, chorusInt32, chorusSum, c, nullptr),
              r == 0 ? chorusInvalidArgument : chorusSuccess);
    EXPECT_EQ(chorusSend(&mine, 1, chorusInt32, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(&theirs, 1, chorusInt32, 1 - r, c, nullptr), chorusSuccess);
    const chorusResult_t end = chorusGroupEnd();
    const std::string text = chorusGetLastError(c);
    if (r == 0) {
      EXPECT_EQ(end, chorusInvalidArgument);
      EXPECT_NE(text.find("recvbuff is NULL"), std::string::npos) << text;
      EXPECT_NE(text.find("none of this communicator's calls in the group ran"), std::string::npos) << text;
    } else {
      EXPECT_EQ(end, chorusTimeout);
      EXPECT_NE(text.find("rank(s) 0"), std::string::npos) << text;
      EXPECT_EQ(text.find("mismatched"), std::string::npos) << text;
    }
    EXPECT_EQ(theirs, -1);
    EXPECT_EQ(v, 7);
  });
}

TEST(PointToPoint, TotalSizeMismatchIsAnErrorEvenWhenMessagesMatch) {
  World w(2);
  w.run([&](int r, chorusComm_t c) {
    // 512 KiB sent as two 256 KiB slices, 256 KiB expected: the first message has the expected size.
    std::vector<std::byte> buf(512 << 10);
    chorusResult_t res = r == 0 ? chorusSend(buf.data(), buf.size(), chorusUint8, 1, c, nullptr)
                                : chorusRecv(buf.data(), buf.size() / 2, chorusUint8, 0, c, nullptr);
    if (r == 1) {
      EXPECT_EQ(res, chorusRemoteError);
      EXPECT_NE(std::string(chorusGetLastError(c)).find("counts disagree"), std::string::npos) << chorusGetLastError(c);
      // "Last" is the slice that ends a message, not the user's last call: the text says which.
      EXPECT_NE(std::string(chorusGetLastError(c))
                    .find("rank 0 sent a slice of 262144 bytes with more of its message to follow where this rank "
                          "expected one of 262144 bytes that ends the message"),
                std::string::npos)
          << chorusGetLastError(c);
    }
  });
}

TEST(Faults, MismatchThatNeedsOtherConnectionsIsReportedNotHung) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  World w(4);
  w.run([&](int r, chorusComm_t c) {
    // Rank 0's small all-reduce runs one-shot (every peer); the others' large one runs the ring (neighbours).
    std::vector<float> v(100000, 1.0f);
    const size_t count = r == 0 ? 1000 : v.size();
    auto t0 = std::chrono::steady_clock::now();
    chorusResult_t res = chorusAllReduce(v.data(), v.data(), count, chorusFloat32, chorusSum, c, nullptr);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(res, chorusRemoteError) << chorusGetLastError(c);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("count=1000"), std::string::npos) << chorusGetLastError(c);
    EXPECT_LT(s, 10.0);
  });
}

TEST(Faults, DifferentRootsAreReportedNotHung) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  for (bool reduce : {false, true}) {
    World w(2);
    w.run([&](int r, chorusComm_t c) {
      std::vector<float> in(1 << 20, 1.0f), out(1 << 20);
      auto t0 = std::chrono::steady_clock::now();
      // Each rank believes it is the root: both chains only send, or only receive.
      chorusResult_t res = reduce
                               ? chorusReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, r, c, nullptr)
                               : chorusBroadcast(in.data(), out.data(), in.size(), chorusFloat32, r, c, nullptr);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(res, chorusRemoteError) << chorusGetLastError(c);
      EXPECT_NE(std::string(chorusGetLastError(c)).find("root="), std::string::npos) << chorusGetLastError(c);
      EXPECT_LT(s, 10.0);
    });
  }
}

// Broadcast and reduce on 3 to 8 ranks where one rank's root or count differs, so that its program needs other
// connections than its peers' (found by a new-user trial: every rank waited for its deadline).
TEST(Faults, ARankWithAnotherRootOrCountIsReportedNotHung) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  struct Case {
    int n, odd;
    bool reduce, other_count;
  };
  for (const Case k : {Case{3, 2, false, false}, Case{3, 2, true, false}, Case{3, 2, false, true},
                       Case{6, 0, false, true}, Case{8, 0, false, true}}) {
    World w(k.n);
    w.run([&](int r, chorusComm_t c) {
      std::vector<float> in(1000000, 1.0f), out(1000000);
      // Warm: every rank's connections of a first, matching call exist, as in a running job; the barrier keeps a
      // fast rank from reaching the mismatch (which breaks every rank) while a slow one is still in the first call.
      ASSERT_EQ(chorusBroadcast(in.data(), out.data(), 12, chorusFloat32, 0, c, nullptr), chorusSuccess)
          << chorusGetLastError(c);
      ASSERT_EQ(chorusBarrier(c, nullptr), chorusSuccess) << chorusGetLastError(c);
      const bool odd = r == k.odd;
      const int root = odd && !k.other_count ? 1 : 0;
      const size_t count = odd && k.other_count ? 10 : (k.other_count ? 1000000 : 12);
      auto t0 = std::chrono::steady_clock::now();
      chorusResult_t res = k.reduce
                               ? chorusReduce(in.data(), out.data(), count, chorusFloat32, chorusSum, root, c, nullptr)
                               : chorusBroadcast(in.data(), out.data(), count, chorusFloat32, root, c, nullptr);
      // Every rank that waits for a peer reports the mismatch; a rank whose own part could end (a root whose sends
      // fit in the queues, odd or not) returns, and its next call fails with the mismatch.
      if (res == chorusSuccess) res = chorusBarrier(c, nullptr);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string e = chorusGetLastError(c);
      EXPECT_EQ(res, chorusRemoteError) << "n=" << k.n << " rank " << r << ": " << e;
      EXPECT_NE(e.find("mismatched collective"), std::string::npos) << "n=" << k.n << " rank " << r << ": " << e;
      EXPECT_LT(s, 10.0) << "n=" << k.n << " rank " << r;
    });
  }
}

TEST(PointToPoint, SizeMismatchIsAnError) {
  World w(2);  // its own world: the error breaks the communicators
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> buf(100);
    chorusResult_t res = r == 0 ? chorusSend(buf.data(), 100, chorusFloat32, 1, c, nullptr)
                                : chorusRecv(buf.data(), 50, chorusFloat32, 0, c, nullptr);
    if (r == 1) {
      EXPECT_EQ(res, chorusRemoteError);
      EXPECT_NE(std::string(chorusGetLastError(c)).find("bytes"), std::string::npos) << chorusGetLastError(c);
    }
  });
}

TEST(PointToPoint, ASendMeetingACollectiveIsReportedAsPointToPoint) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "20000");
  World w(2);  // its own world: the error breaks the communicators
  w.run([&](int r, chorusComm_t c) {
    std::vector<float> buf(1000, 1.0f);
    chorusResult_t res =
        r == 0 ? chorusSend(buf.data(), buf.size(), chorusFloat32, 1, c, nullptr)
               : chorusAllReduce(buf.data(), buf.data(), buf.size(), chorusFloat32, chorusSum, c, nullptr);
    EXPECT_NE(res, chorusSuccess) << "rank " << r;
    if (r == 1) {
      // The header of a point-to-point call has no count or dtype of its own: the report must not invent them.
      const std::string e = chorusGetLastError(c);
      EXPECT_NE(e.find("but rank 0 called SendRecv(point-to-point"), std::string::npos) << e;
      EXPECT_EQ(e.find("count=0"), std::string::npos) << e;
    }
  });
}

TEST(Collectives, AllToAllvIgnoresTheDisplacementsOfEmptyEntries) {
  World& w = World::get(2);
  w.run([&](int r, chorusComm_t c) {
    // One buffer: the send part at [0, 1), the receive part at [2, 4). The empty entry's displacement (500) points
    // past the receive part; it moves nothing, so the buffers do not overlap.
    std::vector<float> buf(1024, -1.0f);
    buf[0] = 10.0f + r;
    size_t scounts[2] = {1, 0}, sdispls[2] = {0, 500};
    size_t rcounts[2] = {r == 0 ? 1u : 0u, r == 0 ? 1u : 0u}, rdispls[2] = {0, 1};
    ASSERT_EQ(
        chorusAllToAllv(buf.data(), scounts, sdispls, buf.data() + 2, rcounts, rdispls, chorusFloat32, c, nullptr),
        chorusSuccess)
        << chorusGetLastError(c);
    EXPECT_EQ(buf[2], r == 0 ? 10.0f : -1.0f);
    EXPECT_EQ(buf[3], r == 0 ? 11.0f : -1.0f);
  });
}

TEST(Collectives, BarrierWaitsForEveryRank) {
  World& w = World::get(4);
  std::atomic<int> arrived{0};
  w.run([&](int r, chorusComm_t c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * r));
    arrived++;
    ASSERT_EQ(chorusBarrier(c, nullptr), chorusSuccess) << chorusGetLastError(c);
    EXPECT_EQ(arrived.load(), 4);
  });
}

TEST(Collectives, MinMaxPropagateNaN) {
  World& w = World::get(3);
  w.run([&](int r, chorusComm_t c) {
    float v[2] = {static_cast<float>(r), r == 1 ? std::numeric_limits<float>::quiet_NaN() : 1.0f};
    float mx[2], mn[2];
    ASSERT_EQ(chorusAllReduce(v, mx, 2, chorusFloat32, chorusMax, c, nullptr), chorusSuccess);
    ASSERT_EQ(chorusAllReduce(v, mn, 2, chorusFloat32, chorusMin, c, nullptr), chorusSuccess);
    EXPECT_EQ(mx[0], 2.0f);
    EXPECT_EQ(mn[0], 0.0f);
    EXPECT_TRUE(std::isnan(mx[1]));
    EXPECT_TRUE(std::isnan(mn[1]));
  });
}

TEST(Threads, TwoThreadsOnOneCommunicatorIsReported) {
  chorusComm_t c[2] = {nullptr, nullptr};
  init_pair(c);
  // Rank 0's communicator is driven by two threads at once while rank 1 is late: one of them must be refused.
  std::atomic<int> refused{0}, ok{0};
  std::vector<std::thread> users;
  for (int i = 0; i < 2; ++i)
    users.emplace_back([&] {
      float v = 1;
      chorusResult_t res = chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c[0], nullptr);
      if (res == chorusInvalidUsage)
        refused++;
      else if (res == chorusSuccess)
        ok++;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  float v = 1;
  ASSERT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c[1], nullptr), chorusSuccess);
  for (auto& t : users) t.join();
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(ok.load(), 1);
  EXPECT_NE(std::string(chorusGetLastError(c[0])).find("two threads"), std::string::npos);
  chorusCommDestroy(c[0]);
  chorusCommDestroy(c[1]);
}

TEST(Faults, AMissingRankBecomesATimeoutNamingIt) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "700");
  World w(3);  // its own world: the timeout breaks the communicators
  std::atomic<bool> done{false};
  w.run([&](int r, chorusComm_t c) {
    if (r == 2) {  // never joins this all-reduce
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    chorusResult_t res = chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string text = chorusGetLastError(c);
    // Whoever times out first reports it; the other hears of it. Either way the error names the missing rank.
    EXPECT_TRUE(res == chorusTimeout || res == chorusRemoteError) << text;
    EXPECT_NE(text.find("timed out"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 2"), std::string::npos) << text;
    EXPECT_NE(text.find("AllReduce #1"), std::string::npos) << text;
    EXPECT_LT(s, 5.0);
    if (r == 0) done = true;
  });
}

// A point-to-point wait names the peer it waited for, which may be waiting itself: the timeout asks every rank what
// it was doing. Rank 0 receives from rank 1, which receives from rank 2, which never calls.
TEST(Faults, APointToPointTimeoutSaysWhatEveryRankWasDoing) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "700");
  World w(3);  // its own world: the timeout breaks the communicators
  std::atomic<int> finished{0};
  std::vector<std::string> errors(3);
  w.run([&](int r, chorusComm_t c) {
    if (r == 2) {
      while (finished < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    EXPECT_NE(chorusRecv(v.data(), v.size(), chorusFloat32, r + 1, c, nullptr), chorusSuccess);
    errors[r] = chorusGetLastError(c);
    ++finished;
  });
  // Whoever times out first reports it; the other hears of it. Either way the report says rank 2 never called.
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[r];
    EXPECT_NE(e.find("SendRecv"), std::string::npos) << e;
    EXPECT_NE(e.find("2 (idle after collective #0)"), std::string::npos) << e;
    EXPECT_NE(e.find("had not called a point-to-point call"), std::string::npos) << e;
  }
}

// A peer of the group that did its part and then left is not the cause while another peer, still there, never
// called: rank 0 sends to rank 1 and receives from rank 2; rank 1 receives, then destroys its communicator; rank 2
// never calls. The error named rank 1 ("destroyed its communicator") and left rank 2 to the small print.
TEST(Faults, APointToPointTimeoutBlamesThePeerThatNeverCalledNotOneThatLeftAfterItsPart) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "1000");
  chorusComm_t c[3] = {nullptr, nullptr, nullptr};
  init_ranks(c);
  {
    // Every pair connected first (a group connects to all its peers before it moves data).
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        int32_t out = r, in[3] = {-1, -1, -1};
        ASSERT_EQ(chorusGroupStart(), chorusSuccess);
        for (int p = 0; p < 3; ++p) {
          if (p == r) continue;
          chorusSend(&out, 1, chorusInt32, p, c[r], nullptr);
          chorusRecv(&in[p], 1, chorusInt32, p, c[r], nullptr);
        }
        ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c[r]);
        for (int p = 0; p < 3; ++p) EXPECT_EQ(in[p], p == r ? -1 : p);
        float x = 1.0f;  // and a collective: rank 1's leave note then says #1
        ASSERT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c[r], nullptr), chorusSuccess);
        EXPECT_EQ(x, 3.0f);
      });
    for (auto& t : ranks) t.join();
  }
  std::atomic<bool> done{false};
  chorusResult_t res = chorusSuccess;
  std::string err;
  std::thread rank1([&] {
    int32_t in = -1;
    EXPECT_EQ(chorusRecv(&in, 1, chorusInt32, 0, c[1], nullptr), chorusSuccess) << chorusGetLastError(c[1]);
    EXPECT_EQ(in, 7);
    EXPECT_EQ(chorusCommDestroy(c[1]), chorusSuccess);
  });
  std::thread rank2([&] {
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(chorusCommAbort(c[2]), chorusSuccess);
  });
  int32_t out = 7, in = -1;
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  chorusSend(&out, 1, chorusInt32, 1, c[0], nullptr);
  chorusRecv(&in, 1, chorusInt32, 2, c[0], nullptr);
  res = chorusGroupEnd();
  err = chorusGetLastError(c[0]);
  done = true;
  rank1.join();
  rank2.join();
  EXPECT_EQ(res, chorusTimeout) << err;
  EXPECT_EQ(err.find("rank 1 destroyed its communicator"), std::string::npos) << err;
  EXPECT_NE(err.find("rank(s) 2 (idle after collective #1) had not called a point-to-point call"), std::string::npos)
      << err;
  EXPECT_NE(err.find("rank(s) 1 had left"), std::string::npos) << err;
  EXPECT_EQ(in, -1);
  EXPECT_EQ(chorusCommAbort(c[0]), chorusSuccess);
}

// Runs body(rank, comm) on n threads, each with a communicator of its own (not a World's) that the body destroys:
// for tests in which ranks leave or stop at different times.
void with_own_communicators(int n, const std::function<void(int, chorusComm_t)>& body) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      chorusComm_t c = nullptr;
      ASSERT_EQ(chorusCommInitRank(&c, n, id, r), chorusSuccess);
      body(r, c);
    });
  for (auto& t : threads) t.join();
}

// Rank 3 leaves after its first collective, while the others go on to a second of `count` floats.
void expect_departed_peer_named(size_t count) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "30000");
  const int n = 4;
  std::vector<std::string> errors(n);
  std::vector<double> seconds(n, 0);
  with_own_communicators(n, [&](int r, chorusComm_t c) {
    float x = 1.0f;
    ASSERT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    if (r == 3) {
      ASSERT_EQ(chorusCommDestroy(c), chorusSuccess);
      return;
    }
    std::vector<float> v(count, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr), chorusRemoteError);
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    errors[r] = chorusGetLastError(c);
    chorusCommDestroy(c);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 3 destroyed its communicator after its collective #1"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_LT(seconds[r], 10.0) << "rank " << r;
  }
}

TEST(Faults, APeerThatDestroyedItsCommunicatorIsNamedNotWaitedFor) { expect_departed_peer_named(100000); }

// Over tcp the first collective connected the ring, and a one-element all-reduce reads the departed peer's closed
// socket before anything else: that close is its goodbye, not a death (a trial found "process died or aborted").
TEST(Faults, APeerThatDestroyedItsCommunicatorIsNamedOverTcpToo) {
  ScopedEnv transports("CHORUS_TRANSPORTS", "tcp");
  expect_departed_peer_named(1);
  expect_departed_peer_named(100000);
}

TEST(Faults, PeersThatFinishedAndLeftDoNotFailTheOthers) {
  // Over tcp, whose connections to a peer that destroyed its communicator report the close when read: ranks 2 and 3
  // leave after an all-to-all (which connected every pair) while rank 0 waits, stalled, for rank 1.
  ScopedEnv transports("CHORUS_TRANSPORTS", "tcp");
  const int n = 4;
  with_own_communicators(n, [&](int r, chorusComm_t c) {
    std::vector<float> in(n, static_cast<float>(r)), out(n);
    ASSERT_EQ(chorusAllToAll(in.data(), out.data(), 1, chorusFloat32, c, nullptr), chorusSuccess)
        << chorusGetLastError(c);
    if (r == 0) {
      float x = 0;
      EXPECT_EQ(chorusRecv(&x, 1, chorusFloat32, 1, c, nullptr), chorusSuccess) << chorusGetLastError(c);
      EXPECT_EQ(x, 42.0f);
    } else if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // ranks 2 and 3 are gone by now
      float x = 42.0f;
      EXPECT_EQ(chorusSend(&x, 1, chorusFloat32, 0, c, nullptr), chorusSuccess) << chorusGetLastError(c);
    }
    EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
  });
}

TEST(Faults, ATimeoutSaysWhichRankHadNotCalledTheCollective) {
  // Rank 3 stays alive but stops calling collectives: the others time out waiting for their ring neighbours, and
  // their errors say which rank had not called (found by a new-user trial: they named a healthy neighbour).
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "2000");
  const int n = 4;
  std::vector<std::string> errors(n);
  std::atomic<int> done{0};
  with_own_communicators(n, [&](int r, chorusComm_t c) {
    float x = 1.0f;
    ASSERT_EQ(chorusAllReduce(&x, &x, 1, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    if (r == 3) {
      while (done.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      std::vector<float> v(100000, 1.0f);
      EXPECT_NE(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
      errors[r] = chorusGetLastError(c);
      ++done;
    }
    chorusCommDestroy(c);
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[r].find("rank(s) 3 (its last was #1, now idle) had not called collective #2"), std::string::npos)
        << "rank " << r << ": " << errors[r];
}

TEST(Faults, ASplitMetByACollectiveTimesOutSayingWhatEachSideDid) {
  ScopedEnv timeout("CHORUS_TIMEOUT_MS", "2000");
  // Ranks 0 and 2 split while rank 1 runs an all-reduce.
  std::vector<std::string> errors(3);
  with_own_communicators(3, [&](int r, chorusComm_t c) {
    if (r != 1) {
      chorusComm_t sub = nullptr;
      EXPECT_NE(chorusCommSplit(c, 0, 0, &sub), chorusSuccess);
    } else {
      std::vector<float> v(1000, 1.0f);
      EXPECT_NE(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    }
    errors[r] = chorusGetLastError(c);
    chorusCommDestroy(c);
  });
  // Whichever side times out first reports, and the others see that report as their peer failure (a splitting
  // rank used to report only its own timeout then): either way every rank's error says what the ranks were doing.
  const std::string split_side = "rank(s) 1 (running collective #1) had not called chorusCommSplit";
  const std::string collective_side = "(its last was #0, in chorusCommSplit) had not called collective #1";
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(errors[r].find(split_side) != std::string::npos || errors[r].find(collective_side) != std::string::npos)
        << "rank " << r << ": " << errors[r];
    // A splitting rank's own timeout says what it waited for in the caller's terms (it named a bootstrap tag).
    if (errors[r].find(split_side) != std::string::npos) {
      EXPECT_NE(errors[r].find(": chorusCommSplit: timed out after 2000 ms waiting for every rank's color and key"),
                std::string::npos)
          << errors[r];
    }
    EXPECT_EQ(errors[r].find("bootstrap allgather"), std::string::npos) << errors[r];
  }
}

TEST(Faults, AbortIsLocalBoundedAndNamedByThePeers) {
  World w(2);
  w.run([&](int r, chorusComm_t c) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(chorusCommAbort(c), chorusSuccess);
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
      w.release(1);
      return;
    }
    std::vector<float> v(1000, 1.0f);
    chorusResult_t res = chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr);
    EXPECT_EQ(res, chorusRemoteError);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("rank 1"), std::string::npos) << chorusGetLastError(c);
    // The communicator stays broken with the same error, and destroy still works.
    EXPECT_EQ(chorusBarrier(c, nullptr), chorusRemoteError);
    const std::string text = chorusGetLastError(c);
    chorusResult_t async = chorusSuccess;
    EXPECT_EQ(chorusCommGetAsyncError(c, &async), chorusSuccess);
    EXPECT_EQ(async, chorusRemoteError);
    EXPECT_EQ(std::string(chorusGetLastError(c)), text);
    chorusComm_t sub = nullptr;
    EXPECT_EQ(chorusCommSplit(c, 0, 0, &sub), chorusRemoteError);
    EXPECT_EQ(std::string(chorusGetLastError(c)), text);
  });
}

TEST(Faults, APeerFailureHeardBeforeAnyCallFailedIsTheAsyncErrorAndNamesTheNextCall) {
  World w(2);
  w.run([&](int r, chorusComm_t c) {
    if (r == 1) {
      EXPECT_EQ(chorusCommAbort(c), chorusSuccess);
      w.release(1);
      return;
    }
    chorusResult_t async = chorusSuccess;
    for (int i = 0; i < 10000 && async == chorusSuccess; ++i) {
      ASSERT_EQ(chorusCommGetAsyncError(c, &async), chorusSuccess);
      if (async == chorusSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(async, chorusRemoteError);
    const std::string heard = chorusGetLastError(c);
    EXPECT_EQ(heard.rfind("rank 0: peer failure: rank 1", 0), 0u) << heard;
    float v = 1.0f;
    EXPECT_EQ(chorusAllReduce(&v, &v, 1, chorusFloat32, chorusSum, c, nullptr), chorusRemoteError);
    const std::string call = chorusGetLastError(c);
    EXPECT_EQ(call.rfind("rank 0: AllReduce #1: peer failure: rank 1", 0), 0u) << call;
    // That call broke the communicator: later calls and the async error give its text unchanged.
    EXPECT_EQ(chorusBarrier(c, nullptr), chorusRemoteError);
    EXPECT_EQ(std::string(chorusGetLastError(c)), call);
    ASSERT_EQ(chorusCommGetAsyncError(c, &async), chorusSuccess);
    EXPECT_EQ(async, chorusRemoteError);
    EXPECT_EQ(std::string(chorusGetLastError(c)), call);
  });
}

// CHORUS_DETERMINISTIC=1: an element of a float all-reduce or reduce has the same bits whatever the call's count,
// across the sizes where the selector would switch algorithms (without it, a 1024-element and a 1025-element sum of
// the same data differed in a third of their elements at 4 ranks: oneshot against rhd).
TEST(Determinism, PinnedReductionsGiveAnElementTheSameBitsAtEverySize) {
  const std::vector<size_t> counts = {1, 7, 100, 1000, 1025, 4100, 20000, 70001};
  // Values of mixed signs and magnitudes, so the order of additions shows in the bits.
  auto value = [](int r, size_t i) {
    uint64_t h = (static_cast<uint64_t>(r) << 32 | i) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return std::ldexp(static_cast<double>(h & 0xffffff) / 0x1000000 - 0.5, static_cast<int>(h >> 24 & 15) - 7);
  };
  for (int n : {3, 4, 5}) {
    ScopedEnv pin("CHORUS_DETERMINISTIC", "1");
    World w(n);
    std::vector<std::vector<std::vector<float>>> ar(n), rd(n), rs(n);
    std::vector<std::vector<std::vector<double>>> ar64(n);
    w.run([&](int r, chorusComm_t c) {
      for (size_t count : counts) {
        std::vector<float> x(count), y(count), z(count);
        std::vector<double> x64(count), y64(count);
        for (size_t i = 0; i < count; ++i) x64[i] = value(r, i);
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(x64[i]);
        ASSERT_EQ(chorusAllReduce(x.data(), y.data(), count, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
        ASSERT_EQ(chorusAllReduce(x64.data(), y64.data(), count, chorusFloat64, chorusSum, c, nullptr), chorusSuccess);
        ASSERT_EQ(chorusReduce(x.data(), z.data(), count, chorusFloat32, chorusSum, n - 1, c, nullptr), chorusSuccess);
        // Reduce-scatter: element i of block b is the same datum at every count.
        std::vector<float> blocks(count * n), mine(count);
        for (int b = 0; b < n; ++b)
          for (size_t i = 0; i < count; ++i)
            blocks[b * count + i] = static_cast<float>(value(r, (b + 1) * 1000003 + i));
        ASSERT_EQ(chorusReduceScatter(blocks.data(), mine.data(), count, chorusFloat32, chorusSum, c, nullptr),
                  chorusSuccess);
        ar[r].push_back(y);
        ar64[r].push_back(y64);
        rd[r].push_back(z);
        rs[r].push_back(mine);
      }
    });
    for (int r = 0; r < n; ++r)
      for (size_t k = 0; k < counts.size(); ++k)
        for (size_t i = 0; i < counts[k]; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(ar[r][k][i]), std::bit_cast<uint32_t>(ar[0][counts.size() - 1][i]))
              << "all-reduce n=" << n << " rank " << r << " count " << counts[k] << " element " << i;
          ASSERT_EQ(std::bit_cast<uint64_t>(ar64[r][k][i]), std::bit_cast<uint64_t>(ar64[0][counts.size() - 1][i]))
              << "double all-reduce n=" << n << " rank " << r << " count " << counts[k] << " element " << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(rs[r][k][i]), std::bit_cast<uint32_t>(rs[r][counts.size() - 1][i]))
              << "reduce-scatter n=" << n << " rank " << r << " count " << counts[k] << " element " << i;
          if (r == n - 1) {
            ASSERT_EQ(std::bit_cast<uint32_t>(rd[r][k][i]), std::bit_cast<uint32_t>(rd[r][counts.size() - 1][i]))
                << "reduce n=" << n << " count " << counts[k] << " element " << i;
          }
        }
  }
  expect_init_refused("CHORUS_DETERMINISTIC", "2", "CHORUS_DETERMINISTIC=2 must be 0 or 1");
}

// CHORUS_FP32_PARTIALS=1: narrow-float reductions carry fp32 partial sums and round once at the end. Rank 0 holds
// 1 and every other rank half a unit in the last place of 1: rounding at every step loses each half unit (ties to
// even), one rounding at the end keeps their sum.
TEST(Fp32Partials, NarrowSumsRoundOnceAtTheEnd) {
  struct Type {
    chorusDataType_t dtype;
    float half_ulp;  // of 1.0
  };
  for (int n : {3, 4}) {
    ScopedEnv wide("CHORUS_FP32_PARTIALS", "1");
    World w(n);
    for (Type t : {Type{chorusFloat16, 0x1p-11f}, Type{chorusBfloat16, 0x1p-8f}, Type{chorusFloat8e4m3, 0x1p-4f},
                   Type{chorusFloat8e5m2, 0x1p-3f}}) {
      const size_t ts = chorusTypeSize(t.dtype), count = 1001;
      auto narrow = [&](float v) {
        uint16_t b = 0;
        kernels::narrow_from_float(t.dtype, &v, &b, 1);
        return b;
      };
      const float sum = 1.0f + static_cast<float>(n - 1) * t.half_ulp;  // exact in fp32
      const uint16_t want_sum = narrow(sum), want_avg = narrow(sum / static_cast<float>(n)), one = narrow(1.0f),
                     want_by2 = narrow(2.0f * sum);
      ASSERT_NE(want_sum, one);  // the test can tell the two apart
      for (const char* algo : {static_cast<const char*>(nullptr), "ring"}) {
        w.run([&](int r, chorusComm_t c) {
          const uint16_t mine = narrow(r == 0 ? 1.0f : t.half_ulp);
          std::vector<uint8_t> in(count * n * ts), ar(count * ts), avg(count * ts), rs(count * ts), rd(count * ts);
          for (size_t i = 0; i < count * n; ++i) std::memcpy(in.data() + i * ts, &mine, ts);
          chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
          o.algorithm = algo;
          ASSERT_EQ(chorusAllReduceEx(in.data(), ar.data(), count, t.dtype, chorusSum, &o, c, nullptr), chorusSuccess)
              << chorusGetLastError(c);
          ASSERT_EQ(chorusAllReduceEx(in.data(), avg.data(), count, t.dtype, chorusAvg, &o, c, nullptr), chorusSuccess);
          ASSERT_EQ(chorusReduceScatterEx(in.data(), rs.data(), count, t.dtype, chorusSum, &o, c, nullptr),
                    chorusSuccess);
          // In place (the result lands in this rank's block of the input), with a pre-multiplied sum by 2.
          std::vector<uint8_t> inplace = in;
          uint16_t two = narrow(2.0f);
          chorusRedOp_t by2;
          ASSERT_EQ(chorusRedOpCreatePreMulSum(&by2, &two, t.dtype, chorusScalarHostImmediate, c), chorusSuccess);
          uint8_t* mine_block = inplace.data() + static_cast<size_t>(r) * count * ts;
          ASSERT_EQ(chorusReduceScatterEx(inplace.data(), mine_block, count, t.dtype, by2, &o, c, nullptr),
                    chorusSuccess)
              << chorusGetLastError(c);
          ASSERT_EQ(chorusRedOpDestroy(by2, c), chorusSuccess);
          // Only the root's recvbuff is written: the others pass NULL.
          ASSERT_EQ(chorusReduceEx(in.data(), r == n - 1 ? rd.data() : nullptr, count, t.dtype, chorusSum, n - 1, &o, c,
                                   nullptr),
                    chorusSuccess)
              << chorusGetLastError(c);
          for (size_t i = 0; i < count; ++i) {
            uint16_t got[4] = {0, 0, 0, 0};
            std::memcpy(&got[0], ar.data() + i * ts, ts);
            std::memcpy(&got[1], avg.data() + i * ts, ts);
            std::memcpy(&got[2], rs.data() + i * ts, ts);
            std::memcpy(&got[3], rd.data() + i * ts, ts);
            uint16_t by2_got = 0;
            std::memcpy(&by2_got, mine_block + i * ts, ts);
            ASSERT_EQ(by2_got, want_by2) << "in-place pre-multiplied reduce-scatter " << t.dtype << " n=" << n;
            ASSERT_EQ(got[0], want_sum) << "all-reduce " << t.dtype << " n=" << n << " rank " << r;
            ASSERT_EQ(got[1], want_avg) << "avg " << t.dtype << " n=" << n << " rank " << r;
            ASSERT_EQ(got[2], want_sum) << "reduce-scatter " << t.dtype << " n=" << n << " rank " << r;
            if (r == n - 1) {
              ASSERT_EQ(got[3], want_sum) << "reduce " << t.dtype << " n=" << n;
            }
          }
        });
      }
    }
  }
  expect_init_refused("CHORUS_FP32_PARTIALS", "yes", "CHORUS_FP32_PARTIALS");
}

TEST(CppApi, CommAndRequests) {
  chorus::UniqueId id = chorus::UniqueId::create();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      chorus::Comm comm(3, id, r);
      EXPECT_EQ(comm.rank(), r);
      EXPECT_EQ(comm.size(), 3);
      std::vector<double> x(10, r + 1.0);
      comm.all_reduce(std::span<double>(x), chorus::Op::Max);
      EXPECT_EQ(x[9], 3.0);
      std::vector<int32_t> shard(4, r), full(12);
      chorus::Request req = comm.iall_gather(std::span<const int32_t>(shard), std::span<int32_t>(full));
      req.wait();
      EXPECT_EQ(full[11], 2);
      chorus::Request again = comm.iall_gather(std::span<const int32_t>(shard), std::span<int32_t>(full));
      EXPECT_TRUE(again.wait_for(60000));  // done long before: true, the buffers are ready
      EXPECT_EQ(full[11], 2);
      EXPECT_THROW(comm.all_gather(std::span<const int32_t>(shard), std::span<int32_t>(shard)), chorus::CommError);
      // Reduce: the root's out must match in (it was written past its end); out is not touched elsewhere.
      std::vector<double> short_out(2, -1.0), sum(10, -1.0);
      if (r == 1) {
        EXPECT_THROW(comm.reduce(std::span<const double>(x), std::span<double>(short_out), 1), chorus::CommError);
        EXPECT_EQ(short_out, std::vector<double>(2, -1.0));
      }
      comm.reduce(std::span<const double>(x), r == 1 ? std::span<double>(sum) : std::span<double>(), 1);
      if (r == 1) {
        EXPECT_EQ(sum, std::vector<double>(10, 9.0));  // x is 3 on each of the 3 ranks after the max all-reduce
      }
      // A per-call algorithm.
      std::vector<float> y(1000, static_cast<float>(r + 1));
      comm.all_reduce(std::span<float>(y), chorus::Op::Sum, chorus::CallOptions{"tree"});
      EXPECT_EQ(y[999], 6.0f);
      comm.all_gather(std::span<const int32_t>(shard), std::span<int32_t>(full), chorus::CallOptions{"bruck"});
      EXPECT_EQ(full[5], 1);
      EXPECT_THROW(comm.all_reduce(std::span<float>(y), chorus::Op::Sum, chorus::CallOptions{"nope"}),
                   chorus::CommError);
      // Naming T converts vectors and spans of non-const elements to the input's std::span<const T>.
      std::vector<float> z(1000);
      comm.all_reduce<float>(y, z);
      EXPECT_EQ(z[0], 18.0f);
      comm.all_gather<int32_t>(shard, full);
      EXPECT_EQ(full[8], 2);
      comm.iall_reduce<float>(z, y).wait();
      EXPECT_EQ(y[999], 54.0f);
      if (r == 0) comm.send<float>(std::span<float>(y).first(2), 1);
      if (r == 1) {
        std::vector<float> got(2);
        comm.recv(std::span<float>(got), 0);
        EXPECT_EQ(got[1], 54.0f);
      }
      // All-to-allv: rank r sends j + 1 copies of (10 * r + j) to rank j.
      std::vector<size_t> sc(3), sd(3), rc(3), rd(3);
      std::vector<int32_t> vin, vout;
      for (int j = 0; j < 3; ++j) {
        sc[j] = j + 1;
        sd[j] = vin.size();
        vin.insert(vin.end(), j + 1, 10 * r + j);
        rc[j] = r + 1;
        rd[j] = 3 * j;
      }
      vout.assign(9, -1);
      comm.all_to_allv(std::span<const int32_t>(vin), std::span<const size_t>(sc), std::span<const size_t>(sd),
                       std::span<int32_t>(vout), std::span<const size_t>(rc), std::span<const size_t>(rd));
      for (int j = 0; j < 3; ++j) EXPECT_EQ(vout[3 * j + r], 10 * j + r);
      rd[2] = 9;  // the block from rank 2 would start at the end
      EXPECT_THROW(
          comm.all_to_allv(std::span<const int32_t>(vin), std::span<const size_t>(sc), std::span<const size_t>(sd),
                           std::span<int32_t>(vout), std::span<const size_t>(rc), std::span<const size_t>(rd)),
          chorus::CommError);
    });
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace chorus::test
