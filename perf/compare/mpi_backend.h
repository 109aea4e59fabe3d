// The harness's communication through Open MPI, shared by the MPI baselines (mpi_*_perf): the same sweep, data,
// checks and columns as the Chorus perf tools, launched with mpirun.
#pragma once

#include <mpi.h>

#include <climits>
#include <string>

#include "common.h"

namespace chorus::perf {

inline void check_mpi(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw PerfError("rank " + std::to_string(rank) + ": " + call + " failed: " + std::string(text, len));
}

inline MPI_Op mpi_op(Op op) {
  switch (op) {
    case Op::Prod: return MPI_PROD;
    case Op::Max: return MPI_MAX;
    case Op::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

inline MPI_Datatype mpi_type(chorusDataType_t dtype) {
  switch (dtype) {
    case chorusFloat64: return MPI_DOUBLE;
    case chorusInt32: return MPI_INT32_T;
    default: return MPI_FLOAT;
  }
}

class MpiBackend final : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, len);
    v = v.substr(0, v.find_first_of("\n,"));
    return v + ", nranks " + std::to_string(nranks_) + " (" + std::to_string(nranks_) + " processes x 1 thread)";
  }
  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", rank_); }
  void allreduce(double* values, size_t n, Op op) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_DOUBLE, mpi_op(op), MPI_COMM_WORLD),
              "MPI_Allreduce (timings)", rank_);
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    const int b = static_cast<int>(bytes);
    check_mpi(MPI_Allgather(in, b, MPI_BYTE, out, b, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather (rank info)", rank_);
  }
  // The op travels as Op in OpArgs; MPI needs no handle of ours.
  chorusRedOp_t acquire_op(Op, chorusDataType_t) override { return chorusSum; }
  void abort() override { MPI_Abort(MPI_COMM_WORLD, kExitFailed); }

 private:
  int rank_ = 0;
  int nranks_ = 1;
};

// Runs the sweep of `coll` (its run() calls MPI) under MPI_Init/MPI_Finalize; returns the exit code.
inline int mpi_main(int argc, char** argv, const ToolInfo& tool, const Collective& coll) {
  MPI_Init(&argc, &argv);
  // Errors come back as codes so that the tool can name the failed call before it stops.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options opts;
  int rc = parse_options(argc, argv, tool, &opts, rank == 0);
  if (rc < 0) {
    MpiBackend backend;
    rc = run_sweep(opts, tool, coll, backend);
  }
  MPI_Finalize();
  return rc;
}

// MPI counts are ints.
inline int mpi_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX))
    throw PerfError("count " + std::to_string(count) + " does not fit MPI's int count");
  return static_cast<int>(count);
}

}  // namespace chorus::perf
