// Collectives on device buffers among ranks sharing one GPU, both paths (src/runtime/cuda_local.h: peers' buffers
// read directly; src/runtime/cuda_stream.h: staged through pinned host memory), against the ceilings of the path
// they take, measured in the same run: pinned host <-> device cudaMemcpyAsync bandwidth (the staging copies) and
// device-to-device copy bandwidth (HBM). For each rank count and size (bytes per rank) it prints the time per call,
// algorithm and bus bandwidth (nccl-tests' definitions: busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather), and the device memory bytes each call moves per second (summed over ranks) as a fraction of the HBM
// ceiling. Sizes are the input bytes per rank (the all-gather's algbw counts its whole output, as nccl-tests does).
// Timing: the host clock around `iters` calls enqueued back to back on every rank's stream, after a warm-up, between
// two barriers of the ranks; median of `trials`.
//
// Ranks as threads (the default): first the issue's targets, so that a time limit on the whole run cannot cut them
// off: the 4-rank direct all-reduce at 8 bytes and at the largest size, and the copy-engine all-gather (4
// thread-ranks on the direct path, whose copies are cudaMemcpyAsync between device buffers, timed once as is and
// once while a kernel holds every thread slot of every SM, tests/gpu/sm_occupier.h, against the cudaMemcpyAsync
// device-to-device bandwidth: finishing under the occupier shows it uses no SM). Then the whole table: 1, 2, 4 and
// 8 thread-ranks of this process.
// Ranks as processes (--processes, under `chorusrun -n N`): each process one rank on the same GPU (CUDA IPC or
// staged); rank 0 prints the rows.
//
// Usage: bench_cuda_collectives [--max-bytes N] [--iters N] [--trials N] [--processes]. Exits 2 with "no CUDA device"
// without one.
#include <chorus/chorus.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/sm_occupier.h"

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

struct Ceilings {
  double h2d = 0, d2h = 0;
  double d2d_copy = 0;                         // device-to-device cudaMemcpyAsync, bytes copied per second (GB/s)
  double hbm() const { return 2 * d2d_copy; }  // the same, counting read + write
};

Ceilings measure_ceilings(size_t max_bytes) {
  const size_t bytes = std::min<size_t>(max_bytes, size_t{256} << 20);
  Ceilings c;
  c.h2d = copy_bandwidth(bytes, cudaMemcpyHostToDevice);
  c.d2h = copy_bandwidth(bytes, cudaMemcpyDeviceToHost);
  c.d2d_copy = copy_bandwidth(bytes, cudaMemcpyDeviceToDevice);
  return c;
}

// One rank's part of a timed collective on its buffers `in` (bytes) and `out` (bytes x n for the all-gather) and a
// stream of its own: `coll` of `bytes` per rank of float32, a warm-up call, then per trial: barrier, `iters` calls,
// stream synchronized, barrier. Returns the time per call of every trial (microseconds).
std::vector<double> rank_timings(chorusComm_t comm, const std::string& coll, size_t bytes, void* in, void* out,
                                 int iters, int trials, const std::function<void()>& barrier) {
  const size_t count = std::max<size_t>(bytes / 4, 1);
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
  // Every rank is past its allocations before any call: a staged call's stream waits for its peers' calls, and a
  // peer blocked in an allocation that waits for the device would never make its own.
  barrier();
  call();
  check(cudaStreamSynchronize(s), "sync");
  std::vector<double> us(static_cast<size_t>(trials), 0.0);
  for (int t = 0; t < trials; ++t) {
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    check(cudaStreamSynchronize(s), "sync");
    barrier();
    us[static_cast<size_t>(t)] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  }
  cudaStreamDestroy(s);
  return us;
}

// Device buffers of one rank: input of `bytes`, output of `bytes` x n, the input zeroed; freed with the object.
struct RankBuffers {
  void *in = nullptr, *out = nullptr;
  RankBuffers(size_t bytes, int n) {
    bytes = std::max<size_t>(bytes, 4);
    check(cudaMalloc(&in, bytes), "cudaMalloc");
    check(cudaMalloc(&out, bytes * n), "cudaMalloc");
    check(cudaMemset(in, 0, bytes), "cudaMemset");
  }
  ~RankBuffers() {
    cudaFree(in);
    cudaFree(out);
  }
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time per call (microseconds) of `coll` on n thread-ranks, `bytes` per rank of float32.
double time_threads(int n, const std::string& coll, size_t bytes, int iters, int trials) {
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) std::exit(1);
  std::vector<double> rank0;
  std::barrier sync(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      chorusComm_t comm = nullptr;
      if (chorusCommInitRank(&comm, n, id, r) != chorusSuccess) {
        std::fprintf(stderr, "init: %s\n", chorusGetLastError(nullptr));
        std::exit(1);
      }
      RankBuffers buf(bytes, n);
      std::vector<double> us =
          rank_timings(comm, coll, bytes, buf.in, buf.out, iters, trials, [&] { sync.arrive_and_wait(); });
      if (r == 0) rank0 = std::move(us);
      chorusCommDestroy(comm);
    });
  }
  for (auto& t : ts) t.join();
  return median(rank0);
}

// The copy-engine all-gather: n thread-ranks on the direct path, `bytes` per rank; with `hold`, while a kernel holds
// every SM. Returns the time per call (microseconds), or a negative value when the calls did not finish within 20 s
// under the occupier (then they need an SM).
double time_copy_engine_all_gather(int n, size_t bytes, int iters, bool hold) {
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) std::exit(1);
  const size_t count = bytes / 4;
  std::vector<void*> in(n), out(n);
  std::vector<cudaStream_t> streams(n);
  std::vector<chorusComm_t> comms(n);
  for (int r = 0; r < n; ++r) {
    check(cudaMalloc(&in[r], bytes), "cudaMalloc");
    check(cudaMalloc(&out[r], bytes * n), "cudaMalloc");
    check(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        if (chorusCommInitRank(&comms[r], n, id, r) != chorusSuccess) std::exit(1);
      });
    for (auto& t : ts) t.join();
  }
  auto issue = [&](int calls) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        for (int i = 0; i < calls; ++i)
          if (chorusAllGather(in[r], out[r], count, chorusFloat32, comms[r], streams[r]) != chorusSuccess) {
            std::fprintf(stderr, "all-gather: %s\n", chorusGetLastError(comms[r]));
            std::exit(1);
          }
      });
    for (auto& t : ts) t.join();
  };
  issue(1);  // warm-up: peers' events and the first rendezvous
  for (cudaStream_t s : streams) check(cudaStreamSynchronize(s), "sync");
  double us = -1;
  {
    std::unique_ptr<chorus::gputest::SmOccupier> occupier;
    if (hold) {
      occupier = std::make_unique<chorus::gputest::SmOccupier>();
      if (!occupier->ok()) {
        std::fprintf(stderr, "bench_cuda_collectives: could not hold every SM: %s\n", occupier->why().c_str());
        std::exit(1);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    issue(iters);
    const auto deadline = t0 + std::chrono::seconds(20);
    bool done = false;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      done = true;
      for (cudaStream_t s : streams) done = done && cudaStreamQuery(s) == cudaSuccess;
    }
    const bool still_held = !hold || occupier->holding();
    if (done && still_held)
      us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  }  // the occupier lets go here
  for (int r = 0; r < n; ++r) {
    check(cudaStreamSynchronize(streams[r]), "sync");
    chorusCommDestroy(comms[r]);
    cudaStreamDestroy(streams[r]);
    cudaFree(in[r]);
    cudaFree(out[r]);
  }
  return us;
}

// Prints one row of the table; returns the fraction of the HBM ceiling.
double print_row(const std::string& coll, bool direct, int n, size_t bytes, double us, const Ceilings& c) {
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
  std::printf("%-10s %-7s %5d %12zu %12.1f %10.3f %10.3f %12.1f %7.1f%%\n", coll.c_str(), direct ? "direct" : "staged",
              n, bytes, us, algbw, algbw * factor, hbm, 100.0 * hbm / c.hbm());
  return hbm / c.hbm();
}

void print_header(const Ceilings& c, const char* ranks_are) {
  std::printf(
      "# ceilings: pinned host->device %.1f GB/s, device->host %.1f GB/s, device-to-device cudaMemcpyAsync %.1f GB/s "
      "copied (HBM read+write %.1f GB/s)\n",
      c.h2d, c.d2h, c.d2d_copy, c.hbm());
  std::printf(
      "# collectives on device buffers, ranks as %s on one GPU, float32; path: direct (peers' device buffers read "
      "by copies and reduction kernels, src/runtime/cuda_local.h) or staged (through pinned host memory)\n",
      ranks_are);
  std::printf("%-10s %-7s %5s %12s %12s %10s %10s %12s %8s\n", "coll", "path", "ranks", "bytes/rank", "time(us)",
              "algbw", "busbw", "HBM GB/s", "of HBM");
}

const size_t kSizes[] = {8, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20};

int iters_for(size_t bytes, int iters) { return bytes >= (size_t{16} << 20) ? std::max(1, iters / 2) : iters * 20; }

// Ranks as processes (under chorusrun): this process is one rank; rank 0 prints.
int run_processes(size_t max_bytes, int iters, int trials) {
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "bench_cuda_collectives --processes: init: %s (run it under chorusrun -n N)\n",
                 chorusGetLastError(nullptr));
    return 1;
  }
  int rank = 0, n = 1;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &n);
  const Ceilings c = rank == 0 ? measure_ceilings(max_bytes) : Ceilings{};
  if (rank == 0) print_header(c, "processes");
  auto barrier = [&] {
    if (chorusBarrier(comm, nullptr) != chorusSuccess) {
      std::fprintf(stderr, "barrier: %s\n", chorusGetLastError(comm));
      std::exit(1);
    }
  };
  // One allocation for every size: peers keep an allocation mapped until the communicator is destroyed, so it is not
  // freed before that (docs/cuda.md).
  size_t largest = 8;
  for (size_t bytes : kSizes)
    if (bytes <= max_bytes) largest = bytes;
  RankBuffers buf(largest, n);
  // The CUDA IPC path first: staged calls of processes wait in kernels that the GPU time-slices between the
  // processes' contexts (milliseconds per call, docs/cuda.md), so a time limit should cut those rows, not these.
  for (const bool direct : {true, false})
    for (const std::string coll : {"all_reduce", "all_gather"}) {
      setenv("CHORUS_CUDA_DIRECT", direct ? "1" : "0", 1);  // every rank sets the same before its calls
      for (size_t bytes : kSizes) {
        if (bytes > max_bytes) continue;
        const double us =
            median(rank_timings(comm, coll, bytes, buf.in, buf.out, iters_for(bytes, iters), trials, barrier));
        if (rank == 0) print_row(coll, direct, n, bytes, us, c);
        std::fflush(stdout);
      }
    }
  chorusCommDestroy(comm);  // before `buf` is freed
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_bytes = size_t{256} << 20;
  int iters = 5, trials = 5;
  bool processes = false;
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
    } else if (a == "--processes") {
      processes = true;
    } else {
      std::fprintf(stderr, "usage: bench_cuda_collectives [--max-bytes N] [--iters N] [--trials N] [--processes]\n");
      return 2;
    }
  }
  if (max_bytes < 8 || iters < 1 || trials < 1) {
    std::fprintf(stderr, "bench_cuda_collectives: --max-bytes must be >= 8, --iters and --trials >= 1\n");
    return 2;
  }
  // Every rank's waiting call holds a hardware queue; 8 thread-ranks need more than the default 8 (docs/cuda.md).
  // At least 32 hardware queues (docs/cuda.md): an environment that set fewer would deadlock staged thread-ranks.
  if (const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"); v == nullptr || std::atoi(v) < 32)
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("bench_cuda_collectives: no CUDA device\n");
    return 2;
  }
  if (processes) return run_processes(max_bytes, iters, trials);
  const Ceilings c = measure_ceilings(max_bytes);
  print_header(c, "threads");

  // The issue's targets first, so that a time limit on the whole table cannot cut them off: the 4-rank direct
  // all-reduce at 8 bytes and at the largest size (rows as in the table), then the copy-engine all-gather.
  setenv("CHORUS_CUDA_DIRECT", "1", 1);
  const size_t large = std::min<size_t>(max_bytes, size_t{256} << 20) / 4 * 4;
  const double ar_8b_us = time_threads(4, "all_reduce", 8, iters_for(8, iters), trials);
  print_row("all_reduce", true, 4, 8, ar_8b_us, c);
  const double ar_large_us = time_threads(4, "all_reduce", large, iters_for(large, iters), trials);
  const double ar_large_frac = print_row("all_reduce", true, 4, large, ar_large_us, c);
  std::fflush(stdout);

  // Copy-engine all-gather: bytes copied per second (every rank copies n inputs) against cudaMemcpyAsync.
  const int n = 4;
  const double free_us = time_copy_engine_all_gather(n, large, iters, false);
  const double held_us = time_copy_engine_all_gather(n, large, iters, true);
  const double copied = static_cast<double>(large) * n * n;
  const double free_gbs = free_us > 0 ? copied / (free_us * 1e-6) / 1e9 : 0;
  const double held_gbs = held_us > 0 ? copied / (held_us * 1e-6) / 1e9 : 0;
  std::printf(
      "\n# copy-engine all-gather: %d thread-ranks, direct path, %zu bytes per rank; bytes copied per second (4 "
      "streams at once) against device-to-device cudaMemcpyAsync on one stream (%.1f GB/s); the time includes "
      "issuing the calls from the rank threads\n",
      n, large, c.d2d_copy);
  std::printf("%-28s %12s %12s %8s\n", "condition", "time(us)", "copied GB/s", "of copy");
  std::printf("%-28s %12.1f %12.1f %7.1f%%\n", "SMs free", free_us, free_gbs, 100 * free_gbs / c.d2d_copy);
  if (held_us > 0)
    std::printf("%-28s %12.1f %12.1f %7.1f%%\n", "every SM held by a kernel", held_us, held_gbs,
                100 * held_gbs / c.d2d_copy);
  else
    std::printf(
        "%-28s %12s: did not finish within 20 s while every SM was held, or the occupying kernel ended first: "
        "not shown to use no SM\n",
        "every SM held by a kernel", "-");

  std::printf("\n# targets (docs/cuda.md)\n");
  auto verdict = [](bool met) { return met ? "met" : "NOT met"; };
  std::printf("4-rank all-reduce of %zu bytes per rank (direct): %.1f%% of the HBM ceiling (goal >= 70%%): %s\n", large,
              100 * ar_large_frac, verdict(ar_large_frac >= 0.70));
  std::printf("4-rank all-reduce of 8 bytes (direct): %.1f us per call (goal <= 10 us): %s\n", ar_8b_us,
              verdict(ar_8b_us <= 10.0));
  std::printf(
      "copy-engine all-gather, 4 thread-ranks, every SM held: %.1f%% of cudaMemcpyAsync (goal >= 85%%, "
      "zero SMs): %s\n",
      100 * held_gbs / c.d2d_copy, verdict(held_us > 0 && held_gbs >= 0.85 * c.d2d_copy));
  std::fflush(stdout);

  // The whole table: both collectives, 1 to 8 ranks, both paths, every size; staged rows up to 16 MiB, where host
  // memcpy bounds them already (8 staged ranks at 256 MiB would move 16 GiB through host memory per all-gather).
  constexpr size_t kStagedMaxBytes = size_t{16} << 20;
  std::printf("\n# the table (staged rows up to %zu bytes)\n", kStagedMaxBytes);
  print_header(c, "threads");
  for (const std::string coll : {"all_reduce", "all_gather"}) {
    for (int ranks : {1, 2, 4, 8}) {
      for (const bool direct : {true, false}) {
        setenv("CHORUS_CUDA_DIRECT", direct ? "1" : "0", 1);  // read at each call; no rank thread runs here
        for (size_t bytes : kSizes) {
          if (bytes > max_bytes || (!direct && bytes > kStagedMaxBytes)) continue;
          print_row(coll, direct, ranks, bytes, time_threads(ranks, coll, bytes, iters_for(bytes, iters), trials), c);
          std::fflush(stdout);
        }
      }
    }
  }
  setenv("CHORUS_CUDA_DIRECT", "1", 1);
  return 0;
}
