// One rank of a GPU job under chorusrun (tests/gpu/collectives_cuda_test.cc, CudaProcesses.*): ranks as processes
// sharing one GPU, device buffers on each process's stream. All-reduce, reduce-scatter, all-gather, broadcast,
// reduce and all-to-all, a few dtypes and every op of the reductions, in place and out of place (all-to-all out of
// place), checked against values computed on the host, and an all-reduce on stream-ordered pool memory (no IPC
// handle: staged) and a ring exchange of chorusSend/chorusRecv on device buffers; prints "gpu-mp: ok" when every
// check passed.
// Exits 2 (skip) without a CUDA device.
#include <chorus/chorus.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/gpu/reference_values.h"

namespace {

int g_rank = 0, g_n = 1;

#define CHECK_CUDA(call)                                                            \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("FAIL rank %d: %s: %s\n", g_rank, #call, cudaGetErrorString(e_)); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)
#define CHECK_CHORUS(call, comm)                                                      \
  do {                                                                                \
    const chorusResult_t r_ = (call);                                                 \
    if (r_ != chorusSuccess) {                                                        \
      std::printf("FAIL rank %d: %s: %s\n", g_rank, #call, chorusGetLastError(comm)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

using chorus::gputest::combine;

// Rank r's element j (signed: every dtype here is).
double value(int r, size_t j, chorusRedOp_t op) { return chorus::gputest::value(r, j, op, true); }

double reduced(chorusRedOp_t op, size_t j, bool is_float) {
  double v = value(0, j, op);
  for (int q = 1; q < g_n; ++q) v = combine(op, v, value(q, j, op));
  if (op == chorusAvg) v = is_float ? v / g_n : std::trunc(v / g_n);
  return v;
}

// Every check uses the same two device buffers, allocated once (buffer_bytes() each) and freed after the communicator
// is destroyed: peers keep an allocation mapped until then (docs/cuda.md).
constexpr size_t kCount = 1003;
size_t buffer_bytes() { return std::max<size_t>(kCount * static_cast<size_t>(g_n) * 8, 70001 * 4); }

template <typename T>
int run_type(chorusComm_t comm, cudaStream_t s, chorusDataType_t t, void* send_buf, void* recv_buf) {
  const bool is_float = std::is_floating_point_v<T>;
  const size_t count = kCount;
  const size_t n = static_cast<size_t>(g_n), r = static_cast<size_t>(g_rank);
  T* dsend = static_cast<T*>(send_buf);
  T* drecv = static_cast<T*>(recv_buf);
  std::vector<T> in(count * n), out(count * n);
  int bad = 0;
  auto expect = [&](const char* what, bool in_place, size_t i, double want, T got) {
    if (static_cast<double>(got) == static_cast<double>(static_cast<T>(want))) return;
    if (bad++ < 5)
      std::printf("FAIL rank %d: %s dtype %d%s element %zu: %g, expected %g\n", g_rank, what, t,
                  in_place ? " in place" : "", i, static_cast<double>(got), want);
  };
  for (bool in_place : {false, true}) {
    for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
      // all-reduce
      for (size_t j = 0; j < count; ++j) in[j] = static_cast<T>(value(g_rank, j, op));
      T* recv = in_place ? dsend : drecv;
      CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight for a non-blocking stream
      CHECK_CHORUS(chorusAllReduce(dsend, recv, count, t, op, comm, s), comm);
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaMemcpy(out.data(), recv, count * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < count; ++j) expect("all-reduce", in_place, j, reduced(op, j, is_float), out[j]);
      // reduce-scatter: block b of every rank's input reduced onto rank b
      for (size_t j = 0; j < count * n; ++j) in[j] = static_cast<T>(value(g_rank, j, op));
      CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * n * sizeof(T), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight for a non-blocking stream
      T* rs_out = in_place ? dsend + r * count : drecv;
      CHECK_CHORUS(chorusReduceScatter(dsend, rs_out, count, t, op, comm, s), comm);
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaMemcpy(out.data(), rs_out, count * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < count; ++j)
        expect("reduce-scatter", in_place, j, reduced(op, r * count + j, is_float), out[j]);
    }
    // all-gather and broadcast (no op)
    for (size_t j = 0; j < count; ++j) in[j] = static_cast<T>(value(g_rank, j, chorusSum));
    T* ag_in = in_place ? drecv + r * count : dsend;
    CHECK_CUDA(cudaMemcpy(ag_in, in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight for a non-blocking stream
    CHECK_CHORUS(chorusAllGather(ag_in, drecv, count, t, comm, s), comm);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(out.data(), drecv, count * n * sizeof(T), cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < count * n; ++j)
      expect("all-gather", in_place, j, value(static_cast<int>(j / count), j % count, chorusSum), out[j]);
    const int root = g_n - 1;
    CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight for a non-blocking stream
    T* bc_out = in_place ? dsend : drecv;
    CHECK_CHORUS(chorusBroadcast(dsend, bc_out, count, t, root, comm, s), comm);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(out.data(), bc_out, count * sizeof(T), cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < count; ++j) expect("broadcast", in_place, j, value(root, j, chorusSum), out[j]);
    // reduce (sum) onto rank 0; `in` still holds this rank's value(rank, j, sum)
    CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight for a non-blocking stream
    T* red_out = in_place ? dsend : drecv;
    CHECK_CHORUS(chorusReduce(dsend, red_out, count, t, chorusSum, 0, comm, s), comm);
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (g_rank == 0) {
      CHECK_CUDA(cudaMemcpy(out.data(), red_out, count * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < count; ++j) expect("reduce", in_place, j, reduced(chorusSum, j, is_float), out[j]);
    }
    // all-to-all (out of place): block b of every rank's input goes to rank b
    if (!in_place) {
      for (size_t j = 0; j < count * n; ++j) in[j] = static_cast<T>(value(g_rank, j, chorusSum));
      CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * n * sizeof(T), cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK_CHORUS(chorusAllToAll(dsend, drecv, count, t, comm, s), comm);
      CHECK_CUDA(cudaStreamSynchronize(s));
      CHECK_CUDA(cudaMemcpy(out.data(), drecv, count * n * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < count * n; ++j)
        expect("all-to-all", false, j, value(static_cast<int>(j / count), r * count + j % count, chorusSum), out[j]);
    }
  }
  return bad == 0 ? 0 : 1;
}

// An all-reduce on memory from a stream-ordered pool (cudaMallocAsync), which has no CUDA IPC handle: every rank
// learns it from the call's rendezvous and stages the call through host memory; the result must not change.
int run_pool_buffers(chorusComm_t comm, cudaStream_t s) {
  const size_t count = 4099;
  float* d = nullptr;
  CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), count * sizeof(float), s));
  std::vector<float> in(count), out(count);
  for (size_t j = 0; j < count; ++j) in[j] = static_cast<float>(value(g_rank, j, chorusSum));
  CHECK_CUDA(cudaMemcpyAsync(d, in.data(), count * sizeof(float), cudaMemcpyHostToDevice, s));
  CHECK_CHORUS(chorusAllReduce(d, d, count, chorusFloat32, chorusSum, comm, s), comm);
  CHECK_CUDA(cudaMemcpyAsync(out.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaFreeAsync(d, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  int bad = 0;
  for (size_t j = 0; j < count; ++j) {
    const float want = static_cast<float>(reduced(chorusSum, j, true));
    if (out[j] != want && bad++ < 5)
      std::printf("FAIL rank %d: all-reduce on pool memory element %zu: %g, expected %g\n", g_rank, j,
                  static_cast<double>(out[j]), static_cast<double>(want));
  }
  return bad == 0 ? 0 : 1;
}

// chorusSend/chorusRecv on device buffers in a group: each rank sends to the next and receives from the previous.
int run_ring_exchange(chorusComm_t comm, cudaStream_t s, void* send_buf, void* recv_buf) {
  const size_t count = 70001;
  const int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n;
  auto* dsend = static_cast<int32_t*>(send_buf);
  auto* drecv = static_cast<int32_t*>(recv_buf);
  std::vector<int32_t> in(count), out(count);
  for (size_t j = 0; j < count; ++j) in[j] = static_cast<int32_t>(g_rank * 1000003 + j);
  CHECK_CUDA(cudaMemcpy(dsend, in.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CHORUS(chorusGroupStart(), comm);
  CHECK_CHORUS(chorusSend(dsend, count, chorusInt32, next, comm, s), comm);
  CHECK_CHORUS(chorusRecv(drecv, count, chorusInt32, prev, comm, s), comm);
  CHECK_CHORUS(chorusGroupEnd(), comm);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(out.data(), drecv, count * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < count; ++j)
    if (out[j] != static_cast<int32_t>(prev * 1000003 + j)) {
      std::printf("FAIL rank %d: ring exchange element %zu: %d, expected %d\n", g_rank, j, out[j],
                  static_cast<int32_t>(prev * 1000003 + j));
      return 1;
    }
  return 0;
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("gpu-mp: no CUDA device\n");
    return 2;
  }
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::printf("FAIL init: %s\n", chorusGetLastError(nullptr));
    return 1;
  }
  chorusCommUserRank(comm, &g_rank);
  chorusCommCount(comm, &g_n);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
  void *send_buf = nullptr, *recv_buf = nullptr;
  if (cudaMalloc(&send_buf, buffer_bytes()) != cudaSuccess || cudaMalloc(&recv_buf, buffer_bytes()) != cudaSuccess) {
    std::printf("FAIL rank %d: cudaMalloc\n", g_rank);
    return 1;
  }
  int rc = 0;
  rc |= run_type<int32_t>(comm, s, chorusInt32, send_buf, recv_buf);
  rc |= run_type<float>(comm, s, chorusFloat32, send_buf, recv_buf);
  rc |= run_type<double>(comm, s, chorusFloat64, send_buf, recv_buf);
  rc |= run_type<int64_t>(comm, s, chorusInt64, send_buf, recv_buf);
  rc |= run_pool_buffers(comm, s);
  rc |= run_ring_exchange(comm, s, send_buf, recv_buf);
  cudaStreamDestroy(s);
  chorusCommDestroy(comm);
  cudaFree(send_buf);
  cudaFree(recv_buf);
  if (rc == 0) std::printf("gpu-mp: ok (rank %d of %d)\n", g_rank, g_n);
  return rc;
}
