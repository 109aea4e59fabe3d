// Emulated hosts: ranks placed by `chorusrun --hosts` into network namespaces that scripts/netns-hosts.sh joins by a
// shaped bridge. Runs the multi-process correctness matrix across hosts and checks that ranks on different hosts
// talk tcp (or UCX over tcp, when chosen) over the bridge while ranks of one host use shm. Needs root and
// `ip netns`; skipped otherwise. CHORUSRUN, MP_WORKER and NETNS_SCRIPT are paths (compile definitions).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/common/process.h"

namespace {

using chorus::test::count_of;
using chorus::test::Result;
using chorus::test::run;

// Why these tests cannot run here, or "" when they can.
std::string cannot_run() {
  if (geteuid() != 0) return "needs root (network namespaces, veth and tc)";
  if (run("ip netns list").code != 0) return "`ip netns` is not available";
  return "";
}

// Prefixes of their own, so a test never touches a benchmark's hosts (prefix "chorus") or another test's, even one
// running from another build directory at the same time: chorus-ctest-<pid>-<hosts>.
std::string test_prefix(int hosts) { return "chorus-ctest-" + std::to_string(getpid()) + "-" + std::to_string(hosts); }

// Namespaces left by a test process that was killed before it could remove them (its pid is gone).
void remove_stale_test_namespaces() {
  Result r = run("ip netns list");
  std::regex re("^chorus-ctest-(\\d+)-\\d+-(h\\d+|br)\\b");
  std::set<std::string> stale;
  size_t start = 0;
  while (start < r.out.size()) {
    size_t nl = r.out.find('\n', start);
    std::string l = r.out.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    std::smatch m;
    if (std::regex_search(l, m, re) && kill(std::stoi(m[1]), 0) != 0 && errno == ESRCH)
      stale.insert(l.substr(0, l.find(' ')));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  for (const std::string& ns : stale) run("ip netns del " + ns);
}

// H emulated hosts for the life of the object; removed again even when the test fails.
class Hosts {
 public:
  Hosts(int hosts, std::string prefix) : prefix_(std::move(prefix)) {
    remove_stale_test_namespaces();
    Result r =
        run(std::string("bash ") + NETNS_SCRIPT + " up " + std::to_string(hosts) + " --rate 1gbit --prefix " + prefix_);
    up_ = r.code == 0;
    // Root without the capabilities (an unprivileged container) cannot create namespaces: not this code's fault.
    if (!up_ && r.out.find("Operation not permitted") != std::string::npos) skip_ = r.out;
    out_ = r.out;
  }
  ~Hosts() { down(); }
  Result down() { return run(std::string("bash ") + NETNS_SCRIPT + " down --prefix " + prefix_); }
  bool up() const { return up_; }
  const std::string& skip_reason() const { return skip_; }
  const std::string& output() const { return out_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_, out_, skip_;
  bool up_ = false;
};

// Bytes host `h` has sent through its shaped link so far (tbf statistics of its eth0).
long long bytes_sent(const std::string& prefix, int h) {
  Result r = run("tc -n " + prefix + "-h" + std::to_string(h) + " -s qdisc show dev eth0");
  std::smatch m;
  if (r.code != 0 || !std::regex_search(r.out, m, std::regex("Sent (\\d+) bytes"))) return -1;
  return std::stoll(m[1]);
}

std::vector<std::string> namespaces_with(const std::string& prefix) {
  std::vector<std::string> found;
  Result r = run("ip netns list");
  std::regex line("^(" + prefix + "-(h\\d+|br))\\b");
  size_t start = 0;
  while (start < r.out.size()) {
    size_t nl = r.out.find('\n', start);
    std::string l = r.out.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    std::smatch m;
    if (std::regex_search(l, m, line)) found.push_back(m[1]);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return found;
}

// `env` selects transports (default: the library's, local,shm,tcp).
std::string launch(const std::string& prefix, const std::string& hosts, int n, const std::string& mode,
                   const std::string& env = "") {
  return env + " CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=TRANSPORT " + CHORUSRUN + " --hosts " + hosts +
         (n > 0 ? " -n " + std::to_string(n) : std::string()) + " --netns-prefix " + prefix + " --timeout 240 " +
         MP_WORKER + " " + mode;
}

// Every "rank A: connected to rank B ... over T" line must name shm when A and B share a host, `between` (tcp
// unless the test chose another transport) otherwise; returns the (A, B) pairs seen.
std::set<std::pair<int, int>> check_transports(const std::string& out, const std::vector<int>& host_of,
                                               const std::string& between = "tcp") {
  std::set<std::pair<int, int>> pairs;
  std::regex re("rank (\\d+): connected to rank (\\d+) channel \\d+ over (\\w+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    int a = std::stoi((*it)[1]), b = std::stoi((*it)[2]);
    std::string t = (*it)[3];
    EXPECT_TRUE(a >= 0 && b >= 0 && a < static_cast<int>(host_of.size()) && b < static_cast<int>(host_of.size()))
        << it->str();
    if (a < 0 || b < 0 || a >= static_cast<int>(host_of.size()) || b >= static_cast<int>(host_of.size())) continue;
    const bool same = host_of[a] == host_of[b];
    EXPECT_EQ(t, same ? "shm" : between) << "rank " << a << " (host " << host_of[a] << ") to rank " << b << " (host "
                                         << host_of[b] << "): " << it->str();
    pairs.insert({a, b});
  }
  return pairs;
}

class Matrix : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The whole correctness matrix (every collective, counts, in/out of place, roots, dtypes, ops; every rank checks
// its own results) with ranks in blocks on H hosts. Its all-to-alls connect every pair of ranks, so every pair's
// transport is seen.
TEST_P(Matrix, EveryRankChecksItsResultsAndCrossHostPairsUseTcp) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  auto [hosts, per_host] = GetParam();
  const int n = hosts * per_host;
  Hosts h(hosts, test_prefix(hosts));
  if (!h.skip_reason().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << h.skip_reason();
  ASSERT_TRUE(h.up()) << h.output();
  const long long sent_before = bytes_sent(h.prefix(), 1);

  Result r = run(launch(h.prefix(), std::to_string(hosts), n, "matrix"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "cases passed"), n) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;

  std::vector<int> host_of(n);
  for (int i = 0; i < n; ++i) host_of[i] = i / per_host;
  auto pairs = check_transports(r.out, host_of);
  EXPECT_EQ(static_cast<int>(pairs.size()), n * (n - 1)) << "every rank should have connected to every other\n"
                                                         << r.out;
  // The cross-host bytes went through host 1's shaped link (not a shortcut over loopback).
  const long long sent_after = bytes_sent(h.prefix(), 1);
  EXPECT_GT(sent_after - sent_before, 1 << 20) << "host 1 sent " << sent_after - sent_before << " bytes over eth0";

  Result d = h.down();
  EXPECT_EQ(d.code, 0) << d.out;
  EXPECT_TRUE(namespaces_with(h.prefix()).empty()) << "namespaces left after down";
}

INSTANTIATE_TEST_SUITE_P(EmulatedHosts, Matrix, ::testing::Values(std::make_tuple(2, 2), std::make_tuple(4, 2)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "hosts_x" +
                                  std::to_string(std::get<1>(info.param)) + "ranks";
                         });

// The matrix with ranks of different hosts joined by UCX over tcp (through the shaped bridge), ranks of one host by
// shm: the UCX transport between separate network stacks, as between machines.
TEST(EmulatedHosts, MatrixOverUcxTcpBetweenHosts) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  const int hosts = 2, per_host = 2, n = hosts * per_host;
  Hosts h(hosts, test_prefix(hosts));
  if (!h.skip_reason().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << h.skip_reason();
  ASSERT_TRUE(h.up()) << h.output();
  const long long sent_before = bytes_sent(h.prefix(), 1);
  Result r =
      run(launch(h.prefix(), std::to_string(hosts), n, "matrix", "CHORUS_TRANSPORTS=shm,ucx CHORUS_UCX_TLS=tcp"));
  if (r.out.find("not built: this build has no UCX") != std::string::npos) GTEST_SKIP() << "no UCX in this build";
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "cases passed"), n) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  std::vector<int> host_of(n);
  for (int i = 0; i < n; ++i) host_of[i] = i / per_host;
  EXPECT_EQ(static_cast<int>(check_transports(r.out, host_of, "ucx").size()), n * (n - 1)) << r.out;
  EXPECT_GT(bytes_sent(h.prefix(), 1) - sent_before, 1 << 20) << "the cross-host bytes did not cross the bridge";
}

// Uneven hosts from an explicit list: 3 ranks on host 0, 1 on host 1.
TEST(EmulatedHosts, UnevenPlacementFromAList) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  Hosts h(2, test_prefix(2));
  if (!h.skip_reason().empty()) GTEST_SKIP() << "cannot create network namespaces here: " << h.skip_reason();
  ASSERT_TRUE(h.up()) << h.output();
  // Idempotent: a second `up` leaves working hosts.
  Hosts again(2, test_prefix(2));
  ASSERT_TRUE(again.up()) << again.output();

  Result r = run(launch(h.prefix(), "3,1", 0, "smoke"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 4) << r.out;
  check_transports(r.out, {0, 0, 0, 1});
  EXPECT_GE(count_of(r.out, " over tcp"), 2) << r.out;  // rank 3, alone on host 1, reaches host 0 over tcp
}

// A docker or libvirt bridge has the same address on every host: listening there, a rank publishes an address no
// other host reaches (helper-73: with docker0 listed before eth0, a 3-host job failed). The default skips such
// bridges, as NCCL skips docker*, and takes one only when nothing else is up.
TEST(EmulatedHosts, TheDefaultAddressIsNotADockerBridgeListedFirst) {
  const std::string why = cannot_run();
  if (!why.empty()) GTEST_SKIP() << why;
  if (run("unshare -n true").code != 0) GTEST_SKIP() << "unshare -n does not work here";
  const std::string docker =
      "ip link add docker0 type veth peer name docker1 && ip addr add 172.17.0.1/16 dev docker0 && "
      "ip link set docker0 up && ip link set docker1 up";
  const std::string eth =
      "ip link add eth9 type veth peer name eth10 && ip addr add 10.213.99.1/24 dev eth9 && ip link set eth9 up && "
      "ip link set eth10 up";
  Result r = run("unshare -n sh -c '" + docker + " && " + eth + " && " + CHORUS_INFO + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("found: always; listens on 10.213.99.1:0"), std::string::npos) << r.out;
  r = run("unshare -n sh -c '" + docker + " && " + CHORUS_INFO + "'");  // nothing else: the bridge
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("found: always; listens on 172.17.0.1:0"), std::string::npos) << r.out;
  r = run("unshare -n sh -c '" + docker + " && " + eth + " && CHORUS_SOCKET_IFNAME=docker0 " + CHORUS_INFO + "'");
  EXPECT_NE(r.out.find("found: always; listens on 172.17.0.1:0"), std::string::npos) << r.out;  // chosen: kept
}

TEST(EmulatedHosts, MissingNamespacesAreAClearError) {
  // No root needed: the launcher stops before entering anything.
  Result r = run(std::string(CHORUSRUN) + " --hosts 2 -n 4 --netns-prefix chorus-ctest-absent true");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("network namespace chorus-ctest-absent-h0 does not exist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run scripts/netns-hosts.sh up 2 --prefix chorus-ctest-absent first"), std::string::npos)
      << r.out;
}

}  // namespace
