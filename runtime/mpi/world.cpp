#include "runtime/mpi/world.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "runtime/mpi/mpi_transport.h"
#include "runtime/mpi/wire.h"

namespace stagecraft::rt::mpi {

/// Two communicators of their own, so that the transport's tags never meet the gather's.
struct World::Comms {
  MPI_Comm transport = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;  ///< Step barriers and the gather to rank 0.
};

namespace {

constexpr int kGatherTag = 1;

// The device whose stage computes the loss (-1: inference, or no stage names it).
int loss_device(const plan::Plan& plan) {
  if (!plan.training) return -1;
  for (const plan::Stage& stage : plan.stages)
    for (const plan::StageTensor& out : stage.outputs)
      if (out.name == plan.training_config.loss_output) return stage.device;
  return -1;
}

// A rank's part of a report, as it travels to rank 0.
std::vector<char> rank_part(const RunReport& report, int device) {
  WireWriter w;
  const DeviceReport& d = report.devices.at(static_cast<size_t>(device));
  w.f64(d.busy_s);
  for (int64_t v : {d.peak_bytes, d.weight_bytes, d.arena_bytes, d.predicted_peak_bytes,
                    d.device_peak_bytes, d.device_used_bytes})
    w.i64(v);
  w.i64(static_cast<int64_t>(report.losses.size()));
  for (double loss : report.losses) w.f64(loss);
  w.i64(static_cast<int64_t>(report.outputs.size()));
  for (const auto& [name, tensor] : report.outputs) w.tensor(name, tensor);
  return w.take();
}

// Rank `rank`'s part, read into rank 0's report.
void take_part(const std::vector<char>& bytes, int rank, bool has_loss, RunReport& report) {
  WireReader r(bytes, fmt::format("the report of rank {}", rank));
  DeviceReport& d = report.devices.at(static_cast<size_t>(rank));
  d.busy_s = r.f64();
  for (int64_t* v : {&d.peak_bytes, &d.weight_bytes, &d.arena_bytes, &d.predicted_peak_bytes,
                     &d.device_peak_bytes, &d.device_used_bytes})
    *v = r.i64();
  std::vector<double> losses(static_cast<size_t>(std::max<int64_t>(0, r.i64())));
  for (double& loss : losses) loss = r.f64();
  if (has_loss) report.losses = std::move(losses);
  for (int64_t k = r.i64(); k > 0; --k) {
    NamedTensor t = r.tensor();
    report.outputs[t.name] = std::move(t.tensor);
  }
}

}  // namespace

bool World::available() { return true; }

World::World() : comms_(std::make_unique<Comms>()) {
  int provided = 0;
  // Serialized: the main thread and the one worker of this rank's device take turns.
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED)
    fail(ErrorKind::kUnsupported, "this MPI gives thread level {}; stagerun needs {} (serialized)",
         provided, MPI_THREAD_SERIALIZED);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms_->transport);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms_->control);
}

World::~World() { finish(0); }

std::vector<int> World::local_devices(const plan::Plan& plan, const std::string& plan_dir) {
  refuse_together([&] {
    if (size_ != plan.devices)
      fail(ErrorKind::kUsage,
           "mpirun started {} rank{} but the plan {} has {} device{}: run one rank per plan "
           "device (mpirun -np {})",
           size_, size_ == 1 ? "" : "s", plan_dir, plan.devices, plan.devices == 1 ? "" : "s",
           plan.devices);
  });
  return {rank_};
}

void World::distribute(RunOptions& options, const plan::Plan& plan) const {
  Layout layout;
  for (const plan::Stage& stage : plan.stages) layout.stage_rank.push_back(stage.device);
  std::set<std::string> shared;
  for (const plan::Stage& stage : plan.stages)
    for (const plan::SharedWeight& w : stage.shared_weights) shared.insert(w.name);
  layout.shared_weights.assign(shared.begin(), shared.end());
  options.make_transport = [comm = comms_->transport, layout](
                               const std::vector<Link>& links, int capacity,
                               InProcessTransport::OnDelivered delivered) {
    Layout with_links = layout;
    with_links.links = links;
    return std::make_unique<MpiTransport>(comm, std::move(with_links), capacity,
                                          std::move(delivered));
  };
  options.step_barrier = [comm = comms_->control] { MPI_Barrier(comm); };
  if (rank_ != 0) options.progress = nullptr;
}

void World::gather(RunReport& report, const plan::Plan& plan) const {
  if (rank_ != 0) {
    std::vector<char> part = rank_part(report, rank_);
    MPI_Send(part.data(), static_cast<int>(part.size()), MPI_BYTE, 0, kGatherTag,
             comms_->control);
    return;
  }
  const int with_loss = loss_device(plan);
  for (int rank = 1; rank < size_; ++rank) {
    MPI_Status status;
    MPI_Probe(rank, kGatherTag, comms_->control, &status);
    int size = 0;
    MPI_Get_count(&status, MPI_BYTE, &size);
    std::vector<char> part(static_cast<size_t>(size));
    MPI_Recv(part.data(), size, MPI_BYTE, rank, kGatherTag, comms_->control, MPI_STATUS_IGNORE);
    take_part(part, rank, rank == with_loss, report);
  }
  // The bubble over every device: each rank's busy time in its median step against rank 0's
  // (the ranks start and end every step together).
  const double step = report.step_s.at(static_cast<size_t>(report.reported_step));
  double busy = 0;
  for (const DeviceReport& d : report.devices) busy += d.busy_s;
  const double slots = static_cast<double>(report.devices.size()) * step;
  report.bubble_fraction = slots > 0 ? std::max(0.0, 1.0 - busy / slots) : 0.0;
}

int World::finish(int exit_code) {
  if (finished_) return exit_code;
  finished_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return exit_code;
  if (exit_code != 0 && !refused_together_) {
    // This rank failed alone: the others may be waiting for it. Its line is printed already.
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  MPI_Comm_free(&comms_->transport);
  MPI_Comm_free(&comms_->control);
  MPI_Finalize();
  return exit_code;
}

}  // namespace stagecraft::rt::mpi
