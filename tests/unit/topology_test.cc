// The topology model: link classes, JSON files (round trip, "count" expansion, every error path naming its field),
// default costs, tuning files, validation, discovery of this host and the example files in topologies/.
#include "topology/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace chorus::topo {
namespace {

std::string example(const std::string& name) { return std::string(CHORUS_SOURCE_DIR) + "/topologies/" + name; }

// A file in the test's temporary directory, removed at the end of the scope.
struct TempFile {
  explicit TempFile(const std::string& name, const std::string& text = "")
      : path(cat(testing::TempDir(), "/chorus_topo_", getpid(), "_", name)) {
    if (!text.empty()) std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

// Runs f, which must throw chorus::Error with `code`; returns the message.
template <typename F>
std::string error_of(F&& f, chorusResult_t code = chorusInvalidArgument) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.subsys(), Subsys::Topology) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// A small but complete topology: two hosts, one with 2 NUMA nodes, 2 GPUs and a NIC, explicit placement.
Topology sample() {
  Topology t;
  Host a;
  a.name = "alpha";
  a.id = "alpha-id";
  a.cores = 16;
  a.numa = {{0, 8, 1ull << 34}, {1, 8, 1ull << 34}};
  a.gpus = {{"NVIDIA H200", "0000:19:00.0", 0}, {"NVIDIA H200", "0000:3b:00.0", 1}};
  a.nics = {{"mlx5_0", "infiniband", 50e9, 0}, {"veth1", "virtual", 1.25e9, -1}};
  Host b;
  b.name = "beta";
  b.id = "beta";
  b.cores = 2;
  b.numa = {{0, 2, 1ull << 30}};
  b.nics = {{"eth0", "ethernet", 0.119e9, 0}};
  t.hosts = {a, b};
  // rank: host, local_rank, process, numa, gpu
  t.ranks = {{0, 0, 0, 0, 0}, {0, 1, 0, 1, 1}, {0, 2, 1, 0, -1}, {0, 3, 2, 1, -1}, {1, 0, 0, -1, -1}, {1, 1, 0, 0, -1}};
  apply_default_costs(t);
  return t;
}

TEST(Topology, LinkClassNames) {
  for (int c = 0; c < kLinkClasses; ++c) {
    const auto lc = static_cast<LinkClass>(c);
    EXPECT_EQ(link_class_from_name(link_class_name(lc)), lc);
  }
  EXPECT_STREQ(link_class_name(LinkClass::SameProcess), "same_process");
  EXPECT_STREQ(link_class_name(LinkClass::SameNuma), "same_numa");
  EXPECT_STREQ(link_class_name(LinkClass::CrossNuma), "cross_numa");
  EXPECT_STREQ(link_class_name(LinkClass::GpuPeer), "gpu_peer");
  EXPECT_STREQ(link_class_name(LinkClass::Network), "network");
  std::string msg = error_of([] { link_class_from_name("nvlink"); });
  EXPECT_NE(msg.find("'nvlink'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("same_process, same_numa, cross_numa, gpu_peer, network"), std::string::npos) << msg;
}

TEST(Topology, LinkClasses) {
  const Topology t = sample();
  t.validate();
  EXPECT_EQ(t.link(0, 1), LinkClass::GpuPeer);    // two GPUs, one process: the bytes still cross NVLink
  EXPECT_EQ(t.link(0, 2), LinkClass::SameNuma);   // processes 0 and 1, both NUMA 0
  EXPECT_EQ(t.link(0, 3), LinkClass::CrossNuma);  // NUMA 0 and 1
  EXPECT_EQ(t.link(2, 3), LinkClass::CrossNuma);
  EXPECT_EQ(t.link(1, 3), LinkClass::SameNuma);     // a GPU rank and a host rank, both NUMA 1
  EXPECT_EQ(t.link(2, 2), LinkClass::SameProcess);  // a rank and itself
  EXPECT_EQ(t.link(4, 5), LinkClass::SameProcess);  // host beta: threads of process 0
  EXPECT_EQ(t.link(0, 4), LinkClass::Network);
  EXPECT_EQ(t.link(5, 3), LinkClass::Network);
  // Unknown NUMA (-1) on either side counts as the same node.
  Topology u = t;
  u.ranks[5].process = 1;
  EXPECT_EQ(u.link(4, 5), LinkClass::SameNuma);
  EXPECT_EQ(&t.params(0, 4), &t.links[static_cast<int>(LinkClass::Network)]);
  EXPECT_DOUBLE_EQ(t.params(0, 4).alpha_s, 30e-6);
  EXPECT_DOUBLE_EQ(t.params(0, 1).bandwidth_Bps, 150e9);
}

TEST(Topology, RanksOfHostAndHostOfRank) {
  const Topology t = sample();
  EXPECT_EQ(t.nranks(), 6);
  EXPECT_EQ(t.nhosts(), 2);
  EXPECT_EQ(t.ranks_of_host(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.ranks_of_host(1), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.host_of_rank(), (std::vector<int>{0, 0, 0, 0, 1, 1}));
  // Interleaved placement: ranks of a host need not be contiguous.
  Topology u = make_cluster({1, 1}, 0);
  u.ranks = {{0, 0, 0, -1, -1}, {1, 0, 0, -1, -1}, {0, 1, 1, -1, -1}};
  u.validate();
  EXPECT_EQ(u.ranks_of_host(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(u.host_of_rank(), (std::vector<int>{0, 1, 0}));
}

TEST(Topology, SubsetKeepsTheMembersPlacesRenumbered) {
  const Topology t = sample();
  // Members 5, 2, 3 (in that new rank order): host beta first, then alpha; local ranks and processes renumbered.
  const Topology u = t.subset({5, 2, 3});
  u.validate();
  ASSERT_EQ(u.nranks(), 3);
  ASSERT_EQ(u.nhosts(), 2);
  EXPECT_EQ(u.hosts[0].name, "beta");
  EXPECT_EQ(u.hosts[1].name, "alpha");
  EXPECT_EQ(u.ranks[0], (RankPlace{0, 0, 0, 0, -1}));
  EXPECT_EQ(u.ranks[1], (RankPlace{1, 0, 0, 0, -1}));
  EXPECT_EQ(u.ranks[2], (RankPlace{1, 1, 1, 1, -1}));
  EXPECT_EQ(u.links, t.links);
  EXPECT_EQ(u.reduce_Bps, t.reduce_Bps);
  // The links between members are the parent's.
  EXPECT_EQ(u.link(0, 1), t.link(5, 2));
  EXPECT_EQ(u.link(1, 2), t.link(2, 3));
  EXPECT_EQ(t.subset({0, 1, 2, 3, 4, 5}), t);
  error_of([&] { t.subset({1, 1}); });
  error_of([&] { t.subset({6}); });
}

TEST(Topology, DefaultCosts) {
  Topology t;
  Host h;
  h.name = h.id = "h";
  h.nics = {{"eth0", "ethernet", 1.25e9, -1}, {"eth1", "ethernet", 3e9, -1}, {"veth0", "virtual", 10e9, -1}};
  Host g;
  g.name = g.id = "g";
  g.net_egress_Bps = 7e9;  // given: kept
  t.hosts = {h, g};
  t.ranks = {{0, 0, 0, -1, -1}, {1, 0, 0, -1, -1}};
  t.links[static_cast<int>(LinkClass::Network)].bandwidth_Bps = 2e9;  // given: kept
  apply_default_costs(t);
  const double expected[kLinkClasses][2] = {{1e-6, 8e9}, {3e-6, 6e9}, {4e-6, 4e9}, {3e-6, 150e9}, {30e-6, 2e9}};
  for (int c = 0; c < kLinkClasses; ++c) {
    EXPECT_DOUBLE_EQ(t.links[c].alpha_s, expected[c][0]) << link_class_name(static_cast<LinkClass>(c));
    EXPECT_DOUBLE_EQ(t.links[c].bandwidth_Bps, expected[c][1]) << link_class_name(static_cast<LinkClass>(c));
  }
  EXPECT_DOUBLE_EQ(t.reduce_Bps, 4e9);
  EXPECT_DOUBLE_EQ(t.copy_Bps, 8e9);
  EXPECT_DOUBLE_EQ(t.hosts[0].net_egress_Bps, 4.25e9);  // the real NICs; the veth's nominal speed is not counted
  EXPECT_DOUBLE_EQ(t.hosts[0].net_ingress_Bps, 4.25e9);
  EXPECT_DOUBLE_EQ(t.hosts[1].net_egress_Bps, 7e9);
  EXPECT_DOUBLE_EQ(t.hosts[1].net_ingress_Bps, 0);  // no NICs: only the per-connection limit applies
}

TEST(Topology, MakeCluster) {
  const Topology t = make_cluster({3, 1, 2}, 0.119e9);
  ASSERT_EQ(t.nhosts(), 3);
  ASSERT_EQ(t.nranks(), 6);
  EXPECT_EQ(t.host_of_rank(), (std::vector<int>{0, 0, 0, 1, 2, 2}));
  EXPECT_EQ(t.ranks[4].local_rank, 0);
  EXPECT_EQ(t.ranks[5].local_rank, 1);
  EXPECT_EQ(t.hosts[2].name, "host2");
  EXPECT_NE(t.hosts[0].id, t.hosts[1].id);
  EXPECT_DOUBLE_EQ(t.hosts[1].net_egress_Bps, 0.119e9);
  EXPECT_EQ(t.link(0, 1), LinkClass::SameNuma);
  EXPECT_EQ(t.link(2, 3), LinkClass::Network);
  EXPECT_DOUBLE_EQ(t.reduce_Bps, 4e9);
  error_of([] { make_cluster({2, 0}, 0); });
  error_of([] { make_cluster({}, 0); });
  error_of([] { make_cluster({1}, -1); });
}

TEST(Topology, PlaceRanks) {
  Host h;
  h.name = h.id = "gpu-node";
  h.numa = {{0, 4, 0}, {1, 4, 0}};
  h.gpus = {{"NVIDIA H200", "", 1}, {"NVIDIA H200", "", -1}};
  const Topology t = place_ranks({h}, {4});
  ASSERT_EQ(t.nranks(), 4);
  EXPECT_EQ(t.ranks[0].gpu, 0);
  EXPECT_EQ(t.ranks[0].numa, 1);  // next to its GPU
  EXPECT_EQ(t.ranks[1].gpu, 1);
  EXPECT_EQ(t.ranks[1].numa, 1);  // GPU's node unknown: round-robin (local 1 -> node 1)
  EXPECT_EQ(t.ranks[2].gpu, -1);
  EXPECT_EQ(t.ranks[2].numa, 0);
  EXPECT_EQ(t.ranks[3].numa, 1);
  EXPECT_EQ(t.ranks[3].process, 3);
  error_of([&] { place_ranks({h}, {1, 1}); });
}

TEST(Topology, JsonRoundTrip) {
  const Topology t = sample();
  const std::string text = to_json(t);
  const Topology back = from_json(text, "round-trip");
  EXPECT_EQ(back, t) << text;
  EXPECT_EQ(to_json(back), text);
  // Values are written in the file's units, shortest form: 30 us, not 3.0000000000000001e-05 s.
  EXPECT_NE(text.find("\"network\": {\"alpha_us\": 30.0, \"bandwidth_GBps\": 1.25, \"overhead_us\": 3.0}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"bandwidth_GBps\": 0.119"), std::string::npos) << text;

  // Implicit placement round-trips as "nranks" and alike hosts named x-0, x-1, ... as one entry with "count".
  Topology c = from_json(R"({"hosts": [{"name": "n", "count": 3, "nranks": 2, "gpus": [{}, {}]},
                                         {"name": "odd", "nranks": 1}]})",
                         "inline");
  ASSERT_EQ(c.nhosts(), 4);
  ASSERT_EQ(c.nranks(), 7);
  const std::string ctext = to_json(c);
  EXPECT_EQ(ctext.find("\"ranks\""), std::string::npos) << ctext;
  EXPECT_NE(ctext.find("\"count\": 3"), std::string::npos) << ctext;
  EXPECT_EQ(from_json(ctext, "again"), c) << ctext;

  // Values that are not short in the file's units still come back bit for bit.
  Topology odd = make_cluster({2}, 1.0 / 3.0 * 1e9);
  odd.links[2].alpha_s = 1.2345678901234567e-7;
  odd.links[3].bandwidth_Bps = 123456789.123456789;
  odd.reduce_Bps = 3.3e9;
  EXPECT_EQ(from_json(to_json(odd), "odd"), odd) << to_json(odd);
}

TEST(Topology, DumpAndLoadFile) {
  const Topology t = sample();
  TempFile f("dump.json");
  dump_file(t, f.path);
  EXPECT_EQ(load_file(f.path), t);
  // Overwrites in place (rename over the old file) and leaves no temporary behind.
  Topology u = make_cluster({1}, 0);
  dump_file(u, f.path);
  EXPECT_EQ(load_file(f.path), u);
  EXPECT_FALSE(std::ifstream(cat(f.path, ".tmp.", getpid())).good());
  const std::string msg =
      error_of([] { dump_file(make_cluster({1}, 0), "/nonexistent-dir/x.json"); }, chorusSystemError);
  EXPECT_NE(msg.find("/nonexistent-dir/x.json"), std::string::npos) << msg;
  const std::string missing = error_of([] { load_file("/nonexistent-dir/t.json"); }, chorusSystemError);
  EXPECT_NE(missing.find("topology file /nonexistent-dir/t.json"), std::string::npos) << missing;
}

TEST(Topology, ImplicitPlacementAndDefaults) {
  const Topology t = from_json(R"({"hosts": [
      {"name": "a", "numa": [{"cores": 4}, {"cores": 4}], "gpus": [{"numa": 1}, {}, {}], "nranks": 4},
      {"name": "b", "id": "b-id"},
      {}]})",
                               "inline");
  ASSERT_EQ(t.nhosts(), 3);
  EXPECT_EQ(t.hosts[0].cores, 8);  // sum of the NUMA nodes'
  EXPECT_EQ(t.hosts[0].numa[1].os_index, 1);
  EXPECT_EQ(t.hosts[0].id, "a");
  EXPECT_EQ(t.hosts[1].id, "b-id");
  EXPECT_EQ(t.hosts[2].name, "host2");
  ASSERT_EQ(t.nranks(), 6);  // 4, then 1 each (no GPUs, no nranks)
  EXPECT_EQ(t.ranks[0].gpu, 0);
  EXPECT_EQ(t.ranks[0].numa, 1);
  EXPECT_EQ(t.ranks[1].gpu, 1);
  EXPECT_EQ(t.ranks[1].numa, 1);  // round-robin: local 1 -> node 1
  EXPECT_EQ(t.ranks[2].numa, 0);
  EXPECT_EQ(t.ranks[3].gpu, -1);
  EXPECT_EQ(t.ranks[3].process, 3);
  EXPECT_EQ(t.ranks[4].host, 1);
  EXPECT_EQ(t.ranks[4].numa, -1);
  EXPECT_EQ(t.ranks[5].host, 2);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::CrossNuma)].bandwidth_Bps, 4e9);

  // Explicit ranks: host by index or name, defaults for the rest.
  const Topology e = from_json(R"({"hosts": [{"name": "x", "gpus": [{}]}, {"name": "y"}],
      "ranks": [{"host": "y"}, {"host": 0, "gpu": 0}, {"host": "x", "process": 0}]})",
                               "inline");
  ASSERT_EQ(e.nranks(), 3);
  EXPECT_EQ(e.host_of_rank(), (std::vector<int>{1, 0, 0}));
  EXPECT_EQ(e.ranks[2].local_rank, 1);
  EXPECT_EQ(e.ranks[2].process, 0);
  EXPECT_EQ(e.ranks[1].gpu, 0);
  EXPECT_EQ(e.link(1, 2), LinkClass::SameProcess);

  // A whole number written with a fraction or an exponent is an integer (tools that write JSON from doubles do).
  const Topology w =
      from_json(R"({"hosts": [{"numa": [{"cores": 8.0, "memory_bytes": 1e11}], "nranks": 2e0}]})", "inline");
  ASSERT_EQ(w.nranks(), 2);
  EXPECT_EQ(w.hosts[0].cores, 8);
  EXPECT_EQ(w.hosts[0].numa[0].memory_bytes, uint64_t{100000000000});
}

TEST(Topology, CountExpansion512x8) {
  const Topology t = load_file(example("cluster-512x8.json"));
  ASSERT_EQ(t.nhosts(), 512);
  ASSERT_EQ(t.nranks(), 4096);
  EXPECT_EQ(t.hosts[0].name, "node-0");
  EXPECT_EQ(t.hosts[511].name, "node-511");
  EXPECT_EQ(t.hosts[511].id, "node-511");
  EXPECT_EQ(t.hosts[7].gpus.size(), 8u);
  EXPECT_EQ(t.hosts[7].gpus[3].name, "NVIDIA H200");
  EXPECT_EQ(t.hosts[7].nics.size(), 8u);
  EXPECT_DOUBLE_EQ(t.hosts[300].net_egress_Bps, 400e9);
  EXPECT_DOUBLE_EQ(t.hosts[300].net_ingress_Bps, 400e9);
  EXPECT_EQ(t.ranks[4095].host, 511);
  EXPECT_EQ(t.ranks[4095].local_rank, 7);
  EXPECT_EQ(t.ranks[4095].gpu, 7);
  EXPECT_EQ(t.ranks[4095].numa, 1);
  EXPECT_EQ(t.link(0, 7), LinkClass::GpuPeer);
  EXPECT_EQ(t.link(7, 8), LinkClass::Network);
  EXPECT_DOUBLE_EQ(t.params(0, 7).bandwidth_Bps, 900e9);
  EXPECT_DOUBLE_EQ(t.params(0, 7).alpha_s, 2e-6);
  EXPECT_DOUBLE_EQ(t.params(0, 8).bandwidth_Bps, 50e9);
  EXPECT_DOUBLE_EQ(t.params(0, 8).alpha_s, 5e-6);
  EXPECT_DOUBLE_EQ(t.reduce_Bps, 2000e9);
  EXPECT_DOUBLE_EQ(t.copy_Bps, 2000e9);
  // Dumped, it stays a few lines: one host entry with "count": 512, no per-rank list.
  const std::string text = to_json(t);
  EXPECT_NE(text.find("\"count\": 512"), std::string::npos);
  EXPECT_EQ(text.find("\"ranks\""), std::string::npos);
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 60) << text;
  EXPECT_EQ(from_json(text, "dump"), t);
  // The summary prints the 512 alike hosts once.
  const std::string d = describe(t);
  EXPECT_NE(d.find("Topology: 512 hosts, 4096 ranks"), std::string::npos) << d;
  EXPECT_NE(d.find("hosts 0-511 (512 alike: 'node-0' .. 'node-511')"), std::string::npos) << d;
  EXPECT_NE(d.find("8 ranks each: 0-7 .. 4088-4095"), std::string::npos) << d;
  EXPECT_LT(std::count(d.begin(), d.end(), '\n'), 40) << d;
}

TEST(Topology, ExampleFiles) {
  for (const char* name : {"emu-2x2.json", "emu-4x2.json"}) {
    const Topology t = load_file(example(name));
    const int hosts = std::string(name) == "emu-2x2.json" ? 2 : 4;
    ASSERT_EQ(t.nhosts(), hosts) << name;
    ASSERT_EQ(t.nranks(), 2 * hosts) << name;
    for (int h = 0; h < hosts; ++h) {
      EXPECT_EQ(t.ranks_of_host(h), (std::vector<int>{2 * h, 2 * h + 1})) << name;
      EXPECT_EQ(t.hosts[h].numa.size(), 1u) << name;
      EXPECT_DOUBLE_EQ(t.hosts[h].net_egress_Bps, 0.119e9) << name;
      EXPECT_DOUBLE_EQ(t.hosts[h].net_ingress_Bps, 0.119e9) << name;
    }
    EXPECT_EQ(t.link(0, 1), LinkClass::SameNuma) << name;
    EXPECT_EQ(t.link(1, 2), LinkClass::Network) << name;
    EXPECT_DOUBLE_EQ(t.params(1, 2).bandwidth_Bps, 0.119e9) << name;
  }
  const Topology u = load_file(example("uneven-3+5.json"));
  ASSERT_EQ(u.nhosts(), 2);
  EXPECT_EQ(u.ranks_of_host(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(u.ranks_of_host(1), (std::vector<int>{3, 4, 5, 6, 7}));
  EXPECT_EQ(u.link(3, 4), LinkClass::CrossNuma);
  EXPECT_EQ(u.link(3, 5), LinkClass::SameNuma);
  EXPECT_EQ(u.link(0, 1), LinkClass::SameNuma);
  EXPECT_DOUBLE_EQ(u.hosts[1].net_egress_Bps, 1.25e9);  // from its NIC
}

// Every way a file can be wrong gives an error that names the file and the field.
TEST(Topology, FileErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* expect;  // substring of the message after "topology file bad.json: "
  };
  const Case cases[] = {
      {"{", "not valid JSON"},
      {R"({"hosts": [{"nics": [{"bandwidth_GBps": 1e400}]}]})", "not valid JSON"},  // out of double's range
      {"[]", "(top level): expected an object, got array"},
      {R"({"hosts": [{"nranks": 2}], "hosts": [{"nranks": 3}]})", "the key \"hosts\" appears twice in one object"},
      {R"({"hosts": [{"cores": 2, "numa": [], "cores": 4}]})", "the key \"cores\" appears twice in one object"},
      {R"({"hosts": []})", "hosts: empty"},
      {R"({"version": 1})", "hosts: missing"},
      {R"({"version": 2, "hosts": [{}]})", "version: 2 is not supported"},
      {R"({"version": "1", "hosts": [{}]})", "version: expected an integer, got string"},
      {R"({"hosts": [{}], "rank": []})", "rank: unknown field"},
      {R"({"hosts": {}})", "hosts: expected an array, got object"},
      {R"({"hosts": [3]})", "hosts[0]: expected an object, got number"},
      {R"({"hosts": [{}, {"nic": []}]})", "hosts[1].nic: unknown field (known: name, id, cores"},
      {R"({"hosts": [{"name": 5}]})", "hosts[0].name: expected a string, got number"},
      {R"({"hosts": [{"id": null}]})", "hosts[0].id: expected a string, got null"},
      {R"({"hosts": [{"cores": 2.5}]})", "hosts[0].cores: expected an integer, got a fraction (2.5)"},
      {R"({"hosts": [{"cores": 1e30}]})", "hosts[0].cores: 1e+30 is out of range (0..2147483647)"},
      {R"({"hosts": [{"cores": -2.0}]})", "hosts[0].cores: -2.0 is out of range"},
      {R"({"hosts": [{"cores": -1}]})", "hosts[0].cores: -1 is out of range"},
      {R"({"hosts": [{"numa": {}}]})", "hosts[0].numa: expected an array"},
      {R"({"hosts": [{"numa": [{"os_index": -2}]}]})", "hosts[0].numa[0].os_index: -2 is out of range"},
      {R"({"hosts": [{"numa": [{"os_index": 1}, {"os_index": 1}]}]})", "hosts[0].numa[1].os_index: 1 appears twice"},
      {R"({"hosts": [{"numa": [{"memory_bytes": "1G"}]}]})", "hosts[0].numa[0].memory_bytes: expected an integer"},
      {R"({"hosts": [{"numa": [{"mem": 1}]}]})", "hosts[0].numa[0].mem: unknown field"},
      {R"({"hosts": [{"gpus": [{"numa": 3}]}]})", "hosts[0].gpus[0].numa: 3 is not a NUMA node of hosts[0]"},
      {R"({"hosts": [{"gpus": [{"pci_bus": 0}]}]})", "hosts[0].gpus[0].pci_bus: expected a string"},
      {R"({"hosts": [{}, {}, {"nics": [{"bandwidth_GBps": "fast"}]}]})",
       "hosts[2].nics[0].bandwidth_GBps: expected a number, got string"},
      {R"({"hosts": [{"nics": [{"bandwidth_GBps": -1}]}]})", "hosts[0].nics[0].bandwidth_GBps: -1 must be >= 0"},
      {R"({"hosts": [{"nics": [{"kind": "wifi"}]}]})", "hosts[0].nics[0].kind: unknown kind 'wifi' (known: ethernet"},
      {R"({"hosts": [{"net_egress_GBps": true}]})", "hosts[0].net_egress_GBps: expected a number, got boolean"},
      {R"({"hosts": [{"net_ingress_GBps": -0.5}]})", "hosts[0].net_ingress_GBps: -0.5 must be >= 0"},
      {R"({"hosts": [{"nranks": 0}]})", "hosts[0].nranks: 0 is out of range"},
      {R"({"hosts": [{"count": 0}]})", "hosts[0].count: 0 is out of range"},
      {R"({"hosts": [{"count": 2000000}]})", "hosts[0].count: too many hosts"},
      {R"({"hosts": [{"nranks": 2000000000}]})", "hosts[0].nranks: too many ranks"},
      {R"({"hosts": [{"name": "a"}, {"name": "a"}]})", "hosts[1].id: 'a' is also the id of hosts[0]"},
      {R"({"hosts": [{"name": "a", "count": 2}, {"name": "a-1"}]})",
       "hosts[1].id: 'a-1' is also the id of hosts[0] (copy 1 of 2)"},
      {R"({"hosts": [{"id": ""}]})", "hosts[0].id: must not be empty"},
      {R"({"hosts": [{}], "ranks": {}})", "ranks: expected an array"},
      {R"({"hosts": [{}], "ranks": []})", "ranks: a topology needs at least one rank"},
      {R"({"hosts": [{}], "ranks": [{"host": 1}]})", "ranks[0].host: 1 is out of range (0..0)"},
      {R"({"hosts": [{}], "ranks": [{"host": "nowhere"}]})", "ranks[0].host: no host is named 'nowhere'"},
      {R"({"hosts": [{"name": "a", "id": "1"}, {"name": "a", "id": "2"}], "ranks": [{"host": "a"}]})",
       "ranks[0].host: several hosts are named 'a'"},
      {R"({"hosts": [{}], "ranks": [{"host": [0]}]})", "ranks[0].host: expected a host index or name, got array"},
      {R"({"hosts": [{}], "ranks": [{"gpu": 0}]})", "ranks[0].gpu: 0 is out of range (hosts[0] has 0 GPUs"},
      {R"({"hosts": [{}], "ranks": [{"numa": 0}]})", "ranks[0].numa: 0 is not a NUMA node of hosts[0]"},
      {R"({"hosts": [{}], "ranks": [{}, {"local_rank": 0}]})", "ranks[1].local_rank: 0 should be 1"},
      {R"({"hosts": [{}], "ranks": [{"process": -1}]})", "ranks[0].process: -1 is out of range"},
      {R"({"hosts": [{}], "ranks": [{"cpu": 1}]})", "ranks[0].cpu: unknown field"},
      {R"({"hosts": [{}, {}], "ranks": [{"host": 0}]})", "hosts[1]: host 'host1' has no ranks"},
      {R"({"hosts": [{"nranks": 2}], "ranks": [{}]})", "hosts[0].nranks: 2 but \"ranks\" places 1 ranks on it"},
      {R"({"hosts": [{}], "links": []})", "links: expected an object"},
      {R"({"hosts": [{}], "links": {"nvlink": {}}})", "links.nvlink: unknown link class (known: same_process"},
      {R"({"hosts": [{}], "links": {"network": {"alpha_us": "5"}}})", "links.network.alpha_us: expected a number"},
      {R"({"hosts": [{}], "links": {"network": {"latency_us": 5}}})", "links.network.latency_us: unknown field"},
      {R"({"hosts": [{}], "links": {"gpu_peer": {"bandwidth_GBps": -900}}})",
       "links.gpu_peer.bandwidth_GBps: -900 must be >= 0"},
      {R"({"hosts": [{}], "reduce_GBps": "x"})", "reduce_GBps: expected a number"},
      {R"({"hosts": [{}], "copy_GBps": -1})", "copy_GBps: -1 must be >= 0"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { from_json(c.json, "bad.json"); });
    EXPECT_EQ(msg.rfind("topology file bad.json: ", 0), 0u) << c.json << "\n  -> " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.json << "\n  -> " << msg << "\n  expected: " << c.expect;
  }
  // Loading a file names its path.
  TempFile f("bad.json", R"({"hosts": [{"nics": [{"bandwidth_GBps": null}]}]})");
  const std::string msg = error_of([&] { load_file(f.path); });
  EXPECT_NE(msg.find(cat("topology file ", f.path, ": hosts[0].nics[0].bandwidth_GBps: expected a number")),
            std::string::npos)
      << msg;
}

TEST(Topology, ValidateRejectsBadIndices) {
  auto expect_invalid = [](const Topology& t, const char* what) {
    const std::string msg = error_of([&] { t.validate(); });
    EXPECT_NE(msg.find(what), std::string::npos) << msg << "\n  expected: " << what;
  };
  const Topology good = sample();
  good.validate();
  Topology t = good;
  t.ranks[2].host = 2;
  expect_invalid(t, "ranks[2].host: 2 is out of range (2 hosts)");
  t = good;
  t.ranks[4].host = -1;
  expect_invalid(t, "ranks[4].host: -1 is out of range");
  t = good;
  t.ranks[1].gpu = 2;
  expect_invalid(t, "ranks[1].gpu: 2 is out of range (hosts[0] has 2 GPUs");
  t = good;
  t.ranks[4].gpu = 0;
  expect_invalid(t, "ranks[4].gpu: 0 is out of range (hosts[1] has 0 GPUs");
  t = good;
  t.ranks[3].numa = 5;
  expect_invalid(t, "ranks[3].numa: 5 is not a NUMA node of hosts[0]");
  t = good;
  t.ranks[3].local_rank = 2;
  expect_invalid(t, "ranks[3].local_rank: 2 should be 3");
  t = good;
  t.ranks[0].process = -1;
  expect_invalid(t, "ranks[0].process: -1 must be >= 0");
  t = good;
  t.ranks[4].host = 0;
  t.ranks[4].local_rank = 4;
  t.ranks[5].local_rank = 5;
  t.ranks[5].host = 0;
  expect_invalid(t, "hosts[1]: host 'beta' has no ranks");
  t = good;
  t.hosts[1].id = "alpha-id";
  expect_invalid(t, "hosts[1].id: 'alpha-id' is also the id of hosts[0]");
  t = good;
  t.hosts[0].gpus[1].numa = 7;
  expect_invalid(t, "hosts[0].gpus[1].numa: 7 is not a NUMA node of hosts[0]");
  t = good;
  t.hosts[0].nics[0].kind = "token-ring";
  expect_invalid(t, "hosts[0].nics[0].kind: unknown kind 'token-ring'");
  t = good;
  t.links[static_cast<int>(LinkClass::SameNuma)].alpha_s = -1e-6;
  expect_invalid(t, "links.same_numa.alpha_us: -1 must be a finite number >= 0");
  t = good;
  t.links[static_cast<int>(LinkClass::Network)].overhead_s = -2e-6;
  expect_invalid(t, "links.network.overhead_us: -2 must be a finite number >= 0");
  t = good;
  t.hosts.clear();
  expect_invalid(t, "hosts: a topology needs at least one host");
  t = good;
  t.ranks.clear();
  expect_invalid(t, "ranks: a topology needs at least one rank");
}

TEST(Topology, TuneFileOverrides) {
  Topology t = load_file(example("emu-2x2.json"));
  const Topology before = t;
  TempFile f("tune.json", R"({"version": 1, "tool": "chorus-tune", "measured_at": "2026-12-01",
      "links": {"same_numa": {"alpha_us": 1.5, "bandwidth_GBps": 7.25},
                "network": {"alpha_us": 55, "overhead_us": 4.5}},
      "reduce_GBps": 9.5})");
  apply_tune_file(t, f.path);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::SameNuma)].alpha_s, 1.5e-6);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::SameNuma)].bandwidth_Bps, 7.25e9);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::Network)].alpha_s, 55e-6);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::Network)].overhead_s, 4.5e-6);
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::SameNuma)].overhead_s, 0.3e-6);     // default, kept
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::Network)].bandwidth_Bps, 0.119e9);  // the file's, kept
  EXPECT_DOUBLE_EQ(t.links[static_cast<int>(LinkClass::CrossNuma)].alpha_s, 4e-6);         // default, kept
  EXPECT_DOUBLE_EQ(t.reduce_Bps, 9.5e9);
  EXPECT_DOUBLE_EQ(t.copy_Bps, before.copy_Bps);
  EXPECT_EQ(t.hosts, before.hosts);
  EXPECT_EQ(t.ranks, before.ranks);

  // A bad tune file names its field and changes nothing.
  Topology u = before;
  TempFile g("badtune.json", R"({"links": {"same_numa": {"alpha_us": 2}, "network": {"bandwidth_GBps": 0}}})");
  const std::string msg = error_of([&] { apply_tune_file(u, g.path); });
  EXPECT_NE(msg.find(cat("tune file ", g.path, ": links.network.bandwidth_GBps: 0 must be > 0")), std::string::npos)
      << msg;
  EXPECT_EQ(u, before);
  TempFile h("badtune2.json", R"({"links": {"infiniband": {"alpha_us": 2}}})");
  const std::string msg2 = error_of([&] { apply_tune_file(u, h.path); });
  EXPECT_NE(msg2.find("links.infiniband: unknown link class"), std::string::npos) << msg2;
  TempFile k("badtune3.json", R"({"copy_GBps": "fast"})");
  const std::string msg3 = error_of([&] { apply_tune_file(u, k.path); });
  EXPECT_NE(msg3.find("copy_GBps: expected a number"), std::string::npos) << msg3;
  TempFile m("badtune4.json", R"({"links": {"network": {"overhead_us": 1e400}}})");
  const std::string msg4 = error_of([&] { apply_tune_file(u, m.path); });
  EXPECT_NE(msg4.find(cat("tune file ", m.path, ": not valid JSON")), std::string::npos) << msg4;
  EXPECT_EQ(u, before);
  // A misspelt cost is an error (it used to be ignored, the default standing in for it), and so is a cost that is
  // finite in the file but not in seconds or bytes per second.
  TempFile n("badtune5.json", R"({"links": {"same_numa": {"alpha_uss": 3}}})");
  const std::string msg5 = error_of([&] { apply_tune_file(u, n.path); });
  EXPECT_NE(msg5.find(cat("tune file ", n.path, ": links.same_numa.alpha_uss: unknown field")), std::string::npos)
      << msg5;
  TempFile o("badtune6.json", R"({"links": {"network": {"bandwidth_GBps": 1e300}}})");
  const std::string msg6 = error_of([&] { apply_tune_file(u, o.path); });
  EXPECT_NE(msg6.find(cat("tune file ", o.path, ": links.network.bandwidth_GBps: is out of range")), std::string::npos)
      << msg6;
  EXPECT_EQ(u, before);
  const std::string dir = error_of([&] { apply_tune_file(u, "/tmp"); }, chorusSystemError);
  EXPECT_NE(dir.find("tune file /tmp: is a directory, not a file"), std::string::npos) << dir;
  error_of([&] { apply_tune_file(u, "/nonexistent-dir/tune.json"); }, chorusSystemError);
}

TEST(Topology, Describe) {
  const std::string d = describe(sample());
  EXPECT_NE(d.find("Topology: 2 hosts, 6 ranks"), std::string::npos) << d;
  EXPECT_NE(d.find("host 0 'alpha' (id alpha-id)"), std::string::npos) << d;
  EXPECT_NE(d.find("16 cores, 2 NUMA nodes, 2 GPUs, 2 NICs; network limit per host: out 50 GB/s, in 50 GB/s"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("NUMA node 1: 8 cores, 16.0 GiB"), std::string::npos) << d;
  EXPECT_NE(d.find("GPU 1: NVIDIA H200, PCI 0000:3b:00.0, NUMA 1"), std::string::npos) << d;
  EXPECT_NE(d.find("NIC mlx5_0: infiniband, 50 GB/s, NUMA 0"), std::string::npos) << d;
  EXPECT_NE(d.find("ranks 0-3"), std::string::npos) << d;
  EXPECT_NE(d.find("local rank 1: process 0, NUMA 1, GPU 1"), std::string::npos) << d;
  EXPECT_NE(d.find("ranks 4-5"), std::string::npos) << d;
  EXPECT_NE(d.find("network       alpha       30 us   bandwidth     1.25 GB/s"), std::string::npos) << d;
  EXPECT_NE(d.find("gpu_peer      alpha        3 us   bandwidth      150 GB/s"), std::string::npos) << d;
  EXPECT_NE(d.find("Reduce 4 GB/s of output per rank, copy 8 GB/s"), std::string::npos) << d;
}

TEST(Topology, DiscoverHost) {
  const Host h = discover_host();
  EXPECT_GE(h.cores, 1);
  EXPECT_FALSE(h.id.empty());
  EXPECT_FALSE(h.name.empty());
  EXPECT_EQ(h.id, host_identity());
  EXPECT_NE(h.id.find(h.name), std::string::npos) << h.id;
  EXPECT_NE(h.id.find("/netns:"), std::string::npos) << h.id;
  int numa_cores = 0;
  for (const NumaNode& n : h.numa) {
    EXPECT_GE(n.os_index, 0);
    EXPECT_GT(n.memory_bytes, 0u);
    numa_cores += n.cores;
  }
  if (!h.numa.empty()) {
    EXPECT_EQ(numa_cores, h.cores);
  }
  for (const Nic& n : h.nics) {
    EXPECT_NE(n.name, "lo");
    EXPECT_GE(n.bandwidth_Bps, 0);
  }
  for (const Gpu& g : h.gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_EQ(g.pci_bus.size(), 12u) << g.pci_bus;  // "0000:19:00.0"
  }
  // The discovered host makes a valid topology that survives a file round trip.
  const Topology t = place_ranks({h}, {2});
  EXPECT_EQ(from_json(to_json(t), "discovered"), t) << to_json(t);
  if (h.gpus.size() >= 2) {
    EXPECT_EQ(t.link(0, 1), LinkClass::GpuPeer);
  }
  if (h.gpus.empty() && h.numa.size() <= 1) {
    EXPECT_EQ(t.link(0, 1), LinkClass::SameNuma);
  }
  EXPECT_NE(t.link(0, 1), LinkClass::Network);
}

// A two-socket GPU server as an hwloc XML export: the GPU, NIC and NUMA logic of discovery, without the hardware.
TEST(Topology, DiscoverFromHwlocXml) {
  const std::string xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <info name="HostName" value="gpubox"/>
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[18-19]">
        <object type="PCIDev" gp_index="22" pci_busid="0000:18:00.0" pci_type="0207 [15b3:1021] [15b3:0023] 00" pci_link_speed="0.000000">
          <object type="OSDev" gp_index="23" name="ib0" osdev_type="2"/>
          <object type="OSDev" gp_index="24" name="mlx5_0" osdev_type="3"/>
        </object>
        <object type="PCIDev" gp_index="21" pci_busid="0000:19:00.0" pci_type="0302 [10de:2335] [10de:18be] a1" pci_link_speed="0.000000">
          <info name="PCIDevice" value="GH100 [H200 SXM 141GB]"/>
        </object>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9" local_memory="2147483648"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13"/>
      </object>
      <object type="Bridge" gp_index="30" bridge_type="0-1" depth="0" bridge_pci="0000:[9a-9b]">
        <object type="PCIDev" gp_index="32" pci_busid="0000:9a:00.0" pci_type="0200 [8086:1593] [8086:0002] 02" pci_link_speed="0.000000">
          <object type="OSDev" gp_index="33" name="eno1" osdev_type="2"/>
        </object>
        <object type="PCIDev" gp_index="34" pci_busid="0000:9a:00.1" pci_type="0300 [1a03:2000] [1a03:2000] 41" pci_link_speed="0.000000"/>
        <object type="PCIDev" gp_index="31" pci_busid="0000:9b:00.0" pci_type="0302 [10de:2335] [10de:18be] a1" pci_link_speed="0.000000"/>
      </object>
    </object>
  </object>
</topology>
)";
  const Host h = discover_host_from_xml(xml);
  EXPECT_EQ(h.name, "gpubox");
  EXPECT_EQ(h.id, "gpubox");
  EXPECT_EQ(h.cores, 4);
  ASSERT_EQ(h.numa.size(), 2u);
  EXPECT_EQ(h.numa[0], (NumaNode{0, 2, 1ull << 30}));
  EXPECT_EQ(h.numa[1], (NumaNode{1, 2, 2ull << 30}));
  // The ASPEED VGA controller (vendor 1a03) is not a GPU for Chorus.
  ASSERT_EQ(h.gpus.size(), 2u);
  EXPECT_EQ(h.gpus[0], (Gpu{"GH100 [H200 SXM 141GB]", "0000:19:00.0", 0}));
  EXPECT_EQ(h.gpus[1], (Gpu{"NVIDIA GPU 10de:2335", "0000:9b:00.0", 1}));
  // ib0 and mlx5_0 are one NIC (one PCI device), named after the RDMA device.
  ASSERT_EQ(h.nics.size(), 2u);
  EXPECT_EQ(h.nics[0], (Nic{"mlx5_0", "infiniband", 0, 0}));
  EXPECT_EQ(h.nics[1], (Nic{"eno1", "ethernet", 0, 1}));
  const Topology t = place_ranks({h}, {3});
  EXPECT_EQ(t.ranks[1].numa, 1);  // next to GPU 1
  EXPECT_EQ(t.ranks[2].numa, 0);  // no GPU: round-robin
  EXPECT_EQ(t.link(0, 1), LinkClass::GpuPeer);
  EXPECT_EQ(t.link(1, 2), LinkClass::CrossNuma);
  EXPECT_EQ(from_json(to_json(t), "xml"), t);

  error_of([] { discover_host_from_xml("<topology>not hwloc</topology>"); });
}

}  // namespace
}  // namespace chorus::topo
