// Bootstrap: unique ids, secrets, sockets, authentication, launcher environments, and the rendezvous with ranks
// as threads of this process (each with its own connection to an in-process root service).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/launch_env.h"
#include "bootstrap/root.h"
#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "core/error.h"

namespace chorus {
namespace {

using namespace std::chrono_literals;

Blob blob_of(const std::string& s) {
  Blob b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::string str_of(const Blob& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// Runs `f`, which must throw chorus::Error; returns it (or an Error with code chorusSuccess if nothing was thrown).
template <typename F>
Error caught(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a chorus::Error";
  return Error(chorusSuccess, Subsys::Bootstrap, "");
}

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// Runs body(rank) on `n` threads and reports any exception as a test failure naming the rank.
void run_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// True once pred() holds, polling for at most `limit`.
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

sockaddr_storage loopback(int port = 0) {
  sockaddr_storage ss{};
  auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sin->sin_port = htons(static_cast<uint16_t>(port));
  return ss;
}

// A root on loopback with a short authentication timeout, as the unique id of its rendezvous.
UniqueIdData quick_root(int auth_timeout_ms = 500, bool one_rendezvous = false) {
  UniqueIdData id;
  id.secret = random_secret();
  RootOptions options;
  options.auth_timeout_ms = auth_timeout_ms;
  options.one_rendezvous = one_rendezvous;
  id.root = start_root(loopback(), id.secret, options);
  return id;
}

// Clears every launcher variable (and CHORUS_SOCKET_IFNAME) for the test's duration, restoring them after.
class ScopedEnv {
 public:
  ScopedEnv() {
    std::vector<const char*> names(launch_env_variables().begin(), launch_env_variables().end());
    names.push_back("CHORUS_SOCKET_IFNAME");
    for (const char* name : names) {
      const char* v = std::getenv(name);
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }
  void set(const char* name, const std::string& value) {
    ASSERT_TRUE(saved_.count(name)) << name << " is not a launch variable";
    setenv(name, value.c_str(), 1);
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// ---- Unique id and secret ----

TEST(UniqueId, RoundTripIPv4) {
  UniqueIdData in;
  in.root = loopback(5678);
  in.secret = random_secret();
  UniqueIdData out = decode_unique_id(encode_unique_id(in));
  EXPECT_EQ(sockaddr_to_string(out.root), "127.0.0.1:5678");
  EXPECT_EQ(out.secret, in.secret);
}

TEST(UniqueId, RoundTripIPv6) {
  UniqueIdData in;
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&in.root);
  sin6->sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fd00::2", &sin6->sin6_addr);
  sin6->sin6_port = htons(29500);
  in.secret = random_secret();
  UniqueIdData out = decode_unique_id(encode_unique_id(in));
  EXPECT_EQ(sockaddr_to_string(out.root), "[fd00::2]:29500");
  EXPECT_EQ(out.secret, in.secret);
}

TEST(UniqueId, BadMagicOrFamilyIsRefused) {
  chorusUniqueId zero{};
  Error e = caught([&] { decode_unique_id(zero); });
  EXPECT_EQ(e.code(), chorusInvalidArgument);
  EXPECT_STREQ(e.what(), "commId is not a Chorus unique id");

  UniqueIdData in;
  in.root = loopback(1);
  chorusUniqueId id = encode_unique_id(in);
  id.internal[5] = 9;  // address family byte
  EXPECT_EQ(caught([&] { decode_unique_id(id); }).code(), chorusInvalidArgument);
}

TEST(UniqueId, SecretsAreRandom) { EXPECT_NE(random_secret(), random_secret()); }

TEST(Secret, HexRoundTrip) {
  Secret s = random_secret();
  EXPECT_EQ(parse_secret(secret_to_hex(s), "X"), s);
  EXPECT_EQ(secret_to_hex(parse_secret("00112233445566778899AABBCCDDEEFF", "X")), "00112233445566778899aabbccddeeff");
}

TEST(Secret, HexErrorsNameTheVariable) {
  Error short_one = caught([] { parse_secret("abcd", "CHORUS_SECRET"); });
  EXPECT_EQ(short_one.code(), chorusInvalidArgument);
  EXPECT_TRUE(contains(short_one.what(), "CHORUS_SECRET must be 32 hex digits"));
  Error not_hex = caught([] { parse_secret("0011223344556677889900112233445g", "CHORUS_SECRET"); });
  EXPECT_EQ(not_hex.code(), chorusInvalidArgument);
  EXPECT_TRUE(contains(not_hex.what(), "character 32"));
}

// ---- Sockets ----

TEST(Socket, AddressText) {
  EXPECT_EQ(sockaddr_to_string(resolve("1.2.3.4", 5678)), "1.2.3.4:5678");
  EXPECT_EQ(sockaddr_to_string(resolve("[::1]", 5678)), "[::1]:5678");
  EXPECT_EQ(sockaddr_to_string(resolve("::1", 7)), "[::1]:7");
  EXPECT_TRUE(sockaddr_is_loopback(resolve("127.0.0.1", 1)));
}

TEST(Socket, InterfaceAddressErrorListsNames) {
  ASSERT_FALSE(interface_names().empty());
  Error e = caught([] { interface_address("nosuchif0"); });
  EXPECT_EQ(e.code(), chorusInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "CHORUS_SOCKET_IFNAME=nosuchif0: no such interface; interfaces with an address: "));
  for (const std::string& name : interface_names()) EXPECT_TRUE(contains(e.what(), name));
  EXPECT_TRUE(sockaddr_is_loopback(interface_address("lo")));
}

TEST(Socket, DefaultAddressFollowsIfname) {
  ScopedEnv env;
  env.set("CHORUS_SOCKET_IFNAME", "lo");
  EXPECT_TRUE(sockaddr_is_loopback(default_address()));
  env.set("CHORUS_SOCKET_IFNAME", "nosuchif0");
  EXPECT_EQ(caught([] { default_address(); }).code(), chorusInvalidArgument);
}

TEST(Socket, SendRecvTimeoutAndEof) {
  Socket listener = Socket::listen(loopback());
  Socket client = Socket::connect(listener.local_addr(), Deadline::after_ms(2000));
  Socket server = listener.accept(Deadline::after_ms(2000));
  const char msg[] = "hello";
  client.send_all(msg, sizeof(msg), Deadline::after_ms(1000));
  char buf[sizeof(msg)] = {};
  server.recv_all(buf, sizeof(buf), Deadline::after_ms(1000));
  EXPECT_STREQ(buf, "hello");

  auto t0 = std::chrono::steady_clock::now();
  Error timeout = caught([&] { server.recv_all(buf, 1, Deadline::after_ms(100)); });
  EXPECT_EQ(timeout.code(), chorusTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);

  client.close();
  Error eof = caught([&] { server.recv_all(buf, 1, Deadline::after_ms(1000)); });
  EXPECT_EQ(eof.code(), chorusSystemError);
  EXPECT_TRUE(contains(eof.what(), "connection closed by peer"));

  EXPECT_EQ(caught([&] { listener.accept(Deadline::after_ms(50)); }).code(), chorusTimeout);
}

TEST(Socket, ConnectRetriesUntilTheListenerAppears) {
  sockaddr_storage addr;
  {
    Socket probe = Socket::listen(loopback());
    addr = probe.local_addr();  // a port that is free once probe closes
  }
  Error refused = caught([&] { Socket::connect(addr, Deadline::after_ms(150)); });
  EXPECT_EQ(refused.code(), chorusSystemError);
  EXPECT_TRUE(contains(refused.what(), sockaddr_to_string(addr)));

  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    Socket listener = Socket::listen(addr);
    Socket s = listener.accept(Deadline::after_ms(3000));
  });
  EXPECT_NO_THROW(Socket::connect(addr, Deadline::after_ms(3000)));
  late.join();
}

TEST(Socket, ConnectRetriesStopAtAnErrorRetryingCannotFixAndWarnOnceWhileWaiting) {
  // An unreachable network ends the wait at once, however far the deadline (it used to be retried until then).
  const Deadline far = Deadline::after_ms(60000);
  ConnectRetries unreachable("rank 1: rank 0 at 255.255.255.255:1");
  const Deadline slice = Deadline::after_ms(1000);
  Error e = caught([&] { Socket::connect(resolve("255.255.255.255", 1), slice); });
  EXPECT_TRUE(contains(e.what(), "unreachable")) << e.what();
  EXPECT_FALSE(unreachable.retry(e, slice, far));

  // A refused connection is retried until the deadline, with one warning naming the peer once it has waited.
  sockaddr_storage addr;
  {
    Socket probe = Socket::listen(loopback());
    addr = probe.local_addr();
  }
  ConnectRetries refused("rank 1: rank 0 at " + sockaddr_to_string(addr), /*warn_after_ms=*/0);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    const Deadline short_slice = Deadline::after_ms(20);
    Error r = caught([&] { Socket::connect(addr, short_slice); });
    EXPECT_TRUE(refused.retry(r, short_slice, far)) << r.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string warning = "rank 1: rank 0 at " + sockaddr_to_string(addr) + ": not reached after 0 s (";
  EXPECT_NE(log.find(warning), std::string::npos) << log;
  EXPECT_EQ(log.find(warning, log.find(warning) + 1), std::string::npos) << log;
  const Deadline over = Deadline::after_ms(0);
  Error last = caught([&] { Socket::connect(addr, over); });
  EXPECT_FALSE(refused.retry(last, over, over));
}

TEST(Socket, ListenOnABusyPortNamesTheAddress) {
  Socket first = Socket::listen(loopback());
  sockaddr_storage addr = first.local_addr();
  Error e = caught([&] { Socket::listen(addr); });
  EXPECT_EQ(e.code(), chorusSystemError);
  EXPECT_TRUE(contains(e.what(), cat("cannot bind ", sockaddr_to_string(addr))));
}

// ---- Authentication ----

struct AuthResult {
  bool ok = false;
  std::string why;
};

// Runs the blocking server on one end of a loopback connection while `client` drives the other.
AuthResult authenticate(const Secret& server_secret, const std::function<void(Socket&)>& client,
                        int server_deadline_ms = 1000) {
  Socket listener = Socket::listen(loopback());
  AuthResult result;
  std::thread server([&] {
    Socket s = listener.accept(Deadline::after_ms(2000));
    result.ok = auth_server(s, server_secret, Deadline::after_ms(server_deadline_ms), &result.why);
  });
  Socket c = Socket::connect(listener.local_addr(), Deadline::after_ms(2000));
  client(c);
  server.join();
  return result;
}

TEST(Auth, SharedSecretIsAccepted) {
  Secret s = random_secret();
  AuthResult r = authenticate(s, [&](Socket& c) { auth_client(c, s, Deadline::after_ms(1000)); });
  EXPECT_TRUE(r.ok) << r.why;
}

// A server that never accepts (a stopped peer, or one waiting for its own failed peers) answers nothing: the
// client's check ends the wait (an abort, a peer failure) instead of the deadline. It used to wait it out: an abort
// took the whole CHORUS_TIMEOUT_MS, 19 s in a review's run.
TEST(Auth, TheCheckEndsAWaitForAServerThatNeverAccepts) {
  Socket listener = Socket::listen(loopback());  // the kernel completes the connection; nobody accepts it
  Socket c = Socket::connect(listener.local_addr(), Deadline::after_ms(2000));
  int checks = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const Error e = caught([&] {
    auth_client(c, random_secret(), Deadline::after_ms(60000), [&] {
      if (++checks == 3) throw Error(chorusInvalidUsage, Subsys::Core, "aborted");
    });
  });
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.code(), chorusInvalidUsage) << e.what();
  EXPECT_EQ(checks, 3);
  EXPECT_LT(waited_s, 30.0);  // three polls, not the 60 s deadline
}

TEST(Auth, WrongSecretIsRefusedBothWays) {
  Secret s = random_secret(), other = random_secret();
  Error client_error(chorusSuccess, Subsys::Bootstrap, "");
  AuthResult r = authenticate(s, [&](Socket& c) {
    client_error = caught([&] { auth_client(c, other, Deadline::after_ms(1000)); });
    c.close();
  });
  EXPECT_FALSE(r.ok);
  // The client found the server's proof wrong and closed: the server's log says what that most likely means.
  EXPECT_TRUE(contains(r.why,
                       "closed the connection after our challenge, without its proof: it most likely holds "
                       "another secret"))
      << r.why;
  EXPECT_EQ(client_error.code(), chorusSystemError);
  EXPECT_TRUE(contains(client_error.what(), "authentication"));
}

TEST(Auth, ServerRefusesAWrongProofAndGarbage) {
  Secret s = random_secret();
  // A client that follows the protocol but does not know the secret: its proof is wrong.
  AuthResult wrong = authenticate(s, [&](Socket& c) {
    uint8_t hello[kAuthHelloBytes] = {'C', 'H', 'R', 'S', 0, 0, 0, 1};
    c.send_all(hello, sizeof(hello), Deadline::after_ms(1000));
    uint8_t challenge[kAuthChallengeBytes];
    c.recv_all(challenge, sizeof(challenge), Deadline::after_ms(1000));
    uint8_t proof[kAuthProofBytes] = {};
    c.send_all(proof, sizeof(proof), Deadline::after_ms(1000));
  });
  EXPECT_FALSE(wrong.ok);
  EXPECT_TRUE(contains(wrong.why, "wrong proof"));

  AuthResult garbage = authenticate(s, [&](Socket& c) {
    std::string junk = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
    c.send_all(junk.data(), junk.size(), Deadline::after_ms(1000));
  });
  EXPECT_FALSE(garbage.ok);
  EXPECT_TRUE(contains(garbage.why, "bad magic"));

  AuthResult idle = authenticate(
      s, [&](Socket&) {}, /*server_deadline_ms=*/100);
  EXPECT_FALSE(idle.ok);
  EXPECT_TRUE(contains(idle.why, "idle"));
}

// ---- Launcher environments ----

const char* kHexSecret = "000102030405060708090a0b0c0d0e0f";

TEST(LaunchEnv, Chorus) {
  ScopedEnv env;
  env.set("CHORUS_RANK", "2");
  env.set("CHORUS_NRANKS", "4");
  env.set("CHORUS_LOCAL_RANK", "0");
  env.set("CHORUS_ROOT_ADDR", "10.0.0.1:1234");
  env.set("CHORUS_SECRET", kHexSecret);
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.nranks, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.root_host, "10.0.0.1");
  EXPECT_EQ(e.root_port, 1234);
  EXPECT_EQ(secret_to_hex(e.secret), kHexSecret);
  EXPECT_EQ(e.source, "chorus");
}

TEST(LaunchEnv, Torchrun) {
  ScopedEnv env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("MASTER_ADDR", "trainer-0");
  env.set("MASTER_PORT", "29500");
  env.set("TORCHELASTIC_RUN_ID", "run-42");
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.nranks, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.root_host, "trainer-0");
  EXPECT_EQ(e.root_port, 29500);
  // Derived from the job identity: equal for every rank of the job, different for another job.
  Secret derived = e.secret;
  env.set("RANK", "5");
  EXPECT_EQ(read_launch_env().secret, derived);
  env.set("TORCHELASTIC_RUN_ID", "run-43");
  EXPECT_NE(read_launch_env().secret, derived);
  // CHORUS_* override launcher values one by one.
  env.set("CHORUS_RANK", "3");
  env.set("CHORUS_SECRET", kHexSecret);
  e = read_launch_env();
  EXPECT_EQ(e.source, "chorus");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.nranks, 8);
  EXPECT_EQ(secret_to_hex(e.secret), kHexSecret);
}

TEST(LaunchEnv, OpenMpi) {
  ScopedEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_MCA_ess_base_jobid", "1234567");
  env.set("CHORUS_ROOT_ADDR", "node7:4000");
  // mpirun inside an allocation: SLURM_PROCID belongs to the daemon and must not win.
  env.set("SLURM_PROCID", "0");
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.nranks, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.root_host, "node7");
  EXPECT_EQ(e.root_port, 4000);
}

TEST(LaunchEnv, Slurm) {
  ScopedEnv env;
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_JOB_ID", "123456");
  env.set("SLURM_STEP_ID", "0");
  env.set("SLURM_JOB_NODELIST", "node[01-04,07],gpu3");
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.nranks, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.root_host, "node01");
  EXPECT_EQ(e.root_port, 29500 + 456);
  env.set("MASTER_PORT", "31000");
  EXPECT_EQ(read_launch_env().root_port, 31000);
}

TEST(LaunchEnv, Pmi) {
  ScopedEnv env;
  env.set("PMI_RANK", "1");
  env.set("PMI_SIZE", "2");
  env.set("PMIX_NAMESPACE", "job.7");
  env.set("CHORUS_ROOT_ADDR", "[fd00::2]:5000");
  LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.source, "pmi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.nranks, 2);
  EXPECT_EQ(e.local_rank, -1);
  EXPECT_EQ(e.root_host, "fd00::2");
  EXPECT_EQ(e.root_port, 5000);
}

TEST(LaunchEnv, ErrorsNameTheVariable) {
  ScopedEnv env;
  auto error_text = [] {
    Error e = caught([] { read_launch_env(); });
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    return std::string(e.what());
  };
  EXPECT_TRUE(contains(error_text(), "CHORUS_RANK"));
  env.set("RANK", "abc");
  env.set("WORLD_SIZE", "2");
  EXPECT_TRUE(contains(error_text(), "RANK='abc' is not an integer"));
  env.set("RANK", " 0");  // whitespace is refused at either end, as it was after the number
  EXPECT_TRUE(contains(error_text(), "RANK=' 0' is not an integer"));
  env.set("RANK", "+0");  // nor a sign the settings would refuse
  EXPECT_TRUE(contains(error_text(), "RANK='+0' is not an integer"));
  env.set("RANK", "2");
  EXPECT_TRUE(contains(error_text(), "RANK=2 is out of range for WORLD_SIZE=2"));
  env.set("RANK", "0");
  EXPECT_TRUE(contains(error_text(), "CHORUS_ROOT_ADDR"));
  env.set("MASTER_ADDR", "host");
  EXPECT_TRUE(contains(error_text(), "MASTER_PORT"));
  env.set("MASTER_PORT", "99999");
  EXPECT_TRUE(contains(error_text(), "MASTER_PORT='99999': port 99999 is out of range [1, 65535]"));
  env.set("MASTER_PORT", "1000");
  EXPECT_TRUE(contains(error_text(), "set CHORUS_SECRET"));
  env.set("CHORUS_SECRET", "xyz");
  EXPECT_TRUE(contains(error_text(), "CHORUS_SECRET must be 32 hex digits"));
  env.set("CHORUS_SECRET", kHexSecret);
  env.set("CHORUS_ROOT_ADDR", "hostonly");
  EXPECT_TRUE(contains(error_text(), "CHORUS_ROOT_ADDR='hostonly'"));
  env.set("CHORUS_ROOT_ADDR", "h:1");
  env.set("CHORUS_NRANKS", "0");
  EXPECT_TRUE(contains(error_text(), "CHORUS_NRANKS=0 must be at least 1"));
}

TEST(LaunchEnv, SlurmNodelistForms) {
  EXPECT_EQ(slurm_first_host("gpu3"), "gpu3");
  EXPECT_EQ(slurm_first_host("node[01-04,07],gpu3"), "node01");
  EXPECT_EQ(slurm_first_host("node[7,9-10]"), "node7");
  EXPECT_EQ(slurm_first_host("rack[1-2]-node[05-08]"), "rack1-node05");
  EXPECT_EQ(slurm_first_host("a,b[1-3]"), "a");
  for (const char* bad : {"", "node[01-04", "node]", "node[x-y]", ",a"}) {
    Error e = caught([&] { slurm_first_host(bad); });
    EXPECT_EQ(e.code(), chorusInvalidArgument) << bad;
    EXPECT_TRUE(contains(e.what(), "SLURM_JOB_NODELIST")) << bad;
  }
}

// ---- Rendezvous ----

class BootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanks, JoinAllgatherP2pBarrier) {
  const int n = GetParam();
  const int services_before = root_services_running();
  UniqueIdData id = create_unique_id();
  auto info = [](int r) { return cat("rank ", r, " ", std::string(static_cast<size_t>(r) * 3, 'x')); };
  run_ranks(n, [&](int r) {
    auto bs = Bootstrap::join(id, r, n, blob_of(info(r)), Deadline::after_ms(10000));
    EXPECT_EQ(bs->rank(), r);
    EXPECT_EQ(bs->nranks(), n);
    ASSERT_EQ(bs->peer_info().size(), static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) EXPECT_EQ(str_of(bs->peer_info()[p]), info(p));

    // Blobs of different sizes (rank 0's is empty), twice on one tag, and once on another.
    for (uint32_t round = 0; round < 2; ++round) {
      Blob mine(static_cast<size_t>(r) * 100 + round, static_cast<std::byte>(r + 1));
      std::vector<Blob> all = bs->allgather(7, mine, Deadline::after_ms(10000));
      ASSERT_EQ(all.size(), static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(all[p].size(), static_cast<size_t>(p) * 100 + round);
        EXPECT_EQ(all[p], Blob(static_cast<size_t>(p) * 100 + round, static_cast<std::byte>(p + 1)));
      }
    }
    EXPECT_EQ(str_of(bs->allgather(8, blob_of(cat(r)), Deadline::after_ms(10000))[n - 1]), cat(n - 1));

    // A ring: two messages to the next rank on one tag arrive in order; one on another tag is kept apart.
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    bs->send(next, 3, blob_of(cat("first from ", r)));
    bs->send(next, 3, blob_of(cat("second from ", r)));
    bs->send(next, 4, blob_of(cat("tag 4 from ", r)));
    EXPECT_EQ(str_of(bs->recv(prev, 4, Deadline::after_ms(10000))), cat("tag 4 from ", prev));
    EXPECT_EQ(str_of(bs->recv(prev, 3, Deadline::after_ms(10000))), cat("first from ", prev));
    EXPECT_EQ(str_of(bs->recv(prev, 3, Deadline::after_ms(10000))), cat("second from ", prev));

    bs->barrier(1, Deadline::after_ms(10000));
    bs->barrier(1, Deadline::after_ms(10000));
    EXPECT_FALSE(bs->failed());
    Error timeout = caught([&] { bs->recv(prev, 99, Deadline::after_ms(20)); });
    EXPECT_EQ(timeout.code(), chorusTimeout);
    EXPECT_TRUE(contains(timeout.what(),
                         cat("rank ", r, ": timed out waiting for a bootstrap message from rank ", prev, " (tag 99)")));
    bs->barrier(2, Deadline::after_ms(10000));  // nobody says goodbye while a peer may still be talking
  });
  // Every rank said goodbye: the root service ends.
  EXPECT_TRUE(eventually([&] { return root_services_running() <= services_before; }, 2000ms));
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapRanks, ::testing::Values(1, 2, 4, 8));

TEST(Bootstrap, RanksMayStartBeforeTheRoot) {
  UniqueIdData id;
  id.secret = random_secret();
  {
    Socket probe = Socket::listen(loopback());
    id.root = probe.local_addr();  // free again once probe closes
  }
  std::thread root([&] {
    std::this_thread::sleep_for(300ms);
    start_root(id.root, id.secret);
  });
  run_ranks(2, [&](int r) {
    auto bs = Bootstrap::join(id, r, 2, blob_of(cat(r)), Deadline::after_ms(5000));
    EXPECT_EQ(str_of(bs->peer_info()[1 - r]), cat(1 - r));
    bs->barrier(0, Deadline::after_ms(5000));
  });
  root.join();
}

TEST(Bootstrap, LargeAllgather) {
  UniqueIdData id = quick_root();
  constexpr size_t kBytes = size_t{1} << 20;  // well over a socket buffer: partial reads and writes everywhere
  auto pattern = [](int r) {
    Blob b(kBytes + static_cast<size_t>(r));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((i * 7 + static_cast<size_t>(r)) & 0xff);
    return b;
  };
  std::vector<Blob> expected;
  for (int r = 0; r < 4; ++r) expected.push_back(pattern(r));
  run_ranks(4, [&](int r) {
    auto bs = Bootstrap::join(id, r, 4, {}, Deadline::after_ms(10000));
    std::vector<Blob> all = bs->allgather(0, expected[r], Deadline::after_ms(10000));
    ASSERT_EQ(all.size(), 4u);
    for (int p = 0; p < 4; ++p) EXPECT_TRUE(all[p] == expected[p]) << "blob of rank " << p;
    bs->barrier(1, Deadline::after_ms(10000));
  });
}

TEST(Bootstrap, StrangersAreRefusedWhileTheJobCompletes) {
  UniqueIdData id = quick_root(/*auth_timeout_ms=*/300);
  ::testing::internal::CaptureStderr();
  Socket garbage = Socket::connect(id.root, Deadline::after_ms(2000));
  std::string junk = "GET / HTTP/1.1\r\nHost: chorus\r\n\r\n";
  garbage.send_all(junk.data(), junk.size(), Deadline::after_ms(1000));
  Socket idle = Socket::connect(id.root, Deadline::after_ms(2000));
  const std::string garbage_addr = sockaddr_to_string(garbage.local_addr());
  const std::string idle_addr = sockaddr_to_string(idle.local_addr());

  run_ranks(4, [&](int r) {
    // The last rank joins after the idle stranger's deadline, so the root must have dealt with both by then.
    if (r == 3) std::this_thread::sleep_for(500ms);
    auto bs = Bootstrap::join(id, r, 4, blob_of(cat(r)), Deadline::after_ms(5000));
    bs->barrier(0, Deadline::after_ms(5000));
    EXPECT_FALSE(bs->failed());
  });
  char byte;
  for (Socket* s : {&garbage, &idle}) {
    Error e = caught([&] { s->recv_all(&byte, 1, Deadline::after_ms(2000)); });
    EXPECT_EQ(e.code(), chorusSystemError);
    EXPECT_TRUE(contains(e.what(), "closed by peer"));
  }
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, cat("refused connection from ", garbage_addr,
                                ": it sent something that is not a "
                                "Chorus hello (bad magic)")));
  EXPECT_TRUE(contains(log, cat("refused connection from ", idle_addr, ": it did not authenticate within 300 ms")));
}

// More connections than max_pending at once (a job of more ranks than that, or strangers holding the slots) wait in
// the listen backlog instead of being closed: every rank joins (a 600-thread perf tool used to lose the 257th and
// the others waited until their timeout).
TEST(Bootstrap, ConnectionsBeyondMaxPendingWaitTheirTurn) {
  UniqueIdData id;
  id.secret = random_secret();
  RootOptions options;
  options.auth_timeout_ms = 300;
  options.max_pending = 2;
  id.root = start_root(loopback(), id.secret, options);
  ::testing::internal::CaptureStderr();
  // Two idle strangers take both slots until their authentication deadline.
  Socket idle1 = Socket::connect(id.root, Deadline::after_ms(2000));
  Socket idle2 = Socket::connect(id.root, Deadline::after_ms(2000));
  run_ranks(6, [&](int r) {
    auto bs = Bootstrap::join(id, r, 6, blob_of(cat(r)), Deadline::after_ms(10000));
    for (int p = 0; p < 6; ++p) EXPECT_EQ(str_of(bs->peer_info()[p]), cat(p));
    bs->barrier(0, Deadline::after_ms(10000));
    EXPECT_FALSE(bs->failed());
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "it did not authenticate within 300 ms")) << log;
}

TEST(Bootstrap, WrongSecretIsRefused) {
  UniqueIdData id = quick_root();
  UniqueIdData wrong = id;
  wrong.secret[0] ^= 0x5a;
  Error e = caught([&] { Bootstrap::join(wrong, 0, 1, {}, Deadline::after_ms(1000)); });
  EXPECT_EQ(e.code(), chorusSystemError);
  EXPECT_TRUE(contains(e.what(), "rank 0: authentication of "));
  EXPECT_TRUE(contains(e.what(), "does not match our secret"));
  // The root is unharmed.
  EXPECT_NO_THROW(Bootstrap::join(id, 0, 1, {}, Deadline::after_ms(2000)));
}

TEST(Bootstrap, AbortedRankIsSeenAsFailedByEveryone) {
  UniqueIdData id = quick_root();
  ::testing::internal::CaptureStderr();
  run_ranks(4, [&](int r) {
    auto bs = Bootstrap::join(id, r, 4, {}, Deadline::after_ms(5000));
    bs->barrier(0, Deadline::after_ms(5000));
    if (r == 2) {
      bs->abort();
      EXPECT_TRUE(bs->failed());
      EXPECT_EQ(caught([&] { bs->send(0, 1, {}); }).code(), chorusRemoteError);
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(eventually([&] { return bs->failed(); }, 2000ms)) << "rank " << r;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
    PeerFailure f = bs->failure();
    EXPECT_EQ(f.rank, 2);
    EXPECT_TRUE(contains(f.text, "rank 2 ("));
    EXPECT_TRUE(contains(f.text, "closed its bootstrap connection without a goodbye"));
    Error e = caught([&] { bs->recv(2, 0, Deadline::after_ms(5000)); });
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_TRUE(contains(e.what(), "without a goodbye"));
    bs->abort();  // as a rank does after its call failed
  });
  std::this_thread::sleep_for(300ms);  // the root sees the three leave
  // Only rank 2's leaving is a failure; the others leave a job that already failed (each was logged as a death).
  const std::string log = ::testing::internal::GetCapturedStderr();
  const size_t first = log.find("without a goodbye");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("without a goodbye", first + 1), std::string::npos) << log;
}

TEST(Bootstrap, LosingTheRootIsAFailure) {
  // A stand-in root that completes a one-rank rendezvous, then goes away.
  UniqueIdData id;
  id.secret = random_secret();
  Socket listener = Socket::listen(loopback());
  id.root = listener.local_addr();
  std::thread fake_root([&] {
    Socket s = listener.accept(Deadline::after_ms(2000));
    ASSERT_TRUE(auth_server(s, id.secret, Deadline::after_ms(2000), nullptr));
    uint8_t bytes[kFrameHeaderBytes];
    s.recv_all(bytes, sizeof(bytes), Deadline::after_ms(2000));
    FrameHeader join = decode_header(bytes);
    EXPECT_EQ(join.type, static_cast<uint32_t>(MsgType::Join));
    std::string info(join.length, '\0');  // read all, so that closing sends a clean end of stream, not a reset
    s.recv_all(info.data(), info.size(), Deadline::after_ms(2000));
    std::vector<uint8_t> list = encode_blobs({blob_of("info")});
    std::vector<uint8_t> frame = make_frame(MsgType::Rendezvous, -1, -1, 0, list.data(), list.size());
    s.send_all(frame.data(), frame.size(), Deadline::after_ms(2000));
    std::this_thread::sleep_for(50ms);
  });
  auto bs = Bootstrap::join(id, 0, 1, blob_of("info"), Deadline::after_ms(2000));
  EXPECT_EQ(str_of(bs->peer_info()[0]), "info");
  fake_root.join();
  EXPECT_TRUE(eventually([&] { return bs->failed(); }, 2000ms));
  EXPECT_EQ(bs->failure().rank, 0);
  EXPECT_EQ(bs->failure().text, cat("the bootstrap root (", sockaddr_to_string(id.root), ") closed the connection"));
  Error e = caught([&] { bs->barrier(0, Deadline::after_ms(1000)); });
  EXPECT_EQ(e.code(), chorusRemoteError);
  EXPECT_TRUE(contains(e.what(), "closed the connection"));
}

TEST(Bootstrap, ReportedFailureReachesEveryRank) {
  UniqueIdData id = quick_root();
  run_ranks(3, [&](int r) {
    auto bs = Bootstrap::join(id, r, 3, {}, Deadline::after_ms(5000));
    if (r == 1) bs->report_failure("rank 1: the disk is on fire");
    EXPECT_TRUE(eventually([&] { return bs->failed(); }, 2000ms)) << "rank " << r;
    EXPECT_EQ(bs->failure().rank, 1);
    EXPECT_EQ(bs->failure().text, "rank 1: the disk is on fire");
  });
}

TEST(Bootstrap, BadRankOrNranksIsRefusedLocally) {
  UniqueIdData id = quick_root();
  for (auto [rank, nranks] : {std::pair{4, 4}, std::pair{-1, 4}, std::pair{0, 0}}) {
    Error e = caught([&] { Bootstrap::join(id, rank, nranks, {}, Deadline::after_ms(1000)); });
    EXPECT_EQ(e.code(), chorusInvalidArgument) << rank << " of " << nranks;
  }
}

TEST(Bootstrap, ADuplicateRankOrANranksMismatchFailsTheRendezvousForEveryRankAtOnce) {
  // The launch is misconfigured and cannot complete: the joiner is refused with the reason, and the rank already
  // waiting fails at once with it instead of at the timeout; so does one of this process that comes later (the id
  // is a unique id's: one rendezvous).
  struct Case {
    int rank, nranks;
    chorusResult_t code;
    const char* text;
  };
  for (const Case& bad : {Case{0, 2, chorusInvalidUsage, "rank 0 has already joined (from "},
                          Case{1, 3, chorusInvalidArgument,
                               "rank 1 joined with nranks=3 but rank 0 (first to join) joined with nranks=2"}}) {
    UniqueIdData id = quick_root(500, /*one_rendezvous=*/true);
    std::string waiting_error;
    std::thread first(
        [&] { waiting_error = caught([&] { Bootstrap::join(id, 0, 2, {}, Deadline::after_ms(20000)); }).what(); });
    // Let rank 0 join first, so that it is the duplicate below and sets nranks.
    std::this_thread::sleep_for(100ms);
    Error refused = caught([&] { Bootstrap::join(id, bad.rank, bad.nranks, {}, Deadline::after_ms(20000)); });
    EXPECT_EQ(refused.code(), bad.code);
    EXPECT_TRUE(contains(refused.what(), bad.text)) << refused.what();
    first.join();
    EXPECT_TRUE(contains(waiting_error, "failed: a join from ")) << waiting_error;
    EXPECT_TRUE(contains(waiting_error, bad.text)) << waiting_error;
    Error late = caught([&] { Bootstrap::join(id, 1, 2, {}, Deadline::after_ms(20000)); });
    EXPECT_EQ(late.code(), chorusInvalidUsage);
    EXPECT_TRUE(contains(late.what(), "this unique id was already used: its rendezvous at ")) << late.what();
    EXPECT_TRUE(contains(late.what(), bad.text)) << late.what();
  }
}

TEST(Bootstrap, AJoinsStopCheckEndsItsWaitAndTellsTheOthers) {
  // Ranks 0 and 1 of 3 wait for rank 2, which never comes. Rank 0's stop check (a split's parent being aborted)
  // fires after 300 ms: rank 0 gets that error, and rank 1 learns why from the root at once, both long before the
  // 60 s deadline.
  UniqueIdData id = quick_root();
  std::atomic<bool> stop{false};
  std::string waiting_error;
  const auto start = std::chrono::steady_clock::now();
  std::thread other(
      [&] { waiting_error = caught([&] { Bootstrap::join(id, 1, 3, {}, Deadline::after_ms(60000)); }).what(); });
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    stop = true;
  });
  Error stopped = caught([&] {
    Bootstrap::join(id, 0, 3, {}, Deadline::after_ms(60000), [&] {
      if (stop) throw Error(chorusInvalidUsage, Subsys::Core, "the parent was aborted");
    });
  });
  stopper.join();
  other.join();
  EXPECT_EQ(stopped.code(), chorusInvalidUsage);
  EXPECT_STREQ(stopped.what(), "the parent was aborted");
  EXPECT_TRUE(contains(waiting_error, "rank 0 left the rendezvous: the parent was aborted")) << waiting_error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// Speaks the wire protocol directly, as a buggy or hostile (but authenticated) client would.
Socket raw_client(const UniqueIdData& id) {
  Socket s = Socket::connect(id.root, Deadline::after_ms(2000));
  auth_client(s, id.secret, Deadline::after_ms(2000));
  return s;
}

// Sends a bare Join for (rank, nranks) and reads the root's answer: its header and text.
std::pair<FrameHeader, std::string> raw_join(const UniqueIdData& id, int rank, int nranks) {
  Socket s = raw_client(id);
  std::vector<uint8_t> join = make_frame(MsgType::Join, rank, nranks, 0, nullptr, 0);
  s.send_all(join.data(), join.size(), Deadline::after_ms(1000));
  uint8_t bytes[kFrameHeaderBytes];
  s.recv_all(bytes, sizeof(bytes), Deadline::after_ms(2000));
  const FrameHeader h = decode_header(bytes);
  EXPECT_LE(h.length, kMaxTextPayload);
  std::string text(std::min<uint64_t>(h.length, kMaxTextPayload), '\0');
  s.recv_all(text.data(), text.size(), Deadline::after_ms(1000));
  return {h, text};
}

TEST(Bootstrap, AFailedUniqueIdRendezvousTellsALateJoinerFromElsewhereWhy) {
  // A unique id's root stays a while after its rendezvous failed: a rank of another process (here the bare
  // protocol, which does not see this process's record of used ids) is refused with the reason, not left to
  // retry a closed port until its timeout.
  UniqueIdData id = quick_root(500, /*one_rendezvous=*/true);
  std::thread first([&] { caught([&] { Bootstrap::join(id, 0, 2, {}, Deadline::after_ms(20000)); }); });
  std::this_thread::sleep_for(100ms);
  caught([&] { Bootstrap::join(id, 0, 2, {}, Deadline::after_ms(20000)); });  // the duplicate fails it
  first.join();
  const auto [h, text] = raw_join(id, /*rank=*/1, /*nranks=*/2);
  EXPECT_EQ(h.type, static_cast<uint32_t>(MsgType::Reject));
  EXPECT_TRUE(contains(text, "already failed")) << text;
  EXPECT_TRUE(contains(text, "rank 0 has already joined")) << text;
}

TEST(Bootstrap, ARankGoneBetweenAuthenticatingAndJoiningFailsTheRendezvousAtOnce) {
  // Its process was killed after proving the secret, before its Join (helper-77): the rank waiting would otherwise
  // wait for it until its timeout.
  UniqueIdData id = quick_root();
  ::testing::internal::CaptureStderr();  // the root's warning
  const Deadline deadline = Deadline::after_ms(60000);
  Error waiting_error(chorusSuccess, Subsys::Bootstrap, "");
  std::thread waiting([&] { waiting_error = caught([&] { Bootstrap::join(id, 0, 2, {}, deadline); }); });
  std::this_thread::sleep_for(100ms);
  raw_client(id);  // authenticated, then closed without a Join
  waiting.join();
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(deadline.passed()) << waiting_error.what();
  EXPECT_EQ(waiting_error.code(), chorusRemoteError);
  EXPECT_TRUE(contains(waiting_error.what(), "closed after authenticating, before joining: its process died"))
      << waiting_error.what();

  // One that stays connected but silent (its host gone without closing) fails it at the authentication deadline.
  UniqueIdData quiet = quick_root(/*auth_timeout_ms=*/300);
  ::testing::internal::CaptureStderr();
  std::thread waiting2([&] { waiting_error = caught([&] { Bootstrap::join(quiet, 0, 2, {}, deadline); }); });
  std::this_thread::sleep_for(100ms);
  Socket silent = raw_client(quiet);
  waiting2.join();
  ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(deadline.passed()) << waiting_error.what();
  EXPECT_TRUE(contains(waiting_error.what(), "authenticated but did not join within 300 ms")) << waiting_error.what();
}

TEST(Bootstrap, RootRejectsOutOfRangeRankOnTheWire) {
  UniqueIdData id = quick_root();
  const auto [h, text] = raw_join(id, /*rank=*/7, /*nranks=*/4);
  EXPECT_EQ(h.type, static_cast<uint32_t>(MsgType::Reject));
  EXPECT_EQ(h.tag, static_cast<uint32_t>(chorusInvalidArgument));
  EXPECT_EQ(text, "rank 7 is out of range for nranks=4");
}

TEST(Bootstrap, RootClosesAConnectionThatSendsAnOversizedFrame) {
  UniqueIdData id = quick_root();
  ::testing::internal::CaptureStderr();
  Socket s = raw_client(id);
  uint8_t header[kFrameHeaderBytes];
  encode_header(FrameHeader{static_cast<uint32_t>(MsgType::Join), 0, 2, 0, uint64_t{1} << 40}, header);
  s.send_all(header, sizeof(header), Deadline::after_ms(1000));
  char byte;
  EXPECT_EQ(caught([&] { s.recv_all(&byte, 1, Deadline::after_ms(2000)); }).code(), chorusSystemError);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "Join frame of 1099511627776 bytes exceeds the limit"));
}

TEST(Bootstrap, JoinTimeoutNamesTheMissingRanks) {
  UniqueIdData id = quick_root();
  auto t0 = std::chrono::steady_clock::now();
  Error e = caught([&] { Bootstrap::join(id, 0, 5, {}, Deadline::after_ms(300)); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  EXPECT_EQ(e.code(), chorusTimeout);
  EXPECT_TRUE(contains(e.what(), cat("rank 0: timed out after ")));
  EXPECT_TRUE(contains(e.what(), cat("ms waiting for the rendezvous at ", sockaddr_to_string(id.root))));
  EXPECT_TRUE(contains(e.what(), "1 of 5 ranks have joined; missing: 1-4"));
}

TEST(Bootstrap, OneRanksJoinTimeoutFailsTheRanksWaitingWithIt) {
  UniqueIdData id = quick_root();
  std::thread patient([&] {
    auto t0 = std::chrono::steady_clock::now();
    Error e = caught([&] { Bootstrap::join(id, 0, 3, {}, Deadline::after_ms(10000)); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3000ms) << "it waited for its own deadline";
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_TRUE(contains(e.what(), "rank 0: the rendezvous at "));
    EXPECT_TRUE(contains(e.what(), "failed: rank 1: timed out after "));
    EXPECT_TRUE(contains(e.what(), "2 of 3 ranks have joined; missing: 2"));
  });
  std::this_thread::sleep_for(50ms);
  Error e = caught([&] { Bootstrap::join(id, 1, 3, {}, Deadline::after_ms(300)); });
  EXPECT_EQ(e.code(), chorusTimeout);
  patient.join();
}

TEST(Bootstrap, UnreachableRootIsASystemError) {
  sockaddr_storage addr;
  {
    Socket probe = Socket::listen(loopback());
    addr = probe.local_addr();
  }
  UniqueIdData id;
  id.root = addr;
  id.secret = random_secret();
  Error e = caught([&] { Bootstrap::join(id, 0, 2, {}, Deadline::after_ms(200)); });
  EXPECT_EQ(e.code(), chorusSystemError);
  EXPECT_TRUE(contains(e.what(), "rank 0: cannot reach the bootstrap root"));
}

}  // namespace
}  // namespace chorus
