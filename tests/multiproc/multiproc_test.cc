// Real processes over shm, tcp, UCX (over its shared memory and over tcp) and ibverbs (skipped without an RDMA
// device), started by chorusrun (and once by hand with torchrun-style variables).
// CHORUSRUN and MP_WORKER are the built binaries' paths (compile definitions).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/process.h"

namespace {

using chorus::test::count_of;
using chorus::test::Result;
using chorus::test::run;

// A way to connect ranks: a name for the test, and the environment that selects it.
struct Net {
  std::string name;
  std::string env;
};
// UCX in both of the ways it runs on one machine: its shared-memory transports and its tcp over loopback.
const Net kShm{"shm", "CHORUS_TRANSPORTS=shm"};
const Net kTcp{"tcp", "CHORUS_TRANSPORTS=tcp"};
const Net kUcxShm{"ucx_sm", "CHORUS_TRANSPORTS=ucx CHORUS_UCX_TLS=sm"};
const Net kUcxTcp{"ucx_tcp", "CHORUS_TRANSPORTS=ucx CHORUS_UCX_TLS=tcp"};
const Net kIbverbs{"ibverbs", "CHORUS_TRANSPORTS=ibverbs"};

std::string launch(int n, const Net& net, const std::string& mode) {
  return net.env + " " + CHORUSRUN + " -n " + std::to_string(n) + " --timeout 240 " + MP_WORKER + " " + mode;
}

// Why a job could not use its transport on this machine or build (it says so in the error every rank prints), or
// "" when it ran.
std::string unavailable(const Result& r) {
  for (const char* why : {"no RDMA device", "not built: this build has no"}) {
    const size_t at = r.out.find(why);
    if (at != std::string::npos) return r.out.substr(at, r.out.find_first_of(";)\n", at) - at);
  }
  return "";
}

class Matrix : public ::testing::TestWithParam<std::tuple<Net, int>> {};

TEST_P(Matrix, EveryRankChecksItsResults) {
  auto [net, n] = GetParam();
  Result r = run(launch(n, net, "matrix"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << net.name << " cannot run here: " << why;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "cases passed"), n) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Processes, Matrix,
                         ::testing::Values(std::make_tuple(kShm, 2), std::make_tuple(kShm, 3), std::make_tuple(kShm, 4),
                                           std::make_tuple(kTcp, 2), std::make_tuple(kTcp, 3),
                                           std::make_tuple(kUcxShm, 2), std::make_tuple(kUcxShm, 4),
                                           std::make_tuple(kUcxTcp, 2), std::make_tuple(kUcxTcp, 3),
                                           std::make_tuple(kIbverbs, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::to_string(std::get<1>(info.param)) +
                                  "ranks";
                         });

// Collectives grouped with sends and receives, and a group spanning a communicator and its split, as processes.
class Group : public ::testing::TestWithParam<std::tuple<Net, int>> {};

TEST_P(Group, CollectivesAndPointToPointInOneGroup) {
  const auto& [net, n] = GetParam();
  Result r = run(launch(n, net, "group"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << "cannot run here: " << why;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "group: ok"), n) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Processes, Group, ::testing::Values(std::make_tuple(kShm, 3), std::make_tuple(kTcp, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::to_string(std::get<1>(info.param)) +
                                  "ranks";
                         });

class Fault : public ::testing::TestWithParam<Net> {};

TEST_P(Fault, KilledRankIsNamedByTheOthersAndLauncherFails) {
  Result r = run(launch(4, GetParam(), "kill"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << "cannot run here: " << why;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "kill: error names rank 2"), 3) << r.out;
  // Only the victim dies of a signal: a survivor used to abort in UCX while destroying its communicator.
  EXPECT_EQ(r.out.find("was also killed"), std::string::npos) << r.out;
}

// Rank 0's process hosts the bootstrap root (chorusrun): its death closes every rank's control connection too, and
// over tcp that was all the others said ("the bootstrap root closed the connection"), without naming rank 0.
TEST_P(Fault, KilledRankHostingTheRootIsNamedByTheOthers) {
  Result r = run(launch(4, GetParam(), "kill-root"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << "cannot run here: " << why;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "kill: error names rank 0"), 3) << r.out;
  EXPECT_EQ(r.out.find("was also killed"), std::string::npos) << r.out;
}

// A rank that forked a worker (no exec) and then died: the worker's copies of its connections must not hide the
// death. Killed ranks were seen as gone only when the worker exited (15 s later here), and survivors waited until then.
TEST(Faults, AKilledRanksForkedChildDoesNotHideItsDeath) {
  for (const auto& [net, mode, victim] :
       {std::make_tuple(kShm, "kill-forked", 2), std::make_tuple(kTcp, "kill-forked", 2),
        std::make_tuple(kShm, "kill-root-forked", 0)}) {
    Result r = run(launch(4, net, mode));
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_EQ(count_of(r.out, "kill: error names rank " + std::to_string(victim)), 3) << mode << "\n" << r.out;
  }
}

// A stopped rank (SIGSTOP: alive, silent) is what every other rank's timeout leads with; each one's own wait, often
// for a neighbour that is waiting too, follows as "seen here as". chorusrun's timeout then ends the stopped rank.
TEST(Faults, AStoppedRankLeadsTheOthersTimeoutErrors) {
  Result r = run(std::string("CHORUS_TRANSPORTS=shm CHORUS_TIMEOUT_MS=2000 CHORUS_DEBUG=INFO ") +
                 "CHORUS_DEBUG_SUBSYS=BOOTSTRAP " + CHORUSRUN + " -n 4 --timeout 15 " + MP_WORKER + " stop");
  EXPECT_EQ(r.code, 124) << r.out;  // chorusrun's own timeout: the stopped rank never ends by itself
  EXPECT_EQ(count_of(r.out, "stop: error leads with rank 2"), 3) << r.out;
  // Rank 0's process, which hosts the root, knows the job failed: at exit it waits for the stopped rank at most
  // a short grace (it was a whole CHORUS_TIMEOUT_MS: a rank whose host died never closes its connection).
  EXPECT_NE(r.out.find("process exit: waiting at most 2000 ms for 1 rendezvous service(s) still in use by failed jobs"),
            std::string::npos)
      << r.out;
  // chorusrun says which rank stopped, once (not again for its own SIGCONT and SIGTERM at the timeout).
  EXPECT_EQ(count_of(r.out, "was stopped by signal"), 1) << r.out;
  EXPECT_NE(r.out.find("chorusrun: rank 2 (pid "), std::string::npos) << r.out;
}

TEST_P(Fault, MismatchedCountIsReportedEverywhereWithBothFingerprints) {
  Result r = run(launch(4, GetParam(), "mismatch-count"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << "cannot run here: " << why;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "mismatch: reported with both fingerprints"), 4) << r.out;
}

TEST_P(Fault, MismatchedDtypeIsReportedEverywhereWithBothFingerprints) {
  Result r = run(launch(4, GetParam(), "mismatch-dtype"));
  if (const std::string why = unavailable(r); !why.empty()) GTEST_SKIP() << "cannot run here: " << why;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "mismatch: reported with both fingerprints"), 4) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Processes, Fault, ::testing::Values(kShm, kTcp, kUcxShm, kUcxTcp, kIbverbs),
                         [](const auto& info) { return info.param.name; });

// A transport listed first that cannot run here (ibverbs without a device; one not built) reaches no peer, and the
// next in the list carries the job.
TEST(Transports, UnavailableTransportFallsThroughToTheNext) {
  Result r = run(launch(2, {"ibverbs_shm", "CHORUS_TRANSPORTS=ibverbs,ucx,shm"}, "smoke"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 2) << r.out;
}

// Asked for a transport that cannot run here and nothing else, every rank says why.
TEST(Transports, OnlyAnUnavailableTransportIsAClearError) {
  Result r = run(launch(2, {"ibverbs", "CHORUS_TRANSPORTS=ibverbs"}, "smoke"));
  if (unavailable(r).empty()) GTEST_SKIP() << "ibverbs runs here";
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no transport in CHORUS_TRANSPORTS='ibverbs' can reach rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ibverbs: "), std::string::npos) << r.out;
}

TEST(Bootstrap, ConnectionWithoutTheSecretIsRefusedAndLoggedAndTheJobCompletes) {
  Result r = run(launch(3, {"shm_tcp", "CHORUS_TRANSPORTS=shm,tcp"}, "intruder"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 3) << r.out;
  // The root (in rank 0) logs every refusal at WARN, the default level.
  EXPECT_NE(r.out.find("[0]"), std::string::npos);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\[0\\].*(refus|reject|dropp)", std::regex::icase))) << r.out;
}

class TorchrunEnvironment : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchrunEnvironment, TwoRanksStartedByHand) {
  // Two ranks started by hand with torchrun's variables; the job id stands in for the secret. MASTER_ADDR may be
  // IPv4 or IPv6 (rank 0 serves the rendezvous on that family).
  const std::string addr = GetParam();
  if (addr.find(':') != std::string::npos) {
    const int fd = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool v6 = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  }
  const std::string pid = std::to_string(getpid());
  const std::string env = "MASTER_ADDR=" + addr +
                          " MASTER_PORT=" + std::to_string(29000 + getpid() % 1000 + (addr == "::1" ? 1000 : 0)) +
                          " WORLD_SIZE=2 TORCHELASTIC_RUN_ID=test" + pid;
  const std::string log0 = "/tmp/chorus_torchrun0_" + pid + ".log";
  Result r = run("sh -c '" + env + " RANK=0 LOCAL_RANK=0 " + MP_WORKER + " smoke-twice > " + log0 + " 2>&1 & " + env +
                 " RANK=1 LOCAL_RANK=1 " + MP_WORKER + " smoke-twice; s1=$?; wait $!; s0=$?; cat " + log0 + "; rm -f " +
                 log0 + "; exit $((s0 + s1))'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 2) << r.out;
  // Then a second communicator from the same variables, after the first was destroyed.
  EXPECT_EQ(count_of(r.out, "smoke: second communicator completed"), 2) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Launcher, TorchrunEnvironment, ::testing::Values("127.0.0.1", "::1"),
                         [](const auto& info) { return std::string(info.index == 0 ? "ipv4" : "ipv6"); });

// A child forked by the process that serves the rendezvous exits at once, although a rank is still connected to the
// service: the exit handler that waits for connected ranks belongs to the process whose threads serve them (helper-61
// found the child waiting out CHORUS_TIMEOUT_MS, here 60 s; the bound below is that timeout's half, not a speed).
TEST(Bootstrap, AChildForkedByTheRendezvousHostExitsWithoutWaitingForItsRanks) {
  const std::string pid = std::to_string(getpid());
  const std::string flag = "/tmp/chorus_fork_exit_" + pid, log0 = "/tmp/chorus_fork_exit0_" + pid + ".log";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(31000 + getpid() % 1000) +
                          " WORLD_SIZE=2 TORCHELASTIC_RUN_ID=fork" + pid +
                          " CHORUS_TIMEOUT_MS=60000 MP_WORKER_FLAG=" + flag;
  Result r = run("sh -c '" + env + " RANK=0 LOCAL_RANK=0 " + MP_WORKER + " fork-exit > " + log0 + " 2>&1 & " + env +
                 " RANK=1 LOCAL_RANK=1 " + MP_WORKER + " fork-exit; s1=$?; wait $!; s0=$?; cat " + log0 + "; rm -f " +
                 log0 + " " + flag + "; exit $((s0 + s1))'");
  EXPECT_EQ(r.code, 0) << r.out;
  const size_t at = r.out.find("the child exited after ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_LT(std::stod(r.out.substr(at + 23)), 30.0) << r.out;
}

// A child forked by a process with live communicators, then serving a job's rendezvous itself, waits at exit for
// that job's ranks (helper-62: the count of live communicators it inherited kept it from waiting, and rank 1 found
// its root gone).
TEST(Bootstrap, AForkedChildServingARendezvousWaitsForItsRanks) {
  const std::string pid = std::to_string(getpid()), log0 = "/tmp/chorus_fork_host0_" + pid + ".log";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(32000 + getpid() % 1000) +
                          " WORLD_SIZE=2 TORCHELASTIC_RUN_ID=forkhost" + pid + " CHORUS_TIMEOUT_MS=30000";
  Result r = run("sh -c '" + env + " RANK=0 LOCAL_RANK=0 " + MP_WORKER + " fork-host > " + log0 + " 2>&1 & " + env +
                 " RANK=1 LOCAL_RANK=1 " + MP_WORKER + " fork-host; s1=$?; wait $!; s0=$?; cat " + log0 + "; rm -f " +
                 log0 + "; exit $((s0 + s1))'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "ok fork-host: rank"), 2) << r.out;
}

TEST(Launcher, ChorusrunPrefixesLinesAndFailsWhenARankFails) {
  Result r = run(std::string(CHORUSRUN) + " -n 3 sh -c 'echo hello $CHORUS_RANK; [ $CHORUS_RANK != 1 ] || exit 7'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_NE(r.out.find("[0] hello 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[2] hello 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 exited with code 7"), std::string::npos) << r.out;
  // A NUL byte is passed through, not the end of the line; a last line without a newline still gets its prefix.
  r = run(std::string(CHORUSRUN) + " -n 1 sh -c 'printf \"a\\000b\\nlast\"' | od -An -c | tr -d ' \\n'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[0]a\\0b\\n[0]last\\n") << r.out;
  // A rank's stderr goes to chorusrun's stderr, its stdout to stdout, each line prefixed.
  r = run(std::string(CHORUSRUN) + " -n 2 sh -c 'echo out $CHORUS_RANK; echo err $CHORUS_RANK >&2' 2>/dev/null | sort");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[0] out 0\n[1] out 1\n") << r.out;
  r = run(std::string(CHORUSRUN) +
          " -n 2 sh -c 'echo out $CHORUS_RANK; echo err $CHORUS_RANK >&2' 2>&1 >/dev/null | sort");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[0] err 0\n[1] err 1\n") << r.out;
  // A process the rank started outlives it and fills stderr past a pipe's buffer before writing stdout: chorusrun
  // reads both until their ends (draining one, then the other, would wait on each other forever).
  r = run(std::string("(") + CHORUSRUN +
          " -n 1 sh -c '(sleep 0.2; head -c 200000 /dev/zero | tr \"\\000\" x >&2; echo late) & exit 0' 2>/dev/null)");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "[0] late\n") << r.out;
  // A second rank that dies of a signal on its own, after the first failure, is named too (it may print nothing: a
  // crash); a rank chorusrun stops is not.
  r = run(std::string(CHORUSRUN) +
          " -n 3 sh -c 'case $CHORUS_RANK in 0) exit 3;; 1) sleep 0.5; kill -SEGV $$;; *) exec sleep 30;; esac'");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("rank 0 exited with code 3; stopping the other ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 was also killed by signal 11 (Segmentation fault)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 2 was also"), std::string::npos) << r.out;
}

TEST(Faults, AFullDevShmIsAnErrorNotABusError) {
  // A 1 MiB /dev/shm in a mount namespace of its own (root only), and FIFOs that need 16 MiB per pair: init's first
  // collective must fail naming /dev/shm on every rank; it used to size the segment sparse and die of SIGBUS when
  // a page could not be backed.
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a private mount of /dev/shm)";
  Result r = run(std::string("unshare -m sh -c 'mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && "
                             "CHORUS_TRANSPORTS=shm CHORUS_SLICE_BYTES=2M ") +
                 CHORUSRUN + " -n 2 --timeout 60 " + MP_WORKER + " smoke'");
  if (r.out.find("mount") != std::string::npos && r.out.find("chorus") == std::string::npos)
    GTEST_SKIP() << "cannot mount a private /dev/shm here: " << r.out;
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("signal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/dev/shm is full"), std::string::npos) << r.out;
}

TEST(Faults, FifosLargerThanHalfTheAvailableMemoryAreAnErrorNotAnOutOfMemoryKill) {
  // 2 x 64 slots x 1 GiB per pair: more than half of any machine this runs on. Where /dev/shm is as large as memory
  // the segment used to be allocated, and a third rank's took the memory: the kernel killed a rank.
  Result r = run(std::string("CHORUS_TRANSPORTS=shm CHORUS_SLICE_BYTES=1G CHORUS_FIFO_DEPTH=64 ") + CHORUSRUN +
                 " -n 2 --timeout 60 " + MP_WORKER + " smoke");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("signal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes of memory available: lower CHORUS_SLICE_BYTES or CHORUS_FIFO_DEPTH"), std::string::npos)
      << r.out;
}

TEST(Launcher, ChorusrunRemovesTheSegmentsItsEndedRanksLeftAndNoOthers) {
  // A rank that ends leaves two segments named as the shm transport names them, and one with its pid but another
  // launch's id (a job in another pid namespace sharing /dev/shm): only its own two are removed.
  Result r = run(std::string(CHORUSRUN) +
                 " -n 1 sh -c 'for n in 0 1; do : > /dev/shm/chorus-$$-$CHORUS_LAUNCH_ID-$n-ab; done; "
                 ": > /dev/shm/chorus-$$-beef-0-ab; echo pid $$'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed 2 shared-memory segment(s) rank 0 left"), std::string::npos) << r.out;
  const size_t at = r.out.find("[0] pid ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string other = "/chorus-" + std::to_string(std::stoi(r.out.substr(at + 8))) + "-beef-0-ab";
  EXPECT_EQ(shm_unlink(other.c_str()), 0) << other << " should have been left alone";
}

TEST(Launcher, RanksStartWithTheDefaultSigpipe) {
  // chorusrun ignores SIGPIPE itself; its ranks must not inherit that (`yes | head -1` would then complain).
  Result r = run(std::string(CHORUSRUN) + " -n 2 sh -c 'grep SigIgn /proc/self/status'");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const std::string rank : {"[0] ", "[1] "}) {
    const size_t at = r.out.find(rank + "SigIgn:");
    ASSERT_NE(at, std::string::npos) << r.out;
    const unsigned long long mask = std::stoull(r.out.substr(r.out.find(':', at) + 1, 20), nullptr, 16);
    EXPECT_EQ(mask & (1ull << (SIGPIPE - 1)), 0u) << r.out;
  }
}

TEST(Faults, ARankWhoseInitFailsAfterTheRendezvousIsNamedNotWaitedFor) {
  // Rank 0 alone writes the topology dump, after the rendezvous; an unwritable path fails its init. Rank 1's init
  // had succeeded: its first call must fail naming rank 0 at once (it waited out the whole timeout).
  Result r = run(std::string("CHORUS_TOPO_DUMP_FILE=/nonexistent-dir/topo.json CHORUS_TIMEOUT_MS=60000 ") + CHORUSRUN +
                 " -n 2 --timeout 50 " + MP_WORKER + " smoke");
  EXPECT_NE(r.code, 0) << r.out;
  // Rank 1 fails at its first call, or in its own init if the report overtakes it there; either way naming rank 0.
  const size_t at = r.out.find("[1] FAIL ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0: communicator init failed", at), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("timed out"), std::string::npos) << r.out;
}

// The pids of `pid`'s children (Linux: /proc/PID/task/PID/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

// Whether `pid` is still running (a zombie waiting for init to reap it is not).
bool running(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

TEST(Launcher, RanksDieWithAKilledLauncher) {
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    execl(CHORUSRUN, CHORUSRUN, "-n", "2", "sleep", "600", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<pid_t> ranks;
  for (int i = 0; i < 500 && ranks.size() < 2; ++i) {
    ranks = children_of(launcher);
    if (ranks.size() < 2) usleep(10000);
  }
  ASSERT_EQ(ranks.size(), 2u);
  // Nothing of the launcher runs after SIGKILL: only the ranks' parent-death signal can stop them.
  ASSERT_EQ(kill(launcher, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  for (pid_t r : ranks) {
    bool gone = false;
    for (int i = 0; i < 500 && !gone; ++i) {
      gone = !running(r);
      if (!gone) usleep(10000);
    }
    EXPECT_TRUE(gone) << "rank process " << r << " still runs after its launcher was killed";
    if (!gone) kill(r, SIGKILL);
  }
}

// chorus-info shows each setting's value, except the secret's (it authenticates every connection of a job), and
// points out a CHORUS_* variable that is not a setting.
TEST(ChorusInfo, ShowsSettingsButNotTheSecretAndPointsOutAMisspeltOne) {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  Result r = run("env CHORUS_SECRET=" + secret + " CHORUS_NCHANNELS=3 CHORUS_TIMOUT_MS=5 " + CHORUS_INFO);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find(secret), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("set: 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CHORUS_TIMOUT_MS       set but not a setting: ignored (did you mean CHORUS_TIMEOUT_MS?)"),
            std::string::npos)
      << r.out;
  // An option whose value is missing says so (it used to be an "unknown argument").
  for (const char* option : {"--transport", "--topology -n"}) {
    r = run(std::string(CHORUS_INFO) + " " + option);
    EXPECT_EQ(r.code, 2) << r.out;
    const std::string name = std::string(option).substr(std::string(option).rfind(' ') + 1);
    EXPECT_NE(r.out.find("chorus-info: " + name + " needs a value"), std::string::npos) << option << "\n" << r.out;
  }
}

#ifdef ALL_REDUCE_PERF
TEST(Launcher, SettingsThatDifferBetweenRanksAreNamedOneByOne) {
  // Each rank's init compares the settings that choose programs; the error names the one that differs (it used to
  // print both ranks' whole settings lines).
  Result r = run(std::string(CHORUSRUN) + " -n 2 sh -c 'CHORUS_NCHANNELS=$((CHORUS_RANK + 1)) exec " + ALL_REDUCE_PERF +
                 " -b 8 -e 8 -n 1 -w 0'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("settings differ between ranks: CHORUS_NCHANNELS='1' here but '2' on rank 1"), std::string::npos)
      << r.out;
}

// The header says which settings the run used, and a CHORUS_* variable that is not a setting (a misspelt one, which
// changes nothing) is pointed out, by the header and once per process by the library's warning.
TEST(PerfTools, TheHeaderNamesTheSettingsInEffectAndAMisspeltOne) {
  Result r = run("env CHORUS_NCHANNELS=2 CHORUS_FP32_PARTIAL=1 " + std::string(ALL_REDUCE_PERF) +
                 " -t 2 -b 8 -e 8 -n 1 -w 0 -d half");
  EXPECT_EQ(r.code, 0) << r.out;
  const size_t settings = r.out.find("# settings:");
  ASSERT_NE(settings, std::string::npos) << r.out;
  const std::string line = r.out.substr(settings, r.out.find('\n', settings) - settings);
  EXPECT_NE(line.find(" CHORUS_NCHANNELS=2"), std::string::npos) << line;
  EXPECT_EQ(line.find("CHORUS_FP32_PARTIAL"), std::string::npos) << line;
  EXPECT_NE(r.out.find("# CHORUS_FP32_PARTIAL is not a setting: ignored (did you mean CHORUS_FP32_PARTIALS?)"),
            std::string::npos)
      << r.out;
  const std::string warning =
      "CHORUS_FP32_PARTIAL is set but is not a Chorus setting, so it is ignored; did you mean CHORUS_FP32_PARTIALS?";
  const size_t first = r.out.find(warning);
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(warning, first + 1), std::string::npos) << "warned more than once per process:\n" << r.out;
  // A misspelt launch variable is why the init fails, so the warning comes before the launch variables are read.
  r = run("env CHORUS_RANK=0 CHORUS_NRANKS=1 CHORUS_ROOT_ADRR=127.0.0.1:1 CHORUS_SECRET=" + std::string(32, 'a') + " " +
          ALL_REDUCE_PERF + " -b 8 -e 8 -n 1 -w 0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CHORUS_ROOT_ADRR is set but is not a Chorus setting, so it is ignored; did you mean "
                       "CHORUS_ROOT_ADDR?"),
            std::string::npos)
      << r.out;
}

// CHORUS_DEBUG_SUBSYS chooses among INFO and TRACE messages; warnings always show (as NCCL's do). A list of unknown
// names only used to silence every subsystem, the warnings too.
TEST(Logging, WarningsShowWhicheverSubsystemsAreChosen) {
  const std::string warning = "CHORUS_FP32_PARTIAL is set but is not a Chorus setting";
  for (const char* subsys : {"FOO", "TRANSPORT", "^CORE", "ALL"}) {
    const Result r = run(std::string("env CHORUS_DEBUG_SUBSYS=") + subsys + " CHORUS_FP32_PARTIAL=1 " +
                         ALL_REDUCE_PERF + " -t 2 -b 8 -e 8 -n 1 -w 0");
    EXPECT_EQ(r.code, 0) << subsys << "\n" << r.out;
    EXPECT_NE(r.out.find(warning), std::string::npos) << subsys << "\n" << r.out;
  }
  // An unknown name is said, with the known ones; with nothing else listed, INFO shows for every subsystem.
  const Result r = run("env CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=FOO " + std::string(ALL_REDUCE_PERF) +
                       " -t 2 -b 8 -e 8 -n 1 -w 0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("CHORUS_DEBUG_SUBSYS: unknown subsystem 'FOO' ignored (known: CORE, BOOTSTRAP"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" INFO ALGORITHMS: "), std::string::npos) << r.out;
}

// A CHORUS_ALGO rule that cannot run (one-shot beyond 64 ranks) used to be set aside at INFO only: it is a warning,
// once per process however many thread-ranks and sizes it applies to.
TEST(Logging, AnAlgoRuleThatCannotRunIsAWarningOncePerProcess) {
  const Result r =
      run("env CHORUS_ALGO=allreduce:oneshot " + std::string(ALL_REDUCE_PERF) + " -t 65 -b 8 -e 64 -n 1 -w 0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out,
                     "WARN ALGORITHMS: AllReduce on 65 ranks: CHORUS_ALGO rule 'allreduce:oneshot' ignored: "
                     "oneshot does not apply"),
            1)
      << r.out;
}

// The footer says which algorithm each size ran (what the library ran, not what the tool asked for), in the text
// and in -J's records.
TEST(PerfTools, TheFooterNamesTheAlgorithmEachSizeRan) {
  const std::string json = "/tmp/chorus_perf_algorithms_" + std::to_string(getpid()) + ".json";
  Result r = run("env CHORUS_ALGO='allreduce:0-1K:ring,1K-:rhd' " + std::string(ALL_REDUCE_PERF) +
                 " -t 2 -b 8 -e 32K -f 8 -n 2 -w 1 -J " + json);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(
      r.out.find("# Algorithm each measured size (bytes) ran, on rank 0:\n#   float sum: 8-512 ring, 4096-32768 rhd\n"),
      std::string::npos)
      << r.out;
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(json.c_str());
  EXPECT_EQ(count_of(text, "\"algorithm\": \"ring\""), 6) << text;  // 3 sizes, in and out of place
  EXPECT_EQ(count_of(text, "\"algorithm\": \"rhd\""), 4) << text;
  // A range of one size names just that size.
  r = run("env CHORUS_ALGO='reducescatter:0-1K:ring,1K-:rhd' " + std::string(REDUCE_SCATTER_PERF) +
          " -t 2 -b 8 -e 4K -f 8 -n 1 -w 0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("#   float sum: 8-512 ring, 4096 rhd\n"), std::string::npos) << r.out;
  // Point-to-point runs no algorithm: no footer (it showed the tool's own barrier's algorithm, helper-72).
  r = run("env CHORUS_ALGO='barrier:0-:tree' " + std::string(SENDRECV_PERF) + " -t 2 -b 8 -e 128 -f 16 -n 2 -w 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("# Algorithm each"), std::string::npos) << r.out;
}

// nccl-tests' convention: 0 when every result is right, 1 for a wrong result or a failed call, 2 for arguments the
// tool cannot run, also those that only the library can refuse (an algorithm or codec that does not apply).
TEST(PerfTools, ArgumentsTheLibraryRefusesExitTwo) {
  const std::string tool = std::string(ALL_REDUCE_PERF) + " -t 2 -b 8 -e 64 -n 2 -w 1";
  Result ok = run(tool);
  EXPECT_EQ(ok.code, 0) << ok.out;
  // An algorithm that does not apply to the communicator (one-shot beyond 64 ranks) is refused by the first call.
  Result algo = run(std::string(ALL_REDUCE_PERF) + " -t 65 -b 8 -e 64 -n 2 -w 1 -A oneshot");
  EXPECT_EQ(algo.code, 2) << algo.out;
  EXPECT_NE(algo.out.find("does not apply to this communicator"), std::string::npos) << algo.out;
  // The refused call left the communicators healthy: they are destroyed, not aborted, so no rank is said to have
  // died (helper-74), also when the ranks are processes.
  EXPECT_EQ(algo.out.find("without a goodbye"), std::string::npos) << algo.out;
  algo = run(std::string(CHORUSRUN) + " -n 65 " + ALL_REDUCE_PERF + " -b 8 -e 64 -n 2 -w 1 -A oneshot");
  EXPECT_EQ(algo.code, 2) << algo.out;
  EXPECT_NE(algo.out.find("does not apply to this communicator"), std::string::npos) << algo.out;
  EXPECT_EQ(algo.out.find("without a goodbye"), std::string::npos) << algo.out;
  // A usage error leaves -J's file as it was (it used to be overwritten with []).
  const std::string kept = "/tmp/chorus_perf_kept_" + std::to_string(getpid()) + ".json";
  std::ofstream(kept) << "precious\n";
  algo = run(tool + " -A bruck -J " + kept);
  EXPECT_EQ(algo.code, 2) << algo.out;
  std::ifstream in(kept);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "precious");
  std::remove(kept.c_str());
  Result zero_block = run(tool + " -Z int8:0");  // block 0: the library's default, as chorus.h says
  EXPECT_EQ(zero_block.code, 0) << zero_block.out;
  Result narrow = run(tool + " -Z int8 -d half,bfloat16");  // widened to float32 by the library
  EXPECT_EQ(narrow.code, 0) << narrow.out;
  Result codec = run(tool + " -Z int8 -d double");
  EXPECT_EQ(codec.code, 2) << codec.out;
  EXPECT_NE(codec.out.find("-Z/--compression: needs -d float, half or bfloat16"), std::string::npos) << codec.out;
  // Found before the sweep, as every bad flag (they used to print the table's header first): an op or collective
  // that has no compressed form.
  // A block or rotation the codec does not take too (they used to fail in the first call on every rank).
  for (const std::string& bad : {tool + " -Z int8 -o max", tool + " -Z sign_vote -o avg",
                                 std::string(BROADCAST_PERF) + " -t 2 -b 8 -e 64 -Z int8", tool + " -Z int8:33",
                                 tool + " -Z sign_vote:64", tool + " -Z fp8_e4m3:64", tool + " -Z int8:96:rht"}) {
    Result r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("-Z/--compression: "), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(r.out.find("# minBytes"), std::string::npos) << bad << ": " << r.out;
  }
  // So is an algorithm the collective (or its compressed form) lacks: they used to fail in the first call.
  for (const std::string& bad :
       {tool + " -A bruck", tool + " -A tree -Z int8", std::string(SENDRECV_PERF) + " -t 2 -b 8 -e 64 -A ring"}) {
    Result r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("-A/--algorithm: "), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(r.out.find("# minBytes"), std::string::npos) << bad << ": " << r.out;
  }
  Result flag = run(tool + " -Q");
  EXPECT_EQ(flag.code, 2) << flag.out;
  Result root = run(tool + " -r -2");
  EXPECT_EQ(root.code, 2) << root.out;
  EXPECT_NE(root.out.find("-r/--root: must be a rank in [0, 2^30), or -1 or 'all' (every root in turn)"),
            std::string::npos)
      << root.out;
  root = run(tool + " -r 1073741824");  // 2^30: past what the tool takes, refused with the same message
  EXPECT_EQ(root.code, 2) << root.out;
  EXPECT_NE(root.out.find("-r/--root: must be a rank in [0, 2^30)"), std::string::npos) << root.out;
  // Point-to-point has no compressed form: -Z used to run it uncompressed and report a codec error of 0.
  Result p2p = run(std::string(SENDRECV_PERF) + " -t 2 -b 8 -e 64 -n 2 -w 1 -Z int8");
  EXPECT_EQ(p2p.code, 2) << p2p.out;
  EXPECT_NE(p2p.out.find("sendrecv has no compressed form"), std::string::npos) << p2p.out;
  // An unwritable -J file is refused before the sweep, not found out after it.
  Result json = run(tool + " -J /nonexistent-dir/out.json");
  EXPECT_EQ(json.code, 2) << json.out;
  EXPECT_NE(json.out.find("-J/--output_file: cannot write it"), std::string::npos) << json.out;
  EXPECT_EQ(json.out.find("Out of bounds"), std::string::npos) << json.out;
  json = run(tool + " -J /tmp");  // a folder
  EXPECT_EQ(json.code, 2) << json.out;
  EXPECT_NE(json.out.find("cannot write it: Is a directory"), std::string::npos) << json.out;
  // Under a launcher the other ranks learn rank 0's verdict and exit 2 with it: they used to fail their first call
  // and exit 1, sometimes before rank 0, and chorusrun then reported rank 1's code.
  Result launched = run(std::string(CHORUSRUN) + " -n 3 " + ALL_REDUCE_PERF + " -b 8 -e 64 -n 2 -w 1 -J /tmp");
  EXPECT_EQ(launched.code, 2) << launched.out;
  EXPECT_NE(launched.out.find("cannot write it: Is a directory"), std::string::npos) << launched.out;
  EXPECT_EQ(launched.out.find("exited with code 1"), std::string::npos) << launched.out;
}

// A sweep from 0 bytes by doubling visits 0, 1, 2, 4 and 8 bytes: 0, 0, 0, 1 and 2 floats. A row per element count,
// not per byte count (it used to print three rows of 0 elements).
TEST(PerfTools, SizesOfTheSameElementCountGiveOneRow) {
  Result r = run(std::string(ALL_REDUCE_PERF) + " -t 2 -b 0 -e 8 -f 2 -n 1 -w 0");
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<std::string> sizes;  // first column of every table row
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string first;
    if (line.empty() || line[0] == '#' || !(words >> first)) continue;
    if (first.find_first_not_of("0123456789") == std::string::npos) sizes.push_back(first);
  }
  EXPECT_EQ(sizes, (std::vector<std::string>{"0", "4", "8"})) << r.out;
}

// Halving/doubling and Bruck move runs of chunks, one round per phase: with 4 KiB slices and two slots per
// connection every run of the larger sizes is many slices; with 5 ranks one rank folds into its partner (rhd) and
// Bruck's blocks wrap; with two channels the block programs send one block per message. The tools check every
// element on every rank, in place and out of place (exit 0: right).
TEST(PerfTools, RunsOfChunksAreRightWithManySlicesAFoldedRankAndTwoChannels) {
  const std::pair<const char*, const char*> cases[] = {
      {ALL_REDUCE_PERF, "rhd"}, {REDUCE_SCATTER_PERF, "rhd"}, {ALL_GATHER_PERF, "rhd"}, {ALL_GATHER_PERF, "bruck"}};
  for (auto [tool, algorithm] : cases)
    for (int nch : {1, 2}) {
      Result r = run(
          "CHORUS_TRANSPORTS=shm CHORUS_SLICE_BYTES=4K CHORUS_FIFO_DEPTH=2 CHORUS_NCHANNELS=" + std::to_string(nch) +
          " " + CHORUSRUN + " -n 5 --timeout 120 " + tool + " -A " + algorithm + " -b 4 -e 1M -f 7 -n 1 -w 0");
      EXPECT_EQ(r.code, 0) << tool << " -A " << algorithm << " nchannels=" << nch << ":\n" << r.out;
      EXPECT_EQ(count_of(r.out, "Out of bounds values : 0 OK"), 1) << r.out;
    }
}
#endif

// chorus-plan --choice-only decides as the library does: a named algorithm is generated, not simulated, and its
// row says so ("named", not the "n/a" of an algorithm that does not apply); unnamed, the cost model decides.
// The settings the environment gives are checked as a communicator checks them (chorus-plan used to plan with a
// slice of 1 B or a FIFO depth of 3, which no communicator takes), and bad ones are usage errors naming them.
TEST(ChorusPlan, SettingsFromTheEnvironmentAreCheckedAsTheLibraryChecksThem) {
  const std::string plan = std::string(CHORUS_PLAN) + " --coll allreduce --bytes 1M";
  for (const auto& [env, text] : std::vector<std::pair<std::string, std::string>>{
           {"CHORUS_SLICE_BYTES=1", "CHORUS_SLICE_BYTES=1 must be between 64 and 1G"},
           {"CHORUS_SLICE_BYTES=16G", "CHORUS_SLICE_BYTES=17179869184 must be between 64 and 1G"},
           {"CHORUS_FIFO_DEPTH=3", "CHORUS_FIFO_DEPTH=3 must be a power of two between 2 and 64"},
           {"CHORUS_NCHANNELS=0", "CHORUS_NCHANNELS=0 must be between 1 and 32"},
           {"CHORUS_FP32_PARTIALS=5", "CHORUS_FP32_PARTIALS=5 must be 0 or 1"},
           {"CHORUS_ALGO=allreduce:0-:nosuch", "nosuch"},
           {"CHORUS_TOPO_FILE=/nonexistent/t.json", "CHORUS_TOPO_FILE: "},
           {"CHORUS_TUNE_FILE=/nonexistent/t.json", "CHORUS_TUNE_FILE: "}}) {
    Result r = run(env + " " + plan);
    EXPECT_EQ(r.code, 2) << env << ": " << r.out;
    EXPECT_NE(r.out.find(text), std::string::npos) << env << ": " << r.out;
  }
  Result net = run(plan + " --nranks 4 --hosts 2 --net-gbps inf");
  EXPECT_EQ(net.code, 2) << net.out;
  EXPECT_NE(net.out.find("--net-gbps 'inf' must be a finite number >= 0"), std::string::npos) << net.out;
  // Plans it could not hold in memory or print are refused up front (one ran out of memory and aborted).
  const std::string big = testing::TempDir() + "/chorus-plan-10000-ranks.json";
  std::FILE* f = std::fopen(big.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"version": 1, "hosts": [{"name": "a", "count": 10000}]})", f);
  std::fclose(f);
  Result ranks = run(std::string(CHORUS_PLAN) + " --coll allreduce --bytes 1K --topo " + big);
  EXPECT_EQ(ranks.code, 2) << ranks.out;
  EXPECT_NE(ranks.out.find("has 10000 ranks; chorus-plan plans at most 8192"), std::string::npos) << ranks.out;
  Result sizes = run(std::string(CHORUS_PLAN) + " --coll allreduce --bytes 1K:8G --step 1.0000001");
  EXPECT_EQ(sizes.code, 2) << sizes.out;
  EXPECT_NE(sizes.out.find("sizes (take a larger --step)"), std::string::npos) << sizes.out;
}

// With CHORUS_FP32_PARTIALS=1 a half-precision sum runs as a float32 call, and chorus-plan chooses for that call as
// the library does: the size ranges of CHORUS_ALGO see 4 bytes per element (it used to plan the half call).
TEST(ChorusPlan, Fp32PartialsPlanTheFloat32CallTheLibraryRuns) {
  const std::string plan =
      std::string(CHORUS_PLAN) + " --coll allreduce --dtype half --bytes 1000 --nranks 2 --choice-only";
  const std::string algo = "CHORUS_ALGO='allreduce:0-1K:tree,1K-:ring' ";
  Result half = run(algo + plan);
  ASSERT_EQ(half.code, 0) << half.out;
  EXPECT_NE(half.out.find("tree (CHORUS_ALGO)"), std::string::npos) << half.out;
  Result widened = run(algo + "CHORUS_FP32_PARTIALS=1 " + plan);
  ASSERT_EQ(widened.code, 0) << widened.out;
  EXPECT_NE(widened.out.find("ring (CHORUS_ALGO)"), std::string::npos) << widened.out;
  EXPECT_NE(widened.out.find("CHORUS_FP32_PARTIALS=1: half runs as a float32 call"), std::string::npos) << widened.out;
}

TEST(ChorusPlan, ChoiceOnlyShowsANamedAlgorithmAsNamed) {
  const std::string plan = std::string(CHORUS_PLAN) + " --coll alltoall --bytes 1024 --nranks 8 --choice-only";
  Result named = run(plan + " --algo bruck");
  ASSERT_EQ(named.code, 0) << named.out;
  EXPECT_NE(named.out.find("named"), std::string::npos) << named.out;
  EXPECT_EQ(named.out.find("n/a"), std::string::npos) << named.out;
  EXPECT_NE(named.out.find("# bruck was named: generated, not simulated"), std::string::npos) << named.out;
  Result chosen = run(plan);
  ASSERT_EQ(chosen.code, 0) << chosen.out;
  EXPECT_EQ(chosen.out.find("named"), std::string::npos) << chosen.out;
  EXPECT_NE(chosen.out.find("(cost model)"), std::string::npos) << chosen.out;
}

}  // namespace
