// Which RDMA device, port and GID the ibverbs transport uses: CHORUS_IB_HCA and CHORUS_IB_GID_INDEX parsing and
// the choice among what the device reports. Device-free, so it is unit-tested everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::ib {

// CHORUS_IB_HCA: "mlx5_0:1,mlx5_1" picks by name prefix (mlx5_1 also matches mlx5_10) and optional port;
// "=mlx5_1" matches names exactly; "^mlx5_0" excludes the listed ones. Empty: every device.
struct HcaFilter {
  struct Item {
    std::string device;
    int port = 0;  // 0: any port
  };
  std::vector<Item> items;
  bool exclude = false;
  bool exact = false;
  bool matches(const std::string& device, int port) const;
};
// Throws chorus::Error (chorusInvalidArgument) naming CHORUS_IB_HCA and what is wrong.
HcaFilter parse_hca_filter(const std::string& text);

// CHORUS_IB_GID_INDEX: "auto" (or empty) -> -1, else an index 0..255. Throws chorusInvalidArgument.
int parse_gid_index(const std::string& text);

// One GID table entry as the device reports it (ibv_query_gid_ex).
enum class GidType : uint8_t { IB, RoCEv1, RoCEv2 };
struct GidEntry {
  int index = 0;
  std::array<uint8_t, 16> gid{};
  GidType type = GidType::IB;
};
// The GID index to use on a port: `wanted` when it is >= 0 and present (else -1, *why set); on InfiniBand 0 when
// present; on RoCE the first RoCE v2 GID holding an IPv4 address (::ffff:a.b.c.d, routable across subnets), else
// the first RoCE v2 one that is not link-local, else the first non-zero one. -1 when there is none.
int choose_gid(const std::vector<GidEntry>& table, bool roce, int wanted, std::string* why);

}  // namespace chorus::ib
