// Collectives on device buffers, ordered on each rank's CUDA stream (src/runtime/cuda_stream.h): every collective,
// dtype and op at 1, 2, 4 and 8 ranks as threads sharing one GPU, in place and out of place; graph capture and
// replay; the host not blocked by a call; bad mixes of buffers. Results are checked on every rank against values
// computed on the host (small integers, so every dtype holds them exactly). Each test skips without a device.
#include <chorus/chorus.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/float_types.h"
#include "tests/common/process.h"
#include "tests/common/world.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/reference_values.h"
#include "tests/gpu/sm_occupier.h"

namespace chorus::gputest {
namespace {

using test::World;

// Each rank's waiting call holds a hardware queue: up to 8 thread-ranks plus the tests' own streams need more than
// the default 8 connections (docs/cuda.md), and an environment that set fewer (some training images export 1) would
// deadlock the staged tests. Raised to 32 before CUDA starts; touches no CUDA itself.
[[maybe_unused]] const bool kMaxConnections = [] {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return (v != nullptr && std::atoi(v) >= 32) || setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1) == 0;
}();

size_t esize(chorusDataType_t t) { return dtype_size(t); }

bool is_float(chorusDataType_t t) {
  return t == chorusFloat16 || t == chorusBfloat16 || t == chorusFloat32 || t == chorusFloat64 ||
         t == chorusFloat8e4m3 || t == chorusFloat8e5m2;
}

void store(chorusDataType_t t, std::byte* p, size_t i, double v) {
  std::byte* q = p + i * esize(t);
  auto put = [&](auto x) { std::memcpy(q, &x, sizeof(x)); };
  switch (t) {
    case chorusInt8: put(static_cast<int8_t>(v)); break;
    case chorusUint8: put(static_cast<uint8_t>(v)); break;
    case chorusInt32: put(static_cast<int32_t>(v)); break;
    case chorusUint32: put(static_cast<uint32_t>(v)); break;
    case chorusInt64: put(static_cast<int64_t>(v)); break;
    case chorusUint64: put(static_cast<uint64_t>(v)); break;
    case chorusFloat16: put(kernels::float_to_half(static_cast<float>(v))); break;
    case chorusBfloat16: put(kernels::float_to_bf16(static_cast<float>(v))); break;
    case chorusFloat32: put(static_cast<float>(v)); break;
    case chorusFloat64: put(v); break;
    case chorusFloat8e4m3: put(kernels::float_to_e4m3(static_cast<float>(v))); break;
    case chorusFloat8e5m2: put(kernels::float_to_e5m2(static_cast<float>(v))); break;
    default: break;
  }
}

double load(chorusDataType_t t, const std::byte* p, size_t i) {
  const std::byte* q = p + i * esize(t);
  auto get = [&](auto x) {
    std::memcpy(&x, q, sizeof(x));
    return x;
  };
  switch (t) {
    case chorusInt8: return get(int8_t{});
    case chorusUint8: return get(uint8_t{});
    case chorusInt32: return get(int32_t{});
    case chorusUint32: return get(uint32_t{});
    case chorusInt64: return static_cast<double>(get(int64_t{}));
    case chorusUint64: return static_cast<double>(get(uint64_t{}));
    case chorusFloat16: return kernels::half_to_float(get(uint16_t{}));
    case chorusBfloat16: return kernels::bf16_to_float(get(uint16_t{}));
    case chorusFloat32: return get(float{});
    case chorusFloat64: return get(double{});
    case chorusFloat8e4m3: return kernels::e4m3_to_float(get(uint8_t{}));
    case chorusFloat8e5m2: return kernels::e5m2_to_float(get(uint8_t{}));
    default: return 0;
  }
}

double finish(chorusRedOp_t op, chorusDataType_t t, double v, int n) {
  if (op != chorusAvg) return v;
  return is_float(t) ? v / n : std::trunc(v / n);
}

// One collective on every rank with device buffers on the rank's own stream; checks every rank's result. The buffers
// are allocated, filled and read back by the test's thread while no call is in flight: a rank's thread runs only
// its call and its stream's synchronization, since a wait for the whole device there (cudaMalloc, cudaFree, a
// synchronous copy) could wait for another rank's staged call, which waits for this rank's (docs/cuda.md, rules).
void run_collective(World& w, const std::vector<cudaStream_t>& streams, const char* coll, chorusDataType_t t,
                    chorusRedOp_t op, size_t count, bool in_place) {
  const int n = w.size();
  const bool is_signed = !(t == chorusUint8 || t == chorusUint32 || t == chorusUint64);
  const int root = n - 1;
  const std::string c = coll;
  // Elements of the send and receive buffers per rank.
  const size_t in_elems = (c == "reduce_scatter" || c == "all_to_all") ? count * n : count;
  const size_t out_elems = (c == "all_gather" || c == "all_to_all") ? count * n : count;
  const size_t es = esize(t);
  struct RankBuffers {
    std::unique_ptr<DeviceBuffer> buf;
    std::byte* send = nullptr;
    std::byte* recv = nullptr;
  };
  std::vector<RankBuffers> b(n);
  for (int r = 0; r < n; ++r) {
    std::vector<std::byte> in(in_elems * es);
    for (size_t j = 0; j < in_elems; ++j) store(t, in.data(), j, value(r, j, op, is_signed));
    b[r].buf = std::make_unique<DeviceBuffer>(std::max(in_elems, out_elems) * es * 2 + 256);
    ASSERT_TRUE(b[r].buf->ok());
    b[r].send = b[r].buf->get();
    b[r].recv = b[r].buf->get((in_elems * es + 255) / 256 * 256);
    if (in_place) {
      // The in-place forms: the same buffer; all-gather reads its block at recvbuff + rank * count, reduce-scatter
      // writes at sendbuff + rank * count.
      b[r].recv = b[r].send;
      if (c == "all_gather") b[r].send = b[r].recv + r * count * es;
      if (c == "reduce_scatter") b[r].recv = b[r].send + r * count * es;
    }
    ASSERT_EQ(upload(b[r].send, in.data(), in.size()), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t comm) {
    void* dsend = b[r].send;
    void* drecv = b[r].recv;
    cudaStream_t s = streams[r];
    chorusResult_t res = chorusSuccess;
    if (c == "all_reduce") res = chorusAllReduce(dsend, drecv, count, t, op, comm, s);
    if (c == "reduce") res = chorusReduce(dsend, drecv, count, t, op, root, comm, s);
    if (c == "broadcast") res = chorusBroadcast(dsend, drecv, count, t, root, comm, s);
    if (c == "all_gather") res = chorusAllGather(dsend, drecv, count, t, comm, s);
    if (c == "reduce_scatter") res = chorusReduceScatter(dsend, drecv, count, t, op, comm, s);
    if (c == "all_to_all") res = chorusAllToAll(dsend, drecv, count, t, comm, s);
    ASSERT_EQ(res, chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    chorusResult_t async = chorusSuccess;
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    ASSERT_EQ(async, chorusSuccess) << chorusGetLastError(comm);
  });
  auto reduced = [&](size_t j) {
    double v = value(0, j, op, is_signed);
    for (int q = 1; q < n; ++q) v = combine(op, v, value(q, j, op, is_signed));
    return finish(op, t, v, n);
  };
  for (int r = 0; r < n; ++r) {
    if (c == "reduce" && r != root) continue;  // nothing defined on the other ranks
    std::vector<std::byte> out(out_elems * es);
    ASSERT_EQ(download(out.data(), b[r].recv, out.size()), cudaSuccess);
    for (size_t i = 0; i < out_elems; ++i) {
      double want = 0;
      if (c == "all_reduce" || c == "reduce") want = reduced(i);
      if (c == "broadcast") want = value(root, i, op, is_signed);
      if (c == "all_gather") want = value(static_cast<int>(i / count), i % count, op, is_signed);
      if (c == "reduce_scatter") want = reduced(r * count + i);
      if (c == "all_to_all") want = value(static_cast<int>(i / count), r * count + i % count, op, is_signed);
      // Through the type, as the library stores it.
      std::byte tmp[8];
      store(t, tmp, 0, want);
      ASSERT_EQ(load(t, out.data(), i), load(t, tmp, 0))
          << coll << " dtype " << t << " op " << op << " n=" << n << " rank " << r << " element " << i
          << (in_place ? " in place" : "");
    }
  }
}

std::vector<cudaStream_t> make_streams(int n) {
  std::vector<cudaStream_t> s(n, nullptr);
  for (auto& x : s) EXPECT_EQ(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

void destroy_streams(std::vector<cudaStream_t>& s) {
  for (auto& x : s) cudaStreamDestroy(x);
}

// CHORUS_CUDA_DIRECT for the next calls (set while no rank thread runs; every rank reads the same value).
void set_direct(bool on) { setenv("CHORUS_CUDA_DIRECT", on ? "1" : "0", 1); }

TEST(CudaCollectives, EveryCollectiveDtypeAndOpAt1To8RanksInAndOutOfPlace) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  // Both paths: thread-ranks reading each other's device buffers (direct), and staged through pinned host memory.
  for (int n : {1, 2, 4, 8}) {
    World& w = World::get(n);
    std::vector<cudaStream_t> streams = make_streams(n);
    for (bool in_place : {false, true}) {
      for (bool direct : {true, false}) {
        set_direct(direct);
        for (chorusDataType_t t :
             {chorusInt8, chorusUint8, chorusInt32, chorusUint32, chorusInt64, chorusUint64, chorusFloat16,
              chorusBfloat16, chorusFloat32, chorusFloat64, chorusFloat8e4m3, chorusFloat8e5m2}) {
          for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
            run_collective(w, streams, "all_reduce", t, op, 1003, in_place);
            run_collective(w, streams, "reduce_scatter", t, op, 301, in_place);
            run_collective(w, streams, "reduce", t, op, 517, in_place);
          }
          run_collective(w, streams, "all_gather", t, chorusSum, 301, in_place);
          run_collective(w, streams, "broadcast", t, chorusSum, 777, in_place);
          run_collective(w, streams, "all_to_all", t, chorusSum, 129, in_place);
        }
        // Large enough to be sliced and pipelined.
        run_collective(w, streams, "all_reduce", chorusFloat32, chorusSum, size_t{4} << 20, in_place);
      }
    }
    destroy_streams(streams);
  }
  set_direct(true);
}

// Small, on the direct path between thread-ranks (kernels reading each other's buffers after stream waits on events:
// nothing spins), for compute-sanitizer memcheck (scripts/gpu-check.sh), which may serialize kernels: the staged
// path's wait kernel holds the device until a peer posts. The staged path is checked by the test above.
TEST(CudaCollectives, SmallAllReducesOnTheDirectPath) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  World& w = World::get(2);
  std::vector<cudaStream_t> streams = make_streams(2);
  set_direct(true);
  run_collective(w, streams, "all_reduce", chorusFloat32, chorusSum, 1003, false);
  run_collective(w, streams, "all_reduce", chorusBfloat16, chorusMax, 1003, true);
  destroy_streams(streams);
}

TEST(CudaCollectives, CapturedInAGraphAndReplayed) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 4;
  World& w = World::get(n);
  std::vector<cudaStream_t> streams = make_streams(n);
  const size_t count = 100003;
  auto in = per_rank_buffers(n, count * 4), out = per_rank_buffers(n, count * 4);
  ASSERT_TRUE(all_allocated(in) && all_allocated(out));
  std::vector<cudaGraph_t> graphs(n, nullptr);
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  w.run([&](int r, chorusComm_t comm) {
    cudaStream_t s = streams[r];
    // One call outside the capture first, as PyTorch asks before capturing (docs/cuda.md): the kernels' loading
    // (lazy) and the first pinned staging are not done inside a capture.
    ASSERT_EQ(chorusAllReduce(in[r]->get(), out[r]->get(), count, chorusFloat32, chorusSum, comm, s), chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_EQ(chorusAllReduce(in[r]->get(), out[r]->get(), count, chorusFloat32, chorusSum, comm, s), chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamEndCapture(s, &graphs[r]), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&execs[r], graphs[r], 0), cudaSuccess);
  });
  for (int replay = 0; replay < 3; ++replay) {
    // New inputs between replays, uploaded while no replay is in flight.
    for (int r = 0; r < n; ++r) {
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((r + 1) * (replay + 1) + i % 7);
      ASSERT_EQ(upload(in[r]->get(), x.data(), count * 4), cudaSuccess);
    }
    w.run([&](int r, chorusComm_t) {
      ASSERT_EQ(cudaGraphLaunch(execs[r], streams[r]), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    });
    for (int r = 0; r < n; ++r) {
      std::vector<float> y(count);
      ASSERT_EQ(download(y.data(), out[r]->get(), count * 4), cudaSuccess);
      for (size_t i = 0; i < count; ++i) {
        const float want = static_cast<float>(10 * (replay + 1) + 4 * (i % 7));
        ASSERT_EQ(y[i], want) << "rank " << r << " replay " << replay << " element " << i;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
  }
  destroy_streams(streams);
}

TEST(CudaCollectives, TheHostDoesNotWaitForTheStream) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  World& w = World::get(2);
  std::vector<cudaStream_t> streams = make_streams(2);
  auto buf = per_rank_buffers(2, 4096);
  ASSERT_TRUE(all_allocated(buf));
  for (int r = 0; r < 2; ++r) {
    std::vector<float> x(1024, 1.0f + r);
    ASSERT_EQ(upload(buf[r]->get(), x.data(), 4096), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t comm) {
    // A first call loads the library's kernels before any stream is held (docs/cuda.md: under lazy loading a first
    // load may wait for every stream of the context, the gated one too). 1 + 2 = 3 everywhere.
    ASSERT_EQ(chorusAllReduce(buf[r]->get(), buf[r]->get(), 1024, chorusFloat32, chorusSum, comm, streams[r]),
              chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    // The stream is held by a gate that opens only after the collective call returned on the host: a call that
    // waited for the stream would never return.
    std::atomic<bool> open{false};
    ASSERT_EQ(cudaLaunchHostFunc(
                  streams[r],
                  [](void* p) {
                    while (!static_cast<std::atomic<bool>*>(p)->load()) {
                    }
                  },
                  &open),
              cudaSuccess);
    ASSERT_EQ(chorusAllReduce(buf[r]->get(), buf[r]->get(), 1024, chorusFloat32, chorusSum, comm, streams[r]),
              chorusSuccess)
        << chorusGetLastError(comm);
    open = true;
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  for (int r = 0; r < 2; ++r) {
    std::vector<float> y(1024);
    ASSERT_EQ(download(y.data(), buf[r]->get(), 4096), cudaSuccess);
    for (float v : y) ASSERT_EQ(v, 6.0f) << "rank " << r;  // 3 + 3
  }
  destroy_streams(streams);
}

TEST(CudaCollectives, CompressedAllReduceOnDeviceBuffersGivesTheSameBitsEverywhere) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 4;
  World& w = World::get(n);
  std::vector<cudaStream_t> streams = make_streams(n);
  const size_t count = 50000;
  auto buf = per_rank_buffers(n, count * 4);
  ASSERT_TRUE(all_allocated(buf));
  for (int r = 0; r < n; ++r) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = std::sin(0.001f * static_cast<float>(i * (r + 1)));
    ASSERT_EQ(upload(buf[r]->get(), x.data(), count * 4), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t comm) {
    chorusCompression_t z = CHORUS_COMPRESSION_INIT(chorusCodecInt8);
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.compression = &z;
    ASSERT_EQ(chorusAllReduceEx(buf[r]->get(), buf[r]->get(), count, chorusFloat32, chorusSum, &o, comm, streams[r]),
              chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  std::vector<std::vector<float>> got(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) ASSERT_EQ(download(got[r].data(), buf[r]->get(), count * 4), cudaSuccess);
  for (int r = 1; r < n; ++r) EXPECT_EQ(std::memcmp(got[r].data(), got[0].data(), count * 4), 0) << "rank " << r;
  destroy_streams(streams);
}

TEST(CudaCollectives, MixedOrUnsupportedBuffersAreClearErrors) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  World& w = World::get(2);
  auto dev = per_rank_buffers(2, 4096);
  ASSERT_TRUE(all_allocated(dev));
  w.run([&](int r, chorusComm_t comm) {
    std::vector<float> host(1024, 1.0f);
    ASSERT_EQ(chorusAllReduce(dev[r]->get(), host.data(), 1024, chorusFloat32, chorusSum, comm, nullptr),
              chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("recvbuff"), std::string::npos) << chorusGetLastError(comm);
    chorusRequest_t req = nullptr;
    EXPECT_EQ(chorusIallReduce(dev[r]->get(), dev[r]->get(), 1024, chorusFloat32, chorusSum, comm, &req),
              chorusNotSupported);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("non-blocking"), std::string::npos);
    // Still usable.
    ASSERT_EQ(chorusAllReduce(host.data(), host.data(), 1024, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess);
    for (float v : host) ASSERT_EQ(v, 2.0f) << "rank " << r;
  });
  // Point-to-point: host and device buffers are not mixed in one group; the call that would mix them is refused when
  // it is made, and the group's other calls (a device exchange, legacy default stream) still run (chorusGroupEnd
  // returns the refusal again). Each rank
  // exchanges with itself only: the two thread-ranks share the NULL stream, and staged calls of two ranks on one
  // stream that waited for each other would never end.
  w.run([&](int r, chorusComm_t comm) {
    std::vector<float> host(512, 1.0f);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusSend(dev[r]->get(), 512, chorusFloat32, r, comm, nullptr), chorusSuccess);
    ASSERT_EQ(chorusRecv(dev[r]->get(2048), 512, chorusFloat32, r, comm, nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(host.data(), 512, chorusFloat32, r, comm, nullptr), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("recvbuff is host memory"), std::string::npos)
        << chorusGetLastError(comm);
    EXPECT_EQ(chorusGroupEnd(), chorusInvalidArgument);  // the others ran; the refusal is returned again
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("recvbuff is host memory"), std::string::npos)
        << chorusGetLastError(nullptr);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    for (float v : host) ASSERT_EQ(v, 1.0f);
  });
}

TEST(CudaCollectives, MismatchedCallsOnTheDirectPathAreReportedNotRun) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  World w(2);  // its own communicators: a mismatch breaks them
  std::vector<cudaStream_t> streams = make_streams(2);
  auto buf = per_rank_buffers(2, 8192);
  ASSERT_TRUE(all_allocated(buf));
  w.run([&](int r, chorusComm_t comm) {
    const size_t count = r == 0 ? 1000 : 2000;
    EXPECT_EQ(chorusAllReduce(buf[r]->get(), buf[r]->get(), count, chorusFloat32, chorusSum, comm, streams[r]),
              chorusRemoteError);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("mismatched device collective"), std::string::npos)
        << chorusGetLastError(comm);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  destroy_streams(streams);
}

// chorusSend/chorusRecv on device buffers, ordered on each rank's stream (staged through pinned host memory): a
// group exchanging with both ring neighbours and with the rank itself, then single calls from rank 0 to rank 1.
TEST(CudaCollectives, PointToPointOnDeviceBuffersInAGroupAndAlone) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 4;
  World& w = World::get(n);
  std::vector<cudaStream_t> streams = make_streams(n);
  const size_t count = 100003;
  auto val = [](int rank, int tag, size_t i) {
    return static_cast<float>(rank * 100 + tag * 10 + static_cast<int>(i % 7));
  };
  struct RankBuffers {
    DeviceBuffer to_next{count * 4}, to_self{count * 4}, from_prev{count * 4}, from_self{count * 4};
  };
  std::vector<std::unique_ptr<RankBuffers>> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(std::make_unique<RankBuffers>());
    RankBuffers& k = *b.back();
    ASSERT_TRUE(k.to_next.ok() && k.to_self.ok() && k.from_prev.ok() && k.from_self.ok());
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = val(r, 1, i);
    ASSERT_EQ(upload(k.to_next.get(), x.data(), count * 4), cudaSuccess);
    for (size_t i = 0; i < count; ++i) x[i] = val(r, 2, i);
    ASSERT_EQ(upload(k.to_self.get(), x.data(), count * 4), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t comm) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    RankBuffers& k = *b[r];
    cudaStream_t s = streams[r];
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusRecv(k.from_prev.get(), count, chorusFloat32, prev, comm, s), chorusSuccess);
    ASSERT_EQ(chorusSend(k.to_next.get(), count, chorusFloat32, next, comm, s), chorusSuccess);
    ASSERT_EQ(chorusSend(k.to_self.get(), count, chorusFloat32, r, comm, s), chorusSuccess);
    ASSERT_EQ(chorusRecv(k.from_self.get(), count, chorusFloat32, r, comm, s), chorusSuccess);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    chorusResult_t async = chorusSuccess;
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    ASSERT_EQ(async, chorusSuccess) << chorusGetLastError(comm);
  });
  std::vector<float> y(count);
  for (int r = 0; r < n; ++r) {
    const int prev = (r + n - 1) % n;
    ASSERT_EQ(download(y.data(), b[r]->from_prev.get(), count * 4), cudaSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], val(prev, 1, i)) << "rank " << r << " element " << i;
    ASSERT_EQ(download(y.data(), b[r]->from_self.get(), count * 4), cudaSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], val(r, 2, i)) << "rank " << r << " element " << i;
  }
  // Alone: rank 0 sends to rank 1 (in three calls: an empty one, then two of different sizes, so that an empty
  // message lost or left over would shift the others); the other ranks do nothing.
  w.run([&](int r, chorusComm_t comm) {
    RankBuffers& k = *b[r];
    cudaStream_t s = streams[r];
    if (r == 0) {
      ASSERT_EQ(chorusSend(k.to_next.get(), 0, chorusFloat32, 1, comm, s), chorusSuccess);
      ASSERT_EQ(chorusSend(k.to_next.get(), count, chorusFloat32, 1, comm, s), chorusSuccess);
      ASSERT_EQ(chorusSend(k.to_self.get(), 5, chorusFloat32, 1, comm, s), chorusSuccess);
    } else if (r == 1) {
      ASSERT_EQ(chorusRecv(k.from_prev.get(), 0, chorusFloat32, 0, comm, s), chorusSuccess);
      ASSERT_EQ(chorusRecv(k.from_prev.get(), count, chorusFloat32, 0, comm, s), chorusSuccess);
      ASSERT_EQ(chorusRecv(k.from_self.get(), 5, chorusFloat32, 0, comm, s), chorusSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  });
  ASSERT_EQ(download(y.data(), b[1]->from_prev.get(), count * 4), cudaSuccess);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], val(0, 1, i)) << "element " << i;
  ASSERT_EQ(download(y.data(), b[1]->from_self.get(), 5 * 4), cudaSuccess);
  for (size_t i = 0; i < 5; ++i) ASSERT_EQ(y[i], val(0, 2, i)) << "element " << i;
  destroy_streams(streams);
}

// A group spanning two communicators on one stream, called in opposite orders by the two ranks: each
// communicator's staged calls are posted before any of them is waited for, so neither rank's stream waits in one
// communicator for a peer that waits in the other.
TEST(CudaCollectives, AGroupSpanningTwoCommunicatorsOnOneStreamMeetsInEitherOrder) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  World& w = World::get(2);
  std::vector<cudaStream_t> streams = make_streams(2);
  const size_t count = 300001;  // several slices
  struct RankBuffers {
    DeviceBuffer to_a{count * 4}, to_b{count * 4}, from_a{count * 4}, from_b{count * 4};
  };
  std::vector<std::unique_ptr<RankBuffers>> b;
  for (int r = 0; r < 2; ++r) {
    b.push_back(std::make_unique<RankBuffers>());
    RankBuffers& k = *b.back();
    ASSERT_TRUE(k.to_a.ok() && k.to_b.ok() && k.from_a.ok() && k.from_b.ok());
    std::vector<int32_t> x(count, 10 + r);
    ASSERT_EQ(upload(k.to_a.get(), x.data(), count * 4), cudaSuccess);
    std::fill(x.begin(), x.end(), 20 + r);
    ASSERT_EQ(upload(k.to_b.get(), x.data(), count * 4), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t c = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &c), chorusSuccess) << chorusGetLastError(a);
    RankBuffers& k = *b[r];
    cudaStream_t s = streams[r];
    auto exchange = [&](chorusComm_t comm, DeviceBuffer& out, DeviceBuffer& in) {
      ASSERT_EQ(chorusSend(out.get(), count, chorusInt32, 1 - r, comm, s), chorusSuccess);
      ASSERT_EQ(chorusRecv(in.get(), count, chorusInt32, 1 - r, comm, s), chorusSuccess);
    };
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    if (r == 0) {
      exchange(a, k.to_a, k.from_a);
      exchange(c, k.to_b, k.from_b);
    } else {
      exchange(c, k.to_b, k.from_b);
      exchange(a, k.to_a, k.from_a);
    }
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(a) << " / " << chorusGetLastError(c);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (chorusComm_t comm : {a, c}) {
      chorusResult_t async = chorusSuccess;
      ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
      ASSERT_EQ(async, chorusSuccess) << chorusGetLastError(comm);
    }
    EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
  });
  std::vector<int32_t> y(count);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(download(y.data(), b[r]->from_a.get(), count * 4), cudaSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], 10 + (1 - r)) << "rank " << r << " element " << i;
    ASSERT_EQ(download(y.data(), b[r]->from_b.get(), count * 4), cudaSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], 20 + (1 - r)) << "rank " << r << " element " << i;
  }
  destroy_streams(streams);
}

// Collectives on device buffers inside a group: on one communicator they run in the order called, before the
// group's sends and receives, on the rank's stream. Across two communicators they are refused with nothing run (they
// are not staged together as point-to-point calls are), and both communicators stay usable.
TEST(CudaCollectives, CollectivesOnDeviceBuffersInAGroup) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 4;
  World& w = World::get(n);
  std::vector<cudaStream_t> streams = make_streams(n);
  const size_t count = 100003;
  struct RankBuffers {
    DeviceBuffer sum{count * 4}, gathered{count * 4 * n}, to_next{8}, from_prev{8};
  };
  std::vector<std::unique_ptr<RankBuffers>> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(std::make_unique<RankBuffers>());
    RankBuffers& k = *b.back();
    ASSERT_TRUE(k.sum.ok() && k.gathered.ok() && k.to_next.ok() && k.from_prev.ok());
    std::vector<float> x(count, static_cast<float>(r + 1));
    ASSERT_EQ(upload(k.sum.get(), x.data(), count * 4), cudaSuccess);
    const int64_t mine = 100 + r, none = -1;
    ASSERT_EQ(upload(k.to_next.get(), &mine, 8), cudaSuccess);
    ASSERT_EQ(upload(k.from_prev.get(), &none, 8), cudaSuccess);
  }
  w.run([&](int r, chorusComm_t comm) {
    RankBuffers& k = *b[r];
    cudaStream_t s = streams[r];
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusRecv(k.from_prev.get(), 1, chorusInt64, (r + n - 1) % n, comm, s), chorusSuccess);
    ASSERT_EQ(chorusAllReduce(k.sum.get(), k.sum.get(), count, chorusFloat32, chorusSum, comm, s), chorusSuccess);
    ASSERT_EQ(chorusAllGather(k.sum.get(), k.gathered.get(), count, chorusFloat32, comm, s), chorusSuccess);
    ASSERT_EQ(chorusSend(k.to_next.get(), 1, chorusInt64, (r + 1) % n, comm, s), chorusSuccess);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    chorusResult_t async = chorusSuccess;
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    ASSERT_EQ(async, chorusSuccess) << chorusGetLastError(comm);
  });
  std::vector<float> y(count * n);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(download(y.data(), b[r]->gathered.get(), count * 4 * n), cudaSuccess);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], 10.0f) << "rank " << r << " element " << i;
    int64_t got = 0;
    ASSERT_EQ(download(&got, b[r]->from_prev.get(), 8), cudaSuccess);
    EXPECT_EQ(got, 100 + (r + n - 1) % n) << "rank " << r;
  }
  w.run([&](int r, chorusComm_t a) {
    chorusComm_t c = nullptr;
    ASSERT_EQ(chorusCommSplit(a, 0, r, &c), chorusSuccess) << chorusGetLastError(a);
    RankBuffers& k = *b[r];
    cudaStream_t s = streams[r];
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusAllReduce(k.sum.get(), k.sum.get(), count, chorusFloat32, chorusSum, a, s), chorusSuccess);
    ASSERT_EQ(chorusAllReduce(k.sum.get(), k.sum.get(), count, chorusFloat32, chorusSum, c, s), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), chorusNotSupported);
    EXPECT_NE(std::string(chorusGetLastError(a)).find("takes collectives on host buffers only"), std::string::npos)
        << chorusGetLastError(a);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (chorusComm_t comm : {a, c}) {  // still usable: an all-reduce of one element each
      ASSERT_EQ(chorusAllReduce(k.from_prev.get(), k.from_prev.get(), 1, chorusInt64, chorusMax, comm, s),
                chorusSuccess)
          << chorusGetLastError(comm);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(download(y.data(), b[r]->sum.get(), count * 4), cudaSuccess);  // nothing of the refused group ran
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(y[i], 10.0f) << "rank " << r << " element " << i;
    int64_t got = 0;
    ASSERT_EQ(download(&got, b[r]->from_prev.get(), 8), cudaSuccess);
    EXPECT_EQ(got, 100 + n - 1) << "rank " << r;
  }
  destroy_streams(streams);
}

// The device-direct all-gather among thread-ranks is copies only (cudaMemcpyAsync between device buffers): it must
// finish while a kernel holds every thread slot of every SM, which work needing an SM could not do. The issue's
// "all-gather on copy engines, zero SMs" shown on the device; bench_cuda_collectives measures its bandwidth so.
TEST(CudaCollectives, DirectAllGatherRunsOnCopyEnginesWhileEverySmIsHeld) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  set_direct(true);
  const int n = 4;
  World& w = World::get(n);
  std::vector<cudaStream_t> streams = make_streams(n);
  const size_t count = size_t{4} << 20;  // 16 MiB of float32 per rank
  auto in = per_rank_buffers(n, count * 4), out = per_rank_buffers(n, count * 4 * n);
  ASSERT_TRUE(all_allocated(in) && all_allocated(out));
  for (int r = 0; r < n; ++r) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r * 1000 + static_cast<int>(i % 977));
    ASSERT_EQ(upload(in[r]->get(), x.data(), count * 4), cudaSuccess);
  }
  // One all-gather before the SMs are held: loading kernels (lazy, at a process's first call on device buffers) may
  // wait for the whole device, which the occupier holds for up to 60 s.
  w.run([&](int r, chorusComm_t comm) {
    ASSERT_EQ(chorusAllGather(in[r]->get(), out[r]->get(), count, chorusFloat32, comm, streams[r]), chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(cudaMemset(out[r]->get(), 0, count * 4 * n), cudaSuccess);  // checked below
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SmOccupier hold;
  ASSERT_TRUE(hold.ok()) << hold.why();
  std::atomic<int> finished{0};
  w.run([&](int r, chorusComm_t comm) {
    ASSERT_EQ(chorusAllGather(in[r]->get(), out[r]->get(), count, chorusFloat32, comm, streams[r]), chorusSuccess)
        << chorusGetLastError(comm);
    // Wait for the stream without blocking on it, at most 20 s (the occupier lets go by itself after 60 s).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    cudaError_t q = cudaErrorNotReady;
    while ((q = cudaStreamQuery(streams[r])) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(q, cudaSuccess) << "rank " << r << ": the all-gather did not finish in 20 s while every SM ("
                              << hold.blocks() << " blocks of 1024 threads on " << hold.sms()
                              << " SMs) was held: it needs an SM";
    ++finished;
  });
  EXPECT_TRUE(hold.holding()) << "the occupying kernel ended before the all-gathers did: nothing was shown";
  hold.release();
  ASSERT_EQ(finished.load(), n);
  for (int r = 0; r < n; ++r) {
    std::vector<float> y(count * n);
    ASSERT_EQ(download(y.data(), out[r]->get(), count * 4 * n), cudaSuccess);
    for (size_t i = 0; i < y.size(); ++i) {
      const int q = static_cast<int>(i / count);
      ASSERT_EQ(y[i], static_cast<float>(q * 1000 + static_cast<int>((i % count) % 977)))
          << "rank " << r << " element " << i;
    }
  }
  destroy_streams(streams);
}

// Ranks as processes sharing the GPU (each process its own context and stream): through CUDA IPC (mapped buffers,
// interprocess events), and staged through pinned memory and the shm transport (CHORUS_CUDA_DIRECT=0).
// tests/gpu/gpu_mp_worker.cc checks every rank's results and prints "gpu-mp: ok".
TEST(CudaProcesses, TwoAndFourProcessesOnOneGpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  for (const char* direct : {"1", "0"})
    for (int n : {2, 4}) {
      // The INFO log says which path the ranks decided on, so the test knows the IPC path was taken.
      const test::Result r =
          test::run(std::string("CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=RUNTIME CHORUS_CUDA_DIRECT=") + direct + " " +
                    "'" + test::built_tool(CHORUSRUN) + "' -n " + std::to_string(n) + " --timeout 120 '" +
                    test::built_tool(GPU_MP_WORKER) + "'");
      EXPECT_EQ(r.code, 0) << "CHORUS_CUDA_DIRECT=" << direct << "\n" << r.out;
      EXPECT_EQ(test::count_of(r.out, "gpu-mp: ok"), n) << "CHORUS_CUDA_DIRECT=" << direct << "\n" << r.out;
      EXPECT_EQ(test::count_of(r.out, "device-direct over CUDA IPC"), std::string(direct) == "1" ? n : 0)
          << "CHORUS_CUDA_DIRECT=" << direct << "\n"
          << r.out;
    }
}

}  // namespace
}  // namespace chorus::gputest
