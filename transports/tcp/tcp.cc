// tcp: any two ranks that can reach each other. One non-blocking socket per (peer, channel), full duplex; each
// direction is a ring of slots like the memory FIFOs, pumped by progress(). Every connection proves knowledge of
// the communicator's secret (bootstrap/auth.h) and then names its communicator, rank and channel.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "bootstrap/auth.h"
#include "bootstrap/socket.h"
#include "core/error.h"
#include "core/log.h"
#include "transports/transports.h"

namespace chorus {

namespace {

struct Hello {
  uint32_t magic = 0x43485443;  // "CHTC"
  uint32_t version = 1;
  uint64_t comm_id = 0;
  int32_t rank = 0;
  int32_t channel = 0;
};

sockaddr_storage parse_addr(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) throw Error(chorusInvalidArgument, Subsys::Transport, "bad address " + text);
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  long port = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    throw Error(chorusRemoteError, Subsys::Transport, "peer published a bad tcp address " + text);
  return resolve(host, static_cast<int>(port));
}

class TcpConnection : public Connection {
 public:
  TcpConnection(int peer, int channel, size_t slot_bytes, int depth, Socket sock)
      : Connection(peer, channel, slot_bytes),
        sock_(std::move(sock)),
        depth_(static_cast<uint64_t>(depth)),
        stride_(sizeof(WireHeader) + slot_bytes),
        send_ring_(depth * stride_),
        recv_ring_(depth * stride_) {
    sock_.set_nonblocking(true);
    sock_.set_nodelay();
  }

  std::byte* send_slot() override {
    if (send_head_ - send_tail_ >= depth_) {
      pump_send();
      if (send_head_ - send_tail_ >= depth_) return nullptr;
    }
    return send_at(send_head_) + sizeof(WireHeader);
  }

  void send_commit(const WireHeader& h) override {
    std::memcpy(send_at(send_head_), &h, sizeof(h));
    ++send_head_;
    pump_send();  // start writing at once: small messages should not wait for the next progress() call
  }

  MessageView recv_peek() override {
    if (recv_tail_ == recv_head_) pump_recv();
    if (recv_tail_ == recv_head_) {
      // Only an error once data is actually missing: a peer that finished may close while we drain.
      if (closed_) fail("closed by the peer (process died or aborted)");
      return {};
    }
    std::byte* s = recv_at(recv_tail_);
    return {reinterpret_cast<const WireHeader*>(s), s + sizeof(WireHeader)};
  }

  void recv_release() override { ++recv_tail_; }

  bool progress() override {
    bool moved = pump_send();
    moved |= pump_recv();
    return moved;
  }

  bool send_idle() const override { return send_tail_ == send_head_; }

  int poll_fd() const override { return sock_.fd(); }
  void wait_recv(int timeout_us) override { wait_fd(POLLIN | (send_idle() ? 0 : POLLOUT), timeout_us); }
  void wait_send(int timeout_us) override { wait_fd(POLLOUT | POLLIN, timeout_us); }

 private:
  void wait_fd(short events, int timeout_us) {
    pollfd p{sock_.fd(), events, 0};
    poll(&p, 1, std::max(1, timeout_us / 1000));
  }

  std::byte* send_at(uint64_t i) { return send_ring_.data() + (i % depth_) * stride_; }
  std::byte* recv_at(uint64_t i) { return recv_ring_.data() + (i % depth_) * stride_; }

  [[noreturn]] void fail(const std::string& what) {
    throw Error(chorusRemoteError, Subsys::Transport,
                cat("tcp connection to rank ", peer(), " (channel ", channel(), "): ", what));
  }

  bool pump_send() {
    bool moved = false;
    while (send_tail_ < send_head_) {
      std::byte* s = send_at(send_tail_);
      WireHeader h;
      std::memcpy(&h, s, sizeof(h));
      const size_t len = sizeof(WireHeader) + h.bytes;
      ssize_t n = ::send(sock_.fd(), s + send_off_, len - send_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail(cat("send failed: ", std::strerror(errno), " (peer died or closed?)"));
      }
      moved = true;
      send_off_ += static_cast<size_t>(n);
      if (send_off_ == len) {
        send_off_ = 0;
        ++send_tail_;
      }
    }
    return moved;
  }

  bool pump_recv() {
    bool moved = false;
    while (recv_head_ - recv_tail_ < depth_) {
      std::byte* s = recv_at(recv_head_);
      size_t want = sizeof(WireHeader);
      if (recv_off_ >= sizeof(WireHeader)) {
        WireHeader h;
        std::memcpy(&h, s, sizeof(h));
        want += h.bytes;
      }
      if (closed_) break;
      ssize_t n = ::recv(sock_.fd(), s + recv_off_, want - recv_off_, MSG_DONTWAIT);
      if (n == 0) {
        closed_ = true;
        break;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        fail(cat("recv failed: ", std::strerror(errno)));
      }
      moved = true;
      recv_off_ += static_cast<size_t>(n);
      if (recv_off_ == sizeof(WireHeader)) {
        WireHeader h;
        std::memcpy(&h, s, sizeof(h));
        if (h.magic != WireHeader::kMagic) fail("received a message with a bad magic (corrupt stream)");
        if (h.bytes > slot_bytes())
          fail(cat("received a message of ", h.bytes, " bytes, more than the slot size ", slot_bytes()));
      }
      if (recv_off_ >= sizeof(WireHeader)) {
        WireHeader h;
        std::memcpy(&h, s, sizeof(h));
        if (recv_off_ == sizeof(WireHeader) + h.bytes) {
          recv_off_ = 0;
          ++recv_head_;
        }
      }
    }
    return moved;
  }

  Socket sock_;
  uint64_t depth_;
  size_t stride_;
  std::vector<std::byte> send_ring_, recv_ring_;
  uint64_t send_head_ = 0, send_tail_ = 0, recv_head_ = 0, recv_tail_ = 0;
  size_t send_off_ = 0, recv_off_ = 0;
  bool closed_ = false;  // the peer closed its end; what arrived before stays readable
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const Secret& secret) : secret_(secret), listener_(Socket::listen(default_address())) {}

  const char* name() const override { return "tcp"; }
  void describe(PeerInfo& self) const override { self.tcp_addr = sockaddr_to_string(listener_.local_addr()); }
  bool can_connect(const PeerInfo& self, const PeerInfo& peer) const override {
    return !peer.tcp_addr.empty() && unreachable_reason(self, peer).empty();
  }
  // A rank listening on loopback (CHORUS_SOCKET_IFNAME=lo) cannot be reached from another host, nor reach a rank
  // there that connects back: refused for the pair, on both ranks alike, instead of a connect that times out.
  std::string unreachable_reason(const PeerInfo& self, const PeerInfo& peer) const override {
    if (self.host_id == peer.host_id) return {};
    for (const PeerInfo* p : {&self, &peer}) {
      const std::string host = p->tcp_addr.substr(0, p->tcp_addr.rfind(':'));
      if (host.rfind("127.", 0) == 0 || host == "[::1]" || host.rfind("[::ffff:127.", 0) == 0)
        return cat("rank ", p->rank, " listens on the loopback address ", p->tcp_addr,
                   ", which another host cannot reach (CHORUS_SOCKET_IFNAME=lo?)");
    }
    return {};
  }
  std::vector<std::byte> prepare(const ConnectSpec&) override { return {}; }

  std::unique_ptr<Connection> connect(const ConnectSpec& s, const std::vector<std::byte>& peer_data,
                                      Deadline deadline) override {
    if (s.rank > s.peer) {
      // The higher rank connects, to the address the peer published.
      Socket sock;
      ConnectRetries retries(cat("rank ", s.rank, ": rank ", s.peer, " at ", s.peer_info->tcp_addr));
      for (;;) {  // in short slices, so a peer failure or an abort ends the wait
        if (s.check_abort) s.check_abort();
        Deadline slice = Deadline::after_ms(std::min(200, deadline.remaining_ms()));
        try {
          sock = Socket::connect(parse_addr(s.peer_info->tcp_addr), slice);
          break;
        } catch (const Error& e) {
          if (!retries.retry(e, slice, deadline)) throw Error(e.code(), Subsys::Transport, retries.why(e));
        }
      }
      auth_client(sock, secret_, deadline, s.check_abort);
      Hello hello;
      hello.comm_id = s.comm_id;
      hello.rank = s.rank;
      hello.channel = s.channel;
      sock.send_all(&hello, sizeof(hello), deadline);
      return std::make_unique<TcpConnection>(s.peer, s.channel, s.slot_bytes, s.fifo_depth, std::move(sock));
    }
    // The lower rank accepts until the expected connection arrives, keeping others for later connect() calls.
    for (;;) {
      auto it = accepted_.find({s.peer, s.channel});
      if (it != accepted_.end()) {
        Socket sock = std::move(it->second);
        accepted_.erase(it);
        return std::make_unique<TcpConnection>(s.peer, s.channel, s.slot_bytes, s.fifo_depth, std::move(sock));
      }
      if (s.check_abort) s.check_abort();
      Socket sock;
      try {
        sock = listener_.accept(Deadline::after_ms(std::min(50, deadline.remaining_ms())));
      } catch (const Error& e) {
        if (e.code() == chorusTimeout && !deadline.passed()) continue;  // a slice passed: check and wait again
        throw;
      }
      // A connection that does not authenticate quickly is dropped; it must not stall the job.
      Deadline auth_deadline = Deadline::after_ms(std::min(5000, deadline.remaining_ms()));
      std::string why;
      if (!auth_server(sock, secret_, auth_deadline, &why)) {
        CHORUS_WARN(Transport, "tcp: refused a connection on %s: %s",
                    sockaddr_to_string(listener_.local_addr()).c_str(), why.c_str());
        continue;
      }
      Hello hello;
      try {
        sock.recv_all(&hello, sizeof(hello), auth_deadline);
      } catch (const Error& e) {
        CHORUS_WARN(Transport, "tcp: dropped a connection that sent no hello: %s", e.what());
        continue;
      }
      if (hello.magic != Hello{}.magic || hello.comm_id != s.comm_id || hello.rank < 0 || hello.channel < 0) {
        CHORUS_WARN(Transport, "tcp: dropped a connection with a bad hello (rank %d channel %d)", hello.rank,
                    hello.channel);
        continue;
      }
      accepted_[{hello.rank, hello.channel}] = std::move(sock);
    }
  }

 private:
  Secret secret_;
  Socket listener_;
  std::map<std::pair<int, int>, Socket> accepted_;
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(const Secret& secret) { return std::make_unique<TcpTransport>(secret); }

}  // namespace chorus
