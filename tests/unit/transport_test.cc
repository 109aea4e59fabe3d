// Transport-level tests that need no network: the peer info every rank publishes, the transport table, and the
// UCX connection driven directly through the slot interface by two transports of this process (UCX over its shared
// memory, and over tcp on loopback for the peer-failure case). Skipped where the build has no UCX.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "core/error.h"
#include "transports/fifo.h"
#include "transports/transport.h"
#include "transports/transports.h"

namespace chorus {
namespace {

TEST(PeerInfo, TransportCapsRoundTripAndAreBounded) {
  PeerInfo p = local_peer_info(3);
  p.tcp_addr = "10.0.0.1:1234";
  p.transport_caps["ucx"] = "shm,net";
  p.transport_caps["ibverbs"] = "RoCE";
  const PeerInfo q = PeerInfo::deserialize(p.serialize());
  EXPECT_EQ(q.rank, 3);
  EXPECT_EQ(q.tcp_addr, p.tcp_addr);
  EXPECT_EQ(q.transport_caps, p.transport_caps);
  std::vector<std::byte> w = p.serialize();
  for (size_t n = 0; n < w.size(); ++n)
    EXPECT_THROW(PeerInfo::deserialize(std::vector<std::byte>(w.begin(), w.begin() + n)), Error) << n;
}

TEST(Transports, ALaunchersCleanupRemovesOnlyTheSegmentsOfTheEndedRank) {
  // Names as the shm transport makes them: /chorus-<pid>-<launch id>-<n>-<hex>. Pids no process has (above pid_max)
  // stand for the ended rank and another whose pid starts with the same digits (the prefix ends with '-'); a rank
  // of another launch (another pid namespace sharing /dev/shm) may have the same pid.
  const int gone = 4194305, other = 41943050;
  const std::vector<std::string> mine = {"/chorus-4194305-1f2e-0-ab", "/chorus-4194305-1f2e-7-cd"};
  const std::string theirs = "/chorus-41943050-1f2e-0-ef", other_launch = "/chorus-4194305-9a9a-0-ab";
  for (const std::string& n : {mine[0], mine[1], theirs, other_launch}) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  EXPECT_EQ(remove_shm_segments_of(gone, "1f2e"), 2);
  for (const std::string& n : mine) EXPECT_LT(shm_open(n.c_str(), O_RDWR, 0600), 0) << n;
  const int fd = shm_open(theirs.c_str(), O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  EXPECT_EQ(remove_shm_segments_of(other, "1f2e"), 1);
  EXPECT_EQ(remove_shm_segments_of(gone, "1f2e"), 0);
  EXPECT_EQ(remove_shm_segments_of(gone, "9a9a"), 1);
}

// A job started without chorusrun (torchrun, mpirun, by hand) whose rank died before its peer mapped a segment
// left it in /dev/shm for good (trial finding); the next shm transport on the host removes it: the name carries the
// creator's pid and pid namespace. Segments of live processes, of other pid namespaces and of this process stay.
TEST(Transports, SegmentsOfProcessesThatDiedAreRemovedByTheNextShmTransport) {
  struct stat st {};
  ASSERT_EQ(stat("/proc/self/ns/pid", &st), 0);
  const std::string ns = std::to_string(st.st_ino), other_ns = std::to_string(st.st_ino + 1);
  const std::string dead = "/chorus-4194305-0-" + ns + "-0-ab";  // above pid_max: no process has it
  const std::string dead_launched = "/chorus-4194305-1f2e-" + ns + "-3-cd";
  const std::vector<std::string> kept = {"/chorus-1-0-" + ns + "-0-ab",  // pid 1 is alive
                                         "/chorus-" + std::to_string(getpid()) + "-0-" + ns + "-0-ab",  // this process
                                         "/chorus-4194305-0-" + other_ns + "-0-ab",  // another pid namespace
                                         "/chorus-4194305-0-7-ab"};                  // an older name (no namespace)
  std::vector<std::string> all = kept;
  all.push_back(dead);
  all.push_back(dead_launched);
  for (const std::string& n : all) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  EXPECT_EQ(remove_shm_segments_of_dead_processes(), 2);
  for (const std::string& n : {dead, dead_launched}) EXPECT_LT(shm_open(n.c_str(), O_RDWR, 0600), 0) << n;
  for (const std::string& n : kept) {
    const int fd = shm_open(n.c_str(), O_RDWR, 0600);
    EXPECT_GE(fd, 0) << n;
    if (fd >= 0) close(fd);
    shm_unlink(n.c_str());
  }
  // The transport does it as it starts.
  const int fd = shm_open(dead.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  { auto shm = make_shm_transport(); }
  EXPECT_LT(shm_open(dead.c_str(), O_RDWR, 0600), 0);
}

TEST(Transports, EveryNameIsKnownInPriorityOrderAndReported) {
  const std::vector<std::string> names = transport_names();
  EXPECT_EQ(names, (std::vector<std::string>{"local", "shm", "ibverbs", "ucx", "tcp"}));
  for (const std::string& n : names) {
    const TransportReport r = report_transport(n);
    EXPECT_FALSE(r.description.empty()) << n;
    EXPECT_FALSE(r.found.empty()) << n;
    std::unique_ptr<Transport> t = make_transport(n, Secret{});
    EXPECT_EQ(t->name(), n);
    EXPECT_EQ(t->unavailable_reason().empty(), r.available) << n << ": " << r.found;
  }
  try {
    make_transport("verbs", Secret{});
    ADD_FAILURE() << "accepted an unknown transport";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ucx"), std::string::npos) << e.what();
  }
}

TEST(TcpTransport, APeerOnAnUnreachableNetworkIsAnErrorAtOnce) {
  // The higher rank connects to the address the peer published; "network is unreachable" is not retried until the
  // deadline (only refused and timed-out attempts are: the peer may not be listening yet).
  std::unique_ptr<Transport> t = make_transport("tcp", Secret{});
  PeerInfo peer;
  peer.tcp_addr = "255.255.255.255:1";
  ConnectSpec spec;
  spec.rank = 1;
  spec.peer = 0;
  spec.peer_info = &peer;
  const Deadline deadline = Deadline::after_ms(60000);
  try {
    t->connect(spec, {}, deadline);
    ADD_FAILURE() << "connected to 255.255.255.255";
  } catch (const Error& e) {
    EXPECT_FALSE(deadline.passed()) << "waited for the deadline: " << e.what();
    EXPECT_EQ(e.code(), chorusSystemError);
    EXPECT_NE(std::string(e.what()).find("unreachable"), std::string::npos) << e.what();
  }
}

TEST(TcpTransport, ALoopbackAddressAcrossHostsIsNotConnectedAndSaysWhy) {
  // CHORUS_SOCKET_IFNAME=lo on one rank of a job over several hosts: the pair is refused alike on both ranks with
  // the reason (it used to time out connecting to 127.0.0.1; helper-79).
  std::unique_ptr<Transport> t = make_transport("tcp", Secret{});
  PeerInfo a, b;
  a.rank = 0;
  a.host_id = "host-a";
  a.tcp_addr = "10.213.0.1:4000";
  b.rank = 1;
  b.host_id = "host-b";
  b.tcp_addr = "127.0.0.1:5000";
  EXPECT_FALSE(t->can_connect(a, b));
  EXPECT_FALSE(t->can_connect(b, a));
  EXPECT_EQ(t->unreachable_reason(a, b), t->unreachable_reason(b, a));
  EXPECT_EQ(t->unreachable_reason(a, b),
            "rank 1 listens on the loopback address 127.0.0.1:5000, which another host cannot reach "
            "(CHORUS_SOCKET_IFNAME=lo?)");
  for (const char* loopback : {"[::1]:5000", "[::ffff:127.0.0.1]:5000", "127.0.1.1:5000"}) {
    b.tcp_addr = loopback;
    EXPECT_FALSE(t->can_connect(a, b)) << loopback;
  }
  // On one host loopback is fine; between hosts, two routable addresses are.
  b.host_id = a.host_id;
  EXPECT_TRUE(t->can_connect(a, b));
  b.host_id = "host-b";
  b.tcp_addr = "10.213.0.2:5000";
  EXPECT_TRUE(t->can_connect(a, b));
  EXPECT_EQ(t->unreachable_reason(a, b), "");
}

// Two ranks of one communicator as two UCX transports of this process, connected through the slot interface.
class UcxPair {
 public:
  UcxPair(const char* tls, int depth, size_t slot_bytes) {
    setenv("CHORUS_UCX_TLS", tls, 1);
    for (int r = 0; r < 2; ++r) {
      t_[r] = make_transport("ucx", Secret{});
      info_[r] = local_peer_info(r);
      t_[r]->describe(info_[r]);
    }
    unsetenv("CHORUS_UCX_TLS");
    if (!t_[0]->unavailable_reason().empty()) {
      skip_ = t_[0]->unavailable_reason();
      return;
    }
    ConnectSpec s[2];
    std::vector<std::byte> data[2];
    for (int r = 0; r < 2; ++r) {
      s[r].comm_id = 42;
      s[r].rank = r;
      s[r].peer = 1 - r;
      s[r].slot_bytes = slot_bytes;
      s[r].fifo_depth = depth;
      s[r].peer_info = &info_[1 - r];
      EXPECT_TRUE(t_[r]->can_connect(info_[r], info_[1 - r]));
      data[r] = t_[r]->prepare(s[r]);
    }
    for (int r = 0; r < 2; ++r) c_[r] = t_[r]->connect(s[r], data[1 - r], Deadline::after_ms(10000));
  }
  const std::string& skip() const { return skip_; }
  Connection& conn(int r) { return *c_[r]; }
  void pump() {
    c_[0]->progress();
    c_[1]->progress();
  }
  // The next message on r's side, pumping both workers until it arrives.
  MessageView wait_message(int r) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      MessageView m = c_[r]->recv_peek();
      if (m.header || std::chrono::steady_clock::now() > until) return m;
      pump();
    }
  }
  std::byte* wait_slot(int r) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      std::byte* s = c_[r]->send_slot();
      if (s || std::chrono::steady_clock::now() > until) return s;
      pump();
    }
  }
  // Closes rank r's side entirely (its connection, then its worker), as a process exit would.
  void close(int r) {
    c_[r].reset();
    t_[r].reset();
  }

 private:
  std::unique_ptr<Transport> t_[2];
  PeerInfo info_[2];
  std::unique_ptr<Connection> c_[2];
  std::string skip_;
};

WireHeader header_for(uint32_t bytes, uint64_t seq) {
  WireHeader h;
  h.comm_id = 42;
  h.seq = seq;
  h.bytes = bytes;
  return h;
}

// The FIFO under the local and shm transports, between two threads: a sender that outruns a receiver which sometimes
// sleeps on it, many times round a two-slot ring, every size up to the slot. Each message arrives once, in order,
// whole, in place, with its header; nothing is seen before it is published.
TEST(SlotFifo, MessagesArriveOnceInOrderWholeAcrossManyLaps) {
  constexpr size_t kSlot = 200;
  constexpr int kDepth = 2;
  constexpr uint64_t kMessages = 100000;
  const size_t bytes = SlotFifo::region_bytes(kSlot, kDepth);
  std::unique_ptr<std::byte, decltype(&std::free)> region(static_cast<std::byte*>(std::aligned_alloc(64, bytes)),
                                                          &std::free);
  std::memset(region.get(), 0xa5, bytes);  // garbage in the slots must not read as a message
  SlotFifo init(region.get(), kSlot, kDepth, true);
  SlotFifo tx(region.get(), kSlot, kDepth, false), rx(region.get(), kSlot, kDepth, false);
  ASSERT_EQ(rx.recv_peek().header, nullptr);
  auto size_of = [](uint64_t i) { return static_cast<size_t>((i * 37) % (kSlot + 1)); };
  std::thread sender([&] {
    for (uint64_t i = 1; i <= kMessages; ++i) {
      std::byte* s;
      while ((s = tx.send_slot()) == nullptr) tx.wait_send(1000);
      const size_t n = size_of(i);
      for (size_t b = 0; b < n; ++b) s[b] = static_cast<std::byte>((b + i) & 0xff);
      tx.send_commit(header_for(static_cast<uint32_t>(n), i));
    }
  });
  uint64_t wrong = 0;
  for (uint64_t i = 1; i <= kMessages; ++i) {
    MessageView m;
    for (int spins = 0; (m = rx.recv_peek()).header == nullptr; ++spins)
      if (spins > 100) rx.wait_recv(1000);  // sleep now and then, so the futex path runs too
    const size_t n = size_of(i);
    if (m.header->seq != i || m.header->bytes != n || m.header->comm_id != 42) {
      ADD_FAILURE() << "message " << i << " arrived as seq " << m.header->seq << ", " << m.header->bytes << " bytes";
      break;
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.payload) % 16, 0u);
    for (size_t b = 0; b < n; ++b) wrong += m.payload[b] != static_cast<std::byte>((b + i) & 0xff);
    rx.recv_release();
  }
  sender.join();
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(rx.recv_peek().header, nullptr);  // nothing more than was sent
}

// Messages of every size (eager and rendezvous), both directions, many times round the ring: each arrives once, in
// order, whole, in place.
void exchange(UcxPair& p, size_t slot_bytes) {
  const size_t sizes[] = {0, 1, 17, 4096, 65536, slot_bytes};
  uint64_t seq = 0;
  for (int round = 0; round < 6; ++round)
    for (size_t bytes : sizes) {
      ++seq;
      for (int from = 0; from < 2; ++from) {
        std::byte* s = p.wait_slot(from);
        ASSERT_NE(s, nullptr);
        for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<std::byte>((i * 7 + seq + from) & 0xff);
        p.conn(from).send_commit(header_for(static_cast<uint32_t>(bytes), seq));
      }
      for (int to = 0; to < 2; ++to) {
        MessageView m = p.wait_message(to);
        ASSERT_NE(m.header, nullptr) << "message " << seq << " never arrived";
        EXPECT_EQ(m.header->seq, seq);
        ASSERT_EQ(m.header->bytes, bytes);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(m.payload) % 16, 0u);
        for (size_t i = 0; i < bytes; ++i)
          ASSERT_EQ(m.payload[i], static_cast<std::byte>((i * 7 + seq + (1 - to)) & 0xff)) << "byte " << i;
        p.conn(to).recv_release();
      }
    }
  // Flush: every send completes.
  for (int i = 0; i < 1000 && !(p.conn(0).send_idle() && p.conn(1).send_idle()); ++i) p.pump();
  EXPECT_TRUE(p.conn(0).send_idle());
  EXPECT_TRUE(p.conn(1).send_idle());
}

TEST(UcxConnection, SharedMemoryMessagesArriveInOrderInPlace) {
  const size_t slot = 256 << 10;
  UcxPair p("sm", 2, slot);
  if (!p.skip().empty()) GTEST_SKIP() << p.skip();
  exchange(p, slot);
}

TEST(UcxConnection, TcpMessagesArriveInOrderInPlace) {
  const size_t slot = 256 << 10;
  UcxPair p("tcp", 4, slot);
  if (!p.skip().empty()) GTEST_SKIP() << p.skip();
  exchange(p, slot);
}

// Sends run ahead of the receiver by more than the ring: the extra ones wait in UCX, and come out in order.
TEST(UcxConnection, SenderAheadOfTheReceiver) {
  UcxPair p("sm", 2, 1024);
  if (!p.skip().empty()) GTEST_SKIP() << p.skip();
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    std::byte* s = p.wait_slot(0);
    ASSERT_NE(s, nullptr);
    std::memcpy(s, &seq, sizeof(seq));
    p.conn(0).send_commit(header_for(sizeof(seq), seq));
  }
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    MessageView m = p.wait_message(1);
    ASSERT_NE(m.header, nullptr);
    uint64_t got;
    std::memcpy(&got, m.payload, sizeof(got));
    EXPECT_EQ(got, seq);
    EXPECT_EQ(m.header->seq, seq);
    p.conn(1).recv_release();
  }
}

// A peer that goes away is a chorus::Error naming it, raised once data is actually missing.
TEST(UcxConnection, ClosedPeerIsAnErrorNamingIt) {
  UcxPair p("tcp", 2, 1024);
  if (!p.skip().empty()) GTEST_SKIP() << p.skip();
  std::byte* s = p.wait_slot(1);
  ASSERT_NE(s, nullptr);
  p.conn(1).send_commit(header_for(0, 1));
  ASSERT_NE(p.wait_message(0).header, nullptr);  // the endpoint is wired up
  p.conn(0).recv_release();
  p.close(1);
  try {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      p.conn(0).progress();
      p.conn(0).recv_peek();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "no error within 20 s of the peer closing";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

// A receive that fails stays failed: every later look raises the same error. The communicator looks at every
// connection again while it waits (for a peer's mismatched call) and skips the failed ones; a second look used to
// test a request already freed (a crash seen when rank 0 was killed during an all-reduce over ucx sm).
TEST(UcxConnection, AFailedReceiveFailsEveryLookAfter) {
  UcxPair p("sm", 2, 1024);
  if (!p.skip().empty()) GTEST_SKIP() << p.skip();
  std::byte* s = p.wait_slot(0);
  ASSERT_NE(s, nullptr);
  p.conn(0).send_commit(header_for(1024 + 64, 1));  // more than the receiver's slot (the ring holds the bytes)
  std::string first;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (first.empty() && std::chrono::steady_clock::now() < until) {
    try {
      p.pump();
      if (p.conn(1).recv_peek().header != nullptr) break;
    } catch (const Error& e) {
      first = e.what();
    }
  }
  ASSERT_NE(first.find("rank 0"), std::string::npos) << "no error for a message larger than the slot: " << first;
  EXPECT_NE(first.find("larger than the slot"), std::string::npos) << first;
  for (int look = 0; look < 3; ++look) {
    try {
      p.conn(1).recv_peek();
      ADD_FAILURE() << "look " << look << " after the failure returned";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
  }
}

TEST(UcxTransport, BadTransportListIsUnavailableWithTheReason) {
  setenv("CHORUS_UCX_TLS", "no-such-transport", 1);
  std::unique_ptr<Transport> t = make_transport("ucx", Secret{});
  const TransportReport r = report_transport("ucx");
  unsetenv("CHORUS_UCX_TLS");
  if (r.found.find("not built") != std::string::npos) GTEST_SKIP() << r.found;
  EXPECT_FALSE(r.available);
  EXPECT_NE(t->unavailable_reason().find("CHORUS_UCX_TLS=no-such-transport"), std::string::npos)
      << t->unavailable_reason();
  PeerInfo a = local_peer_info(0), b = local_peer_info(1);
  t->describe(a);
  EXPECT_FALSE(t->can_connect(a, b));
}

TEST(UcxTransport, LeavesTheCrashSignalsAndSighupToTheApplication) {
  // libucs takes SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGHUP as it loads; linking Chorus must not take them from
  // the application (a sanitizer's or the test runner's own handlers may be there: only UCX's are wrong).
  if (report_transport("ucx").found.find("not built") != std::string::npos) GTEST_SKIP() << "UCX is not built";
  if (std::getenv("UCX_HANDLE_ERRORS") != nullptr || std::getenv("UCX_DEBUG_SIGNO") != nullptr)
    GTEST_SKIP() << "UCX's signal handling was asked for";
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGHUP}) {
    struct sigaction sa {};
    ASSERT_EQ(sigaction(sig, nullptr, &sa), 0);
    void* handler = (sa.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(sa.sa_sigaction)
                                                    : reinterpret_cast<void*>(sa.sa_handler);
    Dl_info info{};
    if (handler == reinterpret_cast<void*>(SIG_DFL) || handler == reinterpret_cast<void*>(SIG_IGN) ||
        dladdr(handler, &info) == 0 || info.dli_fname == nullptr)
      continue;
    EXPECT_EQ(std::string(info.dli_fname).find("libucs"), std::string::npos)
        << "signal " << sig << " is handled in " << info.dli_fname;
  }
}

// Ranks of different hosts need UCX's network on both sides; ranks of one host may share memory.
TEST(UcxTransport, ReachabilityFromWhatBothPublished) {
  std::unique_ptr<Transport> t = make_transport("ucx", Secret{});
  if (!t->unavailable_reason().empty()) GTEST_SKIP() << t->unavailable_reason();
  PeerInfo a = local_peer_info(0), b = local_peer_info(1);
  t->describe(a);
  a.transport_caps["ucx"] = "shm";
  b.transport_caps["ucx"] = "shm";
  EXPECT_TRUE(t->can_connect(a, b));
  b.host_id = "elsewhere";
  EXPECT_FALSE(t->can_connect(a, b)) << "shared memory does not reach another host";
  a.transport_caps["ucx"] = "shm,net";
  b.transport_caps["ucx"] = "net";
  EXPECT_TRUE(t->can_connect(a, b));
  b.transport_caps.erase("ucx");
  EXPECT_FALSE(t->can_connect(a, b)) << "the peer has no UCX";
}

}  // namespace
}  // namespace chorus
