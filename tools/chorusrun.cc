// chorusrun: the local launcher. `chorusrun -n N [--] prog args...` starts N ranks of `prog` on this host with
// CHORUS_RANK, CHORUS_NRANKS, CHORUS_LOCAL_RANK, CHORUS_ROOT_ADDR and a fresh CHORUS_SECRET, prefixes every line
// they print with their rank, and when any rank fails (non-zero exit or a signal) stops the others and exits
// non-zero. Exit code: 0 if every rank exited 0; else the first failing rank's exit code (128 + signal for a
// signal); 2 for bad usage.
//
// With `--hosts H` (or a list of per-host rank counts) the ranks are placed, in blocks, into the network namespaces
// that scripts/netns-hosts.sh creates (emulated hosts; docs/emulated-hosts.md): each child enters its host's
// namespace with setns() before exec, and the rendezvous listens on host 0's bridge address so every host reaches it.
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "bootstrap/unique_id.h"
#include "transports/transports.h"

namespace {

constexpr const char* kNetnsDir = "/var/run/netns";

// One of a rank's output streams: the read end of its pipe, and the bytes after its last newline.
struct Stream {
  int fd = -1;
  std::string partial;
};

struct Rank {
  pid_t pid = -1;
  Stream out, err;  // the rank's stdout and stderr, passed on to chorusrun's own
  bool exited = false;
  bool stopped = false;  // by a signal (SIGSTOP, SIGTSTP...), until continued
  int status = 0;
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: chorusrun -n N [--hosts H|N0,N1,...] [--netns-prefix P] [--timeout SECONDS] [--] prog [args...]\n"
      "  -n, --nranks N       ranks to start on this host (1..1024)\n"
      "      --hosts H        place the ranks on H emulated hosts, the network namespaces P-h0..P-h(H-1)\n"
      "                       of scripts/netns-hosts.sh (root only), in blocks: rank r on host r / (N/H)\n"
      "                       (when H does not divide N, the first N %% H hosts get one rank more)\n"
      "      --hosts N0,N1,.. N0 ranks on host 0, N1 on host 1, ... (-n may then be left out)\n"
      "      --netns-hosts    the same as --hosts\n"
      "      --netns-prefix P namespace prefix (default: chorus)\n"
      "      --timeout SEC    stop every rank after SEC seconds (default: no limit)\n"
      "  -h, --help           this text\n"
      "Each rank gets CHORUS_RANK, CHORUS_NRANKS, CHORUS_LOCAL_RANK (its index on its host), CHORUS_ROOT_ADDR,\n"
      "CHORUS_SECRET and CHORUS_LAUNCH_ID. Each line a rank writes to stdout (stderr) goes to chorusrun's\n"
      "stdout (stderr) behind its rank, as \"[r] \".\n");
}

// Rank counts per emulated host from --hosts: "H" (split N in blocks) or "N0,N1,..." (explicit). Returns false
// with *why set on bad input. `n` is 0 when -n was not given.
bool parse_hosts(const std::string& spec, int n, std::vector<int>* per_host, std::string* why) {
  std::vector<long> values;
  size_t pos = 0;
  while (true) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1024) {
      *why = "'" + item + "' is not a count between 1 and 1024";
      return false;
    }
    values.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  per_host->clear();
  if (values.size() == 1) {
    const int h = static_cast<int>(values[0]);
    if (n == 0) {
      *why = "with a host count, -n N is required (or give ranks per host, e.g. --hosts 2,2)";
      return false;
    }
    if (h > n) {
      *why = std::to_string(h) + " hosts for " + std::to_string(n) + " ranks: every host needs at least one rank";
      return false;
    }
    for (int i = 0; i < h; ++i) per_host->push_back(n / h + (i < n % h ? 1 : 0));
    return true;
  }
  long total = 0;
  for (long v : values) {
    total += v;
    per_host->push_back(static_cast<int>(v));
  }
  if (total > 1024 || (n != 0 && total != n)) {
    *why = "the per-host counts add up to " + std::to_string(total) +
           (n != 0 ? " but -n is " + std::to_string(n) : std::string(", more than 1024 ranks"));
    return false;
  }
  return true;
}

// A free loopback port for rank 0's rendezvous service, chosen below the kernel's ephemeral range: a port from that
// range can be taken in the meantime by any outgoing connection, even one aimed at it (a TCP self-connect while
// rank 1 retries before rank 0 listens).
int free_port() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    std::fclose(f);
  }
  const int first = std::max(1024, lo - 12000), last = std::max(first + 1, lo - 1);
  std::random_device rd;
  for (int attempt = 0; attempt < 200; ++attempt) {
    int port = first + static_cast<int>(rd() % static_cast<unsigned>(last - first));
    try {
      chorus::Socket s = chorus::Socket::listen(chorus::resolve("0.0.0.0", port));
      return port;
    } catch (const std::exception&) {
    }
  }
  chorus::Socket s = chorus::Socket::listen(chorus::resolve("127.0.0.1", 0));
  return chorus::sockaddr_port(s.local_addr());
}

// Writes the complete lines of `s` (and, when final, the rest) to `to`, each behind its rank's prefix.
void flush_lines(int rank, Stream& s, FILE* to, bool final) {
  // Bytes as written (a NUL byte included).
  auto line = [rank, to](const char* text, size_t len) {
    std::fprintf(to, "[%d] ", rank);
    std::fwrite(text, 1, len, to);
    std::fputc('\n', to);
  };
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    line(s.partial.data() + start, nl - start);
  s.partial.erase(0, start);
  if (final && !s.partial.empty()) {
    line(s.partial.data(), s.partial.size());
    s.partial.clear();
  }
  std::fflush(to);
}

// Reads what `s` has (poll said it is readable), passing complete lines on; at its end, the rest, and closes it.
void pump(int rank, Stream& s, FILE* to) {
  char buf[65536];
  ssize_t got;
  do got = read(s.fd, buf, sizeof(buf));
  while (got < 0 && errno == EINTR);
  if (got > 0) {
    s.partial.append(buf, static_cast<size_t>(got));
    flush_lines(rank, s, to, false);
    return;
  }
  flush_lines(rank, s, to, true);
  close(s.fd);
  s.fd = -1;
}

// The rendezvous address for ranks spread over namespaces: host 0's own address (the first non-loopback IPv4
// interface, or CHORUS_SOCKET_IFNAME's) and a port free there. Runs inside host 0's namespace and returns to this
// process's own namespace before returning. Throws with a message for the user.
std::string netns_root_addr(int host0_fd, const std::string& host0_name, bool need_bridge) {
  int self_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self_fd < 0) throw std::runtime_error(std::string("cannot open /proc/self/ns/net: ") + std::strerror(errno));
  if (setns(host0_fd, CLONE_NEWNET) != 0) {
    const int err = errno;
    close(self_fd);
    if (err == EPERM)
      throw std::runtime_error("--hosts needs root: entering network namespace " + host0_name +
                               " (setns) requires CAP_SYS_ADMIN; run chorusrun as root");
    throw std::runtime_error("cannot enter network namespace " + host0_name + ": " + std::strerror(err));
  }
  std::string addr, error;
  try {
    sockaddr_storage a = chorus::default_address();
    const char* ifname = std::getenv("CHORUS_SOCKET_IFNAME");
    if (need_bridge && chorus::sockaddr_is_loopback(a))
      error = ifname != nullptr && *ifname != '\0'
                  ? "CHORUS_SOCKET_IFNAME=" + std::string(ifname) + " is a loopback address in network namespace " +
                        host0_name + ", which other hosts cannot reach; unset it (or name eth0)"
                  : "network namespace " + host0_name +
                        " has no interface with an IPv4 address besides loopback, so other hosts cannot reach its "
                        "rendezvous; run scripts/netns-hosts.sh up H again";
    chorus::set_sockaddr_port(a, free_port());
    addr = chorus::sockaddr_to_string(a);
  } catch (const std::exception& e) {
    error = std::string("in network namespace ") + host0_name + ": " + e.what();
  }
  const bool back = setns(self_fd, CLONE_NEWNET) == 0;
  const int err = errno;
  close(self_fd);
  if (!back)
    throw std::runtime_error(std::string("cannot return to the launcher's network namespace: ") + std::strerror(err));
  if (!error.empty()) throw std::runtime_error(error);
  return addr;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  double timeout_s = 0;
  std::string hosts_spec, netns_prefix = "chorus";
  static option longopts[] = {{"nranks", required_argument, nullptr, 'n'},
                              {"timeout", required_argument, nullptr, 't'},
                              {"hosts", required_argument, nullptr, 'H'},
                              {"netns-hosts", required_argument, nullptr, 'H'},
                              {"netns-prefix", required_argument, nullptr, 'P'},
                              {"help", no_argument, nullptr, 'h'},
                              {nullptr, 0, nullptr, 0}};
  int c;
  // '+' stops at the first non-option: the program's own flags are not ours.
  while ((c = getopt_long(argc, argv, "+n:h", longopts, nullptr)) != -1) {
    switch (c) {
      case 'n': {
        char* end = nullptr;
        long v = std::strtol(optarg, &end, 10);
        if (*end != '\0' || v < 1 || v > 1024) {
          std::fprintf(stderr, "chorusrun: -n %s: expected a rank count between 1 and 1024\n", optarg);
          return 2;
        }
        n = static_cast<int>(v);
        break;
      }
      case 't': {
        char* end = nullptr;
        timeout_s = std::strtod(optarg, &end);
        if (*end != '\0' || !(timeout_s > 0) || !std::isfinite(timeout_s) || timeout_s > 1e9) {
          std::fprintf(stderr, "chorusrun: --timeout %s: expected a positive number of seconds\n", optarg);
          return 2;
        }
        break;
      }
      case 'H': hosts_spec = optarg; break;
      case 'P':
        netns_prefix = optarg;
        if (netns_prefix.empty() || netns_prefix.find('/') != std::string::npos) {
          std::fprintf(stderr, "chorusrun: --netns-prefix '%s': expected a namespace name prefix\n", optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  // Rank counts per emulated host; empty without --hosts (every rank stays in this namespace).
  std::vector<int> per_host;
  if (!hosts_spec.empty()) {
    std::string why;
    if (!parse_hosts(hosts_spec, n, &per_host, &why)) {
      std::fprintf(stderr, "chorusrun: --hosts %s: %s\n", hosts_spec.c_str(), why.c_str());
      return 2;
    }
    if (n == 0)
      for (int count : per_host) n += count;
  }
  if (n == 0 || optind >= argc) {
    std::fprintf(stderr, "chorusrun: %s\n", n == 0 ? "-n N is required" : "no program given");
    usage(stderr);
    return 2;
  }
  // Host of every rank and its index on that host (blocks of consecutive ranks).
  std::vector<int> host_of(n, 0), local_rank(n);
  for (int r = 0, h = 0, i = 0; r < n; ++r) {
    if (!per_host.empty() && i == per_host[h]) {
      ++h;
      i = 0;
    }
    host_of[r] = h;
    local_rank[r] = i++;
  }

  // Every namespace is opened (and host 0's entered) before any rank starts, so a missing one is one clear error.
  std::vector<int> netns_fds;
  std::vector<std::string> netns_names;
  for (size_t h = 0; h < per_host.size(); ++h) {
    netns_names.push_back(netns_prefix + "-h" + std::to_string(h));
    const std::string path = std::string(kNetnsDir) + "/" + netns_names.back();
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      std::string up = "scripts/netns-hosts.sh up " + std::to_string(per_host.size());
      if (netns_prefix != "chorus") up += " --prefix " + netns_prefix;
      if (err == ENOENT)
        std::fprintf(stderr, "chorusrun: network namespace %s does not exist (%s): run %s first\n",
                     netns_names.back().c_str(), path.c_str(), up.c_str());
      else
        std::fprintf(stderr, "chorusrun: cannot open network namespace %s: %s%s\n", path.c_str(), std::strerror(err),
                     err == EACCES || err == EPERM ? " (--hosts needs root)" : "");
      return 1;
    }
    netns_fds.push_back(fd);
  }

  std::string root_addr, secret, launch_id;
  try {
    root_addr = netns_fds.empty() ? "127.0.0.1:" + std::to_string(free_port())
                                  : netns_root_addr(netns_fds[0], netns_names[0], netns_fds.size() > 1);
    secret = chorus::secret_to_hex(chorus::random_secret());
    launch_id = chorus::secret_to_hex(chorus::random_secret()).substr(0, 16);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorusrun: %s\n", e.what());
    return 1;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stderr, nullptr, _IOLBF, 0);  // ranks' stderr lines pass through it: one write per line, not per piece

  std::vector<Rank> ranks(n);
  const pid_t launcher = getpid();
  for (int r = 0; r < n; ++r) {
    int fds[2], err_fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0 || pipe2(err_fds, O_CLOEXEC) != 0) {
      std::perror("chorusrun: pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("chorusrun: fork");
      return 1;
    }
    if (pid == 0) {
      signal(SIGPIPE, SIG_DFL);  // the launcher ignores it; a rank starts with the default, as from a shell
      setpgid(0, 0);             // its own group, so stopping a rank stops what it started too
      // A launcher killed outright (SIGKILL: nothing of it runs) takes its ranks with it, instead of leaving them
      // running unwatched. Checked after the request, in case it died before.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(127);
      dup2(fds[1], STDOUT_FILENO);
      dup2(err_fds[1], STDERR_FILENO);
      setenv("CHORUS_RANK", std::to_string(r).c_str(), 1);
      setenv("CHORUS_NRANKS", std::to_string(n).c_str(), 1);
      setenv("CHORUS_LOCAL_RANK", std::to_string(local_rank[r]).c_str(), 1);
      setenv("CHORUS_ROOT_ADDR", root_addr.c_str(), 1);
      setenv("CHORUS_SECRET", secret.c_str(), 1);
      setenv("CHORUS_LAUNCH_ID", launch_id.c_str(), 1);
      if (!netns_fds.empty() && setns(netns_fds[host_of[r]], CLONE_NEWNET) != 0) {
        std::fprintf(stderr, "chorusrun: rank %d cannot enter network namespace %s: %s\n", r,
                     netns_names[host_of[r]].c_str(), std::strerror(errno));
        _exit(127);
      }
      execvp(argv[optind], argv + optind);
      std::fprintf(stderr, "chorusrun: cannot run %s: %s\n", argv[optind], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);
    close(fds[1]);
    close(err_fds[1]);
    ranks[r].pid = pid;
    ranks[r].out.fd = fds[0];
    ranks[r].err.fd = err_fds[0];
  }

  const auto start = std::chrono::steady_clock::now();
  int exit_code = 0, first_failed = -1, running = n;
  // The first rank that ended well while others ran, and when: ranks finish at different times, but one that left
  // before the others joined or finished a call with it leaves them waiting until their timeout (below).
  int first_done = -1;
  bool first_done_noted = false;
  std::chrono::steady_clock::time_point first_done_at;
  bool stopping = false, signalled = false;  // signalled: chorusrun has sent its ranks a signal
  auto stop_all = [&](int sig) {
    signalled = true;
    for (Rank& r : ranks)
      if (!r.exited) {
        kill(-r.pid, sig);
        if (sig == SIGTERM) kill(-r.pid, SIGCONT);  // a stopped rank takes SIGTERM once continued, not 3 s later
      }
  };
  std::chrono::steady_clock::time_point stop_at;
  // Once every rank has ended: how long output that a process they started still holds is waited for.
  std::chrono::steady_clock::time_point output_until = std::chrono::steady_clock::time_point::max();
  // Until every rank has ended and every output pipe is at its end (a process a rank started may hold them longer;
  // both are read as they fill, so it never blocks writing one while chorusrun waits on the other).
  auto output_open = [&] {
    return std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
  };
  while (running > 0 || output_open()) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<int, bool>> who;  // (rank, its stderr)
    for (int r = 0; r < n; ++r)
      for (const bool is_err : {false, true})
        if (const Stream& s = is_err ? ranks[r].err : ranks[r].out; s.fd >= 0) {
          pfds.push_back({s.fd, POLLIN, 0});
          who.push_back({r, is_err});
        }
    if (!pfds.empty())
      poll(pfds.data(), pfds.size(), 100);
    else
      usleep(100000);
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto [r, is_err] = who[i];
      pump(r, is_err ? ranks[r].err : ranks[r].out, is_err ? stderr : stdout);
    }
    // The ranks that ended since the last look. A death by a signal comes first: when a rank is killed, the others
    // notice within milliseconds and exit with an error, often before chorusrun looks again, and the killed one
    // is the cause to name (helper-77 saw the first exit named instead).
    std::vector<std::pair<pid_t, int>> ended;
    {
      int st;
      pid_t p;
      while ((p = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED)) > 0) ended.push_back({p, st});
      // (An exit status above 128 is how a shell wrapper reports its child's death by a signal.)
      std::stable_partition(ended.begin(), ended.end(), [](const auto& e) {
        return WIFSIGNALED(e.second) || (WIFEXITED(e.second) && WEXITSTATUS(e.second) > 128);
      });
    }
    for (const auto& [pid, status] : ended) {
      for (int r = 0; r < n; ++r) {
        if (ranks[r].pid != pid) continue;
        if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
          // A stopped rank runs nothing, so the ranks that wait for it time out; say which one it is.
          ranks[r].stopped = WIFSTOPPED(status);
          if (ranks[r].stopped && !signalled)
            std::fprintf(stderr,
                         "chorusrun: rank %d (pid %d) was stopped by signal %d (%s); ranks that wait for it will "
                         "time out (kill -CONT %d continues it)\n",
                         r, static_cast<int>(pid), WSTOPSIG(status), strsignal(WSTOPSIG(status)),
                         static_cast<int>(pid));
          continue;
        }
        // A rank that died (or left without destroying its communicators) may leave shm segments nobody maps:
        // named with this launch's id, or without one if a wrapper cleared the rank's environment.
        if (const int n_removed =
                chorus::remove_shm_segments_of(pid, launch_id) + chorus::remove_shm_segments_of(pid, "");
            n_removed > 0)
          std::fprintf(stderr, "chorusrun: removed %d shared-memory segment(s) rank %d left in /dev/shm\n", n_removed,
                       r);
        ranks[r].exited = true;
        ranks[r].status = status;
        --running;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0 && first_failed < 0 && !stopping) {
          first_failed = r;
          exit_code = code;
          std::fprintf(stderr, "chorusrun: rank %d %s %d; stopping the other ranks\n", r,
                       WIFEXITED(status) ? "exited with code" : "was killed by signal",
                       WIFEXITED(status) ? code : WTERMSIG(status));
        } else if (code == 0 && running > 0 && first_done < 0) {
          first_done = r;
          first_done_at = std::chrono::steady_clock::now();
        } else if (WIFSIGNALED(status) && !signalled) {
          // A second rank dying on its own (not stopped by chorusrun) is a failure of its own: say so, since it
          // may print nothing (SIGKILL, SIGSEGV).
          std::fprintf(stderr, "chorusrun: rank %d was also killed by signal %d (%s)\n", r, WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const bool past_timeout = timeout_s > 0 && now - start > std::chrono::duration<double>(timeout_s);
    if (running == 0) {
      // Every rank has ended; only output is left, normally at its end at once. A process a rank started may hold
      // the pipes longer: it gets 10 s, or 1 s after an interrupt or the timeout, then chorusrun stops reading.
      const auto grace = std::chrono::seconds(g_signal != 0 || past_timeout ? 1 : 10);
      output_until = std::min(output_until, now + grace);
      if (now >= output_until) {
        std::fprintf(stderr,
                     "chorusrun: every rank has ended, but a process one started still holds its output: "
                     "not waiting for it\n");
        break;
      }
      continue;
    }
    if (first_done >= 0 && !first_done_noted && first_failed < 0 && !stopping &&
        now - first_done_at > std::chrono::seconds(5)) {
      first_done_noted = true;
      std::fprintf(stderr,
                   "chorusrun: rank %d exited with code 0 over 5 s ago and %d rank(s) still run (fine if they "
                   "finish work of their own; if they wait for it, their error at CHORUS_TIMEOUT_MS names it)\n",
                   first_done, running);
    }
    if (!stopping && (first_failed >= 0 || g_signal != 0 || past_timeout)) {
      if (first_failed < 0) {
        exit_code = g_signal ? 128 + g_signal : 124;
        std::fprintf(stderr, "chorusrun: %s; stopping every rank\n", g_signal ? "interrupted" : "timed out");
      }
      // The others get a few seconds to report the failure themselves (their error names the failed rank), then
      // are terminated.
      stopping = true;
      stop_at = now + std::chrono::seconds(first_failed >= 0 ? 10 : 0);
    }
    // Stopped ranks cannot report anything: when every rank left is stopped, the others' grace ends now.
    if (stopping && !signalled &&
        std::all_of(ranks.begin(), ranks.end(), [](const Rank& k) { return k.exited || k.stopped; }))
      stop_at = std::min(stop_at, now);
    if (stopping && now >= stop_at) {
      stop_all(SIGTERM);
      if (now >= stop_at + std::chrono::seconds(3)) stop_all(SIGKILL);
    }
  }
  for (int r = 0; r < n; ++r)  // what was left without a final newline
    for (const bool is_err : {false, true}) {
      Stream& s = is_err ? ranks[r].err : ranks[r].out;
      if (s.fd < 0) continue;
      flush_lines(r, s, is_err ? stderr : stdout, true);
      close(s.fd);
      s.fd = -1;
    }
  return exit_code;
}
