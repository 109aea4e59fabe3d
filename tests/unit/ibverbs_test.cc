// The ibverbs transport's device-free parts: connection data (serialization, validation of malformed input),
// the registration cache (with a fake register/deregister), slice bookkeeping (windows, credits, immediates,
// work-request ids) and device/GID selection. Plus the transport itself where no RDMA device exists: it reports
// itself unavailable with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "transports/ibverbs/conn_data.h"
#include "transports/ibverbs/mr_cache.h"
#include "transports/ibverbs/select.h"
#include "transports/ibverbs/slots.h"
#include "transports/transport.h"

namespace chorus::ib {
namespace {

ConnData sample() {
  ConnData d;
  d.link_layer = LinkLayer::Ethernet;
  d.port = 1;
  d.lid = 0;
  d.mtu = 3;  // 1024
  d.gid_index = 3;
  d.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7};
  d.qps = {{0x1234, 0xabcdef}, {0x1235, 0x000001}};
  d.ring_addr = 0x7f0000001000;
  d.ring_rkey = 0xdeadbeef;
  d.slots = 4;
  d.slot_stride = 262144 + 64;
  return d;
}

std::vector<std::byte> wire(const ConnData& d) { return serialize(d); }

// Parses, expecting a chorusRemoteError whose text contains `what`.
void expect_malformed(const std::vector<std::byte>& w, const std::string& what) {
  try {
    parse_conn_data(w);
    ADD_FAILURE() << "accepted malformed data (expected: " << what << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(IbConnData, RoundTrips) {
  const ConnData d = sample();
  EXPECT_EQ(parse_conn_data(wire(d)), d);
  ConnData ib = sample();
  ib.link_layer = LinkLayer::InfiniBand;
  ib.lid = 17;
  ib.gid_index = 0;
  ib.qps.resize(kMaxQpsPerConnection, {0xffffff, 0xffffff});
  EXPECT_EQ(parse_conn_data(wire(ib)), ib);
}

TEST(IbConnData, RejectsEveryTruncation) {
  const std::vector<std::byte> w = wire(sample());
  for (size_t n = 0; n < w.size(); ++n) {
    std::vector<std::byte> cut(w.begin(), w.begin() + n);
    EXPECT_THROW(parse_conn_data(cut), Error) << "length " << n;
  }
  std::vector<std::byte> longer = w;
  longer.push_back(std::byte{0});
  expect_malformed(longer, "bytes of queue pairs");
}

TEST(IbConnData, NamesTheBadField) {
  auto with = [](auto change) {
    ConnData d = sample();
    change(d);
    return wire(d);
  };
  std::vector<std::byte> w = wire(sample());
  w[0] = std::byte{0};
  expect_malformed(w, "bad magic");
  w = wire(sample());
  w[4] = std::byte{9};
  expect_malformed(w, "version 9");
  w = wire(sample());
  w[8] = std::byte{7};  // link layer
  expect_malformed(w, "unknown link layer 7");
  expect_malformed(with([](ConnData& d) { d.port = 0; }), "port 0");
  expect_malformed(with([](ConnData& d) { d.mtu = 6; }), "mtu 6");
  expect_malformed(with([](ConnData& d) { d.mtu = 0; }), "mtu 0");
  expect_malformed(with([](ConnData& d) { d.qps.clear(); }), "0 queue pairs");
  expect_malformed(with([](ConnData& d) { d.qps.resize(kMaxQpsPerConnection + 1, {1, 1}); }), "17 queue pairs");
  expect_malformed(with([](ConnData& d) { d.qps[1].qpn = 0x1000000; }), "qpn 16777216");
  expect_malformed(with([](ConnData& d) { d.qps[0].qpn = 0; }), "qpn 0");
  expect_malformed(with([](ConnData& d) { d.qps[0].psn = 0x1000000; }), "psn");
  expect_malformed(with([](ConnData& d) { d.ring_addr = 0; }), "null ring address");
  expect_malformed(with([](ConnData& d) { d.ring_addr = ~uint64_t{0} - 100; }), "wraps");
  expect_malformed(with([](ConnData& d) { d.slots = 3; }), "3 slots");
  expect_malformed(with([](ConnData& d) { d.slots = 128; }), "128 slots");
  expect_malformed(with([](ConnData& d) { d.slot_stride = 100; }), "slot stride 100");
  expect_malformed(with([](ConnData& d) { d.gid = {}; }), "RoCE port without a GID");
  expect_malformed(with([](ConnData& d) { d.gid_index = -1; }), "RoCE port without a GID");
  expect_malformed(with([](ConnData& d) { d.gid_index = -5; }), "gid index -5");
  expect_malformed(with([](ConnData& d) {
                     d.link_layer = LinkLayer::InfiniBand;
                     d.lid = 0;
                   }),
                   "without a LID");
}

TEST(IbConnData, RandomBytesNeverCrashTheParser) {
  std::mt19937 rng(7);
  const std::vector<std::byte> good = wire(sample());
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> w = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) w[rng() % w.size()] = static_cast<std::byte>(rng());
    if (rng() % 8 == 0) w.resize(rng() % (w.size() + 8));
    try {
      const ConnData d = parse_conn_data(w);
      EXPECT_FALSE(d.qps.empty());
      EXPECT_GE(mtu_bytes(d.mtu), 256);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusRemoteError);
    }
  }
}

TEST(IbConnData, IncompatibilityNamesTheSetting) {
  const ConnData a = sample();
  EXPECT_EQ(incompatibility(a, a), "");
  ConnData b = a;
  b.link_layer = LinkLayer::InfiniBand;
  EXPECT_NE(incompatibility(a, b).find("link layers differ"), std::string::npos);
  b = a;
  b.qps.pop_back();
  EXPECT_NE(incompatibility(a, b).find("CHORUS_IB_QPS_PER_CONNECTION"), std::string::npos);
  b = a;
  b.slots = 8;
  EXPECT_NE(incompatibility(a, b).find("CHORUS_FIFO_DEPTH"), std::string::npos);
  b = a;
  b.slot_stride += 64;
  EXPECT_NE(incompatibility(a, b).find("CHORUS_SLICE_BYTES"), std::string::npos);
}

TEST(IbConnData, Text) {
  EXPECT_EQ(mtu_bytes(1), 256);
  EXPECT_EQ(mtu_bytes(5), 4096);
  EXPECT_EQ(gid_text(sample().gid), "::ffff:10.0.0.7");
}

// A fake device: registrations are numbered; the test sees every register and deregister.
struct FakeDevice {
  std::map<uint32_t, std::pair<uintptr_t, size_t>> live;  // lkey -> range
  uint32_t next = 1;
  int registers = 0, deregisters = 0;
  bool fail_next = false;
  MrCache make(MrCache::Limits limits = {}) {
    return MrCache(
        [this](uintptr_t a, size_t n) {
          if (fail_next) {
            fail_next = false;
            throw std::runtime_error("ibv_reg_mr failed");
          }
          EXPECT_EQ(a % 4096, 0u);
          EXPECT_EQ(n % 4096, 0u);
          Registration r;
          r.lkey = next;
          r.rkey = next + 1000;
          live[next++] = {a, n};
          ++registers;
          return r;
        },
        [this](const Registration& r) {
          EXPECT_EQ(live.count(r.lkey), 1u) << "deregistered twice";
          live.erase(r.lkey);
          ++deregisters;
        },
        limits);
  }
  // No two live registrations overlap? (The cache may retire overlapping pinned ones, which stay live.)
  bool covers(uint32_t lkey, uintptr_t a, size_t n) const {
    auto it = live.find(lkey);
    return it != live.end() && it->second.first <= a && a + n <= it->second.first + it->second.second;
  }
};

const void* at(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(IbMrCache, ReusesACoveringRegistration) {
  FakeDevice dev;
  {
    MrCache cache = dev.make();
    {
      MrCache::Ref a = cache.acquire(at(0x10010), 100);
      EXPECT_TRUE(dev.covers(a->lkey, 0x10010, 100));
      EXPECT_EQ(a->addr, 0x10000u);
      EXPECT_EQ(a->len, 4096u);
      MrCache::Ref b = cache.acquire(at(0x10100), 3000);  // inside the same page: a hit while pinned
      EXPECT_EQ(b->lkey, a->lkey);
    }
    MrCache::Ref c = cache.acquire(at(0x10000), 4096);  // unpinned but cached: still a hit
    EXPECT_EQ(dev.registers, 1);
    EXPECT_EQ(cache.stats().hits, 2u);
    EXPECT_EQ(cache.stats().misses, 1u);
  }
  EXPECT_EQ(dev.deregisters, 1);
  EXPECT_TRUE(dev.live.empty());
}

TEST(IbMrCache, GrowsOverIdleNeighboursAndRetiresPinnedOnes) {
  FakeDevice dev;
  MrCache cache = dev.make();
  uint32_t first;
  {
    MrCache::Ref a = cache.acquire(at(0x20000), 4096);
    first = a->lkey;
  }
  // Overlaps the idle one and goes beyond: one registration replaces it.
  MrCache::Ref b = cache.acquire(at(0x20800), 8192);
  EXPECT_EQ(b->addr, 0x20000u);
  EXPECT_EQ(b->len, 3 * 4096u);
  EXPECT_EQ(dev.live.count(first), 0u);
  EXPECT_EQ(cache.stats().entries, 1u);
  // Overlapping a pinned one: the pinned one stays registered for its holder but leaves the cache.
  MrCache::Ref c = cache.acquire(at(0x22000), 16384);
  EXPECT_TRUE(dev.covers(b->lkey, 0x20000, 3 * 4096));
  EXPECT_EQ(c->addr, 0x22000u);
  EXPECT_EQ(cache.stats().retired, 1u);
  EXPECT_EQ(cache.stats().entries, 1u);
  const uint32_t b_key = b->lkey;
  b.reset();
  EXPECT_EQ(dev.live.count(b_key), 0u) << "a retired registration goes with its last holder";
  EXPECT_EQ(cache.stats().retired, 0u);
  // Now served by the new one.
  MrCache::Ref d = cache.acquire(at(0x22100), 64);
  EXPECT_EQ(d->lkey, c->lkey);
}

TEST(IbMrCache, EvictsTheLeastRecentlyUsedIdleEntry) {
  FakeDevice dev;
  MrCache cache = dev.make({/*max_entries=*/3, /*max_bytes=*/size_t{1} << 40, 4096});
  std::vector<uint32_t> keys;
  for (uintptr_t i = 0; i < 3; ++i) keys.push_back(cache.acquire(at(0x100000 * (i + 1)), 64)->lkey);
  cache.acquire(at(0x100000), 64);  // touch the first: the second is now the oldest
  MrCache::Ref pinned = cache.acquire(at(0x300000), 64);
  cache.acquire(at(0x400000), 64);  // a fourth: one must go
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(dev.live.count(keys[1]), 0u) << "the least recently used one";
  EXPECT_EQ(dev.live.count(keys[0]), 1u);
  EXPECT_EQ(dev.live.count(keys[2]), 1u);
}

TEST(IbMrCache, PinnedEntriesAreNeverEvictedAndLimitsHoldOnceReleased) {
  FakeDevice dev;
  MrCache cache = dev.make({/*max_entries=*/2, /*max_bytes=*/size_t{1} << 40, 4096});
  std::vector<MrCache::Ref> refs;
  for (uintptr_t i = 0; i < 4; ++i) refs.push_back(cache.acquire(at(0x100000 * (i + 1)), 64));
  EXPECT_EQ(cache.stats().entries, 4u) << "over the limit while everything is pinned";
  EXPECT_EQ(dev.deregisters, 0);
  refs.clear();
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(dev.deregisters, 2);
}

TEST(IbMrCache, ByteLimit) {
  FakeDevice dev;
  MrCache cache = dev.make({/*max_entries=*/100, /*max_bytes=*/3 * 4096, 4096});
  for (uintptr_t i = 0; i < 5; ++i) cache.acquire(at(0x100000 * (i + 1)), 4096);
  EXPECT_LE(cache.stats().bytes, 3u * 4096);
  EXPECT_EQ(cache.stats().entries, 3u);
}

TEST(IbMrCache, InvalidationDropsOverlappingRegistrations) {
  FakeDevice dev;
  MrCache cache = dev.make();
  const uint32_t a = cache.acquire(at(0x10000), 4096)->lkey;
  const uint32_t b = cache.acquire(at(0x20000), 4096)->lkey;
  const uint32_t c = cache.acquire(at(0x30000), 4096)->lkey;
  MrCache::Ref pinned = cache.acquire(at(0x20000), 64);
  cache.invalidate(at(0x10fff), 0x10002);  // touches a and b (pinned), not c
  EXPECT_EQ(dev.live.count(a), 0u);
  EXPECT_EQ(dev.live.count(b), 1u) << "pinned: deregistered when released";
  EXPECT_EQ(dev.live.count(c), 1u);
  EXPECT_EQ(cache.stats().invalidations, 2u);
  // The freed range is registered afresh, not served from the invalidated entry.
  MrCache::Ref again = cache.acquire(at(0x20000), 64);
  EXPECT_NE(again->lkey, b);
  pinned.reset();
  EXPECT_EQ(dev.live.count(b), 0u);
  cache.invalidate(at(0), 0);  // nothing
}

TEST(IbMrCache, AFailedRegistrationLeavesTheCacheUnchanged) {
  FakeDevice dev;
  MrCache cache = dev.make();
  cache.acquire(at(0x10000), 64);
  dev.fail_next = true;
  EXPECT_THROW(cache.acquire(at(0x10000), 8192), std::runtime_error);
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(dev.live.size(), 1u);
  EXPECT_EQ(cache.acquire(at(0x10000), 64)->lkey, 1u);
}

TEST(IbMrCache, RandomUseKeepsRegistrationsDisjointAndCovering) {
  FakeDevice dev;
  std::mt19937 rng(3);
  {
    MrCache cache = dev.make({/*max_entries=*/8, /*max_bytes=*/size_t{1} << 40, 4096});
    std::vector<std::pair<MrCache::Ref, std::pair<uintptr_t, size_t>>> held;
    for (int i = 0; i < 5000; ++i) {
      const int what = static_cast<int>(rng() % 10);
      if (what < 6) {
        const uintptr_t a = 0x100000 + rng() % (64 * 4096);
        const size_t n = 1 + rng() % (4 * 4096);
        MrCache::Ref r = cache.acquire(at(a), n);
        ASSERT_TRUE(dev.covers(r->lkey, a, n));
        held.emplace_back(std::move(r), std::make_pair(a, n));
      } else if (what < 9 && !held.empty()) {
        held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      } else {
        cache.invalidate(at(0x100000 + rng() % (64 * 4096)), 1 + rng() % 8192);
      }
      for (auto& [ref, range] : held) ASSERT_TRUE(dev.covers(ref->lkey, range.first, range.second));
      if (held.size() > 6) held.erase(held.begin());
    }
  }
  EXPECT_TRUE(dev.live.empty());
  EXPECT_EQ(dev.registers, dev.deregisters);
}

TEST(IbSlots, ImmediatesRoundTrip) {
  for (uint32_t v : {0u, 1u, 12345u, kImmValueMask})
    for (ImmKind k : {ImmKind::Data, ImmKind::Credit}) EXPECT_EQ(decode_imm(encode_imm({k, v})), (Imm{k, v}));
  EXPECT_EQ(encode_imm({ImmKind::Credit, 5}), 0x80000005u);
  EXPECT_EQ(decode_imm(0x80000000u).kind, ImmKind::Credit);
  EXPECT_EQ(unwrap_count(0, 5), 5u);
  EXPECT_EQ(unwrap_count(kImmValueMask - 1, 2), uint64_t{kImmValueMask} + 3);
  EXPECT_EQ(unwrap_count(uint64_t{5} << 31, 0), uint64_t{5} << 31);
}

TEST(IbSlots, WorkRequestIdsRoundTrip) {
  for (WrKind k : {WrKind::Data, WrKind::Credit, WrKind::Recv})
    for (uint8_t qp : {0, 7, 15})
      for (uint32_t conn : {0u, 99u, 0xffffffu})
        for (uint32_t seq : {0u, 1u, 0xffffffffu}) {
          const WrId id{k, qp, conn, seq};
          EXPECT_EQ(decode_wr_id(encode_wr_id(id)), id);
        }
  EXPECT_FALSE(decode_wr_id(0).has_value());
  EXPECT_FALSE(decode_wr_id(uint64_t{9} << 60).has_value());
}

TEST(IbSlots, SenderNeedsBothTheLocalCompletionAndTheCredit) {
  SendWindow s(2);
  ASSERT_TRUE(s.can_post());
  EXPECT_EQ(s.post(), 0u);
  EXPECT_EQ(s.post(), 1u);
  EXPECT_FALSE(s.can_post()) << "two in flight";
  std::string why;
  EXPECT_TRUE(s.on_credit(1, &why));
  EXPECT_FALSE(s.can_post()) << "credited but the write of slot 0 has not completed";
  EXPECT_TRUE(s.on_write_done(0));
  EXPECT_TRUE(s.can_post());
  EXPECT_FALSE(s.idle());
  EXPECT_FALSE(s.on_write_done(0)) << "twice";
  EXPECT_TRUE(s.on_write_done(1));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(s.post(), 2u);
  EXPECT_FALSE(s.can_post()) << "slot 1 is free here but not credited";
  EXPECT_FALSE(s.on_credit(4, &why)) << "more than was sent";
  EXPECT_NE(why.find("credit for 4"), std::string::npos);
  EXPECT_TRUE(s.on_credit(2, &why));
  EXPECT_TRUE(s.on_credit(1, &why) || true);  // a stale credit never moves the window back
  EXPECT_EQ(s.credited(), 2u);
}

TEST(IbSlots, ReceiverTakesOutOfOrderArrivalsInOrder) {
  RecvWindow r(4);
  std::string why;
  EXPECT_FALSE(r.ready());
  EXPECT_EQ(r.on_data(2, &why), 2u);  // queue pair 2 was faster
  EXPECT_FALSE(r.ready());
  EXPECT_EQ(r.on_data(0, &why), 0u);
  EXPECT_TRUE(r.ready());
  EXPECT_EQ(r.next_slot(), 0u);
  EXPECT_EQ(r.release(), 1u);
  EXPECT_FALSE(r.ready());
  EXPECT_FALSE(r.on_data(2, &why).has_value());
  EXPECT_NE(why.find("twice"), std::string::npos);
  EXPECT_FALSE(r.on_data(5, &why).has_value()) << "beyond the window 1..4";
  EXPECT_NE(why.find("overran"), std::string::npos);
  EXPECT_EQ(r.on_data(4, &why), 4u);
  EXPECT_EQ(r.on_data(1, &why), 1u);
  EXPECT_EQ(r.release(), 2u);
  EXPECT_EQ(r.release(), 3u);
}

// Both windows driven together across the 31-bit wrap, with completions and arrivals in random order (several
// queue pairs), as the connection drives them: every message arrives once, in order, into the slot it was sent to.
TEST(IbSlots, SimulatedConnectionAcrossTheWrap) {
  constexpr uint32_t depth = 4;
  SendWindow s(depth);
  RecvWindow r(depth);
  std::mt19937 rng(11);
  // Start near the wrap by replaying many messages quickly.
  std::vector<uint64_t> in_flight, to_complete;
  std::vector<uint32_t> credits;
  uint64_t delivered = 0;
  const uint64_t total = 3000;
  std::string why;
  while (delivered < total) {
    const int what = static_cast<int>(rng() % 4);
    if (what == 0 && s.can_post() && s.posted() < total) {
      const uint64_t seq = s.post();
      in_flight.push_back(seq);
      to_complete.push_back(seq);
    } else if (what == 1 && !in_flight.empty()) {
      const size_t i = rng() % in_flight.size();
      const uint64_t seq = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<long>(i));
      auto got = r.on_data(static_cast<uint32_t>(seq & kImmValueMask), &why);
      ASSERT_TRUE(got.has_value()) << why;
      ASSERT_EQ(*got, seq);
    } else if (what == 2 && !to_complete.empty()) {
      const size_t i = rng() % to_complete.size();
      ASSERT_TRUE(s.on_write_done(static_cast<uint32_t>(to_complete[i])));
      to_complete.erase(to_complete.begin() + static_cast<long>(i));
    } else if (what == 3) {
      while (r.ready()) {
        ASSERT_EQ(r.next(), delivered);
        credits.push_back(r.release());
        ++delivered;
      }
      if (!credits.empty()) {
        ASSERT_TRUE(s.on_credit(credits.back(), &why)) << why;  // the newest carries them all
        credits.clear();
      }
    }
  }
  EXPECT_EQ(s.posted(), total);
}

TEST(IbSelect, HcaFilter) {
  EXPECT_TRUE(parse_hca_filter("").matches("mlx5_0", 1));
  HcaFilter f = parse_hca_filter("mlx5_0:1,mlx5_1");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_FALSE(f.matches("mlx5_0", 2));
  EXPECT_TRUE(f.matches("mlx5_1", 2));
  EXPECT_TRUE(f.matches("mlx5_10", 1)) << "prefix match";
  EXPECT_FALSE(f.matches("rxe0", 1));
  f = parse_hca_filter("=mlx5_1");
  EXPECT_FALSE(f.matches("mlx5_10", 1));
  EXPECT_TRUE(f.matches("mlx5_1", 1));
  f = parse_hca_filter("^mlx5_0");
  EXPECT_FALSE(f.matches("mlx5_0", 1));
  EXPECT_TRUE(f.matches("mlx5_1", 1));
  f = parse_hca_filter("^=mlx5_1:1");
  EXPECT_TRUE(f.exclude && f.exact);
  EXPECT_FALSE(f.matches("mlx5_1", 1));
  EXPECT_TRUE(f.matches("mlx5_1", 2));
  EXPECT_TRUE(f.matches("mlx5_10", 1));
  for (const char* bad :
       {"^", "=", "mlx5_0:", "mlx5_0:0", "mlx5_0:x", "mlx5_0:256", "a,,b", "a,", "bad name", "mlx5_0:1:2"}) {
    try {
      parse_hca_filter(bad);
      ADD_FAILURE() << "accepted CHORUS_IB_HCA='" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("CHORUS_IB_HCA"), std::string::npos);
    }
  }
}

TEST(IbSelect, GidIndex) {
  EXPECT_EQ(parse_gid_index(""), -1);
  EXPECT_EQ(parse_gid_index("auto"), -1);
  EXPECT_EQ(parse_gid_index("3"), 3);
  for (const char* bad : {"-1", "256", "x", "3x"}) EXPECT_THROW(parse_gid_index(bad), Error) << bad;
}

TEST(IbSelect, GidChoice) {
  auto gid = [](std::initializer_list<int> head, std::initializer_list<int> tail) {
    std::array<uint8_t, 16> g{};
    int i = 0;
    for (int b : head) g[i++] = static_cast<uint8_t>(b);
    i = 16 - static_cast<int>(tail.size());
    for (int b : tail) g[i++] = static_cast<uint8_t>(b);
    return g;
  };
  const auto link_local = gid({0xfe, 0x80}, {1});
  const auto v4 = gid({}, {0xff, 0xff, 10, 0, 0, 1});
  const auto global6 = gid({0x20, 0x01, 0x0d, 0xb8}, {1});
  std::string why;
  // RoCE: an IPv4-mapped v2 GID first, then another v2 one, then anything.
  std::vector<GidEntry> t = {{0, link_local, GidType::RoCEv1},
                             {1, link_local, GidType::RoCEv2},
                             {2, global6, GidType::RoCEv2},
                             {3, v4, GidType::RoCEv1},
                             {4, v4, GidType::RoCEv2}};
  EXPECT_EQ(choose_gid(t, true, -1, &why), 4);
  t.pop_back();
  EXPECT_EQ(choose_gid(t, true, -1, &why), 2);
  t.erase(t.begin() + 2);
  EXPECT_EQ(choose_gid(t, true, -1, &why), 0) << "only link-local v2 and v1 left: the first valid one";
  EXPECT_EQ(choose_gid(t, true, 3, &why), 3);
  EXPECT_EQ(choose_gid(t, true, 9, &why), -1);
  EXPECT_NE(why.find("CHORUS_IB_GID_INDEX=9"), std::string::npos);
  EXPECT_EQ(choose_gid({}, true, -1, &why), -1);
  EXPECT_NE(why.find("no valid GID"), std::string::npos);
  // InfiniBand: GID 0.
  EXPECT_EQ(choose_gid({{0, link_local, GidType::IB}}, false, -1, &why), 0);
  EXPECT_EQ(choose_gid({{1, link_local, GidType::IB}}, false, -1, &why), -1);
}

// Where there is no RDMA device (or no libibverbs in the build) the transport exists, reaches no peer, and says why.
TEST(IbTransport, WithoutADeviceItIsUnavailableWithTheReason) {
  const TransportReport report = report_transport("ibverbs");
  std::unique_ptr<Transport> t = make_transport("ibverbs", Secret{});
  if (report.available) GTEST_SKIP() << "an RDMA device is present: " << report.found;
  EXPECT_TRUE(report.found.find("unavailable") != std::string::npos || report.found.find("not built") == 0)
      << report.found;
  const std::string why = t->unavailable_reason();
  EXPECT_FALSE(why.empty());
  EXPECT_TRUE(why.find("no RDMA device") != std::string::npos || why.find("not built") != std::string::npos) << why;
  PeerInfo a = local_peer_info(0), b = local_peer_info(1);
  t->describe(a);
  EXPECT_EQ(a.transport_caps.count("ibverbs"), 0u);
  EXPECT_FALSE(t->can_connect(a, b));
}

}  // namespace
}  // namespace chorus::ib
