#pragma once
/// \file
/// A process of an `mpirun` launch as stagerun sees it: rank g of N runs device g (CPU or GPU
/// ranks, one machine or several): with R data-parallel replicas of a P-device pipeline, pipeline
/// device g % P of replica g / P. It reaches its replica's other devices through the MPI
/// transport (mpi_transport.h) on a communicator of that replica, and sums gradients with its
/// device's other replicas on a communicator of theirs; rank 0 gathers the losses, outputs and
/// device figures and prints them. GPU ranks use NCCL or MPI through host memory instead
/// (gpu_transport.h).
/// No MPI type appears here, so stagerun builds the same with or without MPI: a build without
/// it (world_absent.cpp) refuses to run under mpirun, saying so.
///
/// Failures: an error on one rank is printed by that rank, which then ends every rank with
/// `MPI_Abort` (`finish`); a refusal that every rank makes alike (`refuse_together`: the world
/// size, options this slice does not support) ends every rank normally with the same line. A
/// rank that dies (a signal, the OOM killer) is noticed by mpirun, which names it and ends the
/// others with SIGTERM: each then prints one line saying where it was (the step and the
/// instruction, with the rank it was waiting for) before it exits. A rank that hangs is noticed
/// by the others: every wait (the transport's, the step barrier's, the gather's) gives up after
/// `RunOptions::timeout_s` with a line naming the silent rank, and that rank's `MPI_Abort`
/// ends them all.

#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "runtime/format/plan.h"

namespace stagecraft::rt::mpi {

class World {
 public:
  /// Whether this process is a rank of an mpirun launch (Open MPI's OMPI_COMM_WORLD_SIZE, or a
  /// PMI launcher's PMI_SIZE or PMIX_RANK, is set).
  static bool launched() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
           std::getenv("PMIX_RANK");
  }
  /// Whether this build has the MPI transport.
  static bool available();

  /// Joins the launch (MPI_Init_thread). Throws `Error(kUnsupported)` in a build without MPI.
  World();
  /// Finalises MPI unless `finish` has ended the process.
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// This process's index among the launch's processes on its machine (MPI's shared-memory
  /// split): the GPU a GPU rank takes is this modulo the GPUs it sees.
  int local_rank() const { return local_rank_; }
  /// How messages name this rank: "rank 1 (device 1)".
  std::string name() const { return rank_name(rank_); }

  /// Runs `checks`, which every rank makes alike (the same command line and plan): an `Error`
  /// they throw is rethrown, and `finish` then ends this rank normally (every rank says the
  /// same and exits with the same status) instead of with MPI_Abort.
  template <typename Checks>
  void refuse_together(Checks&& checks) {
    try {
      checks();
    } catch (const Error&) {
      refused_together_ = true;
      throw;
    }
  }

  /// The device this rank runs: the plan's placement says which ({rank()} after the call: the
  /// communicators are then ranked by device). Refuses (every rank) a world whose size is not
  /// the plan's device count (R x P), naming both; splits the communicators (collective).
  std::vector<int> local_devices(const plan::Plan& plan, const std::string& plan_dir);

  /// This rank's run of `pipeline` (loaded for this rank's device): its transport (MPI, on a
  /// communicator of its own), a wait for every rank at each step's start and end, progress
  /// shown by rank 0 only, every wait limited to `options.timeout_s`, and the instruction it
  /// is at kept for the line it prints when mpirun stops it (`options.before_instruction`,
  /// which still calls the hook it had).
  ///
  /// GPU ranks (a backend other than the CPU's) exchange tensors through NCCL or, where NCCL
  /// cannot be used (`transport` "mpi", no NCCL, two ranks on one GPU), MPI through host
  /// memory (runtime/mpi/gpu_transport.h); every rank makes the same choice
  /// (collective_layout.h), and refuses together `transport` "nccl" where NCCL cannot be used.
  /// Every rank must run the same backend (refused together otherwise). Returns the transport
  /// chosen, for the rank's banner ("NCCL", "MPI through host memory (why)"); "MPI" for CPU
  /// ranks.
  std::string distribute(RunOptions& options, const Pipeline& pipeline,
                         const std::string& transport = "auto");

  /// Gathers every rank's part of `report` to rank 0: the losses (from the rank of the stage
  /// that computes the loss), the graph outputs, each device's figures (each rank's own median
  /// step; rank 0's step times) and the bubble over all devices. Other ranks' reports are left
  /// as they were. Every rank calls it; a rank that does not answer within the timeout is named
  /// (`Error(kTimeout)`).
  void gather(RunReport& report, const plan::Plan& plan) const;

  /// Every rank's `losses` (a run's RunReport::losses: one per step, NaN on a rank whose
  /// devices compute no loss) to rank 0, which gets each step's loss over the replicas as
  /// `gather` makes it: the mean of the replicas' (each its loss rank's), added in replica
  /// order as one process adds them. The other ranks get theirs back unchanged. Collective: every
  /// rank calls it with as many losses, within the timeout (stagerun's held-out evaluation).
  std::vector<double> replica_losses(const std::vector<double>& losses,
                                     const plan::Plan& plan) const;

  /// Pipeline::share_running_statistics across processes: each device's replicas take the first
  /// replica's running statistics (one broadcast per stage and statistic over the device's
  /// replicas, from the rank of replica 0), as DDP's broadcast_buffers does. Collective: every
  /// rank calls it, between runs (stagerun, before a held-out evaluation).
  void share_running_statistics(Pipeline& pipeline) const;

  /// Saves a checkpoint of the run into `dir` (runtime/exec/checkpoint.h), every rank calling it
  /// at the same step: rank 0 makes the temporary folder; with ZeRO-1 each stage's optimizer
  /// state is gathered from the replicas' shards to the first replica (the checkpoint does not
  /// depend on the replica count); the first replica's rank of each stage writes its files
  /// (one writer per stage) and sends its manifest entries to rank 0, which writes the
  /// manifest last, with rank 0's `data` (SaveOptions::data: stagerun's data position, the
  /// same on every rank), and renames the folder into place. When a rank fails every rank
  /// throws its error (`Error(kIo)`), the others naming it.
  void save_checkpoint(const Pipeline& pipeline, const std::string& dir,
                       const nlohmann::json& data = nullptr) const;

  /// The end of stagerun with `exit_code` (after its error line, if any, is printed): 0 or a
  /// refusal made together finalise MPI and return the code; any other error ends every rank
  /// now (MPI_Abort with the code) so that none waits for this one.
  int finish(int exit_code);
  /// Every rank ends with the same non-zero exit code, agreed on (a stop signal every rank
  /// stopped for after the same step): `finish` then finalises MPI instead of aborting.
  void end_together() { refused_together_ = true; }

 private:
  struct Comms;  ///< The communicators (MPI's types stay in world.cpp).
  std::unique_ptr<Comms> comms_;
  /// How messages name `rank`: "rank 1 (device 1)".
  std::string rank_name(int rank) const;
  /// Waits until every rank has called it (the step barrier); past the timeout throws
  /// `Error(kTimeout)` naming the ranks that did not arrive. Carries each rank's flags (a
  /// gradient overflowed in the step; a stop was asked for): returns every rank's combined
  /// (any overflow; the highest stop signal). With `squares` not empty (gradient clipping, one
  /// entry per rank), this rank's entry goes to every other rank and theirs are filled in.
  StepFlags barrier(StepFlags flags, std::vector<double>& squares) const;
  /// Stage `stage`'s optimizer state whole on the first replica (collective over the stage
  /// device's replicas: with ZeRO-1 the shards are gathered); the others get nothing.
  std::map<std::string, optim::OptimizerState> whole_state(const Pipeline& pipeline,
                                                            int stage) const;
  /// Sets `options.make_transport` for this rank's backend (`distribute`); the transport chosen.
  std::string make_transports(RunOptions& options, const Pipeline& pipeline,
                              const struct Layout& layout, const std::string& transport);
  /// Every rank's `mine`, by rank (collective, within the timeout).
  std::vector<std::string> all_strings(const std::string& mine) const;
  /// The NCCL communicators of this rank for a run over `links` (collective: rank 0 makes the
  /// ids, every rank joins its groups in the same order and has NCCL connect each at once:
  /// `DeviceGroup::connect`, so that no later send waits for its peer to reach its receive).
  std::shared_ptr<struct NcclSession> join_nccl(const std::vector<Link>& links,
                                                const Pipeline& pipeline) const;
  /// Whether any rank failed (`error` not empty here): collective; throws on every rank when
  /// one did: its own error, the others that error with the rank named (`what`: the step).
  void agree(const std::string& error, const std::string& what) const;

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  int pipeline_devices_ = 1;  ///< P: rank g is device g % P of replica g / P.
  /// Per device, the rank mpirun gave its process (the plan's placement); `rank_` is the
  /// device's index once `local_devices` has ranked the communicators by device.
  std::vector<int> world_ranks_;
  double timeout_s_ = 0;  ///< For the barrier and the gather (the run's --timeout).
  bool refused_together_ = false, finished_ = false;
};

}  // namespace stagecraft::rt::mpi
