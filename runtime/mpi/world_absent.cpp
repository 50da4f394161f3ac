// A build without MPI: stagerun under mpirun says so (world.h).
#include "runtime/mpi/world.h"

#include <fmt/format.h>

namespace stagecraft::rt::mpi {

struct World::Comms {};

bool World::available() { return false; }

World::World() {
  fail(ErrorKind::kUnsupported,
       "stagerun runs under mpirun, but this build has no MPI (Open MPI's libopenmpi-dev was not "
       "found when CMake configured it: run tools/setup.sh, then configure and build again)");
}

World::~World() = default;

std::vector<int> World::local_devices(const plan::Plan&, const std::string&) {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

std::string World::distribute(RunOptions&, const Pipeline&, const std::string&) {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

void World::gather(RunReport&, const plan::Plan&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

std::vector<double> World::replica_losses(const std::vector<double>&, const plan::Plan&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

void World::share_running_statistics(Pipeline&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

void World::save_checkpoint(const Pipeline&, const std::string&, const nlohmann::json&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

int World::finish(int exit_code) { return exit_code; }

// Never reached (the constructor refuses), but stagerun's calls must link.
std::string World::rank_name(int rank) const { return fmt::format("rank {}", rank); }

StepFlags World::barrier(StepFlags, std::vector<double>&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

std::vector<std::string> World::all_strings(const std::string&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

void World::agree(const std::string&, const std::string&) const {
  fail(ErrorKind::kInternal, "no MPI in this build");
}

}  // namespace stagecraft::rt::mpi
