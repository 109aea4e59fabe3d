// bench_cuda_kernels: bandwidth of the CUDA reduction and codec kernels against the device-to-device copy ceiling
// measured in the same run (cudaMemcpyAsync, bytes read + written per second, as in /work/shared/GPU-NOTES.md).
//
// Bytes counted per call (the bytes the kernel must move, not what the caches see):
//   copy ceiling            2 S          (S = --bytes, one buffer)
//   reduce a+b->c           3 S          (two reads, one write; S per operand)
//   copy with premul        2 S
//   encode                  S + message  (+ 2 S with error feedback: the residual is read and written)
//   decode                  message + S
//   decode_accumulate       message + 2 S
// Time per call: CUDA events around --iters back-to-back launches on one stream, after warm-up; the median of
// --trials such runs. Output: a Markdown table with GB/s (1e9 bytes/s), the ratio to the copy ceiling and the
// target of the CUDA issue (reduction >= 90%, codecs >= 80%).
//
// Usage: bench_cuda_kernels [--bytes N] [--iters N] [--trials N]
// Exit status: 0 measured; 1 a CUDA error or a bad argument; 2 no CUDA device (nothing measured; the message says so).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/codec.cuh"
#include "kernels/cuda/reduce.cuh"

namespace {

using namespace chorus::kernels;

struct Options {
  size_t bytes = size_t{256} << 20;
  int iters = 20;
  int trials = 5;
};

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_kernels: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

class Timer {
 public:
  Timer() {
    cuda_ok(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Median seconds per call of fn over `trials` runs of `iters` calls, after two warm-up calls.
  double per_call(const std::function<void()>& fn, const Options& o) {
    fn();
    fn();
    cuda_ok(cudaStreamSynchronize(nullptr), "warm-up");
    std::vector<double> t;
    for (int r = 0; r < o.trials; ++r) {
      cuda_ok(cudaEventRecord(start_, nullptr), "cudaEventRecord");
      for (int i = 0; i < o.iters; ++i) fn();
      cuda_ok(cudaEventRecord(stop_, nullptr), "cudaEventRecord");
      cuda_ok(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0;
      cuda_ok(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      t.push_back(ms * 1e-3 / o.iters);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

struct Row {
  std::string kernel, detail;
  double bytes, seconds;
  double target;  // fraction of the ceiling the issue asks for; 0 = none
};

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

// Gaussian-like fp32 values (sum of four uniforms), cheap to make on the host.
void fill_floats(float* dev, size_t n) {
  std::vector<float> h(n);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& x : h) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      sum += static_cast<float>(s >> 40) * 0x1p-24f;
    }
    x = sum - 2.0f;
  }
  cuda_ok(cudaMemcpy(dev, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
}

const char* dtype_label(chorusDataType_t d) {
  switch (d) {
    case chorusFloat32: return "fp32";
    case chorusBfloat16: return "bf16";
    case chorusFloat16: return "fp16";
    case chorusFloat8e4m3: return "fp8e4m3";
    case chorusInt32: return "int32";
    default: return "?";
  }
}

size_t dsize(chorusDataType_t d) {
  switch (d) {
    case chorusFloat32:
    case chorusInt32: return 4;
    case chorusBfloat16:
    case chorusFloat16: return 2;
    default: return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--bytes" || a == "--iters" || a == "--trials") && i + 1 < argc) {
      const long long v = std::atoll(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "bench_cuda_kernels: %s must be positive\n", a.c_str());
        return 1;
      }
      if (a == "--bytes") o.bytes = static_cast<size_t>(v) & ~size_t{4095};
      if (a == "--iters") o.iters = static_cast<int>(v);
      if (a == "--trials") o.trials = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "usage: bench_cuda_kernels [--bytes N] [--iters N] [--trials N]\n");
      return 1;
    }
  }
  int ndev = 0;
  const cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "bench_cuda_kernels: no CUDA device (cudaGetDeviceCount: %s); nothing measured\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 2;
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB; buffers of %zu MiB, %d calls x %d trials "
      "(median)\n\n",
      prop.name, prop.major, prop.minor, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
      o.bytes >> 20, o.iters, o.trials);

  const size_t S = o.bytes;
  std::byte* a = static_cast<std::byte*>(device_alloc(S));
  std::byte* b = static_cast<std::byte*>(device_alloc(S));
  std::byte* c = static_cast<std::byte*>(device_alloc(S));
  std::byte* r = static_cast<std::byte*>(device_alloc(S));
  const size_t nf = S / sizeof(float);
  fill_floats(reinterpret_cast<float*>(a), nf);
  fill_floats(reinterpret_cast<float*>(b), nf);
  cuda_ok(cudaMemset(r, 0, S), "cudaMemset");
  Timer timer;
  std::vector<Row> rows;

  const double t_copy =
      timer.per_call([&] { cuda_ok(cudaMemcpyAsync(c, a, S, cudaMemcpyDeviceToDevice, nullptr), "copy"); }, o);
  rows.push_back({"cudaMemcpyAsync D2D", "copy ceiling", 2.0 * S, t_copy, 0});

  try {
    for (chorusDataType_t d : {chorusFloat32, chorusBfloat16, chorusFloat16, chorusFloat8e4m3, chorusInt32}) {
      ReduceSpec spec;
      spec.dtype = d;
      spec.kind = ReduceKind::Sum;
      const size_t n = S / dsize(d);
      const double t = timer.per_call([&] { cuda::reduce(spec, c, a, b, n, false, false, nullptr); }, o);
      rows.push_back({"reduce sum a+b->c", dtype_label(d), 3.0 * S, t, 0.9});
    }
    {
      ReduceSpec spec;
      spec.dtype = chorusFloat32;
      spec.premul = true;
      spec.scalar_f = 0.5;
      const double t = timer.per_call([&] { cuda::copy(spec, c, a, nf, true, false, nullptr); }, o);
      rows.push_back({"copy premul", "fp32", 2.0 * S, t, 0});
    }

    using codec::Codec;
    using codec::CodecKind;
    struct C {
      Codec c;
      const char* label;
    };
    std::vector<C> codecs;
    auto mk = [](CodecKind k, uint32_t block, bool sr) {
      Codec x;
      x.kind = k;
      x.block = block;
      x.stochastic_rounding = sr;
      x.seed = 1;
      return x;
    };
    codecs.push_back({mk(CodecKind::Int8, 256, false), "int8 b256"});
    codecs.push_back({mk(CodecKind::Int8, 256, true), "int8 b256 SR"});
    codecs.push_back({mk(CodecKind::Fp8E4M3, 0, false), "fp8_e4m3 (MX)"});
    codecs.push_back({mk(CodecKind::Int4, 0, false), "int4"});
    codecs.push_back({mk(CodecKind::Sign1, 2048, false), "sign1 b2048"});
    codecs.push_back({mk(CodecKind::SignVote, 0, false), "sign_vote"});
    // With the Hadamard rotation (two more passes through a work buffer; no target: the is for the codecs).
    for (C k : {C{mk(CodecKind::Int8, 256, false), "int8 b256 rht"},
                C{mk(CodecKind::Sign1, 2048, false), "sign1 b2048 rht"}}) {
      k.c.rotation = true;
      codecs.push_back(k);
    }
    // The message of int8 (the largest) fits in c; every message is at most S + S / 8.
    for (const C& k : codecs) {
      const size_t msg = codec::encoded_bytes(k.c, nf);
      if (msg > S) continue;
      const double target = k.c.rotation ? 0.0 : 0.8;
      const float* in = reinterpret_cast<const float*>(a);
      const double t_enc = timer.per_call([&] { cuda::encode(k.c, in, nf, c, {}, nullptr, nullptr); }, o);
      rows.push_back({"encode", k.label, static_cast<double>(S + msg), t_enc, target});
      if (k.c.kind != CodecKind::SignVote && !k.c.stochastic_rounding) {
        codec::EncodeCtx ctx;
        ctx.residual = reinterpret_cast<float*>(r);
        const double t_ef = timer.per_call([&] { cuda::encode(k.c, in, nf, c, ctx, nullptr, nullptr); }, o);
        rows.push_back({"encode + error feedback", k.label, static_cast<double>(3 * S + msg), t_ef, target});
      }
      if (k.c.stochastic_rounding) continue;
      auto* out = reinterpret_cast<float*>(b);
      const double t_dec = timer.per_call([&] { cuda::decode(k.c, c, nf, out, nullptr); }, o);
      rows.push_back({"decode", k.label, static_cast<double>(S + msg), t_dec, target});
      const double t_acc = timer.per_call([&] { cuda::decode_accumulate(k.c, c, nf, out, nullptr); }, o);
      rows.push_back({"decode_accumulate", k.label, static_cast<double>(2 * S + msg), t_acc, target});
    }
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  const double ceiling = rows[0].bytes / rows[0].seconds;
  std::printf("| kernel | data | bytes per call | time (us) | GB/s | of copy ceiling | target |\n");
  std::printf("|---|---|---:|---:|---:|---:|---|\n");
  for (const Row& row : rows) {
    const double bw = row.bytes / row.seconds;
    const double frac = bw / ceiling;
    std::string target = "-";
    if (row.target > 0)
      target = std::string(frac >= row.target ? "met" : "MISSED") +
               " (>= " + std::to_string(static_cast<int>(row.target * 100)) + "%)";
    std::printf("| %s | %s | %.0f MiB | %.1f | %.0f | %.1f%% | %s |\n", row.kernel.c_str(), row.detail.c_str(),
                row.bytes / (1 << 20), row.seconds * 1e6, bw / 1e9, 100.0 * frac, target.c_str());
  }
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(r)}) {
    cudaFree(p);
  }
  return 0;
}
