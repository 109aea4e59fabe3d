// The topology model (DESIGN.md, "src/topology/"): which hosts exist, where every rank sits, and what moving bytes
// between two ranks costs. It feeds the hierarchical programs (who shares a host), the simulator (alpha, beta per
// link class, gamma for reductions) and the selector.
//
// Sources, in order: a topology file (CHORUS_TOPO_FILE) stands in for the real machine; otherwise each rank
// discovers its host with hwloc and the communicator all-gathers host identities (boot id + network namespace +
// host name, so each network namespace is its own host). Link parameters come from defaults per class, overridden
// by a topology file's "links" and then by a tuning file (CHORUS_TUNE_FILE, written by chorus-tune).
//
// Units: times in seconds, bandwidths in bytes per second (JSON files use microseconds and GB/s = 1e9 bytes/s, as
// the field quotes them). Thread-safety: a Topology is a value; const methods are safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::topo {

// How two ranks are joined. Ordered from cheapest to dearest.
enum class LinkClass : uint8_t {
  SameProcess,  // threads of one process (local transport)
  SameNuma,     // processes on one host, same NUMA node (shared memory)
  CrossNuma,    // processes on one host, different NUMA nodes (shared memory across the socket link)
  GpuPeer,      // GPUs of one host with peer access (NVLink or PCIe peer-to-peer)
  Network,      // different hosts
  Count
};
constexpr int kLinkClasses = static_cast<int>(LinkClass::Count);
const char* link_class_name(LinkClass c);  // "same_process", "same_numa", "cross_numa", "gpu_peer", "network"
// The class named `name`, or throws chorusInvalidArgument listing the names.
LinkClass link_class_from_name(const std::string& name);

// Cost of one message of b bytes on one connection: alpha + b / bandwidth (Hockney's model), plus `overhead_s` of
// the sender's CPU and again of the receiver's (LogGP's o: Alexandrov et al., "LogGP", SPAA 1995). Alpha overlaps
// with other messages; the overhead does not: a rank that posts k messages spends k * overhead_s doing it.
struct LinkParams {
  double alpha_s = 0;        // latency of one message, seconds
  double bandwidth_Bps = 0;  // one direction, one connection, bytes per second
  double overhead_s = 0;     // CPU time one message costs its sender, and its receiver, seconds (LogGP's o)
  bool operator==(const LinkParams&) const = default;
};

struct NumaNode {
  int os_index = 0;
  int cores = 0;
  uint64_t memory_bytes = 0;
  bool operator==(const NumaNode&) const = default;
};

struct Gpu {
  std::string name;     // "NVIDIA H200"
  std::string pci_bus;  // "0000:19:00.0"
  int numa = -1;        // NUMA node's os_index, -1 when unknown
  bool operator==(const Gpu&) const = default;
};

struct Nic {
  std::string name;          // "eth0", "mlx5_0"
  std::string kind;          // "ethernet", "infiniband", "roce", "virtual" (veth, bridge: no device), "other"
  double bandwidth_Bps = 0;  // one direction; 0 when unknown
  int numa = -1;
  bool operator==(const Nic&) const = default;
};

struct Host {
  std::string name;  // host name, for people
  std::string id;    // identity: equal iff same (emulated) host
  int cores = 0;     // physical cores (hwloc), or logical CPUs when cores are unknown
  std::vector<NumaNode> numa;
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  // All ranks of this host share these network limits, each direction, bytes per second (0: not limited beyond
  // the per-connection bandwidth). Defaults to the sum of the NICs' bandwidth.
  double net_egress_Bps = 0;
  double net_ingress_Bps = 0;
  bool operator==(const Host&) const = default;
};

struct RankPlace {
  int host = 0;        // index into Topology::hosts
  int local_rank = 0;  // index among the ranks of its host, in rank order
  int process = 0;     // index of its process among the processes of its host
  int numa = -1;       // NUMA node's os_index it is bound to, -1 when unknown/unbound
  int gpu = -1;        // index into its host's gpus, -1 for host-only ranks
  bool operator==(const RankPlace&) const = default;
};

struct Topology {
  std::vector<Host> hosts;
  std::vector<RankPlace> ranks;
  std::array<LinkParams, kLinkClasses> links{};
  double reduce_Bps = 0;  // gamma: bytes of output one rank reduces (a (+) b -> c) per second
  double copy_Bps = 0;    // bytes one rank copies per second (memcpy)

  int nranks() const { return static_cast<int>(ranks.size()); }
  int nhosts() const { return static_cast<int>(hosts.size()); }
  // Different hosts: Network. Same host: GpuPeer when both ranks have a GPU (even as threads of one process: the
  // bytes cross NVLink/PCIe), else SameProcess for one process, else SameNuma when the NUMA nodes are equal or
  // either is unknown (-1), else CrossNuma. a == b is SameProcess (or GpuPeer). Ranks must be in range.
  LinkClass link(int a, int b) const;
  const LinkParams& params(int a, int b) const { return links[static_cast<int>(link(a, b))]; }
  // Ranks of host h, ascending.
  std::vector<int> ranks_of_host(int h) const;
  // rank -> host index, the shape hierarchical programs are generated from.
  std::vector<int> host_of_rank() const;
  // The topology of a communicator made of `members` (ranks of this one; member i becomes rank i): the hosts they
  // use, in order of first use, with local ranks and processes renumbered in rank order; costs and limits kept.
  // Members must be distinct and in range (chorusInvalidArgument otherwise).
  Topology subset(const std::vector<int>& members) const;
  // Throws chorusInvalidArgument when indices are out of range, a host has no ranks, or local ranks are not
  // 0..k-1 in rank order; also on empty or duplicate host ids, GPU or NUMA indices the host lacks, unknown NIC
  // kinds and negative costs (0 is allowed: unset until apply_default_costs). The message names the field:
  // "topology: ranks[3].gpu: 2 is out of range (hosts[0] has 2 GPUs; -1 means none)".
  void validate() const;
  bool operator==(const Topology&) const = default;
};

// Default link parameters and gamma (measured on the development machines; MACHINE-NOTES.md), used for every
// value no file provides: every zero alpha, bandwidth, overhead, reduce_Bps, copy_Bps. A host's zero net_egress/ingress
// becomes the sum of its NICs' bandwidth, virtual NICs excepted (their speeds are nominal and they often sit on a
// real NIC); still 0 without such NICs (only the per-connection bandwidth limits).
void apply_default_costs(Topology& t);

// This host as hwloc sees it (NUMA nodes, cores, GPUs, NICs), with `id` from host_identity(). GPUs are NVIDIA PCI
// display/3D controllers in PCI bus order; NICs are hwloc's network and RDMA devices (one per PCI device) plus
// virtual interfaces (veth, bridges; not lo), speeds from sysfs. hwloc runs once per process (its GPU plugins
// are disabled: no CUDA or NVML initialisation). Throws chorusSystemError when hwloc fails.
Host discover_host();
// Boot id + network namespace inode + host name.
std::string host_identity();
// The host an hwloc 2 XML export describes (`lstopo --of xml`, hwloc_topology_export_xmlbuffer), found the way
// discover_host() finds this one, with nothing read from this machine: name and id from the export's HostName,
// NIC speeds unknown (0), network devices "ethernet", RDMA devices "infiniband". Throws chorusInvalidArgument when
// hwloc cannot read the XML.
Host discover_host_from_xml(const std::string& xml);

// A synthetic cluster: `ranks_per_host[h]` ranks on host h, ranks numbered host by host; host h is "host<h>" with
// one core per rank and one NUMA node, each host's network limited to net_Bps each way (0: only the per-connection
// bandwidth), default costs. For tests and chorus-plan. Throws chorusInvalidArgument on a count < 1.
Topology make_cluster(const std::vector<int>& ranks_per_host, double net_Bps);
// `hosts` with ranks_per_host[h] ranks on host h, placed the way a topology file without "ranks" places them
// (docs/topology.md: host by host, GPU i to local rank i, ...), default costs applied, validated. Throws
// chorusInvalidArgument when the sizes differ, a count is < 1 or the hosts are invalid.
Topology place_ranks(std::vector<Host> hosts, const std::vector<int>& ranks_per_host);

// JSON (schema in docs/topology.md). from_json throws chorusInvalidArgument naming the file (origin) and the
// offending field ("topology file x.json: hosts[2].nics[0].bandwidth_GBps: expected a number"); it applies the
// default costs and validates. to_json writes alike hosts as one entry with "count" and omits "ranks" when the
// implicit placement reproduces them; from_json(to_json(t)) == t for every valid t whose costs are applied.
std::string to_json(const Topology& t);
Topology from_json(const std::string& text, const std::string& origin);
// from_json of a file; chorusSystemError when it cannot be read.
Topology load_file(const std::string& path);
// Writes to_json(t) atomically (a temporary file beside `path`, renamed over it); chorusSystemError on failure.
void dump_file(const Topology& t, const std::string& path);
// Overrides links / reduce / copy from a tuning file (the "links", "reduce_GBps", "copy_GBps" fields only; other
// fields are ignored). Values must be > 0. On any error (chorusInvalidArgument naming the field, chorusSystemError
// when unreadable) t is unchanged.
void apply_tune_file(Topology& t, const std::string& path);

// Human-readable summary (chorus-info --topology).
std::string describe(const Topology& t);

}  // namespace chorus::topo
