// shm: processes on one host. The lower rank of a pair creates one POSIX shared-memory segment (mode 0600,
// O_EXCL) holding a SlotFifo per direction and sends its name through the bootstrap; the higher rank opens it and
// unlinks the name at once (the lower rank unlinks it too once both are connected, and when it is destroyed), so
// nothing is left in /dev/shm even if a process dies later. A process that dies before its peer opened a segment
// leaves it: chorusrun removes those of its ranks, and every shm transport, as it starts, removes those whose creator
// is dead in its own pid namespace (any launcher).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "transports/fifo.h"
#include "transports/transports.h"

namespace chorus {

namespace {

struct Mapping {
  void* addr = MAP_FAILED;
  size_t bytes = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) munmap(addr, bytes);
  }
};

std::string errno_text() { return std::strerror(errno); }

std::shared_ptr<Mapping> map_segment(int fd, size_t bytes, const std::string& name) {
  auto m = std::make_shared<Mapping>();
  m->addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m->addr == MAP_FAILED)
    throw Error(chorusSystemError, Subsys::Transport, cat("shm: mmap of ", name, " failed: ", errno_text()));
  m->bytes = bytes;
  return m;
}

// The names of the segments process `pid` of launch `launch_id` creates start with this (remove_shm_segments_of
// relies on it). Without a launch id, "0" stands in. The full name goes on with the creator's pid namespace (so a
// process in the same namespace can tell whether the creator is alive), a counter and a random part:
// /chorus-<pid>-<launch id>-<pid ns>-<counter>-<random>.
std::string segment_prefix(int pid, const std::string& launch_id) {
  return cat("/chorus-", pid, "-", launch_id.empty() ? std::string("0") : launch_id, "-");
}

// The inode of this process's pid namespace (pids are meaningful only within one), or 0 when /proc cannot say.
uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// MemAvailable of /proc/meminfo in bytes, or 0 when it cannot be read.
uint64_t memory_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kib) * 1024;
}

// CHORUS_LAUNCH_ID, checked: it becomes part of a file name.
std::string launch_id() {
  const std::string id = param_str(Param::LaunchId);
  if (id.size() > 16 || id.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw Error(chorusInvalidArgument, Subsys::Transport,
                cat("CHORUS_LAUNCH_ID='", id, "' must be 1 to 16 hex digits (chorusrun sets it)"));
  return id;
}

class ShmTransport : public Transport {
 public:
  ShmTransport() : launch_id_(launch_id()) {  // a bad CHORUS_LAUNCH_ID fails the init, naming it
    if (const int n = remove_shm_segments_of_dead_processes(); n > 0)
      CHORUS_INFO(Transport, "shm: removed %d segment(s) left in /dev/shm by processes that died", n);
  }
  const char* name() const override { return "shm"; }
  bool can_connect(const PeerInfo& self, const PeerInfo& peer) const override { return self.host_id == peer.host_id; }

  std::vector<std::byte> prepare(const ConnectSpec& s) override {
    if (s.rank > s.peer) return {};
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    std::string name = cat(segment_prefix(getpid(), launch_id_), pid_namespace(), "-", counter++, "-", std::hex,
                           (uint64_t{rd()} << 32) | rd());
    const size_t one = SlotFifo::region_bytes(s.slot_bytes, s.fifo_depth);
    // The segment is allocated in full below, and where /dev/shm is as large as memory (as on most hosts) a segment
    // that fits /dev/shm can still take the memory the processes need: the out-of-memory killer, not an error.
    if (const uint64_t avail = memory_available(); avail > 0 && 2 * one > avail / 2)
      throw Error(chorusSystemError, Subsys::Transport,
                  cat("shm: the FIFOs to rank ", s.peer, " need ", 2 * one, " bytes (2 directions x CHORUS_FIFO_DEPTH=",
                      s.fifo_depth, " x CHORUS_SLICE_BYTES=", s.slot_bytes, "), more than half of the ", avail,
                      " bytes of memory available: lower CHORUS_SLICE_BYTES or CHORUS_FIFO_DEPTH"));
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw Error(chorusSystemError, Subsys::Transport, cat("shm: shm_open ", name, ": ", errno_text()));
    // Allocated now, not sized sparse (ftruncate): a full /dev/shm is an error here instead of a SIGBUS at the
    // first touch of a page it cannot back (Docker's default /dev/shm is 64 MiB).
    int e = 0;
    do e = posix_fallocate(fd, 0, static_cast<off_t>(2 * one));
    while (e == EINTR);  // a signal (a profiler's SIGPROF) interrupts the allocation of a large segment
    if (e != 0) {
      close(fd);
      shm_unlink(name.c_str());
      throw Error(chorusSystemError, Subsys::Transport,
                  cat("shm: cannot allocate ", 2 * one, " bytes for ", name, " (FIFOs to rank ", s.peer,
                      "): ", std::strerror(e),
                      e == ENOSPC ? " (/dev/shm is full: enlarge it, e.g. docker --shm-size, or lower "
                                    "CHORUS_SLICE_BYTES / CHORUS_FIFO_DEPTH)"
                                  : ""));
    }
    std::shared_ptr<Mapping> m;
    try {
      m = map_segment(fd, 2 * one, name);
    } catch (...) {
      close(fd);
      shm_unlink(name.c_str());
      throw;
    }
    close(fd);
    auto* base = static_cast<std::byte*>(m->addr);
    SlotFifo(base, s.slot_bytes, s.fifo_depth, true);
    SlotFifo(base + one, s.slot_bytes, s.fifo_depth, true);
    pending_[{s.peer, s.channel}] = {name, m};
    std::vector<std::byte> data(name.size());
    std::memcpy(data.data(), name.data(), name.size());
    return data;
  }

  std::unique_ptr<Connection> connect(const ConnectSpec& s, const std::vector<std::byte>& peer_data,
                                      Deadline) override {
    const size_t one = SlotFifo::region_bytes(s.slot_bytes, s.fifo_depth);
    std::shared_ptr<Mapping> m;
    const bool lower = s.rank < s.peer;
    if (lower) {
      auto it = pending_.find({s.peer, s.channel});
      CHORUS_ASSERT(it != pending_.end());
      m = it->second.second;
    } else {
      if (peer_data.empty() || peer_data.size() > 255)
        throw Error(chorusRemoteError, Subsys::Transport, cat("shm: rank ", s.peer, " sent no valid segment name"));
      std::string name(reinterpret_cast<const char*>(peer_data.data()), peer_data.size());
      int fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0)
        throw Error(chorusSystemError, Subsys::Transport,
                    cat("shm: cannot open segment ", name, " of rank ", s.peer, ": ", errno_text()));
      shm_unlink(name.c_str());  // both ranks hold it now: the name has served its purpose
      struct stat st {};
      if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != 2 * one) {
        close(fd);
        throw Error(chorusRemoteError, Subsys::Transport,
                    cat("shm: segment ", name, " of rank ", s.peer,
                        " has the wrong size (slice or FIFO depth "
                        "settings differ between ranks?)"));
      }
      try {
        m = map_segment(fd, 2 * one, name);
      } catch (...) {
        close(fd);
        throw;
      }
      close(fd);
    }
    auto* base = static_cast<std::byte*>(m->addr);
    SlotFifo send(base + (lower ? 0 : one), s.slot_bytes, s.fifo_depth, false);
    SlotFifo recv(base + (lower ? one : 0), s.slot_bytes, s.fifo_depth, false);
    return std::make_unique<FifoConnection>(s.peer, s.channel, s.slot_bytes, send, recv, m);
  }

  void finish(const ConnectSpec& s) override {
    auto it = pending_.find({s.peer, s.channel});
    if (it == pending_.end()) return;
    shm_unlink(it->second.first.c_str());
    pending_.erase(it);
  }

  ~ShmTransport() override {
    for (auto& [key, v] : pending_) shm_unlink(v.first.c_str());
  }

 private:
  const std::string launch_id_;
  std::map<std::pair<int, int>, std::pair<std::string, std::shared_ptr<Mapping>>> pending_;
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport() { return std::make_unique<ShmTransport>(); }

namespace {

// Unlinks the shm segments whose name (in /dev/shm, without the leading '/', as glibc keeps shm_open names on
// Linux) `match` accepts; returns how many it removed.
template <class Match>
int unlink_segments_if(Match match) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir))
    if (match(e->d_name)) names.push_back(e->d_name);
  closedir(dir);
  int removed = 0;
  for (const std::string& n : names) removed += shm_unlink(("/" + n).c_str()) == 0 ? 1 : 0;
  return removed;
}

}  // namespace

int remove_shm_segments_of(int pid, const std::string& launch_id) {
  const std::string prefix = segment_prefix(pid, launch_id).substr(1);
  return unlink_segments_if([&](const char* name) { return std::strncmp(name, prefix.c_str(), prefix.size()) == 0; });
}

int remove_shm_segments_of_dead_processes() {
  const uint64_t ns = pid_namespace();
  if (ns == 0) return 0;
  return unlink_segments_if([&](const char* name) {
    int pid = 0, end = 0;
    unsigned long long their_ns = 0;
    char launch[17] = {};
    if (std::sscanf(name, "chorus-%d-%16[0-9a-fA-F]-%llu-%n", &pid, launch, &their_ns, &end) != 3 || end == 0)
      return false;
    // Only a creator in this pid namespace that is gone (EPERM: it exists, another user's).
    return their_ns == ns && pid > 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH;
  });
}

}  // namespace chorus
