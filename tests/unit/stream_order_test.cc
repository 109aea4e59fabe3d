// The communicator's places for stream-ordered calls (CommImpl::reserve / post / cancel, used by collectives on
// device buffers, src/runtime/cuda_stream.h): a call takes its place when issued and runs there even when it is
// posted later from another thread, so a blocking call issued after it waits for it. Checked here with host
// buffers, two ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.h"
#include "core/communicator.h"
#include "tests/common/world.h"

namespace chorus {
namespace {

using Clock = std::chrono::steady_clock;

CollArgs all_reduce(const float* send, float* recv, size_t count) {
  CollArgs a;
  a.coll = algo::Coll::AllReduce;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = chorusFloat32;
  a.op = chorusSum;
  return a;
}

void on_two_ranks(const std::function<void(CommImpl&, int)>& fn) {
  const UniqueIdData id = create_unique_id();
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      CommImpl c(id, 2, r);
      fn(c, r);
    });
  for (auto& t : ts) t.join();
}

TEST(StreamOrder, ABlockingCallWaitsForAPlaceReservedBeforeIt) {
  on_two_ranks([](CommImpl& c, int r) {
    const size_t n = 1000;
    std::vector<float> xa(n, 1.0f + r), ya(n, 0.0f), xb(n, 10.0f * (r + 1)), yb(n, 0.0f);
    std::atomic<bool> a_done{false};
    std::atomic<chorusResult_t> a_result{chorusInternalError};
    auto place = c.reserve([&](chorusResult_t res) {
      a_result = res;
      a_done = true;
    });
    CollArgs a = all_reduce(xa.data(), ya.data(), n);
    c.validate(a);
    // Posted later, from another thread (as a CUDA host function would).
    Clock::time_point posted;
    std::thread poster([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      posted = Clock::now();
      c.post(place, a);
    });
    CollArgs b = all_reduce(xb.data(), yb.data(), n);
    c.validate(b);
    c.run_blocking(b);  // issued after the reserved call: runs after it
    const Clock::time_point b_done = Clock::now();
    poster.join();
    EXPECT_TRUE(a_done.load());
    EXPECT_EQ(a_result.load(), chorusSuccess);
    EXPECT_GE(b_done, posted);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(ya[i], 3.0f) << "rank " << r << " element " << i;
      ASSERT_EQ(yb[i], 30.0f) << "rank " << r << " element " << i;
    }
  });
}

TEST(StreamOrder, PlacesRunInTheOrderTheyWereReservedWhateverTheOrderOfPosting) {
  on_two_ranks([](CommImpl& c, int r) {
    const size_t n = 257;
    std::vector<float> x1(n, 1.0f + r), y1(n), x2(n, 5.0f + r), y2(n);
    std::vector<int> order;
    std::mutex mu;
    auto p1 = c.reserve([&](chorusResult_t) {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(1);
    });
    auto p2 = c.reserve([&](chorusResult_t) {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(2);
    });
    CollArgs a1 = all_reduce(x1.data(), y1.data(), n), a2 = all_reduce(x2.data(), y2.data(), n);
    c.validate(a1);
    c.validate(a2);
    c.post(p2, a2);  // the second place is filled first
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.post(p1, a1);
    CollArgs none = all_reduce(x1.data(), y1.data(), n);
    c.validate(none);
    c.run_blocking(none);  // after both
    ASSERT_EQ(order, (std::vector<int>{1, 2}));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(y1[i], 3.0f);
      ASSERT_EQ(y2[i], 11.0f);
    }
  });
}

TEST(StreamOrder, ACancelledPlaceHoldsNothingBack) {
  on_two_ranks([](CommImpl& c, int r) {
    std::vector<float> x(64, 2.0f), y(64, 0.0f);
    auto place = c.reserve([](chorusResult_t) { ADD_FAILURE() << "a cancelled place ran"; });
    EXPECT_TRUE(c.cancel(place));
    CollArgs a = all_reduce(x.data(), y.data(), x.size());
    c.validate(a);
    c.run_blocking(a);
    for (float v : y) ASSERT_EQ(v, 4.0f) << "rank " << r;
  });
}

// Whatever comes first, a post, an abort or the communicator's end, each place's on_done runs exactly once (it alone
// releases the caller's stream): an abort fails the places waiting for a post and any reserved after it, a post after
// that does nothing, and the destructor fails a place that can no longer be posted instead of waiting for it.
TEST(StreamOrder, EveryPlaceIsCompletedOnceByAPostAnAbortOrTheEnd) {
  auto wait_for = [](const std::atomic<int>& calls, int want) {
    for (int i = 0; i < 5000 && calls.load() < want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::vector<float> x(16, 2.0f), y(16, 0.0f);
  {
    std::atomic<int> p1_calls{0}, p2_calls{0};
    std::atomic<chorusResult_t> p1_result{chorusSuccess}, p2_result{chorusSuccess};
    auto c = std::make_unique<CommImpl>(create_unique_id(), 1, 0);
    auto p1 = c->reserve([&](chorusResult_t res) {
      p1_result = res;
      ++p1_calls;
    });
    c->abort();
    wait_for(p1_calls, 1);
    EXPECT_FALSE(c->post(p1, all_reduce(x.data(), y.data(), x.size())));
    EXPECT_FALSE(c->cancel(p1));  // already failed: its on_done ran, so it cannot be withdrawn
    auto p2 = c->reserve([&](chorusResult_t res) {
      p2_result = res;
      ++p2_calls;
    });
    wait_for(p2_calls, 1);
    EXPECT_FALSE(c->post(p2, all_reduce(x.data(), y.data(), x.size())));
    c.reset();
    EXPECT_EQ(p1_calls.load(), 1);
    EXPECT_EQ(p2_calls.load(), 1);
    EXPECT_EQ(p1_result.load(), chorusInvalidUsage);
    EXPECT_EQ(p2_result.load(), chorusInvalidUsage);
  }
  {
    std::atomic<int> calls{0};
    std::atomic<chorusResult_t> result{chorusSuccess};
    auto c = std::make_unique<CommImpl>(create_unique_id(), 1, 0);
    auto posted = c->reserve([&](chorusResult_t res) {
      EXPECT_EQ(res, chorusSuccess);
      ++calls;
    });
    CollArgs a = all_reduce(x.data(), y.data(), x.size());
    c->validate(a);
    EXPECT_TRUE(c->post(posted, a));
    auto never = c->reserve([&](chorusResult_t res) {
      result = res;
      ++calls;
    });
    c.reset();  // ends without waiting for a post of `never`
    EXPECT_EQ(calls.load(), 2);
    EXPECT_EQ(result.load(), chorusInvalidUsage);
    for (float v : y) ASSERT_EQ(v, 2.0f);
  }
}

TEST(StreamOrder, ExtentsOfEveryCollective) {
  on_two_ranks([](CommImpl& c, int r) {
    CollArgs a;
    a.count = 10;
    a.dtype = chorusFloat32;
    a.root = 1;
    auto ext = [&](algo::Coll coll) {
      a.coll = coll;
      return c.extents(a);
    };
    EXPECT_EQ(ext(algo::Coll::AllReduce).send, 40u);
    EXPECT_EQ(ext(algo::Coll::AllGather).recv, 80u);
    EXPECT_EQ(ext(algo::Coll::ReduceScatter).send, 80u);
    EXPECT_EQ(ext(algo::Coll::AllToAll).recv, 80u);
    EXPECT_EQ(ext(algo::Coll::Broadcast).send, r == 1 ? 40u : 0u);
    EXPECT_EQ(ext(algo::Coll::Reduce).recv, r == 1 ? 40u : 0u);
    EXPECT_EQ(ext(algo::Coll::Barrier).send + ext(algo::Coll::Barrier).recv, 0u);
  });
}

// What a call given a stream and host buffers returns: refused naming `buffer` in a CUDA build, not supported (no
// streams at all) in a CPU-only one.
void expect_host_buffers_refused(chorusResult_t res, chorusComm_t c, const std::string& buffer) {
  const std::string text = chorusGetLastError(c);
#ifdef CHORUS_WITH_CUDA
  EXPECT_EQ(res, chorusInvalidArgument);
  EXPECT_NE(text.find(buffer + " is not device memory"), std::string::npos) << text;
#else
  EXPECT_EQ(res, chorusNotSupported);
  EXPECT_NE(text.find("CUDA build"), std::string::npos) << text;
#endif
}

TEST(StreamArgument, HostBuffersWithAStreamAreAClearErrorAndChangeNothing) {
  test::World& w = test::World::get(2);
  w.run([](int r, chorusComm_t c) {
    std::vector<float> x(16, 1.0f + r), y(16, 0.0f);
    // Never dereferenced: the buffers are checked first.
    auto stream = reinterpret_cast<chorusStream_t>(uintptr_t{0x1000});
    const chorusResult_t res = chorusAllReduce(x.data(), y.data(), 16, chorusFloat32, chorusSum, c, stream);
    expect_host_buffers_refused(res, c, "sendbuff");
    for (float v : y) ASSERT_EQ(v, 0.0f);
    ASSERT_EQ(chorusAllReduce(x.data(), y.data(), 16, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
    for (float v : y) ASSERT_EQ(v, 3.0f);
  });
}

TEST(StreamArgument, PointToPointWithAStreamTakesDeviceBuffersOnly) {
  test::World& w = test::World::get(2);
  w.run([](int r, chorusComm_t c) {
    std::vector<float> x(16, 1.0f + r), y(16, 0.0f);
    auto stream = reinterpret_cast<chorusStream_t>(uintptr_t{0x1000});  // never dereferenced
    const chorusResult_t res = r == 0 ? chorusSend(x.data(), 16, chorusFloat32, 1, c, stream)
                                      : chorusRecv(y.data(), 16, chorusFloat32, 0, c, stream);
    expect_host_buffers_refused(res, c, r == 0 ? "sendbuff" : "recvbuff");
    for (float v : y) ASSERT_EQ(v, 0.0f);  // nothing received
    // In a group, the calls of one communicator take one stream: a third call on another stream is refused, and the
    // two already in the group (host buffers, matched across the ranks) still run at chorusGroupEnd, which returns
    // the refusal too.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusSend(x.data(), 16, chorusFloat32, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(y.data(), 16, chorusFloat32, 1 - r, c, nullptr), chorusSuccess);
    // (count 0, so that its buffer, which is not device memory, is not what it is refused for)
    const chorusResult_t third = chorusSend(x.data(), 0, chorusFloat32, 1 - r, c, stream);
#ifdef CHORUS_WITH_CUDA
    EXPECT_EQ(third, chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("take one stream"), std::string::npos) << chorusGetLastError(c);
#else
    EXPECT_EQ(third, chorusNotSupported);
#endif
    EXPECT_EQ(chorusGroupEnd(), third);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("chorusGroupEnd: the group ran without a call it refused"),
              std::string::npos)
        << chorusGetLastError(nullptr);
    for (float v : y) ASSERT_EQ(v, 2.0f - r);
    // A group's first call with a stream and a host buffer is refused when it is made, not at chorusGroupEnd.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    const chorusResult_t first = chorusSend(x.data(), 16, chorusFloat32, 1 - r, c, stream);
    expect_host_buffers_refused(first, c, "sendbuff");
    EXPECT_EQ(chorusGroupEnd(), first);            // nothing ran: the group's only call was refused
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);  // the next group starts clean
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
  });
}

// A collective with a stream in a group checks its buffers when it is made, as outside a group (they used to be
// checked at chorusGroupEnd); refused, it keeps its communicator's other calls in the group from running.
TEST(StreamArgument, ACollectiveWithAStreamInAGroupIsRefusedWhenMadeAndRunsNothingOfItsCommunicator) {
  test::World& w = test::World::get(2);
  w.run([](int r, chorusComm_t c) {
    std::vector<float> x(16, 1.0f + r), y(16, 0.0f);
    auto stream = reinterpret_cast<chorusStream_t>(uintptr_t{0x1000});  // never dereferenced
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    const chorusResult_t res = chorusAllReduce(x.data(), y.data(), 16, chorusFloat32, chorusSum, c, stream);
    expect_host_buffers_refused(res, c, "sendbuff");
    EXPECT_EQ(chorusSend(x.data(), 16, chorusFloat32, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(y.data(), 16, chorusFloat32, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusGroupEnd(), res);
    EXPECT_NE(std::string(chorusGetLastError(c)).find("none of this communicator's calls in the group ran"),
              std::string::npos)
        << chorusGetLastError(c);
    for (float v : y) ASSERT_EQ(v, 0.0f);  // the exchange did not run
  });
}

TEST(StreamArgument, TheLegacyDefaultStreamIsNull) {
  test::World& w = test::World::get(2);
  w.run([](int r, chorusComm_t c) {
    const auto legacy = reinterpret_cast<chorusStream_t>(uintptr_t{0x1});  // cudaStreamLegacy
    std::vector<float> x(16, 1.0f + r), y(16, 0.0f);
    // Host buffers with it: a blocking host call, as with NULL.
    ASSERT_EQ(chorusAllReduce(x.data(), y.data(), 16, chorusFloat32, chorusSum, c, legacy), chorusSuccess)
        << chorusGetLastError(c);
    for (float v : y) ASSERT_EQ(v, 3.0f);
    // In a group, calls with NULL and with it are on one stream.
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusSend(x.data(), 16, chorusFloat32, 1 - r, c, nullptr), chorusSuccess);
    EXPECT_EQ(chorusRecv(y.data(), 16, chorusFloat32, 1 - r, c, legacy), chorusSuccess) << chorusGetLastError(c);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(c);
    for (float v : y) ASSERT_EQ(v, 2.0f - r);
  });
}

}  // namespace
}  // namespace chorus
