// Test helper: n ranks as threads of this process, each with its own communicator (the local transport joins
// them), created once per rank count and reused by every test in the process.
#pragma once

#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "topology/topology.h"

namespace chorus::test {

class World {
 public:
  explicit World(int n) : comms_(n, nullptr) {
    chorusUniqueId id;
    EXPECT_EQ(chorusGetUniqueId(&id), chorusSuccess) << chorusGetLastError(nullptr);
    run_threads([&](int r) {
      ASSERT_EQ(chorusCommInitRank(&comms_[r], n, id, r), chorusSuccess) << chorusGetLastError(nullptr);
    });
  }
  ~World() {
    run_threads([&](int r) {
      if (comms_[r]) {
        EXPECT_EQ(chorusCommDestroy(comms_[r]), chorusSuccess);
      }
    });
  }
  int size() const { return static_cast<int>(comms_.size()); }
  // The test destroyed or aborted rank r's communicator itself.
  void release(int r) { comms_[r] = nullptr; }
  chorusComm_t comm(int r) const { return comms_[r]; }

  // Runs fn(rank, comm) on every rank at once, one thread each.
  void run(const std::function<void(int, chorusComm_t)>& fn) {
    run_threads([&](int r) { fn(r, comms_[r]); });
  }

  // The world of n ranks shared by the tests of this process.
  static World& get(int n) {
    static std::map<int, std::unique_ptr<World>> worlds;
    auto& w = worlds[n];
    if (!w) w = std::make_unique<World>(n);
    return *w;
  }

  // A world whose ranks the communicators see spread over emulated hosts (ranks_per_host[h] ranks on host h, in
  // rank order), through a CHORUS_TOPO_FILE written for it. Shared like get().
  static World& get_with_hosts(const std::vector<int>& ranks_per_host) {
    static std::map<std::vector<int>, std::unique_ptr<World>> worlds;
    auto& w = worlds[ranks_per_host];
    if (!w) {
      int n = 0;
      std::string name = "/tmp/chorus-test-topo";
      for (int m : ranks_per_host) {
        n += m;
        name.append("-").append(std::to_string(m));
      }
      name.append("-").append(std::to_string(getpid())).append(".json");
      topo::dump_file(topo::make_cluster(ranks_per_host, 1.25e9), name);
      setenv("CHORUS_TOPO_FILE", name.c_str(), 1);
      w = std::make_unique<World>(n);
      unsetenv("CHORUS_TOPO_FILE");
      std::remove(name.c_str());
    }
    return *w;
  }

 private:
  void run_threads(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back([&, r] { fn(r); });
    for (auto& t : threads) t.join();
  }
  std::vector<chorusComm_t> comms_;
};

}  // namespace chorus::test
