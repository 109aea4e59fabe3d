// Discovery of this host with hwloc 2 (NUMA nodes, cores, GPUs, NICs) and the host identity that tells (emulated)
// hosts apart.
#include <hwloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "topology/topology.h"

namespace chorus::topo {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string pci_bus_id(hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

// The os_index of the one NUMA node closest to an I/O object, -1 when it is not attached to exactly one.
int numa_of(hwloc_topology_t topo, hwloc_obj_t io) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, io);
  if (anc == nullptr || anc->nodeset == nullptr || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

// Network interface speed in bytes per second from sysfs (Mbit/s there); 0 when unknown (virtual interfaces, a link
// that is down, or a VM's virtio NIC report -1 or nothing).
double netdev_Bps(const std::string& ifname) {
  const std::string text = read_first_line("/sys/class/net/" + ifname + "/speed");
  char* end = nullptr;
  const long mbit = std::strtol(text.c_str(), &end, 10);
  return end != text.c_str() && mbit > 0 ? static_cast<double>(mbit) * 1e6 / 8 : 0;
}

// A device-backed interface's kind from its ARPHRD_* type in sysfs: 1 Ethernet, 32 InfiniBand (IPoIB).
std::string netdev_kind(const std::string& ifname) {
  const std::string type = read_first_line("/sys/class/net/" + ifname + "/type");
  if (type.empty() || type == "1") return "ethernet";
  if (type == "32") return "infiniband";
  return "other";
}

// An RDMA device's port 1: link layer ("InfiniBand" or "Ethernet" = RoCE) and rate ("400 Gb/sec (4X NDR)").
Nic rdma_nic(const std::string& dev) {
  Nic n;
  n.name = dev;
  const std::string port = "/sys/class/infiniband/" + dev + "/ports/1/";
  n.kind = read_first_line(port + "link_layer") == "Ethernet" ? "roce" : "infiniband";
  const std::string rate = read_first_line(port + "rate");
  char* end = nullptr;
  const double gbit = std::strtod(rate.c_str(), &end);
  if (end != rate.c_str() && gbit > 0) n.bandwidth_Bps = gbit * 1e9 / 8;
  return n;
}

// GPU model name: the NVIDIA driver's /proc file is cheap and needs no CUDA or NVML initialisation; hwloc's PCI
// name database is the fallback.
std::string gpu_name(hwloc_obj_t pci, bool local) {
  std::ifstream f;
  if (local) f.open("/proc/driver/nvidia/gpus/" + pci_bus_id(pci) + "/information");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Model:", 0) == 0) {
      size_t b = line.find_first_not_of(" \t", 6);
      if (b != std::string::npos) return line.substr(b);
    }
  }
  if (const char* name = hwloc_obj_get_info_by_name(pci, "PCIDevice")) return name;
  char buf[48];
  std::snprintf(buf, sizeof(buf), "NVIDIA GPU %04x:%04x", pci->attr->pcidev.vendor_id, pci->attr->pcidev.device_id);
  return buf;
}

struct HwlocTopology {
  hwloc_topology_t topo = nullptr;
  ~HwlocTopology() {
    if (topo) hwloc_topology_destroy(topo);
  }
};

[[noreturn]] void hwloc_failed(const char* call) {
  throw Error(chorusSystemError, Subsys::Topology, cat("hwloc: ", call, " failed: ", std::strerror(errno)));
}

// This machine (xml == nullptr) or the one an XML export describes. `local`: facts hwloc lacks (NIC speeds and
// kinds, GPU names, virtual interfaces) are read from this machine's sysfs and /proc.
Host discover_with_hwloc(const std::string* xml) {
  const bool local = xml == nullptr;
  HwlocTopology h;
  if (hwloc_topology_init(&h.topo) != 0) hwloc_failed("hwloc_topology_init");
  // GPU plugins (CUDA, NVML, OpenCL, ROCm SMI, Level Zero) would initialise those runtimes inside the caller's
  // process; PCI vendor and class ids tell GPUs apart without them. Unknown names are fine (plugin not installed).
  for (const char* c : {"cuda", "nvml", "opencl", "rsmi", "levelzero", "gl"})
    hwloc_topology_set_components(h.topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
  if (hwloc_topology_set_io_types_filter(h.topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0)
    hwloc_failed("hwloc_topology_set_io_types_filter");
  if (xml && (xml->size() > INT32_MAX ||
              hwloc_topology_set_xmlbuffer(h.topo, xml->data(), static_cast<int>(xml->size())) != 0))
    hwloc_failed("hwloc_topology_set_xmlbuffer");
  if (hwloc_topology_load(h.topo) != 0) {
    if (xml)
      throw Error(chorusInvalidArgument, Subsys::Topology, "hwloc: cannot read the XML topology (hwloc 2 format)");
    hwloc_failed("hwloc_topology_load");
  }
  hwloc_topology_t topo = h.topo;

  Host host;
  if (local) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host.name = name;
  } else {
    const char* name = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "HostName");
    host.name = name ? name : "hwloc-xml";
    host.id = host.name;
  }
  int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  if (cores <= 0) cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  host.cores = std::max(cores, 1);

  const int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nnuma; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.cores = node->cpuset ? hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_CORE) : 0;
    if (n.cores <= 0 && node->cpuset)
      n.cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_PU);
    n.memory_bytes = node->attr->numanode.local_memory;
    host.numa.push_back(n);
  }
  // The NUMA nodes a NIC or GPU is attached to must be among those listed (a CPU-less memory node is listed too).
  auto known_numa = [&](int os_index) {
    for (const NumaNode& n : host.numa)
      if (n.os_index == os_index) return os_index;
    return -1;
  };

  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci; pci = hwloc_get_next_pcidev(topo, pci)) {
    if (pci->attr->pcidev.vendor_id == 0x10de && (pci->attr->pcidev.class_id >> 8) == 0x03) {
      Gpu g;
      g.name = gpu_name(pci, local);
      g.pci_bus = pci_bus_id(pci);
      g.numa = known_numa(numa_of(topo, pci));
      host.gpus.push_back(g);
    }
  }

  // PCI bus order: nvidia-smi's, and CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID (zero-padded hex sorts as numbers).
  std::stable_sort(host.gpus.begin(), host.gpus.end(),
                   [](const Gpu& x, const Gpu& y) { return x.pci_bus < y.pci_bus; });

  // NICs: one per PCI device. An RDMA device (openfabrics) and its netdev are the same NIC, named after the RDMA
  // device, which is what an RDMA transport opens.
  std::set<std::string> seen_netdevs;
  std::map<hwloc_obj_t, size_t> nic_of_pci;
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    const auto type = os->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    if (os->name == nullptr || std::strcmp(os->name, "lo") == 0) continue;
    if (type == HWLOC_OBJ_OSDEV_NETWORK) seen_netdevs.insert(os->name);
    Nic nic;
    if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      nic = local ? rdma_nic(os->name) : Nic{os->name, "infiniband", 0, -1};
    } else {
      nic.name = os->name;
      nic.kind = local ? netdev_kind(os->name) : "ethernet";
      nic.bandwidth_Bps = local ? netdev_Bps(os->name) : 0;
    }
    hwloc_obj_t parent = os->parent;
    nic.numa = parent ? known_numa(numa_of(topo, parent)) : -1;
    const bool on_pci = parent != nullptr && parent->type == HWLOC_OBJ_PCI_DEVICE;
    if (on_pci) {
      auto it = nic_of_pci.find(parent);
      if (it != nic_of_pci.end()) {
        Nic& prev = host.nics[it->second];
        if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
          if (nic.bandwidth_Bps == 0) nic.bandwidth_Bps = prev.bandwidth_Bps;
          prev = nic;
        } else if (prev.bandwidth_Bps == 0) {
          prev.bandwidth_Bps = nic.bandwidth_Bps;
        }
        continue;
      }
      nic_of_pci[parent] = host.nics.size();
    }
    host.nics.push_back(nic);
  }
  // hwloc lists only interfaces backed by a device; the veth of an emulated host (network namespace) and bridges
  // are not, and sysfs shows them.
  if (FILE* p = local ? std::fopen("/proc/net/dev", "r") : nullptr) {
    char line[512];
    while (std::fgets(line, sizeof(line), p)) {
      char* colon = std::strchr(line, ':');
      if (!colon) continue;  // the two header lines
      *colon = '\0';
      std::string ifname(line + std::strspn(line, " "));
      if (ifname == "lo" || seen_netdevs.count(ifname) || exists("/sys/class/net/" + ifname + "/device")) continue;
      Nic nic;
      nic.name = ifname;
      nic.kind = "virtual";
      nic.bandwidth_Bps = netdev_Bps(ifname);
      host.nics.push_back(nic);
    }
    std::fclose(p);
  }
  CHORUS_INFO(Topology, "discovered host %s: %d cores, %zu NUMA nodes, %zu GPUs, %zu NICs", host.name.c_str(),
              host.cores, host.numa.size(), host.gpus.size(), host.nics.size());
  return host;
}

}  // namespace

std::string host_identity() {
  // Not the hostname alone: emulated hosts (network namespaces) share it, and so do containers cloned from one image.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  struct stat st {};
  const uint64_t netns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  return cat(host, "/", read_first_line("/proc/sys/kernel/random/boot_id"), "/netns:", netns);
}

Host discover_host() {
  // hwloc takes tens of milliseconds and the machine does not change while the process runs. The identity is cheap
  // and is computed every time, so it always names the network namespace the caller is in now.
  static const Host cached = discover_with_hwloc(nullptr);
  Host h = cached;
  h.id = host_identity();
  return h;
}

Host discover_host_from_xml(const std::string& xml) { return discover_with_hwloc(&xml); }

}  // namespace chorus::topo
