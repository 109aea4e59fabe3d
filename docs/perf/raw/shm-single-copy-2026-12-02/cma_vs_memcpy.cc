// Microbenchmark behind docs/perf/shm-single-copy-2026-12-02.md: memcpy against process_vm_readv(2) from this
// process itself, same sizes, same buffers (warm). Build: g++ -O2 -o cma cma_vs_memcpy.cc
#include <sys/uio.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
int main() {
  for (size_t sz : {65536ul, 262144ul, 1048576ul, 4194304ul}) {
    std::vector<char> a(sz, 1), b(sz, 2);
    int reps = 2000000000 / sz / 4;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      memcpy(b.data(), a.data(), sz);
      asm volatile("" ::: "memory");
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      iovec l{b.data(), sz}, r{a.data(), sz};
      process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    }
    auto t2 = std::chrono::steady_clock::now();
    double m = std::chrono::duration<double>(t1 - t0).count(), c = std::chrono::duration<double>(t2 - t1).count();
    printf("%8zu  memcpy %.2f GB/s  cma %.2f GB/s\n", sz, sz * reps / m / 1e9, sz * reps / c / 1e9);
  }
}
