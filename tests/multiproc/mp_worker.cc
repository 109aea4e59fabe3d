// One rank of a multi-process test, started by chorusrun (or by a test that sets launcher variables itself).
// Usage: mp_worker MODE. Exit code 0 when this rank saw what the mode expects; the driver
// (multiproc_test.cc) checks every rank's output and chorusrun's exit code.
//   matrix     every collective x counts {0, 1, n-1, 100003} x in/out of place x roots {0, last} x a set of
//              dtypes and ops; each rank computes its own expected result
//   kill       a large all-reduce during which rank 2 SIGKILLs itself; the others must fail naming rank 2 in < 10 s
//   kill-root  the same with rank 0, whose process hosts the bootstrap root under a launcher
//   kill-forked / kill-root-forked
//              the same, but the victim first forks a child (no exec) that outlives it by 15 s, holding copies of
//              its descriptors: the others must still name it within 10 s
//   stop       small all-reduces during which rank 2 stops itself (SIGSTOP); the others' errors (run with a short
//              CHORUS_TIMEOUT_MS) must lead with rank 2 not answering, not the neighbour each waited for
//   mismatch-count / mismatch-dtype
//              rank 0 calls all-reduce with another count / dtype; every rank must fail showing both calls
//   group      collectives and a point-to-point ring in one group (a split's communicator in it too), every rank
//              checking its values
//   smoke      one all-reduce, checked
//   smoke-twice  the same, then again on a second communicator from the same environment (after a destroy)
//   intruder   rank 1 connects to the rendezvous port without the secret (garbage, then idle) before joining;
//              the job must still complete
#include <chorus/chorus.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "tests/common/data.h"

using namespace chorus::test;

namespace {

int g_rank = 0, g_n = 0;

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    chorusResult_t r_ = (call);                                                                    \
    if (r_ != chorusSuccess) {                                                                     \
      std::printf("FAIL %s: %s: %s\n", #call, chorusGetErrorString(r_), chorusGetLastError(comm)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

// All-to-allv: elements rank i sends to rank j.
size_t v_count(size_t count, int i, int j) { return count == 0 ? 0 : count * (1 + (i + 2 * j) % 3) / 2 + (i * j) % 2; }

enum class C {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllToAllv,
  SendRecv,
  Barrier,
  Gather,
  Scatter
};
const char* cname(C c) {
  static const char* n[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter", "AllToAll",
                            "AllToAllv", "SendRecv",  "Barrier", "Gather",    "Scatter"};
  return n[static_cast<int>(c)];
}

// Every algorithm of the table for a collective ("" where there is no choice: send/recv, barrier).
std::vector<std::string> algorithms_of(C c) {
  using chorus::algo::Coll;
  static const Coll map[] = {Coll::AllReduce,     Coll::Broadcast, Coll::Reduce,    Coll::AllGather,
                             Coll::ReduceScatter, Coll::AllToAll,  Coll::AllToAllv, Coll::SendRecv,
                             Coll::Barrier,       Coll::Gather,    Coll::Scatter};
  std::vector<std::string> names;
  if (c == C::SendRecv || c == C::Barrier) return {""};
  for (const auto& a : chorus::algo::algorithm_table())
    if (a.coll == map[static_cast<int>(c)]) names.push_back(a.name);
  return names;
}

int run_matrix(chorusComm_t comm) {
  const int n = g_n, r = g_rank;
  const chorusDataType_t types[] = {chorusFloat32, chorusBfloat16, chorusInt32, chorusFloat8e4m3, chorusUint64};
  const TestOp ops[] = {TestOp::Sum, TestOp::Max, TestOp::Avg, TestOp::PreMulSum, TestOp::Prod};
  std::vector<std::byte> in, out, want;
  int cases = 0;
  for (C coll : {C::AllReduce, C::Broadcast, C::Reduce, C::AllGather, C::ReduceScatter, C::AllToAll, C::AllToAllv,
                 C::SendRecv, C::Barrier, C::Gather, C::Scatter}) {
    const bool red = coll == C::AllReduce || coll == C::Reduce || coll == C::ReduceScatter;
    for (const std::string& algorithm : algorithms_of(coll))
      for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n - 1), size_t{100003}}) {
        for (bool in_place : {false, true}) {
          if (in_place && (coll == C::AllToAllv || coll == C::SendRecv || coll == C::Barrier)) continue;
          for (int root : {0, n - 1}) {
            const bool rooted = coll == C::Broadcast || coll == C::Reduce || coll == C::Gather || coll == C::Scatter;
            if (root != 0 && !rooted) continue;
            for (chorusDataType_t t : types) {
              for (TestOp op : ops) {
                if (!red && op != TestOp::Sum) continue;
                const size_t esz = type_size(t);
                const bool uns = is_unsigned(t);
                // Sizes (elements) of this rank's input and output.
                size_t in_e = count, out_e = count;
                std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
                if (coll == C::AllGather || coll == C::Gather) out_e = count * n;
                if (coll == C::ReduceScatter || coll == C::Scatter) in_e = count * n;
                if (coll == C::AllToAll) in_e = out_e = count * n;
                if (coll == C::AllToAllv) {
                  in_e = out_e = 0;
                  for (int j = 0; j < n; ++j) {
                    sc[j] = v_count(count, r, j);
                    sd[j] = in_e;
                    in_e += sc[j] + 1;
                    rc[j] = v_count(count, j, r);
                    rd[j] = out_e;
                    out_e += rc[j] + 1;
                  }
                }
                in.assign(in_e * esz + 8, std::byte{0});
                out.assign(std::max(in_e, out_e) * esz + 8, std::byte{0xA5});
                want.assign(std::max(in_e, out_e) * esz + 8, std::byte{0xA5});
                auto value = [&](int q, size_t i) { return test_value(op, q, i, uns); };
                for (size_t i = 0; i < in_e; ++i) store(t, in.data(), i, static_cast<double>(value(r, i)));
                std::vector<int64_t> vals(n);
                auto reduced = [&](size_t i) {
                  for (int q = 0; q < n; ++q) vals[q] = value(q, i);
                  return reduce_values(op, vals.data(), n);
                };
                size_t check_e = out_e;
                switch (coll) {
                  case C::AllReduce:
                    for (size_t i = 0; i < count; ++i) store_result(t, op, reduced(i), n, want.data(), i);
                    break;
                  case C::Reduce:
                    if (r == root) {
                      for (size_t i = 0; i < count; ++i) store_result(t, op, reduced(i), n, want.data(), i);
                    } else if (in_place) {
                      std::memcpy(want.data(), in.data(), count * esz);
                    }
                    break;
                  case C::ReduceScatter:
                    for (size_t i = 0; i < count; ++i) store_result(t, op, reduced(r * count + i), n, want.data(), i);
                    check_e = count;
                    break;
                  case C::Broadcast:
                    for (size_t i = 0; i < count; ++i) store(t, want.data(), i, static_cast<double>(value(root, i)));
                    break;
                  case C::AllGather:
                    for (int b = 0; b < n; ++b)
                      for (size_t i = 0; i < count; ++i)
                        store(t, want.data(), b * count + i, static_cast<double>(value(b, i)));
                    break;
                  case C::AllToAll:
                    for (int b = 0; b < n; ++b)
                      for (size_t i = 0; i < count; ++i)
                        store(t, want.data(), b * count + i, static_cast<double>(value(b, r * count + i)));
                    break;
                  case C::AllToAllv:
                    for (int b = 0; b < n; ++b) {
                      size_t b_sd = 0;  // where rank b's block for rank r starts in b's input
                      for (int j = 0; j < r; ++j) b_sd += v_count(count, b, j) + 1;
                      for (size_t i = 0; i < rc[b]; ++i)
                        store(t, want.data(), rd[b] + i, static_cast<double>(value(b, b_sd + i)));
                    }
                    break;
                  case C::SendRecv:  // ring shift: receive rank r-1's input
                    for (size_t i = 0; i < count; ++i)
                      store(t, want.data(), i, static_cast<double>(value((r + n - 1) % n, i)));
                    break;
                  case C::Barrier: check_e = 0; break;
                  case C::Gather:
                    if (r == root) {
                      for (int b = 0; b < n; ++b)
                        for (size_t i = 0; i < count; ++i)
                          store(t, want.data(), b * count + i, static_cast<double>(value(b, i)));
                    } else if (in_place) {  // untouched: the sentinel and this rank's input where it put it
                      std::memcpy(want.data() + r * count * esz, in.data(), count * esz);
                    }
                    break;
                  case C::Scatter:
                    for (size_t i = 0; i < count; ++i)
                      store(t, want.data(), i, static_cast<double>(value(root, r * count + i)));
                    check_e = count;
                    break;
                }
                if (in_place) {
                  if (coll == C::AllGather || coll == C::Gather)
                    std::memcpy(out.data() + r * count * esz, in.data(), count * esz);
                  else
                    std::memcpy(out.data(), in.data(), in_e * esz);
                }
                chorusRedOp_t rop = chorusSum;
                if (red) {
                  if (op == TestOp::Max) rop = chorusMax;
                  if (op == TestOp::Avg) rop = chorusAvg;
                  if (op == TestOp::Prod) rop = chorusProd;
                  if (op == TestOp::PreMulSum) {
                    std::byte scalar[8];
                    store(t, scalar, 0, kPreMulScalar);
                    CHECK_OK(chorusRedOpCreatePreMulSum(&rop, scalar, t, chorusScalarHostImmediate, comm));
                  }
                }
                const void* send = in_place ? out.data() : in.data();
                std::byte* o = out.data();
                chorusCollOptions_t opt = CHORUS_COLL_OPTIONS_INIT;
                if (!algorithm.empty()) opt.algorithm = algorithm.c_str();
                switch (coll) {
                  case C::AllReduce: CHECK_OK(chorusAllReduceEx(send, o, count, t, rop, &opt, comm, nullptr)); break;
                  case C::Broadcast: CHECK_OK(chorusBroadcastEx(send, o, count, t, root, &opt, comm, nullptr)); break;
                  case C::Reduce: CHECK_OK(chorusReduceEx(send, o, count, t, rop, root, &opt, comm, nullptr)); break;
                  case C::AllGather:
                    CHECK_OK(chorusAllGatherEx(in_place ? o + r * count * esz : in.data(), o, count, t, &opt, comm,
                                               nullptr));
                    break;
                  case C::ReduceScatter:
                    CHECK_OK(chorusReduceScatterEx(send, in_place ? o + r * count * esz : o, count, t, rop, &opt, comm,
                                                   nullptr));
                    if (in_place) std::memmove(o, o + r * count * esz, count * esz);
                    break;
                  case C::AllToAll: CHECK_OK(chorusAllToAllEx(send, o, count, t, &opt, comm, nullptr)); break;
                  case C::AllToAllv:
                    CHECK_OK(
                        chorusAllToAllv(in.data(), sc.data(), sd.data(), o, rc.data(), rd.data(), t, comm, nullptr));
                    break;
                  case C::SendRecv:
                    CHECK_OK(chorusGroupStart());
                    CHECK_OK(chorusSend(in.data(), count, t, (r + 1) % n, comm, nullptr));
                    CHECK_OK(chorusRecv(o, count, t, (r + n - 1) % n, comm, nullptr));
                    CHECK_OK(chorusGroupEnd());
                    break;
                  case C::Barrier: CHECK_OK(chorusBarrier(comm, nullptr)); break;
                  case C::Gather:
                    CHECK_OK(chorusGatherEx(in_place ? o + r * count * esz : in.data(), o, count, t, root, &opt, comm,
                                            nullptr));
                    break;
                  case C::Scatter:
                    CHECK_OK(
                        chorusScatterEx(send, in_place ? o + r * count * esz : o, count, t, root, &opt, comm, nullptr));
                    if (in_place) std::memmove(o, o + r * count * esz, count * esz);
                    break;
                }
                if (red && op == TestOp::PreMulSum) CHECK_OK(chorusRedOpDestroy(rop, comm));
                int64_t bad = first_mismatch(t, op, o, want.data(), check_e);
                if (bad >= 0) {
                  std::printf("FAIL %s/%s count=%zu %s root=%d dtype=%d op=%s: element %lld is %g, expected %g\n",
                              cname(coll), algorithm.c_str(), count, in_place ? "in-place" : "out-of-place", root,
                              static_cast<int>(t), test_op_name(op), static_cast<long long>(bad), load(t, o, bad),
                              load(t, want.data(), bad));
                  return 1;
                }
                ++cases;
              }
            }
          }
        }
      }
  }
  std::printf("matrix: %d cases passed\n", cases);
  return 0;
}

int run_kill(chorusComm_t comm, int victim, bool forked_child) {
  // Large all-reduces back to back, so that whenever the victim dies the others are inside one, however fast they
  // run.
  const size_t count = size_t{64} << 20;  // 256 MiB of floats per rank
  std::vector<float> buf(count, 1.0f);
  if (g_rank == victim) {
    if (forked_child && fork() == 0) {
      // A worker forked without exec, as a data loader's: it holds copies of every descriptor the rank had when it
      // forked, and outlives it by 15 s (the others must name it within 10). Its output goes nowhere, so the
      // launcher does not wait for it.
      const pid_t parent = getppid();
      const int null = open("/dev/null", O_RDWR);
      for (int fd = 0; fd <= 2; ++fd) dup2(null, fd);
      for (int i = 0; i < 600 && getppid() == parent; ++i) usleep(100000);
      sleep(15);
      _exit(0);
    }
    std::thread worker([&] {
      for (int i = 0; i < 1000; ++i)
        if (chorusAllReduce(buf.data(), buf.data(), count, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
          return;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::printf("rank %d: killing itself in the middle of an all-reduce\n", victim);
    std::fflush(stdout);
    raise(SIGKILL);
  }
  chorusResult_t res = chorusSuccess;
  double s = 0;
  for (int i = 0; i < 1000 && res == chorusSuccess; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    res = chorusAllReduce(buf.data(), buf.data(), count, chorusFloat32, chorusSum, comm, nullptr);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string text = chorusGetLastError(comm);
  std::printf("result %s, the failing call took %.2f s: %s\n", chorusGetErrorString(res), s, text.c_str());
  // Rank 0's death takes the bootstrap root with it: the error must say rank 0 is gone, not only mention it in
  // passing (a "seen here as: connection to rank 0 closed").
  const std::string name = "rank " + std::to_string(victim), needle = victim == 0 ? name + " is gone" : name;
  bool ok = res != chorusSuccess && text.find(needle) != std::string::npos && s < 10.0;
  if (ok)
    std::printf("kill: error names %s\n", name.c_str());
  else
    std::printf("FAIL kill: expected an error naming %s within 10 s\n", name.c_str());
  return ok ? 0 : 1;
}

int run_stop(chorusComm_t comm) {
  std::vector<float> buf(1024, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  chorusResult_t res = chorusSuccess;
  for (int i = 0; res == chorusSuccess; ++i) {
    if (g_rank == 2 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300)) {
      std::printf("rank 2: stopping itself between all-reduces\n");
      std::fflush(stdout);
      raise(SIGSTOP);
    }
    res = chorusAllReduce(buf.data(), buf.data(), buf.size(), chorusFloat32, chorusSum, comm, nullptr);
  }
  const std::string text = chorusGetLastError(comm);
  std::printf("result %s: %s\n", chorusGetErrorString(res), text.c_str());
  const size_t lead = text.find(": rank(s) 2 did not answer a status question");
  // Said once: a rank whose own diagnosis is the one a peer reported first adds only what it saw itself.
  const std::string silent = "did not answer a status question";
  const bool once = lead != std::string::npos && text.find(silent, text.find(silent, lead) + 1) == std::string::npos;
  const bool ok = lead != std::string::npos && lead < text.find("timed out waiting") && once;
  std::printf(ok ? "stop: error leads with rank 2\n" : "FAIL stop: expected an error leading with rank 2\n");
  return ok ? 0 : 1;
}

// Collectives and sends/receives in one chorusGroupStart/End, as NCCL users write them: an all-reduce, an all-gather
// of its result (called after it, so it gathers the sums), a reduce-scatter and a ring exchange; then a group that
// spans the communicator and a split of it, each rank calling them in its own order.
int run_group(chorusComm_t comm) {
  const size_t count = 100003;  // several slices
  const int next = (g_rank + 1) % g_n, prev = (g_rank + g_n - 1) % g_n;
  std::vector<int32_t> sum(count, g_rank + 1), gathered(count * g_n, -1), scattered(count * g_n), mine(count, g_rank),
      from_prev(count, -1);
  for (size_t i = 0; i < scattered.size(); ++i) scattered[i] = static_cast<int32_t>(i % 5) + g_rank;
  chorusGroupStart();
  chorusSend(mine.data(), count, chorusInt32, next, comm, nullptr);
  chorusAllReduce(sum.data(), sum.data(), count, chorusInt32, chorusSum, comm, nullptr);
  chorusAllGather(sum.data(), gathered.data(), count, chorusInt32, comm, nullptr);
  chorusReduceScatter(scattered.data(), scattered.data() + g_rank * count, count, chorusInt32, chorusMin, comm,
                      nullptr);
  chorusRecv(from_prev.data(), count, chorusInt32, prev, comm, nullptr);
  chorusResult_t res = chorusGroupEnd();
  const int32_t total = g_n * (g_n + 1) / 2;
  bool ok = res == chorusSuccess;
  for (size_t i = 0; ok && i < count; ++i)
    ok = sum[i] == total && from_prev[i] == prev &&
         scattered[g_rank * count + i] == static_cast<int32_t>((g_rank * count + i) % 5);
  for (size_t i = 0; ok && i < gathered.size(); ++i) ok = gathered[i] == total;
  if (!ok) {
    std::printf("FAIL group: %s: %s\n", chorusGetErrorString(res), chorusGetLastError(nullptr));
    return 1;
  }
  chorusComm_t half = nullptr;
  if (chorusCommSplit(comm, g_rank % 2, g_rank, &half) != chorusSuccess) {
    std::printf("FAIL group: split: %s\n", chorusGetLastError(comm));
    return 1;
  }
  int half_n = 0;
  chorusCommCount(half, &half_n);
  int64_t a = g_rank, b = 1;
  chorusGroupStart();
  if (g_rank % 2 == 0) {
    chorusAllReduce(&a, &a, 1, chorusInt64, chorusSum, comm, nullptr);
    chorusAllReduce(&b, &b, 1, chorusInt64, chorusSum, half, nullptr);
  } else {
    chorusAllReduce(&b, &b, 1, chorusInt64, chorusSum, half, nullptr);
    chorusAllReduce(&a, &a, 1, chorusInt64, chorusSum, comm, nullptr);
  }
  res = chorusGroupEnd();
  chorusCommDestroy(half);
  if (res != chorusSuccess || a != int64_t{g_n} * (g_n - 1) / 2 || b != half_n) {
    std::printf("FAIL group across two communicators: %s (a=%lld b=%lld)\n", chorusGetLastError(nullptr),
                static_cast<long long>(a), static_cast<long long>(b));
    return 1;
  }
  std::printf("group: ok\n");
  return 0;
}

int run_mismatch(chorusComm_t comm, bool dtype) {
  std::vector<double> buf(1001, 1.0);
  size_t count = (g_rank == 0 && !dtype) ? 1001 : 1000;
  chorusDataType_t t = (g_rank == 0 && dtype) ? chorusFloat64 : chorusFloat32;
  chorusResult_t res = chorusAllReduce(buf.data(), buf.data(), count, t, chorusSum, comm, nullptr);
  std::string text = chorusGetLastError(comm);
  std::printf("result %s: %s\n", chorusGetErrorString(res), text.c_str());
  // Both fingerprints: this rank's call and the other one.
  bool both = dtype ? (text.find("float") != std::string::npos && text.find("double") != std::string::npos)
                    : (text.find("count=1000") != std::string::npos && text.find("count=1001") != std::string::npos);
  bool ok = res != chorusSuccess && both;
  std::printf(ok ? "mismatch: reported with both fingerprints\n" : "FAIL mismatch: not reported as expected\n");
  return ok ? 0 : 1;
}

// Connects to host:port, retrying until it is up; returns the fd or -1.
int raw_connect(const std::string& hostport) {
  auto colon = hostport.rfind(':');
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) == 0) {
      int fd = socket(res->ai_family, SOCK_STREAM, 0);
      if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        freeaddrinfo(res);
        return fd;
      }
      if (fd >= 0) close(fd);
      freeaddrinfo(res);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return -1;
}

}  // namespace

// "fork-host": rank 0's process holds a live communicator of its own (two threads) and forks; the child is rank 0
// of the launcher's job and serves its rendezvous, and rank 1 says goodbye late. The child's exit must wait for
// rank 1 as any rendezvous host's does: the live communicators it inherited are its parent's, not its own (they
// used to keep its exit handler from waiting, and rank 1 lost its root).
int fork_host(int rank) {
  auto job = [](int r) {
    chorusComm_t c = nullptr;
    if (chorusCommInitFromEnv(&c) != chorusSuccess) {
      std::printf("FAIL fork-host init: %s\n", chorusGetLastError(nullptr));
      return 1;
    }
    std::vector<float> v(64, 1.0f);
    chorusResult_t res = chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, c, nullptr);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    if (res == chorusSuccess) res = chorusBroadcast(v.data(), v.data(), 16, chorusFloat32, 0, c, nullptr);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const bool ok = res == chorusSuccess && v[0] == 2.0f;
    std::printf("%s fork-host: rank %d %s\n", ok ? "ok" : "FAIL", r, ok ? "done" : chorusGetLastError(c));
    chorusCommDestroy(c);
    return ok ? 0 : 1;
  };
  if (rank != 0) return job(rank);
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) return 1;
  chorusComm_t own[2] = {nullptr, nullptr};
  std::thread other([&] { chorusCommInitRank(&own[1], 2, id, 1); });
  chorusCommInitRank(&own[0], 2, id, 0);
  other.join();
  const pid_t child = fork();
  if (child == 0) std::exit(job(0));
  int status = 0;
  waitpid(child, &status, 0);
  std::thread t([&] { chorusCommDestroy(own[1]); });
  chorusCommDestroy(own[0]);
  t.join();
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "matrix";
  if (mode == "fork-host") return fork_host(std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : 0);
  int idle_fd = -1;
  if (mode == "intruder" && std::getenv("CHORUS_RANK") && std::string(std::getenv("CHORUS_RANK")) == "1") {
    const char* root = std::getenv("CHORUS_ROOT_ADDR");
    int fd = raw_connect(root ? root : "");
    if (fd < 0) {
      std::printf("FAIL intruder: could not reach the rendezvous port\n");
      return 1;
    }
    const char junk[] = "GET / HTTP/1.0\r\n\r\nnot a chorus peer";
    (void)!write(fd, junk, sizeof(junk));
    idle_fd = raw_connect(root);  // a second one that says nothing at all
    std::printf("intruder: sent garbage on one connection, idling on another\n");
  }
  chorusComm_t comm = nullptr;
  chorusResult_t res = chorusCommInitFromEnv(&comm);
  if (res != chorusSuccess) {
    std::printf("FAIL init: %s\n", chorusGetLastError(nullptr));
    return 1;
  }
  chorusCommUserRank(comm, &g_rank);
  chorusCommCount(comm, &g_n);
  int rc = 1;
  if (mode == "matrix")
    rc = run_matrix(comm);
  else if (mode == "kill" || mode == "kill-forked")
    rc = run_kill(comm, 2, mode == "kill-forked");
  else if (mode == "kill-root" || mode == "kill-root-forked")
    rc = run_kill(comm, 0, mode == "kill-root-forked");
  else if (mode == "stop")
    rc = run_stop(comm);
  else if (mode == "group")
    rc = run_group(comm);
  else if (mode == "mismatch-count")
    rc = run_mismatch(comm, false);
  else if (mode == "mismatch-dtype")
    rc = run_mismatch(comm, true);
  else if (mode == "intruder" || mode == "smoke" || mode == "smoke-twice") {
    auto smoke = [&](const char* done) {
      std::vector<float> v(1000, 1.0f);
      res = chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, comm, nullptr);
      const int ok = (res == chorusSuccess && v[0] == static_cast<float>(g_n)) ? 0 : 1;
      if (ok == 0)
        std::printf("%s\n", done);
      else
        std::printf("FAIL smoke: %s\n", chorusGetLastError(comm));
      return ok;
    };
    rc = smoke("smoke: job completed");
    if (rc == 0 && mode == "smoke-twice") {
      // The launcher's variables serve a second rendezvous (rank 0 serves it on the same port again).
      chorusCommDestroy(comm);
      comm = nullptr;
      if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
        std::printf("FAIL second init: %s\n", chorusGetLastError(nullptr));
        return 1;
      }
      rc = smoke("smoke: second communicator completed");
    }
  } else if (mode == "fork-exit") {
    // Rank 0 serves the rendezvous (torchrun's variables) and destroys its communicator while rank 1 is still
    // connected; then a child it forks exits. The child inherited the exit handler that waits for the rendezvous
    // service's connected ranks, but not the service's threads: it must not wait (it used to wait until
    // CHORUS_TIMEOUT_MS). Rank 1 says goodbye only once the child is gone (MP_WORKER_FLAG appears).
    const char* flag = std::getenv("MP_WORKER_FLAG");
    std::vector<float> v(8, 1.0f);
    res = chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat32, chorusSum, comm, nullptr);
    rc = res == chorusSuccess && v[0] == static_cast<float>(g_n) && flag ? 0 : 1;
    if (rc == 0 && g_rank == 1) {
      for (int i = 0; i < 1200 && !std::filesystem::exists(flag); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else if (rc == 0 && g_rank == 0) {
      chorusCommDestroy(comm);
      comm = nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      const pid_t child = fork();
      if (child == 0) std::exit(0);  // runs the atexit handlers
      int status = 0;
      waitpid(child, &status, 0);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (FILE* f = std::fopen(flag, "w")) std::fclose(f);
      std::printf("fork-exit: the child exited after %.1f s\n", s);
      rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
    }
  } else {
    std::printf("FAIL unknown mode %s\n", mode.c_str());
  }
  if (idle_fd >= 0) close(idle_fd);
  // After a failure the communicator is broken; destroy still frees it.
  if (comm) chorusCommDestroy(comm);
  return rc;
}
