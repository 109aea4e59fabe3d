// The transport interface (DESIGN.md, "Transports").
//
// A Connection joins this rank to one peer on one channel, full duplex. Its core is a FIFO of slots in each
// direction, the shape every transport shares:
//  - send: send_slot() lends the next free slot (nullptr when all are in flight); the caller writes the payload
//    straight into it (a copy, or a reduction fused with the copy) and send_commit() publishes it with its header;
//  - receive: recv_peek() shows the next arrived message in place (zero-copy: the caller reduces or copies from
//    where the bytes landed), and recv_release() hands the slot back.
// Neither call blocks; progress() moves bytes for transports that need a pump (tcp). A closed or dead peer is a
// chorus::Error (chorusRemoteError) naming the peer, raised from the next call. The executor owns all waiting,
// so every wait has a deadline and sees peer failures.
//
// Thread-safety: one Connection is used by one thread at a time (the thread running its communicator's work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/unique_id.h"
#include "core/deadline.h"

namespace chorus {

// Carried in front of every message: identifies the communicator and the operation, so that a rank that called a
// different collective, count, dtype, op or root is detected instead of exchanging garbage.
struct WireHeader {
  uint64_t comm_id = 0;
  uint64_t seq = 0;    // collective sequence number; point-to-point messages carry only the high bit
  uint64_t count = 0;  // the call's count in elements (0 where counts differ per peer)
  uint32_t bytes = 0;  // payload bytes of this message
  uint8_t coll = 0;    // algo::Coll
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;  // kLastSlice on the last message of a step
  int32_t root = 0;
  uint16_t algo = 0;  // id of the algorithm (algorithm_table()) the sender runs: ranks must run the same program
  uint16_t magic = kMagic;
  static constexpr uint16_t kMagic = 0x4348;  // "CH"
  // Marks a step's last message, so a receiver expecting more or fewer bytes in total than were sent notices even
  // when every message has the expected size.
  static constexpr uint8_t kLastSlice = 1;
};
static_assert(sizeof(WireHeader) == 40);

struct MessageView {
  const WireHeader* header = nullptr;
  const std::byte* payload = nullptr;
};

class Connection {
 public:
  virtual ~Connection() = default;
  int peer() const { return peer_; }
  int channel() const { return channel_; }
  // Largest payload of one message, in bytes.
  size_t slot_bytes() const { return slot_bytes_; }

  virtual std::byte* send_slot() = 0;
  virtual void send_commit(const WireHeader& header) = 0;
  virtual MessageView recv_peek() = 0;
  virtual void recv_release() = 0;
  // Moves bytes; returns true if anything moved. Cheap no-op for memory transports.
  virtual bool progress() { return false; }
  // True when every committed message has left this process (tcp: written to the socket).
  virtual bool send_idle() const { return true; }
  // Block until a message may have arrived (wait_recv) or a slot may have freed (wait_send), or `timeout_us`
  // passes. Spurious returns are fine: the executor re-checks.
  virtual void wait_recv(int timeout_us) = 0;
  virtual void wait_send(int timeout_us) = 0;
  // The file descriptor behind a pumped connection (a socket, a UCX worker's event fd, a verbs completion
  // channel), or -1. The executor sleeps on all of a call's descriptors at once, so a send that can move is not
  // held up by a sleep on a receive. Connections may share one descriptor.
  virtual int poll_fd() const { return -1; }
  // Called right before the executor sleeps on poll_fd(): the poll(2) events to wait for, or 0 when something is
  // pending already and the caller must not sleep (an event-driven descriptor is re-armed here).
  virtual short arm_poll();

 protected:
  Connection(int peer, int channel, size_t slot_bytes) : peer_(peer), channel_(channel), slot_bytes_(slot_bytes) {}

 private:
  int peer_;
  int channel_;
  size_t slot_bytes_;
};

// What every rank publishes about itself at init (all-gathered through the bootstrap).
struct PeerInfo {
  int rank = -1;
  std::string host_id;         // boot id + network namespace + hostname: equal iff same (emulated) host
  uint64_t process_token = 0;  // random per process: equal (with host_id) iff same process
  int pid = 0;
  bool hosts_root = false;  // this rank's process runs the communicator's bootstrap root
  std::string tcp_addr;     // "ip:port" of this rank's tcp listener
  std::string settings;     // CHORUS_* settings that must agree on every rank (checked at init)
  // What each transport found on this rank that peers need to decide whether it can reach it (transport name ->
  // short text, e.g. ucx -> "shm,net"); filled by Transport::describe().
  std::map<std::string, std::string> transport_caps;
  std::vector<std::byte> serialize() const;
  static PeerInfo deserialize(const std::vector<std::byte>& blob);  // throws on malformed data
};
PeerInfo local_peer_info(int rank);

struct ConnectSpec {
  uint64_t comm_id = 0;
  int rank = 0;
  int peer = 0;
  int channel = 0;
  size_t slot_bytes = 0;
  int fifo_depth = 0;
  const PeerInfo* peer_info = nullptr;  // the peer's published info
  std::function<void()> check_abort;    // throws when the communicator failed or was aborted (poll while waiting)
};

// One transport instance per communicator. Connection setup is pairwise in three phases driven by the
// communicator through the bootstrap: prepare() makes the data the peer needs (e.g. a shm segment name);
// connect() completes the connection from the peer's data (tcp: the higher rank connects, the lower accepts;
// the communicator connects to lower ranks first, so waits only ever point to lower ranks and cannot cycle);
// finish() runs once both sides are connected (e.g. unlinks the shm name).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Adds what peers need to reach this rank (e.g. the tcp listener's address) before the info is all-gathered.
  virtual void describe(PeerInfo& self) const {}
  // Must give the same answer on both ranks of a pair (decide from what both published), or they would choose
  // different transports.
  virtual bool can_connect(const PeerInfo& self, const PeerInfo& peer) const = 0;
  // Why this transport can reach no peer at all on this rank ("no RDMA device ..."), or "" when it may.
  virtual std::string unavailable_reason() const { return {}; }
  // Why it cannot reach `peer` when can_connect() says no and unavailable_reason() is "" (tcp: a loopback address
  // published across hosts), or "" when there is nothing more specific to say.
  virtual std::string unreachable_reason(const PeerInfo& self, const PeerInfo& peer) const { return {}; }
  virtual std::vector<std::byte> prepare(const ConnectSpec& spec) = 0;
  virtual std::unique_ptr<Connection> connect(const ConnectSpec& spec, const std::vector<std::byte>& peer_data,
                                              Deadline deadline) = 0;
  virtual void finish(const ConnectSpec& spec) {}
};

// Creates a transport for one communicator (before its rendezvous). `secret` authenticates tcp connections.
// Throws chorusInvalidArgument for an unknown name, listing the known ones. A known transport that this build or
// this machine lacks (no UCX, no RDMA device) is still created: it reaches no peer and says why
// (unavailable_reason()), so one CHORUS_TRANSPORTS works on every machine of a job.
std::unique_ptr<Transport> make_transport(const std::string& name, const Secret& secret);
// Known transport names, in priority order (local > shm > ibverbs > ucx > tcp).
std::vector<std::string> transport_names();

// What a transport is and what it finds on this machine, for chorus-info.
struct TransportReport {
  std::string name;
  std::string description;  // one line: what it moves bytes with
  std::string found;        // what it sees here (UCX version and transports, RDMA devices), or why it cannot run
  bool available = true;
};
TransportReport report_transport(const std::string& name);

}  // namespace chorus
