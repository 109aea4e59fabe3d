// Real processes over shm and tcp, started by chorusrun (and once by hand with torchrun-style variables).
// CHORUSRUN and MP_WORKER are the built binaries' paths (compile definitions).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/process.h"

namespace {

using chorus::test::count_of;
using chorus::test::Result;
using chorus::test::run;

std::string launch(int n, const std::string& transports, const std::string& mode) {
  return "CHORUS_TRANSPORTS=" + transports + " " + CHORUSRUN + " -n " + std::to_string(n) + " --timeout 240 " +
         MP_WORKER + " " + mode;
}

class Matrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Matrix, EveryRankChecksItsResults) {
  auto [transports, n] = GetParam();
  Result r = run(launch(n, transports, "matrix"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "cases passed"), n) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Processes, Matrix,
                         ::testing::Values(std::make_tuple("shm", 2), std::make_tuple("shm", 3),
                                           std::make_tuple("shm", 4), std::make_tuple("tcp", 2),
                                           std::make_tuple("tcp", 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

class Fault : public ::testing::TestWithParam<std::string> {};

TEST_P(Fault, KilledRankIsNamedByTheOthersAndLauncherFails) {
  Result r = run(launch(4, GetParam(), "kill"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "kill: error names rank 2"), 3) << r.out;
}

TEST_P(Fault, MismatchedCountIsReportedEverywhereWithBothFingerprints) {
  Result r = run(launch(4, GetParam(), "mismatch-count"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "mismatch: reported with both fingerprints"), 4) << r.out;
}

TEST_P(Fault, MismatchedDtypeIsReportedEverywhereWithBothFingerprints) {
  Result r = run(launch(4, GetParam(), "mismatch-dtype"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "mismatch: reported with both fingerprints"), 4) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Processes, Fault, ::testing::Values("shm", "tcp"));

TEST(Bootstrap, ConnectionWithoutTheSecretIsRefusedAndLoggedAndTheJobCompletes) {
  Result r = run(launch(3, "shm,tcp", "intruder"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 3) << r.out;
  // The root (in rank 0) logs every refusal at WARN, the default level.
  EXPECT_NE(r.out.find("[0]"), std::string::npos);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\[0\\].*(refus|reject|dropp)", std::regex::icase))) << r.out;
}

TEST(Launcher, TorchrunEnvironment) {
  // Two ranks started by hand with torchrun's variables; the job id stands in for the secret.
  const std::string pid = std::to_string(getpid());
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(29000 + getpid() % 1000) +
                          " WORLD_SIZE=2 TORCHELASTIC_RUN_ID=test" + pid;
  const std::string log0 = "/tmp/chorus_torchrun0_" + pid + ".log";
  Result r = run("sh -c '" + env + " RANK=0 LOCAL_RANK=0 " + MP_WORKER + " smoke > " + log0 + " 2>&1 & " + env +
                 " RANK=1 LOCAL_RANK=1 " + MP_WORKER + " smoke; s1=$?; wait $!; s0=$?; cat " + log0 + "; rm -f " +
                 log0 + "; exit $((s0 + s1))'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "smoke: job completed"), 2) << r.out;
}

TEST(Launcher, ChorusrunPrefixesLinesAndFailsWhenARankFails) {
  Result r = run(std::string(CHORUSRUN) + " -n 3 sh -c 'echo hello $CHORUS_RANK; [ $CHORUS_RANK != 1 ] || exit 7'");
  EXPECT_EQ(r.code, 7) << r.out;
  EXPECT_NE(r.out.find("[0] hello 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[2] hello 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 exited with code 7"), std::string::npos) << r.out;
}

}  // namespace
