#include "bootstrap/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

constexpr char kMagic[4] = {'C', 'H', 'R', 'S'};
constexpr char kServerLabel[] = "chorus-server";
constexpr char kClientLabel[] = "chorus-client";
constexpr uint8_t kVerdictOk = 'K';

using Mac = uint8_t[kAuthMacBytes];

// HMAC-SHA256(secret, label || first || second). The label binds each proof to its direction, so a server's proof
// can never be replayed as a client's.
void compute_mac(const Secret& secret, const char* label, const uint8_t* first, const uint8_t* second, Mac out) {
  uint8_t msg[32 + 2 * kAuthNonceBytes];
  size_t label_len = std::strlen(label);
  CHORUS_ASSERT(label_len <= 32);
  std::memcpy(msg, label, label_len);
  std::memcpy(msg + label_len, first, kAuthNonceBytes);
  std::memcpy(msg + label_len + kAuthNonceBytes, second, kAuthNonceBytes);
  unsigned int out_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, label_len + 2 * kAuthNonceBytes, out,
           &out_len) == nullptr ||
      out_len != kAuthMacBytes)
    throw Error(chorusSystemError, Subsys::Bootstrap, "OpenSSL HMAC-SHA256 failed");
}

void random_nonce(uint8_t* out) { os_random_bytes(out, kAuthNonceBytes, "a nonce"); }

bool mac_equal(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kAuthMacBytes) == 0; }

// Sends a short frame on a fresh connection without waiting; true only if every byte went out.
bool send_now(int fd, const void* data, size_t n) {
  for (;;) {
    ssize_t rc = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc < 0 && errno == EINTR) continue;
    return rc == static_cast<ssize_t>(n);
  }
}

}  // namespace

void auth_client(Socket& sock, const Secret& secret, Deadline deadline, const std::function<void()>& check) {
  std::string peer = "the peer";
  try {
    peer = sockaddr_to_string(sock.peer_addr());
  } catch (const Error&) {
    // Reset already: the first send or receive below reports it.
  }
  // Re-labels an I/O failure with what it means at this step of the handshake, keeping its code.
  auto step = [&](auto&& io, const char* meaning) {
    try {
      io();
    } catch (const Error& e) {
      if (e.code() == chorusTimeout)
        throw Error(chorusTimeout, Subsys::Bootstrap, cat("authentication with ", peer, " timed out: ", e.what()));
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("authentication refused by ", peer, ": ", meaning, " (", e.what(), ")"));
    }
  };

  uint8_t hello[kAuthHelloBytes];
  std::memcpy(hello, kMagic, 4);
  hello[4] = static_cast<uint8_t>(kAuthVersion >> 24);
  hello[5] = static_cast<uint8_t>(kAuthVersion >> 16);
  hello[6] = static_cast<uint8_t>(kAuthVersion >> 8);
  hello[7] = static_cast<uint8_t>(kAuthVersion);
  uint8_t* nonce_c = hello + 8;
  random_nonce(nonce_c);
  step([&] { sock.send_all(hello, sizeof(hello), deadline); }, "the connection broke before the handshake");

  if (check)
    while (!sock.wait_readable(Deadline::after_ms(std::min(200, deadline.remaining_ms()))) && !deadline.passed())
      check();
  uint8_t challenge[kAuthChallengeBytes];
  step([&] { sock.recv_all(challenge, sizeof(challenge), deadline); },
       "it closed the connection instead of answering our hello (not a Chorus service?)");
  const uint8_t* nonce_s = challenge;
  Mac expected;
  compute_mac(secret, kServerLabel, nonce_c, nonce_s, expected);
  if (!mac_equal(expected, challenge + kAuthNonceBytes))
    throw Error(chorusSystemError, Subsys::Bootstrap,
                cat("authentication of ", peer,
                    " failed: its proof does not match our secret (it serves another job: check the unique id or "
                    "CHORUS_SECRET)"));

  Mac proof;
  compute_mac(secret, kClientLabel, nonce_s, nonce_c, proof);
  step([&] { sock.send_all(proof, sizeof(proof), deadline); }, "the connection broke before our proof was sent");
  uint8_t verdict = 0;
  step([&] { sock.recv_all(&verdict, 1, deadline); }, "it did not accept our proof (a different secret?)");
  if (verdict != kVerdictOk)
    throw Error(chorusSystemError, Subsys::Bootstrap,
                cat("authentication refused by ", peer, ": unexpected verdict byte ", static_cast<int>(verdict)));
}

AuthServer::AuthServer(const Secret& secret) : secret_(secret) {}

AuthServer::Status AuthServer::status() const {
  switch (state_) {
    case State::Accepted: return Status::Ok;
    case State::Refused: return Status::Refused;
    case State::ReadHello:
    case State::ReadProof: break;
  }
  return Status::NeedMore;
}

AuthServer::Status AuthServer::refuse(std::string why) {
  state_ = State::Refused;
  why_ = std::move(why);
  return Status::Refused;
}

bool AuthServer::fill(int fd, size_t want) {
  while (got_ < want) {
    ssize_t n = ::recv(fd, buf_ + got_, want - got_, MSG_DONTWAIT);
    if (n > 0) {
      got_ += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      // A client checks this side's proof (in the challenge) before sending its own: one holding another secret
      // closes here.
      if (state_ == State::ReadProof && got_ == 0)
        refuse(
            "closed the connection after our challenge, without its proof: it most likely holds another secret "
            "(check the unique id or CHORUS_SECRET), unless it stopped joining (its init failed, timed out or was "
            "aborted)");
      else
        refuse(cat("closed the connection during authentication (after ", got_, " bytes)"));
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    refuse(cat("receive failed during authentication: ", std::strerror(errno)));
    return false;
  }
  return true;
}

AuthServer::Status AuthServer::on_readable(int fd) {
  switch (state_) {
    case State::ReadHello: {
      if (!fill(fd, kAuthHelloBytes)) return status();
      if (std::memcmp(buf_, kMagic, 4) != 0) return refuse("sent something that is not a Chorus hello (bad magic)");
      uint32_t version = (uint32_t{buf_[4]} << 24) | (uint32_t{buf_[5]} << 16) | (uint32_t{buf_[6]} << 8) | buf_[7];
      if (version != kAuthVersion)
        return refuse(cat("speaks authentication protocol version ", version, ", this build speaks ", kAuthVersion));
      std::memcpy(nonce_c_, buf_ + 8, kAuthNonceBytes);
      random_nonce(nonce_s_);
      uint8_t challenge[kAuthChallengeBytes];
      std::memcpy(challenge, nonce_s_, kAuthNonceBytes);
      compute_mac(secret_, kServerLabel, nonce_c_, nonce_s_, challenge + kAuthNonceBytes);
      if (!send_now(fd, challenge, sizeof(challenge))) return refuse("could not be sent the challenge");
      got_ = 0;
      state_ = State::ReadProof;
      return Status::NeedMore;
    }
    case State::ReadProof: {
      if (!fill(fd, kAuthProofBytes)) return status();
      Mac expected;
      compute_mac(secret_, kClientLabel, nonce_s_, nonce_c_, expected);
      if (!mac_equal(expected, buf_)) return refuse("sent a wrong proof: it does not know the secret");
      if (!send_now(fd, &kVerdictOk, 1)) return refuse("could not be sent the verdict");
      state_ = State::Accepted;
      return Status::Ok;
    }
    case State::Accepted:
    case State::Refused: break;
  }
  return status();
}

bool auth_server(Socket& sock, const Secret& secret, Deadline deadline, std::string* why) {
  AuthServer server(secret);
  for (;;) {
    pollfd p{sock.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      if (why != nullptr) *why = cat("poll failed: ", std::strerror(errno));
      return false;
    }
    if (rc == 0) {
      if (!deadline.passed()) continue;
      if (why != nullptr) *why = "stayed idle past the authentication deadline";
      return false;
    }
    switch (server.on_readable(sock.fd())) {
      case AuthServer::Status::Ok: return true;
      case AuthServer::Status::Refused:
        if (why != nullptr) *why = server.why();
        return false;
      case AuthServer::Status::NeedMore: break;
    }
  }
}

}  // namespace chorus
