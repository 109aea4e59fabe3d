// A memory registration cache: registering memory with an RDMA device pins its pages and costs tens of
// microseconds to milliseconds, so a buffer used again is registered once. Parameterised over the register and
// deregister functions (ibv_reg_mr / ibv_dereg_mr in the transport, a fake in the unit tests), so it needs no device.
//
// - acquire(p, len) returns a pinned registration covering [p, p + len): a cached one that covers the range (a
//   hit), else a new one over the range rounded out to pages and merged with every idle registration it overlaps.
//   Pinned registrations are never deregistered; unpinning happens when the Ref is destroyed.
// - Live registrations never overlap, so a lookup is one ordered-map search.
// - Beyond max_entries or max_bytes, the least recently used idle registrations are evicted.
// - invalidate(p, len) says the memory was freed or remapped: overlapping registrations leave the cache at once;
//   a pinned one is deregistered when its last Ref goes.
// Not thread-safe: one cache belongs to one transport instance, used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace chorus::ib {

struct Registration {
  uintptr_t addr = 0;
  size_t len = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  void* handle = nullptr;  // the transport's (struct ibv_mr*)
};

class MrCache {
 public:
  // Registers [addr, addr + len) (page-aligned); throws on failure.
  using RegisterFn = std::function<Registration(uintptr_t addr, size_t len)>;
  using DeregisterFn = std::function<void(const Registration&)>;
  struct Limits {
    size_t max_entries = 1024;
    size_t max_bytes = size_t{64} << 30;
    size_t page = 4096;  // a power of two
  };
  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0, invalidations = 0;
    size_t entries = 0, bytes = 0;  // live (cached) registrations
    size_t retired = 0;             // invalidated or superseded but still pinned
  };

 private:
  struct Entry {
    Registration reg;
    int pins = 0;
    uint64_t last_use = 0;
    bool retired = false;
  };

 public:
  // A pinned registration. Move-only; unpins on destruction. Must not outlive its cache.
  class Ref {
   public:
    Ref() = default;
    Ref(Ref&& o) noexcept : cache_(o.cache_), e_(o.e_) { o.cache_ = nullptr, o.e_ = nullptr; }
    Ref& operator=(Ref&& o) noexcept {
      if (this != &o) {
        reset();
        cache_ = o.cache_, e_ = o.e_;
        o.cache_ = nullptr, o.e_ = nullptr;
      }
      return *this;
    }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() { reset(); }
    void reset();
    explicit operator bool() const { return e_ != nullptr; }
    const Registration& operator*() const { return e_->reg; }
    const Registration* operator->() const { return &e_->reg; }

   private:
    friend class MrCache;
    Ref(MrCache* c, Entry* e) : cache_(c), e_(e) {}
    MrCache* cache_ = nullptr;
    Entry* e_ = nullptr;
  };

  MrCache(RegisterFn reg, DeregisterFn dereg, Limits limits);
  MrCache(RegisterFn reg, DeregisterFn dereg) : MrCache(std::move(reg), std::move(dereg), Limits{}) {}
  // Deregisters everything. Every Ref must be gone.
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // len > 0. Throws what the register function throws (the cache is unchanged then).
  Ref acquire(const void* p, size_t len);
  void invalidate(const void* p, size_t len);
  Stats stats() const;

 private:
  void unpin(Entry* e);
  void retire(std::map<uintptr_t, std::unique_ptr<Entry>>::iterator it);
  void evict_to_limits();

  RegisterFn reg_;
  DeregisterFn dereg_;
  Limits limits_;
  std::map<uintptr_t, std::unique_ptr<Entry>> live_;  // by start address; ranges never overlap
  std::vector<std::unique_ptr<Entry>> retired_;       // out of the cache, still pinned
  uint64_t clock_ = 0;
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace chorus::ib
