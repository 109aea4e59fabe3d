// TCP sockets for the bootstrap (and the tcp transport): an RAII socket whose every blocking call takes a Deadline,
// and helpers to pick, resolve and print addresses.
//
// Errors: chorus::Error with Subsys::Bootstrap; chorusTimeout when a deadline passes, chorusSystemError for OS
// failures and for a peer that closed the connection, chorusInvalidArgument for bad user input (an unknown
// interface name, a host that does not resolve).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "core/deadline.h"

namespace chorus {

// A connected or listening TCP socket. Move-only; closes its descriptor on destruction. Every socket is created
// close-on-exec, and sends never raise SIGPIPE. A child forked without exec lets go of every Socket's connection at
// once (its descriptors then read /dev/null), so a rank that forked a worker and died is still seen as gone by its
// peers, who see its connections close, and not only once the worker exits.
//
// Thread-safety: one thread may send while another receives on the same socket; shutdown() may be called from any
// thread while others are blocked in send_all/recv_all (it wakes them). Two concurrent senders (or receivers) must
// be serialised by the caller. close() and moves are not thread-safe.
class Socket {
 public:
  Socket() = default;
  // Takes ownership of `fd`, one that socket.cc made (and registered for forks: see the class comment).
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();
  // shutdown(SHUT_RDWR) or (SHUT_WR when `write_only`), keeping the descriptor open: wakes a thread blocked in
  // recv_all on this socket (it sees end of file) without the descriptor-reuse race of closing under it.
  void shutdown(bool write_only = false) const;

  // A listening socket bound to `addr` (port 0 = an ephemeral port; read it back with local_addr()), with
  // SO_REUSEADDR. Non-blocking. Throws chorusSystemError naming the address when it cannot be bound.
  static Socket listen(const sockaddr_storage& addr, int backlog = 4096);  // capped by net.core.somaxconn
  // Connects to `addr`, retrying refused and timed-out attempts with a short backoff until `deadline` (the peer
  // may not be listening yet). Throws chorusSystemError naming the address and the last OS error when the
  // deadline passes or on an error that retrying cannot fix. The returned socket is non-blocking, TCP_NODELAY.
  static Socket connect(const sockaddr_storage& addr, Deadline deadline);
  // Waits for one incoming connection (returned non-blocking, TCP_NODELAY). Throws chorusTimeout when `deadline`
  // passes.
  Socket accept(Deadline deadline) const;
  // Accepts one pending connection without waiting; returns an invalid Socket when none is pending. The new
  // socket is non-blocking. `peer` (optional) receives the remote address.
  Socket try_accept(sockaddr_storage* peer = nullptr) const;

  sockaddr_storage local_addr() const;
  sockaddr_storage peer_addr() const;

  // Sends / receives exactly `bytes` bytes, waiting with poll() as needed (works on blocking and non-blocking
  // sockets). Throws chorusTimeout when `deadline` passes first, chorusSystemError on an OS error or, for
  // recv_all, when the peer closes the connection ("connection closed by peer").
  void send_all(const void* data, size_t bytes, Deadline deadline) const;
  void recv_all(void* data, size_t bytes, Deadline deadline) const;

  // Waits until the socket is readable (data, end of file or an error: the next recv_all reports which) or
  // `deadline` passes; true if readable. Reads nothing.
  bool wait_readable(Deadline deadline) const;

  void set_nonblocking(bool on) const;
  void set_nodelay() const;

 private:
  int fd_ = -1;
};

// The retries of one connection made in slices: Socket::connect with a short deadline, and a stop condition (an
// abort, a peer's failure) checked between them. After a slice's error, retry() says whether to try again: not
// when `deadline` has passed, nor when the error came before the slice's end (one that retrying cannot fix, such
// as "network is unreachable"). While it retries, it says once, as a warning naming `whom` ("rank 3: rank 1 at
// 10.0.0.2:4000"), when the peer has not been reached for `warn_after_ms`: the wait may last until
// CHORUS_TIMEOUT_MS. Not thread-safe (one per connection).
class ConnectRetries {
 public:
  static constexpr int kWarnAfterMs = 10000;
  explicit ConnectRetries(std::string whom, int warn_after_ms = kWarnAfterMs);
  bool retry(const std::exception& error, const Deadline& slice, const Deadline& deadline);
  // The text of the error that ended the retries, with how long they lasted.
  std::string why(const std::exception& error) const;

 private:
  std::string whom_;
  int warn_after_ms_;
  std::chrono::steady_clock::time_point start_;
  bool warned_ = false;
};

// Names of the network interfaces that have an IPv4 or IPv6 address, in getifaddrs order, without duplicates.
std::vector<std::string> interface_names();
// The address of interface `ifname` (IPv4 preferred, then a global IPv6, then any IPv6), port 0. Throws
// chorusInvalidArgument "CHORUS_SOCKET_IFNAME=<ifname>: no such interface; interfaces with an address: lo, ..."
// when it has no address.
sockaddr_storage interface_address(const std::string& ifname);
// The address Chorus listens on by default, port 0: CHORUS_SOCKET_IFNAME's when set, else the first interface
// that is up, not loopback, not a container or VM bridge (docker*, virbr*: the same address on every host) and has
// an IPv4 address, else the first such bridge, else 127.0.0.1.
sockaddr_storage default_address();
// Resolves `host` (a name, an IPv4 address, or an IPv6 address with or without brackets) with getaddrinfo,
// preferring IPv4. Throws chorusInvalidArgument when the name does not exist, chorusSystemError for other
// resolver failures, both naming the host.
sockaddr_storage resolve(const std::string& host, int port);

// "1.2.3.4:5678", "[::1]:5678" (with "%ifname" inside the brackets for a scoped IPv6 address).
std::string sockaddr_to_string(const sockaddr_storage& addr);
// Port in host byte order (0 for an unknown family) / set it.
int sockaddr_port(const sockaddr_storage& addr);
void set_sockaddr_port(sockaddr_storage& addr, int port);
// The length to pass to bind/connect for this family.
socklen_t sockaddr_len(const sockaddr_storage& addr);
// True for 127.0.0.0/8 and ::1.
bool sockaddr_is_loopback(const sockaddr_storage& addr);

}  // namespace chorus
