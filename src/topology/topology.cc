// The topology model: link classes, validation, default costs, synthetic clusters, JSON files and the summary
// chorus-info prints. Discovery of the real machine is in discover.cc.
#include "topology/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace chorus::topo {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr const char* kLinkNames[kLinkClasses] = {"same_process", "same_numa", "cross_numa", "gpu_peer", "network"};
// Measured on the development machines (MACHINE-NOTES.md) and typical NVLink / Ethernet figures.
// {alpha, bandwidth, overhead}
constexpr LinkParams kDefaultLinks[kLinkClasses] = {
    {1e-6, 8e9, 0.2e-6},   // same_process
    {3e-6, 6e9, 0.3e-6},   // same_numa
    {4e-6, 4e9, 0.4e-6},   // cross_numa
    {3e-6, 150e9, 2e-6},   // gpu_peer
    {30e-6, 1.25e9, 3e-6}  // network
};
constexpr double kDefaultReduceBps = 4e9;
constexpr double kDefaultCopyBps = 8e9;
const char* const kNicKinds[] = {"ethernet", "infiniband", "roce", "virtual", "other"};

// JSON units: microseconds and GB/s (1e9 bytes/s). Reading divides or multiplies by an exact power of ten.
double us_to_s(double us) { return us / 1e6; }
double gbps_to_bps(double gbps) { return gbps * 1e9; }

// The number to write for a value v that is read back with `read`: the shortest decimal that reads back as exactly
// v, so files stay readable ("3", not "3.0000000000000004") and to_json -> from_json is the identity.
double for_file(double v, double (*read)(double), double guess) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, guess);
    double x = std::strtod(buf, nullptr);
    if (read(x) == v) return x;
  }
  for (double x : {std::nextafter(guess, -INFINITY), std::nextafter(guess, INFINITY)})
    if (read(x) == v) return x;
  return guess;
}
double s_for_file(double s) { return for_file(s, us_to_s, s * 1e6); }
double bps_for_file(double bps) { return for_file(bps, gbps_to_bps, bps / 1e9); }

bool known_nic_kind(const std::string& kind) {
  for (const char* k : kNicKinds)
    if (kind == k) return true;
  return false;
}
std::string nic_kind_list() {
  std::string out;
  for (const char* k : kNicKinds) out += cat(out.empty() ? "" : ", ", k);
  return out;
}
std::string link_name_list() {
  std::string out;
  for (const char* k : kLinkNames) out += cat(out.empty() ? "" : ", ", k);
  return out;
}

[[noreturn]] void invalid(const std::string& message) { throw Error(chorusInvalidArgument, Subsys::Topology, message); }

// The place a host's ranks get when a file gives no "ranks": see docs/topology.md.
RankPlace implicit_place(const Host& h, int host_index, int local) {
  RankPlace p;
  p.host = host_index;
  p.local_rank = local;
  p.process = local;
  p.gpu = local < static_cast<int>(h.gpus.size()) ? local : -1;
  // A GPU rank is bound next to its GPU; other ranks are spread over the NUMA nodes.
  if (p.gpu >= 0 && h.gpus[static_cast<size_t>(p.gpu)].numa >= 0)
    p.numa = h.gpus[static_cast<size_t>(p.gpu)].numa;
  else
    p.numa = h.numa.size() > 1 ? h.numa[static_cast<size_t>(local) % h.numa.size()].os_index : -1;
  return p;
}

// Checks everything validate() promises; `prefix` starts every message and `host_path(h)` names host h the way the
// caller's input does (from_json: the file's entry, with the copy when "count" expanded it).
void validate_impl(const Topology& t, const std::string& prefix, const std::function<std::string(int)>& host_path) {
  auto fail = [&](const std::string& path, const std::string& what) { invalid(cat(prefix, path, ": ", what)); };
  auto check_nonneg = [&](double v, const std::string& path) {
    if (!std::isfinite(v) || v < 0) fail(path, cat(v, " must be a finite number >= 0"));
  };
  if (t.hosts.empty()) fail("hosts", "a topology needs at least one host");
  if (t.ranks.empty()) fail("ranks", "a topology needs at least one rank");
  std::map<std::string, int> ids;
  for (int h = 0; h < t.nhosts(); ++h) {
    const Host& host = t.hosts[static_cast<size_t>(h)];
    const std::string hp = host_path(h);
    if (host.id.empty()) fail(hp + ".id", "must not be empty (it tells hosts apart)");
    auto [it, fresh] = ids.emplace(host.id, h);
    if (!fresh) fail(hp + ".id", cat("'", host.id, "' is also the id of ", host_path(it->second)));
    if (host.cores < 0) fail(hp + ".cores", cat(host.cores, " must be >= 0"));
    std::map<int, int> numa_seen;
    for (size_t i = 0; i < host.numa.size(); ++i) {
      const NumaNode& n = host.numa[i];
      const std::string np = cat(hp, ".numa[", i, "]");
      if (n.os_index < 0) fail(np + ".os_index", cat(n.os_index, " must be >= 0"));
      if (!numa_seen.emplace(n.os_index, static_cast<int>(i)).second)
        fail(np + ".os_index", cat(n.os_index, " appears twice"));
      if (n.cores < 0) fail(np + ".cores", cat(n.cores, " must be >= 0"));
    }
    auto numa_list = [&] {
      std::string out;
      for (const NumaNode& n : host.numa) out += cat(out.empty() ? "" : ", ", n.os_index);
      return out.empty() ? std::string("none listed") : out;
    };
    auto check_numa = [&](int numa, const std::string& path) {
      if (numa == -1) return;
      if (numa < -1 || numa_seen.count(numa) == 0)
        fail(path, cat(numa, " is not a NUMA node of ", hp, " (its nodes: ", numa_list(), "; -1 means unknown)"));
    };
    for (size_t i = 0; i < host.gpus.size(); ++i) check_numa(host.gpus[i].numa, cat(hp, ".gpus[", i, "].numa"));
    for (size_t i = 0; i < host.nics.size(); ++i) {
      const Nic& nic = host.nics[i];
      const std::string np = cat(hp, ".nics[", i, "]");
      if (!known_nic_kind(nic.kind))
        fail(np + ".kind", cat("unknown kind '", nic.kind, "' (known: ", nic_kind_list(), ")"));
      check_nonneg(nic.bandwidth_Bps, np + ".bandwidth_GBps");
      check_numa(nic.numa, np + ".numa");
    }
    check_nonneg(host.net_egress_Bps, hp + ".net_egress_GBps");
    check_nonneg(host.net_ingress_Bps, hp + ".net_ingress_GBps");
  }
  for (int c = 0; c < kLinkClasses; ++c) {
    check_nonneg(t.links[static_cast<size_t>(c)].alpha_s * 1e6, cat("links.", kLinkNames[c], ".alpha_us"));
    check_nonneg(t.links[static_cast<size_t>(c)].bandwidth_Bps / 1e9, cat("links.", kLinkNames[c], ".bandwidth_GBps"));
    check_nonneg(t.links[static_cast<size_t>(c)].overhead_s * 1e6, cat("links.", kLinkNames[c], ".overhead_us"));
  }
  check_nonneg(t.reduce_Bps / 1e9, "reduce_GBps");
  check_nonneg(t.copy_Bps / 1e9, "copy_GBps");

  std::vector<int> per_host(t.hosts.size(), 0);
  for (int r = 0; r < t.nranks(); ++r) {
    const RankPlace& p = t.ranks[static_cast<size_t>(r)];
    const std::string rp = cat("ranks[", r, "]");
    if (p.host < 0 || p.host >= t.nhosts())
      fail(rp + ".host", cat(p.host, " is out of range (", t.nhosts(), " hosts)"));
    const Host& host = t.hosts[static_cast<size_t>(p.host)];
    int& expected = per_host[static_cast<size_t>(p.host)];
    if (p.local_rank != expected)
      fail(rp + ".local_rank",
           cat(p.local_rank, " should be ", expected, ": local ranks count 0, 1, ... in rank order on each host"));
    ++expected;
    if (p.process < 0) fail(rp + ".process", cat(p.process, " must be >= 0"));
    if (p.gpu < -1 || p.gpu >= static_cast<int>(host.gpus.size()))
      fail(rp + ".gpu",
           cat(p.gpu, " is out of range (", host_path(p.host), " has ", host.gpus.size(), " GPUs; -1 means none)"));
    if (p.numa != -1) {
      bool found = false;
      for (const NumaNode& n : host.numa) found = found || n.os_index == p.numa;
      if (!found) fail(rp + ".numa", cat(p.numa, " is not a NUMA node of ", host_path(p.host), " (-1 means unknown)"));
    }
  }
  for (int h = 0; h < t.nhosts(); ++h)
    if (per_host[static_cast<size_t>(h)] == 0)
      fail(host_path(h), cat("host '", t.hosts[static_cast<size_t>(h)].name, "' has no ranks"));
}

// ---- JSON reading ----

// Reads one file's JSON with error messages "<prefix><field path>: <what>".
class Reader {
 public:
  explicit Reader(std::string prefix) : prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    invalid(cat(prefix_, path.empty() ? std::string("(top level)") : path, ": ", what));
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  const Json& object(const Json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, cat("expected an object, got ", j.type_name()));
    return j;
  }
  const Json& array(const Json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, cat("expected an array, got ", j.type_name()));
    return j;
  }
  // Rejects fields not in `known` (typos would otherwise be ignored silently); "comment" is allowed everywhere.
  void only(const Json& obj, const std::string& path, std::initializer_list<const char*> known) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (it.key() == "comment") continue;
      bool ok = false;
      for (const char* k : known) ok = ok || it.key() == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += cat(list.empty() ? "" : ", ", k);
        fail(join(path, it.key()), cat("unknown field (known: ", list, ", comment)"));
      }
    }
  }
  static const Json* find(const Json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  double number(const Json& j, const std::string& path, double min) const {
    if (!j.is_number()) fail(path, cat("expected a number, got ", j.type_name()));
    double v = j.get<double>();
    if (!(v >= min)) fail(path, cat(v, " must be >= ", min));
    return v;
  }
  // A cost: >= 0 in a topology file (0: the default), > 0 in a tuning file (a measurement).
  double value(const Json& j, const std::string& path, bool zero_ok) const {
    const double v = number(j, path, 0);
    if (!zero_ok && v == 0) fail(path, "0 must be > 0 (a measured cost)");
    return v;
  }
  double number_or(const Json& obj, const char* key, const std::string& path, double min, double fallback) const {
    const Json* j = find(obj, key);
    return j ? number(*j, join(path, key), min) : fallback;
  }
  // An integer; a number written with a fraction or an exponent is taken when its value is whole (8.0, 1e11).
  int64_t integer(const Json& j, const std::string& path, int64_t min, int64_t max) const {
    if (j.is_number_float()) {
      const double d = j.get<double>();
      if (d != std::trunc(d)) fail(path, cat("expected an integer, got a fraction (", j.dump(), ")"));
      if (d < static_cast<double>(min) || d >= static_cast<double>(max) + 1.0)  // max + 1: exact, a power of 2
        fail(path, cat(j.dump(), " is out of range (", min, "..", max, ")"));
      return static_cast<int64_t>(d);
    }
    if (!j.is_number_integer()) fail(path, cat("expected an integer, got ", j.type_name()));
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(path, cat(j.dump(), " is out of range (", min, "..", max, ")"));
    int64_t v = j.get<int64_t>();
    if (v < min || v > max) fail(path, cat(v, " is out of range (", min, "..", max, ")"));
    return v;
  }
  int int_or(const Json& obj, const char* key, const std::string& path, int min, int fallback) const {
    const Json* j = find(obj, key);
    return j ? static_cast<int>(integer(*j, join(path, key), min, INT32_MAX)) : fallback;
  }
  std::string string_or(const Json& obj, const char* key, const std::string& path, const std::string& fallback) const {
    const Json* j = find(obj, key);
    if (!j) return fallback;
    if (!j->is_string()) fail(join(path, key), cat("expected a string, got ", j->type_name()));
    return j->get<std::string>();
  }

  Json parse(const std::string& text) const {
    // A key twice in one object: the parser would keep the last silently, and a copy edited in the wrong place
    // would be ignored as a misspelt field would (those are errors too).
    std::vector<std::set<std::string>> keys;  // of the objects open at this point of the text
    std::string twice;
    auto note_keys = [&](int, Json::parse_event_t event, Json& parsed) {
      if (event == Json::parse_event_t::object_start) {
        keys.emplace_back();
      } else if (event == Json::parse_event_t::object_end) {
        if (!keys.empty()) keys.pop_back();
      } else if (event == Json::parse_event_t::key && !keys.empty()) {
        if (!keys.back().insert(parsed.get<std::string>()).second && twice.empty()) twice = parsed.get<std::string>();
      }
      return true;
    };
    Json j;
    try {
      j = Json::parse(text, note_keys);
    } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
      invalid(cat(prefix_, "not valid JSON: ", e.what()));
    }
    if (!twice.empty()) invalid(cat(prefix_, "the key \"", twice, "\" appears twice in one object"));
    return j;
  }

  // "links": {"<class>": {"alpha_us": x, "bandwidth_GBps": y, "overhead_us": z}, ...}: sets the fields present.
  // Unknown fields of a class are errors. `strict`: values must be >= 0 (topology files); else > 0 (tuning files,
  // measured costs).
  void links(const Json& j, std::array<LinkParams, kLinkClasses>& out, bool strict) const {
    object(j, "links");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "comment") continue;
      const std::string path = join("links", it.key());
      int c = 0;
      while (c < kLinkClasses && it.key() != kLinkNames[c]) ++c;
      if (c == kLinkClasses) fail(path, cat("unknown link class (known: ", link_name_list(), ")"));
      const Json& lj = object(it.value(), path);
      // Both kinds of file: a misspelt field is an error, not a cost silently left at its default.
      only(lj, path, {"alpha_us", "bandwidth_GBps", "overhead_us"});
      LinkParams& lp = out[static_cast<size_t>(c)];
      // In units of seconds and bytes per second, a value must still be finite (1e300 GB/s is not).
      auto finite = [&](double v, const char* key) {
        if (!std::isfinite(v)) fail(join(path, key), "is out of range");
        return v;
      };
      if (const Json* a = find(lj, "alpha_us"))
        lp.alpha_s = finite(us_to_s(value(*a, join(path, "alpha_us"), strict)), "alpha_us");
      if (const Json* b = find(lj, "bandwidth_GBps"))
        lp.bandwidth_Bps = finite(gbps_to_bps(value(*b, join(path, "bandwidth_GBps"), strict)), "bandwidth_GBps");
      if (const Json* o = find(lj, "overhead_us"))
        lp.overhead_s = finite(us_to_s(value(*o, join(path, "overhead_us"), strict)), "overhead_us");
    }
  }

 private:
  std::string prefix_;
};

std::string read_text(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(chorusSystemError, Subsys::Topology, cat(what, " ", path, ": is a directory, not a file"));
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw Error(chorusSystemError, Subsys::Topology, cat(what, " ", path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream os;
  os << f.rdbuf();
  if (f.bad())
    throw Error(chorusSystemError, Subsys::Topology, cat(what, " ", path, ": cannot read: ", std::strerror(errno)));
  return os.str();
}

// One host entry of a file, before "count" expands it.
struct HostEntry {
  Host host;
  int nranks = -1;  // -1: not given
  int count = 0;    // 0: not given
};

HostEntry read_host(const Reader& rd, const Json& hj, const std::string& hp, int first_index) {
  rd.object(hj, hp);
  rd.only(hj, hp,
          {"name", "id", "cores", "numa", "gpus", "nics", "net_egress_GBps", "net_ingress_GBps", "nranks", "count"});
  HostEntry e;
  Host& h = e.host;
  h.name = rd.string_or(hj, "name", hp, cat("host", first_index));
  h.id = rd.string_or(hj, "id", hp, h.name);
  if (const Json* nj = Reader::find(hj, "numa")) {
    const std::string np = Reader::join(hp, "numa");
    rd.array(*nj, np);
    for (size_t i = 0; i < nj->size(); ++i) {
      const std::string p = cat(np, "[", i, "]");
      const Json& o = rd.object((*nj)[i], p);
      rd.only(o, p, {"os_index", "cores", "memory_bytes"});
      NumaNode n;
      n.os_index = rd.int_or(o, "os_index", p, 0, static_cast<int>(i));
      n.cores = rd.int_or(o, "cores", p, 0, 0);
      if (const Json* m = Reader::find(o, "memory_bytes"))
        n.memory_bytes = static_cast<uint64_t>(rd.integer(*m, Reader::join(p, "memory_bytes"), 0, INT64_MAX));
      h.numa.push_back(n);
    }
  }
  int numa_cores = 0;
  for (const NumaNode& n : h.numa) numa_cores += n.cores;
  h.cores = rd.int_or(hj, "cores", hp, 0, numa_cores);
  if (const Json* gj = Reader::find(hj, "gpus")) {
    const std::string gp = Reader::join(hp, "gpus");
    rd.array(*gj, gp);
    for (size_t i = 0; i < gj->size(); ++i) {
      const std::string p = cat(gp, "[", i, "]");
      const Json& o = rd.object((*gj)[i], p);
      rd.only(o, p, {"name", "pci_bus", "numa"});
      Gpu g;
      g.name = rd.string_or(o, "name", p, "");
      g.pci_bus = rd.string_or(o, "pci_bus", p, "");
      g.numa = rd.int_or(o, "numa", p, -1, -1);
      h.gpus.push_back(g);
    }
  }
  if (const Json* nj = Reader::find(hj, "nics")) {
    const std::string np = Reader::join(hp, "nics");
    rd.array(*nj, np);
    for (size_t i = 0; i < nj->size(); ++i) {
      const std::string p = cat(np, "[", i, "]");
      const Json& o = rd.object((*nj)[i], p);
      rd.only(o, p, {"name", "kind", "bandwidth_GBps", "numa"});
      Nic n;
      n.name = rd.string_or(o, "name", p, cat("nic", i));
      n.kind = rd.string_or(o, "kind", p, "ethernet");
      if (!known_nic_kind(n.kind))
        rd.fail(Reader::join(p, "kind"), cat("unknown kind '", n.kind, "' (known: ", nic_kind_list(), ")"));
      n.bandwidth_Bps = gbps_to_bps(rd.number_or(o, "bandwidth_GBps", p, 0, 0));
      n.numa = rd.int_or(o, "numa", p, -1, -1);
      h.nics.push_back(n);
    }
  }
  h.net_egress_Bps = gbps_to_bps(rd.number_or(hj, "net_egress_GBps", hp, 0, 0));
  h.net_ingress_Bps = gbps_to_bps(rd.number_or(hj, "net_ingress_GBps", hp, 0, 0));
  e.nranks = rd.int_or(hj, "nranks", hp, 1, -1);
  e.count = rd.int_or(hj, "count", hp, 1, 0);
  return e;
}

// ---- JSON writing ----

OrderedJson host_json(const Host& h) {
  OrderedJson j;
  j["name"] = h.name;
  if (h.id != h.name) j["id"] = h.id;
  j["cores"] = h.cores;
  if (!h.numa.empty()) {
    OrderedJson a = OrderedJson::array();
    for (const NumaNode& n : h.numa)
      a.push_back({{"os_index", n.os_index}, {"cores", n.cores}, {"memory_bytes", n.memory_bytes}});
    j["numa"] = a;
  }
  if (!h.gpus.empty()) {
    OrderedJson a = OrderedJson::array();
    for (const Gpu& g : h.gpus) a.push_back({{"name", g.name}, {"pci_bus", g.pci_bus}, {"numa", g.numa}});
    j["gpus"] = a;
  }
  if (!h.nics.empty()) {
    OrderedJson a = OrderedJson::array();
    for (const Nic& n : h.nics)
      a.push_back(
          {{"name", n.name}, {"kind", n.kind}, {"bandwidth_GBps", bps_for_file(n.bandwidth_Bps)}, {"numa", n.numa}});
    j["nics"] = a;
  }
  j["net_egress_GBps"] = bps_for_file(h.net_egress_Bps);
  j["net_ingress_GBps"] = bps_for_file(h.net_ingress_Bps);
  return j;
}

// True when `name` is `base` + "-" + index (how "count" names copies).
bool is_copy_name(const std::string& name, const std::string& base, int index) { return name == cat(base, "-", index); }
std::string strip_copy_suffix(const std::string& name) {
  size_t dash = name.rfind('-');
  return dash == std::string::npos ? name : name.substr(0, dash);
}

// Hosts h and g are alike when they differ at most in name and id.
bool alike(const Host& a, const Host& b) {
  Host x = a;
  x.name = b.name;
  x.id = b.id;
  return x == b;
}

// Writes JSON with small objects and arrays on one line, so that files stay short and diffable.
void write_compact(const OrderedJson& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      out += first ? "" : ", ";
      first = false;
      out += OrderedJson(it.key()).dump() + ": ";
      write_compact(it.value(), out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      out += i ? ", " : "";
      write_compact(j[i], out);
    }
    out += ']';
  } else {
    out += j.dump();
  }
}
void write_pretty(const OrderedJson& j, int indent, std::string& out) {
  std::string one;
  write_compact(j, one);
  if ((!j.is_object() && !j.is_array()) || indent + one.size() <= 110 || j.empty()) {
    out += one;
    return;
  }
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  out += j.is_object() ? "{\n" : "[\n";
  size_t i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) {
    out += pad;
    if (j.is_object()) out += OrderedJson(it.key()).dump() + ": ";
    write_pretty(it.value(), indent + 2, out);
    out += i + 1 < j.size() ? ",\n" : "\n";
  }
  out += std::string(static_cast<size_t>(indent), ' ') + (j.is_object() ? "}" : "]");
}

// "1 core", "2 cores"
std::string counted(size_t n, const char* what) { return cat(n, " ", what, n == 1 ? "" : "s"); }

std::string gbps_text(double bps) { return cat(bps / 1e9, " GB/s"); }

// "0-3,5,7-9"
std::string ranges(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    out += cat(out.empty() ? "" : ",", v[i]);
    if (j > i) out += cat("-", v[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

const char* link_class_name(LinkClass c) {
  const int i = static_cast<int>(c);
  CHORUS_ASSERT(i >= 0 && i < kLinkClasses);
  return kLinkNames[i];
}

LinkClass link_class_from_name(const std::string& name) {
  for (int c = 0; c < kLinkClasses; ++c)
    if (name == kLinkNames[c]) return static_cast<LinkClass>(c);
  invalid(cat("unknown link class '", name, "' (known: ", link_name_list(), ")"));
}

LinkClass Topology::link(int a, int b) const {
  CHORUS_ASSERT(a >= 0 && a < nranks() && b >= 0 && b < nranks());
  const RankPlace& x = ranks[static_cast<size_t>(a)];
  const RankPlace& y = ranks[static_cast<size_t>(b)];
  if (x.host != y.host) return LinkClass::Network;
  // Bytes between two GPUs move over NVLink or PCIe whether the ranks are threads of one process or not.
  if (x.gpu >= 0 && y.gpu >= 0) return LinkClass::GpuPeer;
  if (x.process == y.process) return LinkClass::SameProcess;
  if (x.numa < 0 || y.numa < 0 || x.numa == y.numa) return LinkClass::SameNuma;
  return LinkClass::CrossNuma;
}

std::vector<int> Topology::ranks_of_host(int h) const {
  std::vector<int> out;
  for (int r = 0; r < nranks(); ++r)
    if (ranks[static_cast<size_t>(r)].host == h) out.push_back(r);
  return out;
}

std::vector<int> Topology::host_of_rank() const {
  std::vector<int> out;
  out.reserve(ranks.size());
  for (const RankPlace& p : ranks) out.push_back(p.host);
  return out;
}

Topology Topology::subset(const std::vector<int>& members) const {
  Topology t;
  t.links = links;
  t.reduce_Bps = reduce_Bps;
  t.copy_Bps = copy_Bps;
  std::map<int, int> host_index;                  // old host -> new host
  std::vector<std::map<int, int>> process_index;  // per new host: old process -> new process
  std::vector<int> nlocal;                        // per new host: ranks placed so far
  std::set<int> seen;
  for (int m : members) {
    if (m < 0 || m >= nranks() || !seen.insert(m).second)
      throw Error(chorusInvalidArgument, Subsys::Topology,
                  cat("topology subset: member ", m, " is out of range [0, ", nranks(), ") or repeated"));
    const RankPlace& old = ranks[static_cast<size_t>(m)];
    auto [it, added] = host_index.emplace(old.host, t.nhosts());
    if (added) {
      t.hosts.push_back(hosts[static_cast<size_t>(old.host)]);
      process_index.emplace_back();
      nlocal.push_back(0);
    }
    const auto h = static_cast<size_t>(it->second);
    RankPlace place = old;
    place.host = it->second;
    place.local_rank = nlocal[h]++;
    place.process = process_index[h].emplace(old.process, static_cast<int>(process_index[h].size())).first->second;
    t.ranks.push_back(place);
  }
  return t;
}

void Topology::validate() const {
  validate_impl(*this, "topology: ", [](int h) { return cat("hosts[", h, "]"); });
}

void apply_default_costs(Topology& t) {
  for (int c = 0; c < kLinkClasses; ++c) {
    LinkParams& lp = t.links[static_cast<size_t>(c)];
    if (lp.alpha_s == 0) lp.alpha_s = kDefaultLinks[c].alpha_s;
    if (lp.bandwidth_Bps == 0) lp.bandwidth_Bps = kDefaultLinks[c].bandwidth_Bps;
    if (lp.overhead_s == 0) lp.overhead_s = kDefaultLinks[c].overhead_s;
  }
  if (t.reduce_Bps == 0) t.reduce_Bps = kDefaultReduceBps;
  if (t.copy_Bps == 0) t.copy_Bps = kDefaultCopyBps;
  for (Host& h : t.hosts) {
    // Virtual interfaces (veth, bridges) report nominal speeds and often sit on top of a real NIC: not counted.
    double sum = 0;
    for (const Nic& n : h.nics)
      if (n.kind != "virtual") sum += n.bandwidth_Bps;
    if (h.net_egress_Bps == 0) h.net_egress_Bps = sum;
    if (h.net_ingress_Bps == 0) h.net_ingress_Bps = sum;
  }
}

Topology place_ranks(std::vector<Host> hosts, const std::vector<int>& ranks_per_host) {
  if (hosts.size() != ranks_per_host.size())
    invalid(cat("place_ranks: ", hosts.size(), " hosts but ", ranks_per_host.size(), " rank counts"));
  Topology t;
  t.hosts = std::move(hosts);
  for (int h = 0; h < t.nhosts(); ++h) {
    const int k = ranks_per_host[static_cast<size_t>(h)];
    if (k < 1) invalid(cat("place_ranks: host ", h, " has ", k, " ranks (at least 1 each)"));
    for (int l = 0; l < k; ++l) t.ranks.push_back(implicit_place(t.hosts[static_cast<size_t>(h)], h, l));
  }
  apply_default_costs(t);
  t.validate();
  return t;
}

Topology make_cluster(const std::vector<int>& ranks_per_host, double net_Bps) {
  if (ranks_per_host.empty()) invalid("make_cluster: needs at least one host");
  if (!std::isfinite(net_Bps) || net_Bps < 0) invalid(cat("make_cluster: net_Bps ", net_Bps, " must be >= 0"));
  std::vector<Host> hosts;
  for (size_t h = 0; h < ranks_per_host.size(); ++h) {
    Host host;
    host.name = cat("host", h);
    host.id = host.name;
    host.cores = std::max(ranks_per_host[h], 1);
    host.numa.push_back(NumaNode{0, host.cores, 0});
    host.net_egress_Bps = net_Bps;
    host.net_ingress_Bps = net_Bps;
    hosts.push_back(host);
  }
  return place_ranks(std::move(hosts), ranks_per_host);
}

std::string to_json(const Topology& t) {
  OrderedJson j;
  j["version"] = 1;
  // Ranks are written only when the file's implicit placement (host by host, docs/topology.md) would not
  // reproduce them; then each host entry says how many ranks it has.
  std::vector<int> per_host(t.hosts.size(), 0);
  bool implicit = true;
  for (const RankPlace& p : t.ranks) {
    if (p.host < 0 || p.host >= t.nhosts()) {
      implicit = false;
      break;
    }
    ++per_host[static_cast<size_t>(p.host)];
  }
  if (implicit) {
    std::vector<RankPlace> expected;
    for (int h = 0; h < t.nhosts(); ++h)
      for (int l = 0; l < per_host[static_cast<size_t>(h)]; ++l)
        expected.push_back(implicit_place(t.hosts[static_cast<size_t>(h)], h, l));
    implicit = expected == t.ranks;
  }
  for (int c : per_host) implicit = implicit && c > 0;

  OrderedJson hosts = OrderedJson::array();
  for (size_t h = 0; h < t.hosts.size();) {
    // A run of alike hosts named base-0, base-1, ... (ids likewise) with as many ranks each becomes one entry.
    const Host& first = t.hosts[h];
    const std::string base = strip_copy_suffix(first.name);
    const std::string id_base = strip_copy_suffix(first.id);
    size_t m = 0;
    while (h + m < t.hosts.size()) {
      const Host& x = t.hosts[h + m];
      if (!is_copy_name(x.name, base, static_cast<int>(m)) || !is_copy_name(x.id, id_base, static_cast<int>(m)) ||
          !alike(x, first) || (implicit && per_host[h + m] != per_host[h]))
        break;
      ++m;
    }
    OrderedJson hj = host_json(first);
    if (m >= 2) {
      hj["name"] = base;
      if (id_base != base)
        hj["id"] = id_base;
      else
        hj.erase("id");
    } else {
      m = 1;
    }
    if (implicit) hj["nranks"] = per_host[h];
    if (m >= 2) hj["count"] = m;
    hosts.push_back(hj);
    h += m;
  }
  j["hosts"] = hosts;
  if (!implicit) {
    OrderedJson ranks = OrderedJson::array();
    for (const RankPlace& p : t.ranks)
      ranks.push_back(
          {{"host", p.host}, {"local_rank", p.local_rank}, {"process", p.process}, {"numa", p.numa}, {"gpu", p.gpu}});
    j["ranks"] = ranks;
  }
  OrderedJson links;
  for (int c = 0; c < kLinkClasses; ++c) {
    const LinkParams& lp = t.links[static_cast<size_t>(c)];
    links[kLinkNames[c]] = {{"alpha_us", s_for_file(lp.alpha_s)},
                            {"bandwidth_GBps", bps_for_file(lp.bandwidth_Bps)},
                            {"overhead_us", s_for_file(lp.overhead_s)}};
  }
  j["links"] = links;
  j["reduce_GBps"] = bps_for_file(t.reduce_Bps);
  j["copy_GBps"] = bps_for_file(t.copy_Bps);
  std::string out;
  write_pretty(j, 0, out);
  out += '\n';
  return out;
}

Topology from_json(const std::string& text, const std::string& origin) {
  const std::string prefix = cat("topology file ", origin, ": ");
  Reader rd(prefix);
  const Json root = rd.parse(text);
  rd.object(root, "");
  rd.only(root, "", {"version", "hosts", "ranks", "links", "reduce_GBps", "copy_GBps"});
  if (const Json* v = Reader::find(root, "version")) {
    const int64_t version = rd.integer(*v, "version", INT64_MIN, INT64_MAX);
    if (version != 1) rd.fail("version", cat(version, " is not supported (this build reads version 1)"));
  }
  const Json* hj = Reader::find(root, "hosts");
  if (!hj) rd.fail("hosts", "missing: a topology needs at least one host");
  rd.array(*hj, "hosts");
  if (hj->empty()) rd.fail("hosts", "empty: a topology needs at least one host");

  Topology t;
  std::vector<std::string> host_paths;  // expanded host -> how the file names it
  std::vector<int> entry_nranks;        // expanded host -> "nranks" of its entry, -1 when not given
  for (size_t e = 0; e < hj->size(); ++e) {
    const std::string hp = cat("hosts[", e, "]");
    HostEntry entry = read_host(rd, (*hj)[e], hp, t.nhosts());
    if (t.hosts.size() + static_cast<size_t>(std::max(entry.count, 1)) > (1u << 20))
      rd.fail(Reader::join(hp, "count"), "too many hosts (at most 1048576 in all)");
    if (entry.count == 0) {
      t.hosts.push_back(entry.host);
      host_paths.push_back(hp);
      entry_nranks.push_back(entry.nranks);
      continue;
    }
    for (int c = 0; c < entry.count; ++c) {
      Host h = entry.host;
      h.name = cat(h.name, "-", c);
      h.id = cat(h.id, "-", c);
      t.hosts.push_back(h);
      host_paths.push_back(cat(hp, " (copy ", c, " of ", entry.count, ")"));
      entry_nranks.push_back(entry.nranks);
    }
  }

  if (const Json* rj = Reader::find(root, "ranks")) {
    rd.array(*rj, "ranks");
    std::map<std::string, int> by_name;  // -1: several hosts have this name
    for (int h = 0; h < t.nhosts(); ++h) {
      auto [it, fresh] = by_name.emplace(t.hosts[static_cast<size_t>(h)].name, h);
      if (!fresh) it->second = -1;
    }
    std::vector<int> count(t.hosts.size(), 0);
    for (size_t r = 0; r < rj->size(); ++r) {
      const std::string rp = cat("ranks[", r, "]");
      const Json& o = rd.object((*rj)[r], rp);
      rd.only(o, rp, {"host", "local_rank", "process", "numa", "gpu"});
      RankPlace p;
      if (const Json* h = Reader::find(o, "host")) {
        if (h->is_string()) {
          auto it = by_name.find(h->get<std::string>());
          if (it == by_name.end()) rd.fail(rp + ".host", cat("no host is named '", h->get<std::string>(), "'"));
          if (it->second < 0)
            rd.fail(rp + ".host", cat("several hosts are named '", h->get<std::string>(), "': use the index"));
          p.host = it->second;
        } else if (h->is_number_integer()) {
          p.host = static_cast<int>(rd.integer(*h, rp + ".host", 0, t.nhosts() - 1));
        } else {
          rd.fail(rp + ".host", cat("expected a host index or name, got ", h->type_name()));
        }
      }
      const int local = count[static_cast<size_t>(p.host)]++;
      p.local_rank = rd.int_or(o, "local_rank", rp, 0, local);
      p.process = rd.int_or(o, "process", rp, 0, p.local_rank);
      p.numa = rd.int_or(o, "numa", rp, -1, -1);
      p.gpu = rd.int_or(o, "gpu", rp, -1, -1);
      t.ranks.push_back(p);
    }
    for (int h = 0; h < t.nhosts(); ++h) {
      const int want = entry_nranks[static_cast<size_t>(h)];
      if (want >= 0 && want != count[static_cast<size_t>(h)])
        rd.fail(host_paths[static_cast<size_t>(h)] + ".nranks",
                cat(want, " but \"ranks\" places ", count[static_cast<size_t>(h)], " ranks on it"));
    }
  } else {
    for (int h = 0; h < t.nhosts(); ++h) {
      const Host& host = t.hosts[static_cast<size_t>(h)];
      int k = entry_nranks[static_cast<size_t>(h)];
      if (k < 0) k = std::max<int>(1, static_cast<int>(host.gpus.size()));
      if (t.ranks.size() + static_cast<size_t>(k) > (1u << 24))
        rd.fail(host_paths[static_cast<size_t>(h)] + ".nranks", "too many ranks (at most 16777216 in all)");
      for (int l = 0; l < k; ++l) t.ranks.push_back(implicit_place(host, h, l));
    }
  }

  if (const Json* lj = Reader::find(root, "links")) rd.links(*lj, t.links, /*strict=*/true);
  t.reduce_Bps = gbps_to_bps(rd.number_or(root, "reduce_GBps", "", 0, 0));
  t.copy_Bps = gbps_to_bps(rd.number_or(root, "copy_GBps", "", 0, 0));
  apply_default_costs(t);
  validate_impl(t, prefix, [&](int h) { return host_paths[static_cast<size_t>(h)]; });
  return t;
}

Topology load_file(const std::string& path) { return from_json(read_text(path, "topology file"), path); }

void dump_file(const Topology& t, const std::string& path) {
  const std::string text = to_json(t);
  // Written beside the target and renamed over it, so a reader never sees half a file.
  const std::string tmp = cat(path, ".tmp.", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f)
    throw Error(chorusSystemError, Subsys::Topology,
                cat("topology dump ", path, ": cannot create ", tmp, ": ", std::strerror(errno)));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int saved = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    throw Error(chorusSystemError, Subsys::Topology,
                cat("topology dump ", tmp, ": write failed: ", std::strerror(saved)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(chorusSystemError, Subsys::Topology,
                cat("topology dump ", path, ": rename failed: ", std::strerror(err)));
  }
}

void apply_tune_file(Topology& t, const std::string& path) {
  Reader rd(cat("tune file ", path, ": "));
  const Json root = rd.parse(read_text(path, "tune file"));
  rd.object(root, "");
  std::array<LinkParams, kLinkClasses> links = t.links;
  if (const Json* lj = Reader::find(root, "links")) rd.links(*lj, links, /*strict=*/false);
  double reduce = t.reduce_Bps, copy = t.copy_Bps;
  if (const Json* j = Reader::find(root, "reduce_GBps")) reduce = gbps_to_bps(rd.value(*j, "reduce_GBps", false));
  if (const Json* j = Reader::find(root, "copy_GBps")) copy = gbps_to_bps(rd.value(*j, "copy_GBps", false));
  if (!std::isfinite(reduce)) rd.fail("reduce_GBps", "is out of range");
  if (!std::isfinite(copy)) rd.fail("copy_GBps", "is out of range");
  // Applied only when the whole file is good.
  t.links = links;
  t.reduce_Bps = reduce;
  t.copy_Bps = copy;
}

std::string describe(const Topology& t) {
  std::ostringstream os;
  os << "Topology: " << t.nhosts() << (t.nhosts() == 1 ? " host, " : " hosts, ") << t.nranks()
     << (t.nranks() == 1 ? " rank\n" : " ranks\n");
  std::vector<std::vector<int>> of_host(t.hosts.size());
  for (int r = 0; r < t.nranks(); ++r) {
    const int h = t.ranks[static_cast<size_t>(r)].host;
    if (h >= 0 && h < t.nhosts()) of_host[static_cast<size_t>(h)].push_back(r);
  }
  // How a host's ranks sit, independent of their rank numbers: alike hosts with equal layouts print once.
  auto layout = [&](size_t h) {
    std::vector<RankPlace> out;
    for (int r : of_host[h]) {
      RankPlace p = t.ranks[static_cast<size_t>(r)];
      p.host = 0;
      out.push_back(p);
    }
    return out;
  };
  char line[128];
  for (size_t h = 0; h < t.hosts.size();) {
    const Host& host = t.hosts[h];
    size_t m = 1;
    while (h + m < t.hosts.size() && alike(t.hosts[h + m], host) && layout(h + m) == layout(h)) ++m;
    if (m == 1)
      os << "host " << h << " '" << host.name << "' (id " << host.id << ")\n";
    else
      os << "hosts " << h << "-" << h + m - 1 << " (" << m << " alike: '" << host.name << "' .. '"
         << t.hosts[h + m - 1].name << "')\n";
    os << "  " << counted(static_cast<size_t>(host.cores), "core") << ", " << counted(host.numa.size(), "NUMA node")
       << ", " << counted(host.gpus.size(), "GPU") << ", " << counted(host.nics.size(), "NIC")
       << "; network limit per host: out "
       << (host.net_egress_Bps > 0 ? gbps_text(host.net_egress_Bps) : std::string("none")) << ", in "
       << (host.net_ingress_Bps > 0 ? gbps_text(host.net_ingress_Bps) : std::string("none")) << "\n";
    for (const NumaNode& n : host.numa) {
      os << "  NUMA node " << n.os_index << ": " << counted(static_cast<size_t>(n.cores), "core");
      if (n.memory_bytes > 0) {
        std::snprintf(line, sizeof(line), "%.1f", static_cast<double>(n.memory_bytes) / double(1 << 30));
        os << ", " << line << " GiB";
      }
      os << "\n";
    }
    for (size_t g = 0; g < host.gpus.size(); ++g) {
      const Gpu& gpu = host.gpus[g];
      os << "  GPU " << g << ": " << (gpu.name.empty() ? "(unnamed)" : gpu.name);
      if (!gpu.pci_bus.empty()) os << ", PCI " << gpu.pci_bus;
      if (gpu.numa >= 0) os << ", NUMA " << gpu.numa;
      os << "\n";
    }
    for (const Nic& nic : host.nics) {
      os << "  NIC " << nic.name << ": " << nic.kind << ", "
         << (nic.bandwidth_Bps > 0 ? gbps_text(nic.bandwidth_Bps) : std::string("speed unknown"));
      if (nic.numa >= 0) os << ", NUMA " << nic.numa;
      os << "\n";
    }
    if (m == 1) {
      os << "  ranks " << ranges(of_host[h]) << "\n";
    } else {
      os << "  " << of_host[h].size() << " ranks each: " << ranges(of_host[h]) << " .. " << ranges(of_host[h + m - 1])
         << "\n";
    }
    for (const RankPlace& p : layout(h)) {
      os << "    local rank " << p.local_rank << ": process " << p.process;
      if (p.numa >= 0) os << ", NUMA " << p.numa;
      if (p.gpu >= 0) os << ", GPU " << p.gpu;
      os << "\n";
    }
    h += m;
  }
  os << "Links (per connection, one direction; a message of b bytes costs alpha + b / bandwidth, and overhead of\n"
        "the sender's and the receiver's CPU):\n";
  for (int c = 0; c < kLinkClasses; ++c) {
    const LinkParams& lp = t.links[static_cast<size_t>(c)];
    std::snprintf(line, sizeof(line), "  %-13s alpha %8.3g us   bandwidth %8.4g GB/s   overhead %8.3g us\n",
                  kLinkNames[c], lp.alpha_s * 1e6, lp.bandwidth_Bps / 1e9, lp.overhead_s * 1e6);
    os << line;
  }
  os << "Reduce " << gbps_text(t.reduce_Bps) << " of output per rank, copy " << gbps_text(t.copy_Bps) << "\n";
  return os.str();
}

}  // namespace chorus::topo
