#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "trainer/dist.h"
#include "trainer/ops.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'C', 'H', 'O', 'R', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr const char* kMetaHeader = "chorus-trainer-checkpoint 1";

std::string step_name(int step) {
  char b[32];
  std::snprintf(b, sizeof(b), "step-%08d", step);
  return b;
}

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail_errno("cannot open", path);
  const int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) fail_errno("cannot fsync", path);
}

// Writes `bytes` to a new file and fsyncs it; die_midway, when set, runs after half of it is written.
void write_durably(const std::string& path, const std::string& bytes, const std::function<void()>& die_midway) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail_errno("cannot create", path);
  size_t done = 0;
  auto put = [&](size_t upto) {
    while (done < upto) {
      const ssize_t w = ::write(fd, bytes.data() + done, upto - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ::close(fd);
        fail_errno("cannot write", path);
      }
      done += size_t(w);
    }
  };
  if (die_midway) {
    put(bytes.size() / 2);
    ::fsync(fd);
    die_midway();
  }
  put(bytes.size());
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail_errno("cannot fsync", path);
}

template <typename T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Reads a T at *pos of s, or throws naming the file.
template <typename T>
T get(const std::string& s, size_t* pos, const std::string& path) {
  if (s.size() - *pos < sizeof(T)) throw std::runtime_error("checkpoint file '" + path + "' is truncated");
  T v;
  std::memcpy(&v, s.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return v;
}

std::string serialize(const CheckpointMeta& meta, int rank, const std::vector<StateBuffer>& bufs) {
  std::string s(kMagic, sizeof(kMagic));
  put(s, kVersion);
  put(s, meta.model_hash);
  put(s, int32_t(rank));
  put(s, int32_t(meta.nranks));
  put(s, int32_t(meta.step));
  put(s, uint32_t(bufs.size()));
  for (const StateBuffer& b : bufs) {
    put(s, uint32_t(b.name.size()));
    s += b.name;
    put(s, uint64_t(b.data.size()));
    s.append(reinterpret_cast<const char*>(b.data.data()), b.data.size_bytes());
  }
  put(s, fnv1a(s.data(), s.size()));
  return s;
}

std::string meta_text(const CheckpointMeta& m) {
  std::ostringstream s;
  char hash[32];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(m.model_hash));
  s << kMetaHeader << "\n"
    << "model_hash " << hash << "\n"
    << "model " << m.model << "\n"
    << "nranks " << m.nranks << "\n"
    << "shard_group " << m.shard_group << "\n"
    << "step " << m.step << "\n"
    << "steps " << m.steps << "\n"
    << "rng " << m.rng.s[0] << " " << m.rng.s[1] << " " << m.rng.s[2] << " " << m.rng.s[3] << "\n"
    << "drawn " << m.drawn << "\n"
    << "training " << m.training << "\n";
  for (const auto& [name, value] : m.collectives) s << "collectives " << name << "=" << value << "\n";
  s << "history " << m.history.size() << "\n";
  char line[96];
  for (const HistoryRow& h : m.history) {
    std::snprintf(line, sizeof(line), "%d %.17g %.17g\n", h.step, h.loss, h.val);
    s << line;
  }
  // Last, a checksum of everything above: a meta.txt cut short or edited is refused, not half read.
  std::string text = s.str();
  std::snprintf(line, sizeof(line), "end %016llx\n", static_cast<unsigned long long>(fnv1a(text.data(), text.size())));
  return text + line;
}

// What killed attempts leave under root: temporary directories (.tmp), directories half deleted (.del, or a step
// directory without meta.txt, which no complete checkpoint lacks), and .old copies whose checkpoint is there (else
// pruning that checkpoint would bring its stale copy back). None is a complete checkpoint.
bool is_incomplete_step(const fs::path& p) {
  static const std::regex kStep("step-[0-9]{8}");
  return std::regex_match(p.filename().string(), kStep) && !fs::exists(p / "meta.txt");
}

void remove_leftovers(const std::string& root) {
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(root)) {
    const fs::path& p = e.path();
    const std::string ext = p.extension().string();
    if (ext == ".tmp" || ext == ".del" || (ext == ".old" && fs::exists(p.parent_path() / p.stem())) ||
        is_incomplete_step(p))
      leftovers.push_back(p);
  }
  for (const fs::path& p : leftovers) fs::remove_all(p);
}

// Removes a checkpoint directory so that no kill can leave it torn under its name: it is renamed (atomic, made
// durable) to <dir>.del, which nothing reads and the next checkpoint removes, and only then deleted.
void retire(const fs::path& dir) {
  const fs::path gone = dir.string() + ".del";
  fs::remove_all(gone);
  fs::rename(dir, gone);
  fsync_path(dir.parent_path().string());
  fs::remove_all(gone);
}

// Every rank reports whether its part went well; returns how many failed.
int failures(Dist& dist, bool ok) {
  double f[1] = {ok ? 0.0 : 1.0};
  dist.sum_world(f);
  return static_cast<int>(f[0]);
}

// Complete checkpoints under root, oldest first. A step-N.old without its step-N is step N: a checkpoint written
// again (save_checkpoint, step 3) is renamed so before the new one takes its name, and a kill between the two renames
// must not lose it.
std::vector<fs::path> complete_checkpoints(const std::string& root) {
  static const std::regex kName("step-[0-9]{8}(\\.old)?");
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, kName) || !fs::exists(e.path() / "meta.txt")) continue;
    if (e.path().extension() == ".old" && fs::exists(e.path().parent_path() / e.path().stem())) continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta, const std::vector<StateBuffer>& mine,
                            Dist& dist, int keep, const std::function<void()>& die_midway) {
  const int rank = dist.rank();
  const std::string name = step_name(meta.step);
  const std::string tmp = root + "/" + name + ".tmp", final_dir = root + "/" + name;
  std::string err;
  auto attempt = [&](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  auto agree = [&](const std::string& stage) {
    const int n = failures(dist, err.empty());
    if (n > 0)
      throw std::runtime_error("checkpoint " + final_dir + ": " +
                               (err.empty() ? std::to_string(n) + " rank(s) failed to " + stage : err));
  };

  // 1. Rank 0 makes a fresh temporary directory (a killed earlier attempt may have left one).
  if (rank == 0)
    attempt([&] {
      if (!fs::exists(root)) {
        fs::create_directories(root);
        fsync_path(fs::absolute(root).parent_path().string());  // the new directory's entry, durable too
      }
      remove_leftovers(root);  // first: on a nearly full disk their space may be needed
      fs::create_directory(tmp);
    });
  agree("prepare the directory");
  // 2. Every rank writes its file durably.
  attempt(
      [&] { write_durably(tmp + "/rank-" + std::to_string(rank) + ".bin", serialize(meta, rank, mine), die_midway); });
  agree("write their shard");
  // 3. Rank 0 adds the metadata and publishes the directory with one rename.
  if (rank == 0)
    attempt([&] {
      write_durably(tmp + "/meta.txt", meta_text(meta), {});
      fsync_path(tmp);
      const std::string old = final_dir + ".old";
      if (fs::exists(final_dir)) {  // written again after resuming from an older one
        fs::remove_all(old);
        fs::rename(final_dir, old);
      }
      fs::rename(tmp, final_dir);
      fsync_path(root);
      fs::remove_all(old);
      remove_leftovers(root);  // the .old copy of a checkpoint written again, now that the checkpoint is there
      // Keep the newest `keep`.
      std::vector<fs::path> all = complete_checkpoints(root);
      for (size_t i = 0; i + std::max(keep, 1) < all.size(); ++i) retire(all[i]);
    });
  agree("publish the checkpoint");
  return final_dir;
}

void remove_checkpoint(const std::string& dir) {
  if (fs::exists(dir)) retire(dir);
}

std::string latest_checkpoint(const std::string& root) {
  std::vector<fs::path> all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

std::vector<std::pair<std::string, std::string>> collective_settings() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"CHORUS_ALGO", "CHORUS_NCHANNELS", "CHORUS_DETERMINISTIC", "CHORUS_SLICE_BYTES",
                           "CHORUS_TOPO_FILE", "CHORUS_TUNE_FILE"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0' && std::strchr(v, '\n') == nullptr)
      out.emplace_back(name, v);
  return out;
}

std::vector<std::string> incomplete_checkpoints(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (is_incomplete_step(e.path())) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> checkpoints_after(const std::string& root, int step) {
  std::vector<std::string> out;
  for (const fs::path& p : complete_checkpoints(root))
    if (std::stoi(p.filename().string().substr(5, 8)) > step) out.push_back(p.string());
  return out;
}

CheckpointMeta read_meta(const std::string& dir) {
  const std::string path = dir + "/meta.txt";
  std::ifstream file(path, std::ios::binary);
  std::string text, line;
  if (file) {
    std::ostringstream ss;
    ss << file.rdbuf();
    text = ss.str();
  }
  if (!file || text.compare(0, std::strlen(kMetaHeader) + 1, std::string(kMetaHeader) + "\n") != 0)
    throw std::runtime_error("'" + dir + "' is not a trainer checkpoint (no readable meta.txt)");
  // The last line is "end <checksum of the lines above>".
  const size_t end_at = text.rfind("end ", text.size() >= 5 ? text.size() - 5 : 0);
  if (end_at == std::string::npos)
    throw std::runtime_error("checkpoint '" + dir +
                             "': meta.txt is damaged (no checksum line: cut short, or written by an older trainer)");
  char want[32];
  std::snprintf(want, sizeof(want), "end %016llx\n", static_cast<unsigned long long>(fnv1a(text.data(), end_at)));
  if ((end_at > 0 && text[end_at - 1] != '\n') || text.substr(end_at) != want)
    throw std::runtime_error("checkpoint '" + dir +
                             "': meta.txt is damaged (cut short or edited: its checksum line does not match)");
  std::istringstream in(text.substr(0, end_at));
  std::getline(in, line);
  CheckpointMeta m;
  size_t nhist = 0;
  std::string key;
  std::vector<std::string> seen;
  try {
    while (in >> key) {
      seen.push_back(key);
      if (key == "model_hash") {
        std::string h;
        in >> h;
        m.model_hash = std::stoull(h, nullptr, 16);
      } else if (key == "model") {
        in >> std::ws;
        std::getline(in, m.model);
      } else if (key == "training") {
        in >> std::ws;
        std::getline(in, m.training);
      } else if (key == "nranks") {
        in >> m.nranks;
      } else if (key == "shard_group") {
        in >> m.shard_group;
      } else if (key == "step") {
        in >> m.step;
      } else if (key == "steps") {
        in >> m.steps;
      } else if (key == "rng") {
        in >> m.rng.s[0] >> m.rng.s[1] >> m.rng.s[2] >> m.rng.s[3];
      } else if (key == "drawn") {
        in >> m.drawn;
      } else if (key == "collectives") {  // NAME=value to the end of the line, the value as it was set
        std::string line;
        in.get();  // the one space after the key
        std::getline(in, line);
        const size_t eq = line.find('=');
        if (eq == std::string::npos) throw std::runtime_error("malformed value of 'collectives'");
        m.collectives.emplace_back(line.substr(0, eq), line.substr(eq + 1));
      } else if (key == "history") {
        in >> nhist;
        for (size_t i = 0; i < nhist && in; ++i) {
          HistoryRow h;
          std::string loss, val;
          in >> h.step >> loss >> val;
          h.loss = std::stod(loss);
          h.val = std::stod(val);
          m.history.push_back(h);
        }
      } else {
        throw std::runtime_error("unknown field '" + key + "'");
      }
      if (!in) throw std::runtime_error("malformed value of '" + key + "'");
    }
  } catch (const std::exception& e) {  // std::stod and friends say only their own name
    throw std::runtime_error(
        "checkpoint '" + dir + "': meta.txt: " +
        (dynamic_cast<const std::runtime_error*>(&e) ? e.what() : "malformed value of '" + key + "'"));
  }
  for (const char* k :
       {"model_hash", "model", "training", "nranks", "shard_group", "step", "steps", "rng", "drawn", "history"})
    if (std::find(seen.begin(), seen.end(), k) == seen.end())
      throw std::runtime_error("checkpoint '" + dir + "': meta.txt has no '" + k + "' (written by an older trainer?)");
  return m;
}

CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect, int rank,
                               const std::vector<StateBuffer>& mine) {
  const CheckpointMeta meta = read_meta(dir);
  if (meta.model_hash != expect.model_hash)
    throw std::runtime_error("checkpoint '" + dir + "' is of another model:\n  checkpoint: " + meta.model +
                             "\n  this run:   " + expect.model);
  if (meta.nranks != expect.nranks || meta.shard_group != expect.shard_group)
    throw std::runtime_error("checkpoint '" + dir + "' holds shards of " + std::to_string(meta.nranks) +
                             " ranks in shard groups of " + std::to_string(meta.shard_group) + "; this run has " +
                             std::to_string(expect.nranks) + " in groups of " + std::to_string(expect.shard_group) +
                             " (resume with the same ranks)");
  if (meta.training != expect.training) {
    // "key=value ..." on both sides; name every flag whose value differs.
    auto fields = [](const std::string& text) {
      std::vector<std::pair<std::string, std::string>> kv;
      std::istringstream in(text);
      std::string tok;
      while (in >> tok) {
        const size_t eq = tok.find('=');
        kv.emplace_back(tok.substr(0, eq), eq == std::string::npos ? "" : tok.substr(eq + 1));
      }
      return kv;
    };
    const auto theirs = fields(meta.training), ours = fields(expect.training);
    std::string diff;
    for (const auto& [k, v] : ours) {
      auto it = std::find_if(theirs.begin(), theirs.end(), [&](const auto& f) { return f.first == k; });
      const std::string was = it == theirs.end() ? "(not recorded)" : it->second;
      if (was == v) continue;
      diff += "\n  " + (k == "data" ? std::string("--data / --val-fraction: another text (checkpoint: ") + was +
                                          ", this run: " + v + ")"
                                    : "--" + k + " " + v + " (checkpoint: " + was + ")");
    }
    if (diff.empty()) diff = "\n  checkpoint: " + meta.training + "\n  this run:   " + expect.training;
    throw std::runtime_error("checkpoint '" + dir + "' was trained with other settings; resume with its flags:" + diff);
  }
  if (meta.collectives != expect.collectives && rank == 0) {
    auto value = [](const std::vector<std::pair<std::string, std::string>>& kv, const std::string& name) {
      for (const auto& [k, v] : kv)
        if (k == name) return v;
      return std::string("unset");
    };
    std::string diff;
    for (const auto& kv : {meta.collectives, expect.collectives})
      for (const auto& [name, v] : kv)
        if (value(meta.collectives, name) != value(expect.collectives, name) &&
            diff.find(name + "=") == std::string::npos)
          diff += " " + name + "=" + value(expect.collectives, name) +
                  " (checkpoint: " + value(meta.collectives, name) + ")";
    std::fprintf(stderr,
                 "chorus-trainer: warning: resuming under other Chorus settings:%s; the collectives may sum in "
                 "another order, so the losses may differ in their last bits from a run that was never stopped\n",
                 diff.c_str());
  }
  const std::string path = dir + "/rank-" + std::to_string(rank) + ".bin";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno("cannot read checkpoint file", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  if (s.size() < sizeof(kMagic) + sizeof(uint64_t) || std::memcmp(s.data(), kMagic, sizeof(kMagic)) != 0)
    throw std::runtime_error("'" + path + "' is not a trainer checkpoint file");
  size_t end = s.size() - sizeof(uint64_t), tail = end;
  if (get<uint64_t>(s, &tail, path) != fnv1a(s.data(), end))
    throw std::runtime_error("checkpoint file '" + path + "' is damaged (checksum mismatch)");
  size_t pos = sizeof(kMagic);
  const std::string body = s.substr(0, end);
  if (get<uint32_t>(body, &pos, path) != kVersion)
    throw std::runtime_error("checkpoint file '" + path + "' has an unknown format version");
  const uint64_t hash = get<uint64_t>(body, &pos, path);
  const int32_t r = get<int32_t>(body, &pos, path), n = get<int32_t>(body, &pos, path);
  const int32_t step = get<int32_t>(body, &pos, path);
  if (hash != meta.model_hash || r != rank || n != meta.nranks || step != meta.step)
    throw std::runtime_error("checkpoint file '" + path + "' does not belong with its meta.txt");
  const uint32_t nbuf = get<uint32_t>(body, &pos, path);
  if (nbuf != mine.size())
    throw std::runtime_error("checkpoint file '" + path + "' holds " + std::to_string(nbuf) +
                             " buffers; this run has " + std::to_string(mine.size()));
  for (const StateBuffer& b : mine) {
    const uint32_t len = get<uint32_t>(body, &pos, path);
    if (body.size() - pos < len) throw std::runtime_error("checkpoint file '" + path + "' is truncated");
    const std::string name = body.substr(pos, len);
    pos += len;
    const uint64_t count = get<uint64_t>(body, &pos, path);
    if (name != b.name || count != b.data.size())
      throw std::runtime_error("checkpoint file '" + path + "' holds '" + name + "' of " + std::to_string(count) +
                               " values where this run expects '" + b.name + "' of " + std::to_string(b.data.size()));
    if (body.size() - pos < count * sizeof(float))
      throw std::runtime_error("checkpoint file '" + path + "' is truncated");
    std::memcpy(b.data.data(), body.data() + pos, count * sizeof(float));
    pos += count * sizeof(float);
  }
  return meta;
}

}  // namespace trainer
