// Sharded checkpoints, written atomically.
//
// A checkpoint is a directory <root>/step-NNNNNNNN holding one file per rank (rank-R.bin: that rank's shards and
// experts, with a header naming the model, the rank and the step, and a checksum) and meta.txt (rank 0: the model,
// the step, the sampler's state and the loss history). It is written as <root>/step-NNNNNNNN.tmp: every rank
// writes and fsyncs its file, the ranks agree that all did, then rank 0 writes meta.txt, fsyncs the directory and
// renames it to its final name, which is atomic. A directory named step-NNNNNNNN is therefore always complete, and
// a rank killed at any moment leaves at worst a .tmp directory, which the next checkpoint removes and resuming
// ignores. Deleting one (pruning beyond --keep, or later ones on --overwrite) renames it to .del first, for the
// same reason. meta.txt ends with a checksum of its lines, so a damaged one is refused, not half read.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainer/data.h"
#include "trainer/model.h"

namespace trainer {

class Dist;

struct HistoryRow {
  int step = 0;
  double loss = 0;  // training loss of the step
  double val = -1;  // validation loss measured after the step, or -1
};

struct CheckpointMeta {
  uint64_t model_hash = 0;
  std::string model;  // ModelConfig::describe()
  // The settings besides the model that decide the trajectory, "flag=value ..." (Trainer::meta): a resume with other
  // values is refused, naming them.
  std::string training;
  // The Chorus settings that may change the order in which the collectives sum (collective_settings()), as
  // (variable, value) of those set. A resume under others is said, not refused: it trains on, but the losses may
  // differ in their last bits from a run that was never stopped.
  std::vector<std::pair<std::string, std::string>> collectives;
  int nranks = 1, shard_group = 1;
  int step = 0, steps = 0;  // steps done, steps planned
  Rng rng;
  uint64_t drawn = 0;
  std::vector<HistoryRow> history;
};

// The CHORUS_* variables of this process that may change the collectives' summation order (the algorithm
// choice and the channels: CHORUS_ALGO, CHORUS_NCHANNELS, CHORUS_DETERMINISTIC, CHORUS_SLICE_BYTES,
// CHORUS_TOPO_FILE, CHORUS_TUNE_FILE), those set, in that order.
std::vector<std::pair<std::string, std::string>> collective_settings();

// Collective over dist's world: writes <root>/step-<meta.step> as described above, then keeps the newest `keep`
// checkpoints. `die_midway` (for the fault tests) is called halfway through writing this rank's file. Throws
// std::runtime_error on any rank's failure. Returns the checkpoint's path.
std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta, const std::vector<StateBuffer>& mine,
                            Dist& dist, int keep, const std::function<void()>& die_midway = {});

// Deletes the checkpoint directory `dir` (rank 0 only) so that a kill at any moment leaves no torn checkpoint under
// its name: renamed to <dir>.del first (atomic and made durable), which nothing reads and the next checkpoint
// removes. Throws std::filesystem::filesystem_error or std::runtime_error.
void remove_checkpoint(const std::string& dir);

// The newest complete checkpoint under root, or "" when there is none.
std::string latest_checkpoint(const std::string& root);

// Step directories under root without meta.txt (not checkpoints: cut short, or damaged), which the next
// checkpoint removes; sorted.
std::vector<std::string> incomplete_checkpoints(const std::string& root);

// The complete checkpoints under root of steps after `step`, oldest first.
std::vector<std::string> checkpoints_after(const std::string& root, int step);

// Reads a checkpoint's meta.txt. Throws std::runtime_error when dir is not a checkpoint.
CheckpointMeta read_meta(const std::string& dir);

// Checks that the checkpoint at dir fits this run (same model, same ranks and shard groups), then fills `mine` from
// this rank's file, checking names, sizes and the checksum, and returns its metadata. Throws std::runtime_error
// saying what differs.
CheckpointMeta load_checkpoint(const std::string& dir, const CheckpointMeta& expect, int rank,
                               const std::vector<StateBuffer>& mine);

}  // namespace trainer
