#include "transports/ibverbs/select.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace chorus::ib {

namespace {

[[noreturn]] void bad_hca(const std::string& text, const std::string& why) {
  throw Error(chorusInvalidArgument, Subsys::Transport, cat("CHORUS_IB_HCA='", text, "': ", why));
}

bool valid_device_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

bool is_ipv4_mapped(const std::array<uint8_t, 16>& g) {
  for (int i = 0; i < 10; ++i)
    if (g[i] != 0) return false;
  return g[10] == 0xff && g[11] == 0xff;
}

bool is_link_local(const std::array<uint8_t, 16>& g) { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

bool is_zero(const std::array<uint8_t, 16>& g) { return g == std::array<uint8_t, 16>{}; }

}  // namespace

bool HcaFilter::matches(const std::string& device, int port) const {
  if (items.empty()) return true;
  bool hit = false;
  for (const Item& it : items) {
    const bool name = exact ? device == it.device : device.compare(0, it.device.size(), it.device) == 0;
    if (name && (it.port == 0 || it.port == port)) hit = true;
  }
  return exclude ? !hit : hit;
}

HcaFilter parse_hca_filter(const std::string& text) {
  HcaFilter f;
  std::string s = text;
  // NCCL_IB_HCA's prefixes, in either order: ^ excludes, = matches exactly.
  for (int k = 0; k < 2 && !s.empty(); ++k) {
    if (s[0] == '^' && !f.exclude) {
      f.exclude = true;
      s.erase(0, 1);
    } else if (s[0] == '=' && !f.exact) {
      f.exact = true;
      s.erase(0, 1);
    }
  }
  if (s.empty()) {
    if (f.exclude || f.exact) bad_hca(text, "lists no device after the prefix");
    return f;
  }
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) bad_hca(text, "has an empty entry");
    HcaFilter::Item it;
    const size_t colon = item.find(':');
    it.device = item.substr(0, colon);
    if (!valid_device_name(it.device)) bad_hca(text, cat("'", it.device, "' is not a device name"));
    if (colon != std::string::npos) {
      const std::string p = item.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      const long port = std::strtol(p.c_str(), &end, 10);
      if (p.empty() || *end != '\0' || errno != 0 || port < 1 || port > 255)
        bad_hca(text, cat("port '", p, "' of ", it.device, " is not a port number (1..255)"));
      it.port = static_cast<int>(port);
    }
    f.items.push_back(it);
  }
  if (!s.empty() && s.back() == ',') bad_hca(text, "has an empty entry");
  return f;
}

int parse_gid_index(const std::string& text) {
  if (text.empty() || text == "auto") return -1;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || v < 0 || v > 255)
    throw Error(chorusInvalidArgument, Subsys::Transport,
                cat("CHORUS_IB_GID_INDEX='", text, "' is neither auto nor a GID index (0..255)"));
  return static_cast<int>(v);
}

int choose_gid(const std::vector<GidEntry>& table, bool roce, int wanted, std::string* why) {
  if (wanted >= 0) {
    for (const GidEntry& e : table)
      if (e.index == wanted && !is_zero(e.gid)) return wanted;
    *why = cat("CHORUS_IB_GID_INDEX=", wanted, " is not a valid GID on this port");
    return -1;
  }
  if (!roce) {
    for (const GidEntry& e : table)
      if (e.index == 0 && !is_zero(e.gid)) return 0;
    *why = "the port has no GID 0";
    return -1;
  }
  for (const GidEntry& e : table)
    if (e.type == GidType::RoCEv2 && is_ipv4_mapped(e.gid)) return e.index;
  for (const GidEntry& e : table)
    if (e.type == GidType::RoCEv2 && !is_zero(e.gid) && !is_link_local(e.gid)) return e.index;
  for (const GidEntry& e : table)
    if (!is_zero(e.gid)) return e.index;
  *why = "the port has no valid GID (is an IP address configured on its network interface?)";
  return -1;
}

}  // namespace chorus::ib
