// chorus-tune end to end: a real 2-rank job over shm writes a tuning file that topo::apply_tune_file reads with
// sensible values, leaving the classes it did not measure at their defaults; one rank without a launcher measures
// the kernels only; bad flags are refused with exit code 2. CHORUSRUN and CHORUS_TUNE are the built binaries' paths
// (compile definitions).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "topology/topology.h"

#include "tests/common/process.h"

namespace {

namespace fs = std::filesystem;
using chorus::topo::LinkClass;

using chorus::test::Result;
using chorus::test::run;

// A fresh directory under the test temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "chorus_tune_XXXXXX";
    char* d = mkdtemp(tmpl.data());
    EXPECT_NE(d, nullptr);
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

size_t count_of(const std::string& out, const std::string& needle) {
  size_t c = 0;
  for (size_t pos = 0; (pos = out.find(needle, pos)) != std::string::npos; pos += needle.size()) ++c;
  return c;
}

TEST(ChorusTune, TwoRanksOverShmWriteAFileThatApplyTuneFileReads) {
  TempDir dir;
  const std::string file = dir.path() + "/tune.json";
  const Result r = run(std::string("CHORUS_TRANSPORTS=shm ") + CHORUSRUN + " -n 2 --timeout 240 " + CHORUS_TUNE +
                       " -o " + file + " --max-bytes 1M --iters 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[0] wrote " + file), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("same_numa    0-1"), std::string::npos) << r.out;
  // Only rank 0 prints.
  EXPECT_EQ(r.out.find("[1] "), std::string::npos) << r.out;
  // Written atomically: nothing but the file is left in the directory.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "tune.json");
  }
  EXPECT_EQ(entries, 1);

  chorus::topo::Topology t = chorus::topo::make_cluster({2}, 0);
  const chorus::topo::Topology defaults = t;
  ASSERT_NO_THROW(chorus::topo::apply_tune_file(t, file));
  const chorus::topo::LinkParams& same = t.links[static_cast<size_t>(LinkClass::SameNuma)];
  EXPECT_GT(same.alpha_s, 1e-8);  // between 10 ns and 100 ms
  EXPECT_LT(same.alpha_s, 0.1);
  EXPECT_GT(same.bandwidth_Bps, 1e7);  // between 10 MB/s and 10 TB/s
  EXPECT_LT(same.bandwidth_Bps, 1e13);
  EXPECT_GT(t.reduce_Bps, 1e7);
  EXPECT_LT(t.reduce_Bps, 1e13);
  EXPECT_GT(t.copy_Bps, 1e7);
  EXPECT_LT(t.copy_Bps, 1e13);
  // Classes the job does not have keep their defaults.
  for (LinkClass c : {LinkClass::SameProcess, LinkClass::CrossNuma, LinkClass::GpuPeer, LinkClass::Network})
    EXPECT_EQ(t.links[static_cast<size_t>(c)], defaults.links[static_cast<size_t>(c)]) << link_class_name(c);

  const nlohmann::json j = read_json(file);
  ASSERT_TRUE(j["links"].is_object());
  EXPECT_EQ(j["links"].size(), 1u) << j.dump();
  EXPECT_TRUE(j["links"].contains("same_numa"));
  EXPECT_EQ(j["nranks"], 2);
  EXPECT_EQ(j["hosts"], 1);
  EXPECT_TRUE(j["measured_at"].is_string());
  EXPECT_FALSE(j["method"].get<std::string>().empty());
  // 8 B, 32 B, ... 512 KiB (times 4) and 1 MiB, each [bytes, fastest us, median us].
  const nlohmann::json& sweep = j["sweep"]["same_numa"];
  ASSERT_EQ(sweep.size(), 10u) << sweep.dump();
  for (size_t i = 0; i < sweep.size(); ++i) {
    const nlohmann::json& p = sweep[i];
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].get<size_t>(), i + 1 < sweep.size() ? size_t{8} << (2 * i) : size_t{1} << 20);
    EXPECT_GT(p[1].get<double>(), 0);
    EXPECT_GE(p[2].get<double>(), p[1].get<double>());
  }
  EXPECT_EQ(j["pairs"]["same_numa"]["ranks"], nlohmann::json({0, 1}));
  EXPECT_GT(j["collective"]["all_reduce"][0]["measured_us"].get<double>(), 0);
}

TEST(ChorusTune, OneRankWithoutALauncherMeasuresTheKernelsOnly) {
  TempDir dir;
  const std::string file = dir.path() + "/tune.json";
  const Result r = run(std::string("env -u CHORUS_RANK ") + CHORUS_TUNE + " --output=" + file);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = read_json(file);
  EXPECT_TRUE(j["links"].is_object() && j["links"].empty()) << j.dump();
  EXPECT_GT(j["reduce_GBps"].get<double>(), 0);
  EXPECT_GT(j["copy_GBps"].get<double>(), 0);
  chorus::topo::Topology t = chorus::topo::make_cluster({2, 2}, 0);
  const chorus::topo::Topology defaults = t;
  ASSERT_NO_THROW(chorus::topo::apply_tune_file(t, file));
  EXPECT_EQ(t.links, defaults.links);
}

TEST(ChorusTune, BadFlagsAreNamedAndExitTwo) {
  const std::string tool = CHORUS_TUNE;
  struct Case {
    std::string args, says;
  };
  for (const Case& c :
       {Case{"-o x --bogus", "unknown flag '--bogus'"}, Case{"-o x --iters 0", "--iters '0'"},
        Case{"-o x --iters", "--iters needs a value"}, Case{"-o x --max-bytes 1K", "--max-bytes '1K'"},
        Case{"-o x --max-bytes 3X", "--max-bytes '3X'"}, Case{"--iters 3", "-o/--output FILE is required"}}) {
    const Result r = run("env -u CHORUS_RANK " + tool + " " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
  // Under a launcher every rank exits 2 and only rank 0 says why.
  const Result r = run(std::string(CHORUSRUN) + " -n 2 " + tool + " -o x --bogus");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(count_of(r.out, "unknown flag '--bogus'"), 1u) << r.out;
  // An output that cannot be written fails the job before anything is measured.
  const Result w = run(std::string("CHORUS_TRANSPORTS=shm ") + CHORUSRUN + " -n 2 --timeout 120 " + tool +
                       " -o /nonexistent-dir/tune.json --max-bytes 4K --iters 1");
  EXPECT_EQ(w.code, 1) << w.out;
  EXPECT_NE(w.out.find("cannot write /nonexistent-dir/tune.json"), std::string::npos) << w.out;
}

}  // namespace
