// Bootstrap: rendezvous, out-of-band messages and the control plane of one communicator.
//
// Shape: a root service (a thread in the process that created the unique id, or rank 0 for launcher-environment
// init) accepts one TCP connection per rank. Every connection proves knowledge of the 128-bit secret by an HMAC
// challenge-response (auth.h); anything else is refused and logged, and does not disturb the job. The root then
//  - gathers and broadcasts blobs (all-gather, barrier),
//  - relays point-to-point messages between ranks (used to exchange transport connection data),
//  - watches every rank's connection: an error reported by a rank, or a connection that closes without a goodbye
//    (a dead process), is broadcast to every rank as a failure naming that rank.
// Each rank runs one service thread that reads its root connection and files messages into a mailbox, and sets
// the failure flag that the executor polls.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/unique_id.h"
#include "core/deadline.h"

namespace chorus {

using Blob = std::vector<std::byte>;

struct PeerFailure {
  int rank = -1;     // the rank that failed or reported the failure
  std::string text;  // what happened, as reported (already names the rank)
  // The connection to the root closed: the root's process is gone (rank 0 by convention; the communicator knows
  // which rank's process hosted it from the peers' info).
  bool root_lost = false;
};

class Bootstrap {
 public:
  // Joins the rendezvous at `id` as `rank` of `nranks` and all-gathers `info` (each rank's blob, e.g. host id and
  // transport addresses). Blocks until every rank has joined or `deadline` passes (then throws chorusTimeout naming
  // the ranks still missing, as far as the root knows them). Throws chorusInvalidArgument for bad rank/nranks,
  // chorusSystemError when the root cannot be reached. `check_stop`, when given, is called about every 20 ms while
  // the rank waits for the others (every 1 s while it retries to reach the root); whatever it throws ends the wait
  // (after this rank tells the root why, so the rendezvous fails for the others too): a split uses it to stop when its
  // parent is aborted or has failed.
  static std::unique_ptr<Bootstrap> join(const UniqueIdData& id, int rank, int nranks, const Blob& info,
                                         Deadline deadline, const std::function<void()>& check_stop = {});
  virtual ~Bootstrap() = default;  // says goodbye to the root (unless aborted) and stops the service thread

  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // The blobs all-gathered at join, indexed by rank.
  virtual const std::vector<Blob>& peer_info() const = 0;

  // Collective all-gather of one blob per rank (blobs may differ in size). `tag` separates concurrent uses.
  virtual std::vector<Blob> allgather(uint32_t tag, const Blob& mine, Deadline deadline) = 0;
  virtual void barrier(uint32_t tag, Deadline deadline) = 0;
  // Point to point, relayed by the root. Messages from one peer with one tag arrive in order.
  virtual void send(int peer, uint32_t tag, const Blob& data) = 0;
  virtual Blob recv(int peer, uint32_t tag, Deadline deadline) = 0;
  // Tag of the note a rank leaves with its goodbye (leave_note), delivered as a point-to-point message from the
  // leaving rank (8 bytes: its progress, host order). Not for other uses.
  static constexpr uint32_t kTagLeft = 0xFFFFFFFFu;
  // Sent with this rank's goodbye when it is destroyed (not after an abort): how far it went (the communicator: its
  // call count), for peers that may wait for it. The root delivers a note to every rank still connected when it is
  // lower than every note it delivered before, so the normal end of a job (equal notes) costs one delivery per rank
  // and a rank that left early is known to all; and to every rank whose connection request (kTagConnect) the
  // leaving rank had not answered with its own. Call before destruction.
  virtual void leave_note(uint64_t progress) = 0;
  // Tag of a communicator's connection request to a peer (CommImpl::ensure_connections): both ranks of a new
  // connection send one, and the root pairs them up to know which requests wait for a rank that leaves.
  static constexpr uint32_t kTagConnect = 1;
  // A peer's question of how far this rank is, answered by this rank's service thread with what set_status gives
  // (so a rank whose application thread is busy elsewhere, or idle, still answers), as a message with
  // kTagStatusReply (for a rank that has left, the root answers one byte). A rank that timed out asks every peer,
  // to say which did not call the collective.
  static constexpr uint32_t kTagStatus = 0xFFFFFFFEu;
  static constexpr uint32_t kTagStatusReply = 0xFFFFFFFDu;
  // The answer to kTagStatus questions; called from the service thread, so it must not block. Thread-safe.
  virtual void set_status(std::function<Blob()> status) = 0;
  // The first message with `tag` queued from each peer that has one, as (peer, copy), without taking any: what
  // peers have asked of this rank that it has not received yet. Never blocks.
  virtual std::vector<std::pair<int, Blob>> peek(uint32_t tag) const = 0;

  // Control plane. report_failure tells the root, which tells every rank (including this one).
  virtual void report_failure(const std::string& text) = 0;
  // Cheap to poll: true once any rank failed or died, or this rank's root connection broke.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  virtual PeerFailure failure() const = 0;
  // Local abort: closes the root connection without a goodbye (peers see this rank as failed). Bounded time.
  virtual void abort() = 0;

 protected:
  std::atomic<bool> failed_{false};
};

// Bootstraps (communicators) alive in this process.
int bootstraps_alive();

}  // namespace chorus
