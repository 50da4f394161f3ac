// World's transports (world.h `distribute`): the MPI transport for CPU ranks; NCCL or MPI through
// host memory for GPU ranks, every rank making the same choice.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>

#include "runtime/core/device_comm.h"
#include "runtime/exec/collective_layout.h"
#include "runtime/mpi/gpu_transport.h"
#include "runtime/mpi/mpi_transport.h"
#include "runtime/mpi/world.h"
#include "runtime/mpi/world_comms.h"

namespace stagecraft::rt::mpi {

std::vector<std::string> World::all_strings(const std::string& mine) const {
  const MPI_Comm comm = comms_->control;
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_), 0);
  MPI_Request request;
  MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, &request);
  complete(request, "exchange of the ranks' backends and GPUs", timeout_s_);
  for (int r = 1; r < size_; ++r)
    offsets[static_cast<size_t>(r)] =
        offsets[static_cast<size_t>(r) - 1] + lengths[static_cast<size_t>(r) - 1];
  std::string all(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Iallgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                  MPI_CHAR, comm, &request);
  complete(request, "exchange of the ranks' backends and GPUs", timeout_s_);
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r)
    out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                             static_cast<size_t>(lengths[static_cast<size_t>(r)])));
  return out;
}

std::shared_ptr<NcclSession> World::join_nccl(const std::vector<Link>& links,
                                              const Pipeline& pipeline) const {
  const plan::Plan& plan = pipeline.plan();
  const DeviceComms& comms = *pipeline.backend().device_comms();
  auto session = std::make_shared<NcclSession>();
  for (const plan::Stage& stage : plan.stages) session->stage_device.push_back(stage.device);
  session->groups = comm_groups(session->stage_device, links, plan.devices, plan.data_parallel);
  session->rank = rank_;
  for (int r = 0; r < size_; ++r) session->rank_names.push_back(rank_name(r));
  // Rank 0 makes every group's id; every rank gets them all.
  std::vector<char> ids;
  if (rank_ == 0)
    for (size_t k = 0; k < session->groups.size(); ++k) {
      std::vector<char> id = comms.new_id();
      ids.insert(ids.end(), id.begin(), id.end());
    }
  int length = static_cast<int>(ids.size());
  MPI_Request request;
  MPI_Ibcast(&length, 1, MPI_INT, 0, comms_->control, &request);
  complete(request, "NCCL ids from rank 0", timeout_s_);
  ids.resize(static_cast<size_t>(length));
  MPI_Ibcast(ids.data(), length, MPI_CHAR, 0, comms_->control, &request);
  complete(request, "NCCL ids from rank 0", timeout_s_);
  const size_t groups = session->groups.size();
  const size_t each = groups == 0 ? 0 : ids.size() / groups;
  // Every rank joins its groups in the one order: none waits for a group another has not
  // reached.
  for (size_t k = 0; k < groups; ++k) {
    const std::vector<int>& ranks = session->groups[k].ranks;
    auto at = std::find(ranks.begin(), ranks.end(), rank_);
    if (at == ranks.end()) continue;
    const std::vector<char> id(ids.begin() + static_cast<long>(k * each),
                               ids.begin() + static_cast<long>((k + 1) * each));
    std::vector<std::string> names;
    for (int r : ranks) names.push_back(rank_name(r));
    try {
      session->joined[static_cast<int>(k)] =
          comms.join(id, static_cast<int>(ranks.size()), static_cast<int>(at - ranks.begin()),
                     rank_, timeout_s_);
      session->joined[static_cast<int>(k)]->connect(!session->groups[k].replicas);
    } catch (const Error& e) {
      fail(e.kind(), "joining the NCCL communicator of {}: {}", fmt::join(names, ", "),
           e.message());
    }
  }
  return session;
}

std::string World::make_transports(RunOptions& options, const Pipeline& pipeline,
                                   const Layout& layout, const std::string& transport) {
  const Backend& backend = pipeline.backend();
  const double timeout = options.timeout_s;
  const std::vector<std::string> backends = all_strings(std::string(backend.name()));
  refuse_together([&] {
    for (int r = 0; r < size_; ++r)
      if (backends[static_cast<size_t>(r)] != backends[0])
        fail(ErrorKind::kUnsupported,
             "{} runs the {} backend and {} the {} backend: every rank must run the same "
             "(--backend)",
             rank_name(0), backends[0], rank_name(r), backends[static_cast<size_t>(r)]);
  });
  const MPI_Comm comm = comms_->pipeline, replicas = comms_->replicas;
  if (backend.name() == "cpu") {
    refuse_together([&] {
      if (transport == "nccl")
        fail(ErrorKind::kUsage,
             "--transport nccl is for GPU ranks (--backend cuda); the cpu backend's ranks use MPI");
    });
    options.make_transport = [comm, replicas, layout, timeout](
                                 int, const std::vector<Link>& links, int capacity,
                                 InProcessTransport::OnDelivered delivered) {
      Layout with_links = layout;
      with_links.links = links;
      return std::make_unique<MpiTransport>(comm, std::move(with_links), capacity,
                                            std::move(delivered), timeout, replicas);
    };
    return "MPI";
  }
  // GPU ranks: NCCL where every rank can use it and no two share a GPU.
  const DeviceComms* comms = backend.device_comms();
  const std::string why = comms != nullptr ? comms->unavailable()
                                           : fmt::format("the {} backend has no NCCL", backend.name());
  std::string missing;
  const std::vector<std::string> whys = all_strings(why);
  for (int r = 0; r < size_ && missing.empty(); ++r)
    if (!whys[static_cast<size_t>(r)].empty())
      missing = fmt::format("{}: {}", rank_name(r), whys[static_cast<size_t>(r)]);
  const std::vector<std::string> gpus =
      all_strings(comms != nullptr && why.empty() ? comms->device_identity(rank_) : "");
  std::vector<std::string> names;
  for (int r = 0; r < size_; ++r) names.push_back(rank_name(r));
  GpuTransportChoice choice;
  refuse_together([&] { choice = choose_gpu_transport(transport, missing, gpus, names); });
  const bool nccl = choice.kind == GpuTransport::kNccl;
  auto session = std::make_shared<std::shared_ptr<NcclSession>>();
  options.make_transport = [this, comm, replicas, layout, timeout, nccl, session, &backend,
                            &pipeline](int replica, const std::vector<Link>& links, int capacity,
                                       InProcessTransport::OnDelivered delivered)
      -> std::unique_ptr<Transport> {
    Layout with_links = layout;
    with_links.links = links;
    auto staged = std::make_unique<HostStagedTransport>(
        std::make_unique<MpiTransport>(comm, std::move(with_links), capacity, delivered,
                                       timeout, replicas),
        backend.make_device(rank_, 1));
    if (!nccl) return staged;
    if (!*session) *session = join_nccl(links, pipeline);  // once, at the first run
    return std::make_unique<NcclTransport>(*session, std::move(staged),
                                           backend.make_device(rank_, 1), replica, capacity,
                                           std::move(delivered), timeout);
  };
  return choice.why;
}

}  // namespace stagecraft::rt::mpi
