#include "transports/ibverbs/mr_cache.h"

#include <algorithm>

#include "core/error.h"

namespace chorus::ib {

void MrCache::Ref::reset() {
  if (cache_ != nullptr && e_ != nullptr) cache_->unpin(e_);
  cache_ = nullptr;
  e_ = nullptr;
}

MrCache::MrCache(RegisterFn reg, DeregisterFn dereg, Limits limits)
    : reg_(std::move(reg)), dereg_(std::move(dereg)), limits_(limits) {
  CHORUS_ASSERT(limits_.page > 0 && (limits_.page & (limits_.page - 1)) == 0);
}

MrCache::~MrCache() {
  for (auto& [start, e] : live_) {
    CHORUS_ASSERT(e->pins == 0);
    dereg_(e->reg);
  }
  CHORUS_ASSERT(retired_.empty());
}

MrCache::Ref MrCache::acquire(const void* p, size_t len) {
  CHORUS_ASSERT(len > 0);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  CHORUS_ASSERT(a + len > a);
  const uintptr_t b = a + len;
  // The one live entry that could cover a: the last starting at or before it.
  auto it = live_.upper_bound(a);
  if (it != live_.begin()) {
    Entry* e = std::prev(it)->second.get();
    if (e->reg.addr + e->reg.len >= b) {
      ++stats_.hits;
      e->last_use = ++clock_;
      ++e->pins;
      return Ref(this, e);
    }
  }
  ++stats_.misses;
  // Miss: register the page-rounded range, grown to swallow the idle entries it overlaps (they are replaced by
  // the new one); pinned overlapping entries are retired, valid for their holders but no longer handed out.
  uintptr_t lo = a & ~(limits_.page - 1);
  uintptr_t hi = (b + limits_.page - 1) & ~(limits_.page - 1);
  std::vector<std::map<uintptr_t, std::unique_ptr<Entry>>::iterator> overlapping;
  it = live_.upper_bound(lo);
  if (it != live_.begin() && std::prev(it)->second->reg.addr + std::prev(it)->second->reg.len > lo) --it;
  for (; it != live_.end() && it->first < hi; ++it) overlapping.push_back(it);
  for (auto& o : overlapping)
    if (o->second->pins == 0) {
      lo = std::min(lo, o->second->reg.addr);
      hi = std::max(hi, o->second->reg.addr + o->second->reg.len);
    }
  auto made = std::make_unique<Entry>();
  made->reg = reg_(lo, hi - lo);  // throws: nothing changed yet
  made->reg.addr = lo;
  made->reg.len = hi - lo;
  for (auto& o : overlapping) {
    if (o->second->pins == 0) {
      dereg_(o->second->reg);
      bytes_ -= o->second->reg.len;
      live_.erase(o);
    } else {
      retire(o);
    }
  }
  Entry* e = made.get();
  e->last_use = ++clock_;
  e->pins = 1;
  bytes_ += e->reg.len;
  live_.emplace(lo, std::move(made));
  evict_to_limits();
  return Ref(this, e);
}

void MrCache::retire(std::map<uintptr_t, std::unique_ptr<Entry>>::iterator it) {
  it->second->retired = true;
  bytes_ -= it->second->reg.len;
  retired_.push_back(std::move(it->second));
  live_.erase(it);
}

void MrCache::invalidate(const void* p, size_t len) {
  if (len == 0) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + len;
  auto it = live_.upper_bound(a);
  if (it != live_.begin() && std::prev(it)->second->reg.addr + std::prev(it)->second->reg.len > a) --it;
  while (it != live_.end() && it->first < b) {
    auto next = std::next(it);
    ++stats_.invalidations;
    if (it->second->pins == 0) {
      dereg_(it->second->reg);
      bytes_ -= it->second->reg.len;
      live_.erase(it);
    } else {
      retire(it);
    }
    it = next;
  }
}

void MrCache::unpin(Entry* e) {
  CHORUS_ASSERT(e->pins > 0);
  if (--e->pins > 0) return;
  if (e->retired) {
    auto it = std::find_if(retired_.begin(), retired_.end(), [e](const auto& r) { return r.get() == e; });
    CHORUS_ASSERT(it != retired_.end());
    dereg_(e->reg);
    retired_.erase(it);
    return;
  }
  evict_to_limits();  // an entry that could not be evicted while pinned may go now
}

void MrCache::evict_to_limits() {
  while (live_.size() > limits_.max_entries || bytes_ > limits_.max_bytes) {
    auto victim = live_.end();
    for (auto it = live_.begin(); it != live_.end(); ++it)
      if (it->second->pins == 0 && (victim == live_.end() || it->second->last_use < victim->second->last_use))
        victim = it;
    if (victim == live_.end()) return;  // everything is pinned: over the limit until something is released
    dereg_(victim->second->reg);
    bytes_ -= victim->second->reg.len;
    live_.erase(victim);
    ++stats_.evictions;
  }
}

MrCache::Stats MrCache::stats() const {
  Stats s = stats_;
  s.entries = live_.size();
  s.bytes = bytes_;
  s.retired = retired_.size();
  return s;
}

}  // namespace chorus::ib
