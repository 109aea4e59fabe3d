// CUDA reduction kernels (src/kernels/cuda/reduce.cuh) against the CPU Reducer (src/kernels/cpu/reduce.h): every
// dtype x op x (premul, final avg), vector and scalar paths (aligned, equally misaligned, differently misaligned
// pointers), in place, and copy. Results must be the CPU's bits exactly; the one allowance is NaN, compared as
// "both NaN" for fp32/fp64/fp16/bf16 (GPU arithmetic returns the canonical NaN, x86 the operand's payload; the
// fp8 formats have fixed NaN codes and are compared exactly). Random data from fixed seeds: random bit patterns
// (NaN, Inf, subnormals, extremes) mixed with ordinary values.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/float_types.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/host_flag.cuh"
#include "kernels/cuda/reduce.cuh"
#include "tests/gpu/gpu_test.h"

namespace chorus::kernels {
namespace {

using gputest::DeviceBuffer;

const chorusDataType_t kAllTypes[] = {chorusInt8,    chorusUint8,    chorusInt32,      chorusUint32,
                                      chorusInt64,   chorusUint64,   chorusFloat16,    chorusFloat32,
                                      chorusFloat64, chorusBfloat16, chorusFloat8e4m3, chorusFloat8e5m2};
const ReduceKind kAllKinds[] = {ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min};

// Random elements of `dtype`: half random bits, half ordinary values (small integers, values near 1).
std::vector<std::byte> random_elems(chorusDataType_t dtype, size_t n, unsigned seed) {
  const size_t es = dtype_size(dtype);
  std::vector<std::byte> v(n * es);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    if (i % 2 == 1) {
      const float f = normal(rng);
      switch (dtype) {
        case chorusFloat16: bits = float_to_half(f); break;
        case chorusBfloat16: bits = float_to_bf16(f); break;
        case chorusFloat8e4m3: bits = float_to_e4m3(f); break;
        case chorusFloat8e5m2: bits = float_to_e5m2(f); break;
        case chorusFloat32: bits = std::bit_cast<uint32_t>(f); break;
        case chorusFloat64: bits = std::bit_cast<uint64_t>(static_cast<double>(f)); break;
        default: bits = static_cast<uint64_t>(static_cast<int64_t>(f * 8.0f)); break;
      }
    }
    std::memcpy(v.data() + i * es, &bits, es);  // little-endian: the low bytes
  }
  return v;
}

bool is_nan(chorusDataType_t dtype, const std::byte* p) {
  uint64_t b = 0;
  std::memcpy(&b, p, dtype_size(dtype));
  switch (dtype) {
    case chorusFloat16: return (b & 0x7fff) > 0x7c00;
    case chorusBfloat16: return (b & 0x7fff) > 0x7f80;
    case chorusFloat32: return (b & 0x7fffffffu) > 0x7f800000u;
    case chorusFloat64: return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    // fp8: either sign. A NaN result's sign is the hardware's (x86 gives its invalid-operation NaN the sign bit,
    // the GPU's canonical NaN has none), and the stores keep it.
    case chorusFloat8e4m3: return (b & 0x7f) == 0x7f;
    case chorusFloat8e5m2: return (b & 0x7f) > 0x7c;
    default: return false;  // integers
  }
}

// Index of the first element that differs (NaN == NaN as above), or -1.
long first_mismatch(chorusDataType_t dtype, const std::vector<std::byte>& want, const std::vector<std::byte>& got) {
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i * es < want.size(); ++i) {
    const std::byte* w = want.data() + i * es;
    const std::byte* g = got.data() + i * es;
    if (std::memcmp(w, g, es) == 0) continue;
    if (is_nan(dtype, w) && is_nan(dtype, g)) continue;
    return static_cast<long>(i);
  }
  return -1;
}

std::string hex(const std::byte* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = n; i-- > 0;) {
    s += d[static_cast<unsigned>(p[i]) >> 4];
    s += d[static_cast<unsigned>(p[i]) & 15];
  }
  return s;
}

ReduceSpec make_spec(chorusDataType_t dtype, ReduceKind kind, bool premul, int avg) {
  ReduceSpec s;
  s.dtype = dtype;
  s.kind = kind;
  s.premul = premul;
  s.scalar_f = 0.3712;
  s.scalar_i = -5;
  s.avg_divisor = avg;
  return s;
}

// Element offsets (in elements) of dst, a and b inside their buffers.
struct Offsets {
  size_t dst, a, b;
};

// Runs one reduction on the GPU and on the CPU and compares. in_place: dst is a (offsets.dst ignored).
void check_reduce(const ReduceSpec& spec, size_t n, Offsets off, bool in_place, bool b_is_input, bool final,
                  unsigned seed) {
  const size_t es = dtype_size(spec.dtype);
  const auto a = random_elems(spec.dtype, n, seed);
  const auto b = random_elems(spec.dtype, n, seed + 1);
  std::vector<std::byte> want(n * es);
  Reducer(spec).reduce(want.data(), a.data(), b.data(), n, b_is_input, final);

  DeviceBuffer da(n * es), db(n * es), dd(n * es);
  ASSERT_TRUE(da.ok() && db.ok() && dd.ok());
  std::byte* pa = da.get(off.a * es);
  std::byte* pb = db.get(off.b * es);
  std::byte* pd = in_place ? pa : dd.get(off.dst * es);
  CHORUS_CUDA_OK(gputest::upload(pa, a.data(), a.size()));
  CHORUS_CUDA_OK(gputest::upload(pb, b.data(), b.size()));
  cuda::reduce(spec, pd, pa, pb, n, b_is_input, final, nullptr);
  CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
  std::vector<std::byte> got(n * es);
  CHORUS_CUDA_OK(gputest::download(got.data(), pd, got.size()));
  const long i = first_mismatch(spec.dtype, want, got);
  EXPECT_EQ(i, -1) << dtype_name(spec.dtype) << " kind " << static_cast<int>(spec.kind) << " premul " << spec.premul
                   << " avg " << spec.avg_divisor << " n " << n << ": element " << i << " a=0x"
                   << hex(a.data() + (i < 0 ? 0 : i) * es, es) << " b=0x" << hex(b.data() + (i < 0 ? 0 : i) * es, es)
                   << " cpu=0x" << hex(want.data() + (i < 0 ? 0 : i) * es, es) << " gpu=0x"
                   << hex(got.data() + (i < 0 ? 0 : i) * es, es);
}

TEST(CudaReduce, EveryDtypeOpPremulAvgMatchesCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 1;
  for (chorusDataType_t dtype : kAllTypes) {
    for (ReduceKind kind : kAllKinds) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool premul = variant & 1;
        const bool final = variant & 2;
        const ReduceSpec spec = make_spec(dtype, kind, premul, final ? 3 : 0);
        check_reduce(spec, 40009, {0, 0, 0}, false, true, final, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaReduce, HeadTailAndScalarPathsMatchCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 1000;
  for (chorusDataType_t dtype : kAllTypes) {
    const ReduceSpec spec = make_spec(dtype, ReduceKind::Sum, true, 7);
    for (size_t n : {size_t{1}, size_t{3}, size_t{15}, size_t{17}, size_t{1000}, size_t{65537}}) {
      check_reduce(spec, n, {1, 1, 1}, false, true, true, seed++);   // same misalignment: scalar head
      check_reduce(spec, n, {0, 1, 0}, false, false, true, seed++);  // different: scalar all the way
      check_reduce(spec, n, {3, 3, 5}, false, true, false, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaReduce, InPlaceMatchesCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 2000;
  for (chorusDataType_t dtype : kAllTypes) {
    for (ReduceKind kind : kAllKinds) {
      check_reduce(make_spec(dtype, kind, false, 4), 10001, {0, 0, 0}, true, true, true, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CudaReduce, LargeAverageDivisorAndIntegerWrap) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 3000;
  for (chorusDataType_t dtype : kAllTypes) {
    check_reduce(make_spec(dtype, ReduceKind::Sum, true, 1000), 5000, {0, 0, 0}, false, true, true, seed++);
    check_reduce(make_spec(dtype, ReduceKind::Prod, true, 0), 5000, {0, 0, 0}, false, true, false, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaCopy, TransformsMatchCpuAndPlainCopyIsExact) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  unsigned seed = 4000;
  for (chorusDataType_t dtype : kAllTypes) {
    const size_t es = dtype_size(dtype);
    for (int variant = 0; variant < 4; ++variant) {
      const bool premul = variant & 1;
      const bool final = variant & 2;
      const ReduceSpec spec = make_spec(dtype, ReduceKind::Sum, premul, 5);
      for (size_t off : {size_t{0}, size_t{1}}) {
        const size_t n = 33333;
        const auto src = random_elems(dtype, n, seed++);
        std::vector<std::byte> want(n * es);
        Reducer(spec).copy(want.data(), src.data(), n, true, final);
        DeviceBuffer ds(n * es), dd(n * es);
        ASSERT_TRUE(ds.ok() && dd.ok());
        CHORUS_CUDA_OK(gputest::upload(ds.get(off * es), src.data(), src.size()));
        cuda::copy(spec, dd.get(), ds.get(off * es), n, true, final, nullptr);
        CHORUS_CUDA_OK(cudaStreamSynchronize(nullptr));
        std::vector<std::byte> got(n * es);
        CHORUS_CUDA_OK(gputest::download(got.data(), dd.get(), got.size()));
        EXPECT_EQ(first_mismatch(dtype, want, got), -1) << dtype_name(dtype) << " variant " << variant;
      }
    }
  }
}

TEST(CudaReduce, OrderedOnTheCallersStream) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  // Two dependent reductions on a non-default stream, read back after one stream synchronisation only.
  const size_t n = 1 << 20;
  std::vector<float> a(n, 1.5f), b(n, 2.0f);
  DeviceBuffer da(n * 4), db(n * 4);
  ASSERT_TRUE(da.ok() && db.ok());
  cudaStream_t s;
  CHORUS_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHORUS_CUDA_OK(cudaMemcpyAsync(da.get(), a.data(), n * 4, cudaMemcpyHostToDevice, s));
  CHORUS_CUDA_OK(cudaMemcpyAsync(db.get(), b.data(), n * 4, cudaMemcpyHostToDevice, s));
  const ReduceSpec spec = make_spec(chorusFloat32, ReduceKind::Sum, false, 2);
  cuda::reduce(spec, da.get(), da.get(), db.get(), n, false, false, s);  // 3.5
  cuda::reduce(spec, da.get(), da.get(), db.get(), n, false, true, s);   // (3.5 + 2) / 2
  std::vector<float> got(n);
  CHORUS_CUDA_OK(cudaMemcpyAsync(got.data(), da.get(), n * 4, cudaMemcpyDeviceToHost, s));
  CHORUS_CUDA_OK(cudaStreamSynchronize(s));
  CHORUS_CUDA_OK(cudaStreamDestroy(s));
  for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(got[i], 2.75f) << i;
}

// The staging path's wait (runtime/cuda_stream.cc): the stream's later work runs only after the host sets the flag,
// and then promptly. A kernel that never saw the host's store fails here after 10 s instead of hanging the suite.
TEST(CudaHostFlag, StreamWaitsUntilTheHostSetsTheFlag) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  void* host = nullptr;
  CHORUS_CUDA_OK(cudaHostAlloc(&host, 64, cudaHostAllocPortable | cudaHostAllocMapped));
  auto* flag = static_cast<uint32_t*>(host);
  *flag = 0;
  void* flag_dev = nullptr;
  CHORUS_CUDA_OK(cudaHostGetDevicePointer(&flag_dev, host, 0));
  DeviceBuffer d(4096);
  ASSERT_TRUE(d.ok());
  cudaStream_t s;
  CHORUS_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t after;
  CHORUS_CUDA_OK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  CHORUS_CUDA_OK(cudaMemsetAsync(d.get(), 0, 4096, s));
  cuda::wait_host_flag(static_cast<const uint32_t*>(flag_dev), 1, s);
  CHORUS_CUDA_OK(cudaMemsetAsync(d.get(), 0x5a, 4096, s));
  CHORUS_CUDA_OK(cudaEventRecord(after, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady) << "the stream did not wait for the flag";
  __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaEventQuery(after)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  ASSERT_EQ(q, cudaSuccess) << "the stream did not resume within 10 s of the host setting the flag";
  std::vector<uint8_t> got(4096);
  CHORUS_CUDA_OK(cudaMemcpy(got.data(), d.get(), 4096, cudaMemcpyDeviceToHost));
  for (uint8_t v : got) ASSERT_EQ(v, 0x5a);
  CHORUS_CUDA_OK(cudaEventDestroy(after));
  CHORUS_CUDA_OK(cudaStreamDestroy(s));
  CHORUS_CUDA_OK(cudaFreeHost(host));
}

// Argument errors are found on the host before anything is enqueued, so these run without a device.
TEST(CudaReduceArgs, RejectedBeforeAnyLaunch) {
  alignas(16) static uint8_t buf[256];
  auto expect_invalid = [](auto&& fn, const char* what) {
    try {
      fn();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusInvalidArgument) << what << ": " << e.what();
    }
  };
  const ReduceSpec ok = make_spec(chorusFloat32, ReduceKind::Sum, false, 0);
  ReduceSpec bad_type = ok;
  bad_type.dtype = static_cast<chorusDataType_t>(77);
  ReduceSpec bad_div = ok;
  bad_div.avg_divisor = -1;
  expect_invalid([&] { cuda::reduce(bad_type, buf, buf, buf, 4, false, false, nullptr); }, "dtype");
  expect_invalid([&] { cuda::reduce(bad_div, buf, buf, buf, 4, false, false, nullptr); }, "divisor");
  expect_invalid([&] { cuda::reduce(ok, nullptr, buf, buf, 4, false, false, nullptr); }, "null dst");
  expect_invalid([&] { cuda::reduce(ok, buf + 2, buf, buf + 64, 4, false, false, nullptr); }, "misaligned dst");
  expect_invalid([&] { cuda::reduce(ok, buf + 4, buf, buf + 64, 4, false, false, nullptr); }, "partial overlap");
  expect_invalid([&] { cuda::copy(ok, buf + 4, buf, 4, false, false, nullptr); }, "copy partial overlap");
  cuda::reduce(ok, nullptr, nullptr, nullptr, 0, false, false, nullptr);  // n == 0: nothing to do, no error
}

}  // namespace
}  // namespace chorus::kernels
