// A point in time by which a blocking wait must finish. Every wait in Chorus takes one.
#pragma once

#include <chrono>
#include <cstdint>

namespace chorus {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kNeverMs = int64_t{1} << 40;
  // `ms` from now; beyond 2^40 ms (about 35 years) it is never, so that no setting can overflow the clock.
  static Deadline after_ms(int64_t ms) {
    if (ms >= kNeverMs) return never();
    return Deadline(Clock::now() + std::chrono::milliseconds(ms));
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  bool passed() const { return Clock::now() >= t_; }
  // Milliseconds left, clamped to [0, INT32_MAX] (for poll()).
  int remaining_ms() const {
    if (t_ == Clock::time_point::max()) return INT32_MAX;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t_ - Clock::now()).count();
    return left < 0 ? 0 : (left > INT32_MAX ? INT32_MAX : static_cast<int>(left));
  }
  Clock::time_point time() const { return t_; }

 private:
  explicit Deadline(Clock::time_point t) : t_(t) {}
  Clock::time_point t_;
};

}  // namespace chorus
