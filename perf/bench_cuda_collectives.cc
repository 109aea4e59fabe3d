// Collectives on device buffers among ranks as threads sharing one GPU, both paths (src/runtime/cuda_local.h: peers'
// buffers read directly; src/runtime/cuda_stream.h: staged through pinned host memory), against the
// ceilings of the path they take, measured in the same run: pinned host <-> device cudaMemcpyAsync bandwidth (the
// staging copies) and device-to-device copy bandwidth (HBM). For each rank count (1, 2, 4, 8) and size (bytes per
// rank) it prints the time per call, algorithm and bus bandwidth (nccl-tests' definitions: busbw = algbw x
// 2(n-1)/n for all-reduce, (n-1)/n for all-gather), and the device memory bytes each call moves per second (the
// staging copies read and write every byte of the buffers once each, summed over ranks) as a fraction of the HBM
// ceiling. Sizes are the input bytes per rank (the all-gather's algbw counts its whole output, as nccl-tests does).
// Timing: the host clock around `iters` calls enqueued back to back on every rank's stream, after a warm-up, between
// two barriers of the rank threads; median of `trials`.
//
// Usage: bench_cuda_collectives [--max-bytes N] [--iters N] [--trials N]. Exits 2 with "no CUDA device" without one.
#include <chorus/chorus.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_collectives: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Bandwidth in GB/s of cudaMemcpyAsync of `bytes` of kind `kind` (bytes copied per second), median of 5 x 10.
double copy_bandwidth(size_t bytes, cudaMemcpyKind kind) {
  void *a = nullptr, *b = nullptr;
  const bool host_src = kind == cudaMemcpyHostToDevice, host_dst = kind == cudaMemcpyDeviceToHost;
  check(host_src ? cudaMallocHost(&a, bytes) : cudaMalloc(&a, bytes), "alloc");
  check(host_dst ? cudaMallocHost(&b, bytes) : cudaMalloc(&b, bytes), "alloc");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> gbs;
  for (int t = 0; t < 6; ++t) {
    cudaEventRecord(e0, s);
    for (int i = 0; i < 10; ++i) check(cudaMemcpyAsync(b, a, bytes, kind, s), "cudaMemcpyAsync");
    cudaEventRecord(e1, s);
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (t > 0) gbs.push_back(10.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  host_src ? cudaFreeHost(a) : cudaFree(a);
  host_dst ? cudaFreeHost(b) : cudaFree(b);
  cudaStreamDestroy(s);
  return gbs[gbs.size() / 2];
}

// Median time per call (microseconds) of `coll` on n thread-ranks, `bytes` per rank of float32.
double time_collective(int n, const std::string& coll, size_t bytes, int iters, int trials) {
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) std::exit(1);
  std::vector<double> per_trial_us(static_cast<size_t>(trials), 0.0);
  std::barrier sync(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      chorusComm_t comm = nullptr;
      if (chorusCommInitRank(&comm, n, id, r) != chorusSuccess) {
        std::fprintf(stderr, "init: %s\n", chorusGetLastError(nullptr));
        std::exit(1);
      }
      const size_t count = std::max<size_t>(bytes / 4, 1);
      const size_t out_elems = coll == "all_gather" ? count * n : count;
      void *in = nullptr, *out = nullptr;
      check(cudaMalloc(&in, count * 4), "cudaMalloc");
      check(cudaMalloc(&out, out_elems * 4), "cudaMalloc");
      check(cudaMemset(in, 0, count * 4), "cudaMemset");
      cudaStream_t s;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      auto call = [&] {
        const chorusResult_t res = coll == "all_gather"
                                       ? chorusAllGather(in, out, count, chorusFloat32, comm, s)
                                       : chorusAllReduce(in, out, count, chorusFloat32, chorusSum, comm, s);
        if (res != chorusSuccess) {
          std::fprintf(stderr, "%s: %s\n", coll.c_str(), chorusGetLastError(comm));
          std::exit(1);
        }
      };
      call();
      check(cudaStreamSynchronize(s), "sync");
      for (int t = 0; t < trials; ++t) {
        sync.arrive_and_wait();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) call();
        check(cudaStreamSynchronize(s), "sync");
        sync.arrive_and_wait();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (r == 0) per_trial_us[static_cast<size_t>(t)] = us / iters;
      }
      cudaStreamDestroy(s);
      cudaFree(in);
      cudaFree(out);
      chorusCommDestroy(comm);
    });
  }
  for (auto& t : ts) t.join();
  std::sort(per_trial_us.begin(), per_trial_us.end());
  return per_trial_us[per_trial_us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_bytes = size_t{256} << 20;
  int iters = 5, trials = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_collectives: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--max-bytes") {
      max_bytes = std::strtoull(next(), nullptr, 0);
    } else if (a == "--iters") {
      iters = std::atoi(next());
    } else if (a == "--trials") {
      trials = std::atoi(next());
    } else {
      std::fprintf(stderr, "usage: bench_cuda_collectives [--max-bytes N] [--iters N] [--trials N]\n");
      return 2;
    }
  }
  // Every rank's waiting call holds a hardware queue; 8 thread-ranks need more than the default 8 (docs/cuda.md).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("bench_cuda_collectives: no CUDA device\n");
    return 2;
  }
  const size_t ceiling_bytes = std::min<size_t>(max_bytes, size_t{256} << 20);
  const double h2d = copy_bandwidth(ceiling_bytes, cudaMemcpyHostToDevice);
  const double d2h = copy_bandwidth(ceiling_bytes, cudaMemcpyDeviceToHost);
  // Device-to-device: bytes read + written per second (the HBM traffic).
  const double d2d = 2 * copy_bandwidth(ceiling_bytes, cudaMemcpyDeviceToDevice);
  std::printf(
      "# ceilings: pinned host->device %.1f GB/s, device->host %.1f GB/s, device-to-device (HBM read+write) "
      "%.1f GB/s\n",
      h2d, d2h, d2d);
  std::printf(
      "# collectives on device buffers, ranks as threads on one GPU, float32; path: direct (peers' device buffers "
      "read by copies and reduction kernels, src/runtime/cuda_local.h) or staged (through pinned host memory)\n");
  std::printf("%-10s %-7s %5s %12s %12s %10s %10s %12s %8s\n", "coll", "path", "ranks", "bytes/rank", "time(us)",
              "algbw", "busbw", "HBM GB/s", "of HBM");
  for (const std::string coll : {"all_reduce", "all_gather"}) {
    for (int n : {1, 2, 4, 8}) {
      for (const bool direct : {true, false}) {
        setenv("CHORUS_CUDA_DIRECT", direct ? "1" : "0", 1);  // read at each call; no rank thread runs here
        for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
          if (bytes > max_bytes) continue;
          const int it = bytes >= (size_t{16} << 20) ? std::max(1, iters / 2) : iters * 20;
          const double us = time_collective(n, coll, bytes, it, trials);
          // nccl-tests' size: the all-gather's whole output, the all-reduce's buffer.
          const double out_bytes = coll == "all_gather" ? static_cast<double>(bytes) * n : static_cast<double>(bytes);
          const double algbw = out_bytes / (us * 1e-6) / 1e9;
          const double factor = n == 1 ? 0.0 : (coll == "all_reduce" ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n);
          // Device memory bytes per call, all ranks. Staged: each rank's input read once, output written once.
          // Direct all-reduce: per rank n - 1 reduction kernels over its 1/n share (read 2, write 1) and n - 1 copies
          // of a 1/n share (read 1, write 1); direct all-gather: per rank n copies of an input (read 1, write 1).
          const double sz = static_cast<double>(bytes);
          double per_rank = sz + out_bytes;
          if (direct && n > 1) per_rank = coll == "all_reduce" ? 5.0 * (n - 1) / n * sz : 2.0 * n * sz;
          const double hbm = n * per_rank / (us * 1e-6) / 1e9;
          std::printf("%-10s %-7s %5d %12zu %12.1f %10.3f %10.3f %12.1f %7.1f%%\n", coll.c_str(),
                      direct ? "direct" : "staged", n, bytes, us, algbw, algbw * factor, hbm, 100.0 * hbm / d2d);
        }
      }
    }
  }
  return 0;
}
