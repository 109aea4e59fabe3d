// Mutual authentication of a TCP connection by knowledge of the 128-bit job secret: an HMAC-SHA256
// challenge-response (RFC 2104 HMAC over SHA-256, computed by OpenSSL). Neither side ever sends the secret, and each
// side's proof covers both nonces, so a recorded exchange cannot be replayed and a proof cannot be reflected back.
//
// Frames (fixed sizes, so nothing read from an unauthenticated peer sizes a buffer):
//   client -> server  hello      "CHRS" | u32 version (big-endian) | nonce_c[16]                     24 bytes
//   server -> client  challenge  nonce_s[16] | HMAC(secret, "chorus-server" | nonce_c | nonce_s)    48 bytes
//   client -> server  proof      HMAC(secret, "chorus-client" | nonce_s | nonce_c)                   32 bytes
//   server -> client  verdict    'K'                                                                  1 byte
// A server that refuses just closes the connection (a peer without the secret learns nothing more).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "core/deadline.h"

namespace chorus {

inline constexpr uint32_t kAuthVersion = 1;
inline constexpr size_t kAuthNonceBytes = 16;
inline constexpr size_t kAuthMacBytes = 32;
inline constexpr size_t kAuthHelloBytes = 4 + 4 + kAuthNonceBytes;
inline constexpr size_t kAuthChallengeBytes = kAuthNonceBytes + kAuthMacBytes;
inline constexpr size_t kAuthProofBytes = kAuthMacBytes;

// Client side, blocking until `deadline`. Returns once the server accepted our proof. Throws chorusSystemError
// "authentication refused by <addr>: ..." when the server closes the connection or refuses, or when the server's
// own proof does not match `secret` (a different job, or not a Chorus service); chorusTimeout when the deadline
// passes. Thread-safety: uses `sock` exclusively for the duration. `check` (optional) is called about every
// 200 ms while the server has not answered our hello (it answers once it accepts, which a stopped or busy peer may
// never do): it throws to end the wait (an abort, a peer failure).
void auth_client(Socket& sock, const Secret& secret, Deadline deadline, const std::function<void()>& check = {});

// Server side as a non-blocking state machine for a poll() loop: call on_readable(fd) whenever the (non-blocking)
// descriptor is readable. It reads only the bytes of the current frame (never beyond the handshake, so data the
// client sends after it stays in the socket), and its two short writes go to a fresh connection's empty send
// buffer, so it never blocks. Idle peers are the caller's to time out. One instance per connection; not
// thread-safe.
class AuthServer {
 public:
  enum class Status { NeedMore, Ok, Refused };

  explicit AuthServer(const Secret& secret);
  AuthServer(const AuthServer&) = delete;
  AuthServer& operator=(const AuthServer&) = delete;

  Status on_readable(int fd);
  Status status() const;
  // Why the peer was refused ("" unless status() == Refused).
  const std::string& why() const { return why_; }

 private:
  enum class State { ReadHello, ReadProof, Accepted, Refused };

  Status refuse(std::string why);
  // Reads until `want` bytes are buffered; false if more must arrive first (or the peer was refused).
  bool fill(int fd, size_t want);

  Secret secret_;
  State state_ = State::ReadHello;
  uint8_t buf_[kAuthHelloBytes > kAuthProofBytes ? kAuthHelloBytes : kAuthProofBytes] = {};
  size_t got_ = 0;
  uint8_t nonce_c_[kAuthNonceBytes] = {};
  uint8_t nonce_s_[kAuthNonceBytes] = {};
  std::string why_;
};

// Blocking server side (for tests and simple accept loops): true when the peer proved the secret; otherwise false
// with the reason in *why (if given). Never throws for peer misbehaviour or a passed deadline.
bool auth_server(Socket& sock, const Secret& secret, Deadline deadline, std::string* why);

}  // namespace chorus
