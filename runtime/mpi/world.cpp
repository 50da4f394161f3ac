#include "runtime/mpi/world.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "runtime/exec/checkpoint.h"
#include "runtime/exec/collective_layout.h"
#include "runtime/core/device_comm.h"
#include "runtime/mpi/gpu_transport.h"
#include "runtime/mpi/mpi_transport.h"
#include "runtime/mpi/rebase.h"
#include "runtime/optim/optimizer.h"
#include "runtime/mpi/wire.h"
#include "runtime/mpi/world_comms.h"

namespace stagecraft::rt::mpi {

namespace {

constexpr int kGatherTag = 1;
constexpr int kBarrierTag = 2;

// What this rank is doing, for the line it prints when mpirun stops it with SIGTERM (another
// rank failed or died). A signal handler reaches only what is global: this is written by the
// worker before each instruction (atomics), and the texts are made before the run starts.
struct StopNote {
  enum Phase : int { kLoading, kInstruction, kBarrier, kGather, kSave };
  std::atomic<int> phase{kLoading};
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> index{0};
  std::atomic<bool> texts_ready{false};
  std::vector<std::string> texts;  ///< Per instruction of this rank's list.
  char prefix[96] = "stagerun: ";  ///< "stagerun: rank 1 (device 1): "
};
StopNote stop_note;

// Appends `text` to `line` (signal-safe: no allocation).
void append(char* line, size_t capacity, size_t& at, const char* text) {
  for (; *text && at + 1 < capacity; ++text) line[at++] = *text;
}

void append_int(char* line, size_t capacity, size_t& at, int64_t value) {
  char digits[24];
  int n = 0;
  uint64_t v = value < 0 ? static_cast<uint64_t>(-value) : static_cast<uint64_t>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  if (value < 0) digits[n++] = '-';
  while (n > 0 && at + 1 < capacity) line[at++] = digits[--n];
}

// SIGTERM (mpirun ends the job): one line saying where this rank was, then exit 143.
extern "C" void on_sigterm(int) {
  char line[512];
  size_t at = 0;
  const size_t cap = sizeof line;
  append(line, cap, at, stop_note.prefix);
  append(line, cap, at, "ended by SIGTERM ");
  const int phase = stop_note.phase.load();
  const int64_t step = stop_note.step.load();
  if (phase == StopNote::kLoading) {
    append(line, cap, at, "before its first step");
  } else if (phase == StopNote::kGather) {
    append(line, cap, at, "after its last step, gathering the report to rank 0");
  } else {
    append(line, cap, at, "at step ");
    append_int(line, cap, at, step);
    const auto index = static_cast<size_t>(stop_note.index.load());
    append(line, cap, at, ": ");
    if (stop_note.texts_ready.load() && index < stop_note.texts.size())
      append(line, cap, at, stop_note.texts[index].c_str());
    if (phase == StopNote::kBarrier)
      append(line, cap, at, ", then waiting for every rank at the step barrier");
    if (phase == StopNote::kSave) append(line, cap, at, ", then saving a checkpoint");
  }
  append(line, cap, at,
         "; mpirun ends every rank once one fails or dies (its message names that rank)\n");
  ssize_t written = write(STDERR_FILENO, line, at);
  (void)written;
  _exit(128 + SIGTERM);
}

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
  w.f64(d.send_s);
  w.f64(report.allreduce_s.at(static_cast<size_t>(device)));
  for (int64_t v : {d.peak_bytes, d.weight_bytes, d.arena_bytes, d.predicted_peak_bytes,
                    d.device_peak_bytes, d.device_used_bytes})
    w.i64(v);
  w.i64(static_cast<int64_t>(report.losses.size()));
  for (double loss : report.losses) w.f64(loss);
  w.i64(static_cast<int64_t>(report.outputs.size()));
  for (const auto& [name, tensor] : report.outputs) w.tensor(name, tensor);
  // The device's events (for --trace) and the clock they are on: its step starts.
  w.i64(static_cast<int64_t>(report.step_start_s.size()));
  for (double start : report.step_start_s) w.f64(start);
  int64_t count = 0;
  for (const schedule::TimelineEvent& e : report.events) count += e.device == device;
  w.i64(count);
  for (const schedule::TimelineEvent& e : report.events) {
    if (e.device != device) continue;
    for (int64_t v : {int64_t{e.device}, static_cast<int64_t>(e.op), int64_t{e.stage},
                      int64_t{e.microbatch}})
      w.i64(v);
    w.f64(e.start_s);
    w.f64(e.end_s);
  }
  // Its memory track, on the same clock.
  count = 0;
  for (const MemorySample& m : report.memory) count += m.device == device;
  w.i64(count);
  for (const MemorySample& m : report.memory) {
    if (m.device != device) continue;
    w.f64(m.time_s);
    w.i64(m.bytes);
  }
  return w.take();
}

// Each step's loss from the replicas' (each the mean over its microbatches, from its loss rank):
// their mean, added in replica order as one process adds them (pipeline_run.cpp make_report).
std::vector<double> replica_mean(const std::vector<std::vector<double>>& per_replica,
                                 size_t steps) {
  std::vector<double> losses(steps, 0.0);
  for (size_t s = 0; s < steps; ++s) {
    double sum = 0;
    for (const std::vector<double>& replica : per_replica) sum += replica.at(s);
    losses[s] = sum / static_cast<double>(per_replica.size());
  }
  return losses;
}

// What rank 0 collects of the ranks' parts: per replica its losses and outputs.
struct Collected {
  std::vector<std::vector<double>> losses;             ///< Per replica (its loss rank's).
  std::map<std::string, std::vector<Tensor>> outputs;  ///< Per name, per replica.
};

// Rank `rank`'s part (of replica `replica`), read into rank 0's report and `into`.
void take_part(const std::vector<char>& bytes, int rank, int replica, bool has_loss,
               RunReport& report, Collected& into) {
  WireReader r(bytes, fmt::format("the report of rank {}", rank));
  DeviceReport& d = report.devices.at(static_cast<size_t>(rank));
  d.busy_s = r.f64();
  d.send_s = r.f64();
  report.allreduce_s.at(static_cast<size_t>(rank)) = r.f64();
  for (int64_t* v : {&d.peak_bytes, &d.weight_bytes, &d.arena_bytes, &d.predicted_peak_bytes,
                     &d.device_peak_bytes, &d.device_used_bytes})
    *v = r.i64();
  std::vector<double> losses(static_cast<size_t>(std::max<int64_t>(0, r.i64())));
  for (double& loss : losses) loss = r.f64();
  if (has_loss) into.losses.at(static_cast<size_t>(replica)) = std::move(losses);
  for (int64_t k = r.i64(); k > 0; --k) {
    NamedTensor t = r.tensor();
    auto& parts = into.outputs[t.name];
    parts.resize(into.losses.size());
    parts.at(static_cast<size_t>(replica)) = std::move(t.tensor);
  }
  std::vector<double> starts(static_cast<size_t>(std::max<int64_t>(0, r.i64())));
  for (double& start : starts) start = r.f64();
  std::vector<schedule::TimelineEvent> events(static_cast<size_t>(std::max<int64_t>(0, r.i64())));
  for (schedule::TimelineEvent& e : events) {
    e.device = static_cast<int>(r.i64());
    const int64_t op = r.i64();
    if (op < 0 || op > static_cast<int64_t>(schedule::Op::kOptimizerStep))
      fail(ErrorKind::kFormat, "the report of rank {}: an event of op {} (0 to {})", rank, op,
           static_cast<int>(schedule::Op::kOptimizerStep));
    e.op = static_cast<schedule::Op>(op);
    e.stage = static_cast<int>(r.i64());
    e.microbatch = static_cast<int>(r.i64());
    e.start_s = r.f64();
    e.end_s = r.f64();
  }
  std::vector<MemorySample> memory(static_cast<size_t>(std::max<int64_t>(0, r.i64())));
  for (MemorySample& m : memory) {
    m.device = rank;
    m.time_s = r.f64();
    m.bytes = r.i64();
  }
  rebase_events(events, memory, starts, report.step_start_s);
  report.events.insert(report.events.end(), events.begin(), events.end());
  report.memory.insert(report.memory.end(), memory.begin(), memory.end());
}

}  // namespace

void complete(MPI_Request& request, const std::string& what, double timeout_s) {
  auto done = [&] {
    int flag = 0;
    MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  };
  if (!poll_until(done, timeout_s))
    fail(ErrorKind::kTimeout,
         "the {} did not complete within {:g} s: a rank died or stopped answering (stagerun "
         "--timeout)",
         what, timeout_s);
}

bool World::available() { return true; }

World::World() : comms_(std::make_unique<Comms>()) {
  int provided = 0;
  // Open MPI's shared-memory transport copies large messages straight out of the sender's
  // memory (CMA, process_vm_readv). When the sender dies mid-message the reader's library
  // prints "Read -1, expected N, errno = 3" and ends that rank on its own, before it can say
  // where it was; in containers without ptrace rights the same read fails for every message.
  // The copy through shared memory instead is what Open MPI advises there; a user's own
  // setting of the variable wins (overwrite = 0).
  setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  // hwloc's GL component, which Open MPI's topology discovery loads, opens X displays :0 to :5;
  // each attempt looks a name up, and where the machine has no /etc/hosts and its DNS drops
  // the query (a fresh Debian root, CI) every lookup waits 5 s: MPI_Init of 4 ranks took
  // 10.4 s there against 0.35 s without the component. Displays say nothing about a rank's
  // cores or memory; a user's own setting wins.
  setenv("HWLOC_COMPONENTS", "-gl", 0);
  // Serialized: the main thread and the one worker of this rank's device take turns.
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED)
    fail(ErrorKind::kUnsupported, "this MPI gives thread level {}; stagerun needs {} (serialized)",
         provided, MPI_THREAD_SERIALIZED);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms_->transport);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms_->control);
  MPI_Comm node = MPI_COMM_NULL;  // this machine's processes
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
  std::snprintf(stop_note.prefix, sizeof stop_note.prefix, "stagerun: rank %d: ", rank_);
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

std::string World::rank_name(int rank) const {
  const auto g = static_cast<size_t>(rank);
  return fmt::format("rank {} (device {})", g < world_ranks_.size() ? world_ranks_[g] : rank,
                     rank);
}

StepFlags World::barrier(StepFlags flags, std::vector<double>& squares) const {
  stop_note.phase = StopNote::kBarrier;
  const MPI_Comm comm = comms_->control;
  // Every rank sends a token to every other and waits for theirs: unlike MPI_Barrier, it
  // knows whose token is missing when one never comes. A token is {flags, squares}: 1, plus 1
  // for an overflow, plus twice the stop signal (never 0, which a missing token leaves), then
  // its device's sum of squared gradients (clipping).
  const bool clips = !squares.empty();
  if (clips && squares.size() != static_cast<size_t>(size_))
    fail(ErrorKind::kInternal, "the step barrier got {} devices' squares for {} ranks",
         squares.size(), size_);
  std::vector<std::array<double, 2>> tokens(static_cast<size_t>(size_), {0, 0});
  const std::array<double, 2> token = {
      static_cast<double>(1 + (flags.overflow ? 1 : 0) + 2 * flags.stop_signal),
      clips ? squares[static_cast<size_t>(rank_)] : 0.0};
  std::vector<MPI_Request> receives, sends;
  std::vector<int> from;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request request;
    MPI_Irecv(tokens[static_cast<size_t>(r)].data(), 2, MPI_DOUBLE, r, kBarrierTag, comm, &request);
    receives.push_back(request);
    from.push_back(r);
    MPI_Isend(token.data(), 2, MPI_DOUBLE, r, kBarrierTag, comm, &request);
    sends.push_back(request);
  }
  auto all_done = [](std::vector<MPI_Request>& requests) {
    int flag = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
    return flag != 0;
  };
  if (!poll_until([&] { return all_done(receives); }, timeout_s_)) {
    std::vector<std::string> missing;
    for (size_t k = 0; k < receives.size(); ++k) {
      int flag = 0;
      MPI_Test(&receives[k], &flag, MPI_STATUS_IGNORE);
      if (!flag) missing.push_back(rank_name(from[k]));
    }
    fail(ErrorKind::kTimeout,
         "{} did not arrive within {:g} s: {} died or stopped answering (stagerun --timeout)",
         fmt::join(missing, ", "), timeout_s_, missing.size() == 1 ? "it" : "they");
  }
  // Every rank has posted its receives (its token came): the sends complete.
  if (!poll_until([&] { return all_done(sends); }, timeout_s_))
    fail(ErrorKind::kTimeout, "the step barrier's tokens were not taken in {:g} s", timeout_s_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int t = static_cast<int>(tokens[static_cast<size_t>(r)][0]);
    flags.overflow |= ((t - 1) & 1) != 0;
    flags.stop_signal = std::max(flags.stop_signal, (t - 1) / 2);
    if (clips) squares[static_cast<size_t>(r)] = tokens[static_cast<size_t>(r)][1];
  }
  return flags;
}

World::~World() { finish(0); }

std::vector<int> World::local_devices(const plan::Plan& plan, const std::string& plan_dir) {
  const int devices = plan.devices * plan.data_parallel;
  refuse_together([&] {
    if (size_ != devices && plan.data_parallel == 1)
      fail(ErrorKind::kUsage,
           "mpirun started {} rank{} but the plan {} has {} device{}: run one rank per plan "
           "device (mpirun -np {})",
           size_, size_ == 1 ? "" : "s", plan_dir, plan.devices, plan.devices == 1 ? "" : "s",
           plan.devices);
    if (size_ != devices)
      fail(ErrorKind::kUsage,
           "mpirun started {} rank{} but the plan {} has {} devices ({} replicas x {}): run one "
           "rank per device (mpirun -np {})",
           size_, size_ == 1 ? "" : "s", plan_dir, devices, plan.data_parallel, plan.devices,
           devices);
  });
  // The rank mpirun gave this process runs the device the plan's placement puts there (a
  // permutation, checked when the plan was loaded). The transport and control communicators
  // are ranked by device from here on, so that below rank g is device g: pipeline device
  // g % P of replica g / P.
  world_ranks_ = plan.placement;
  for (int g = 0; g < devices; ++g)
    if (plan.placement[static_cast<size_t>(g)] == rank_) {
      for (MPI_Comm* comm : {&comms_->transport, &comms_->control}) {
        MPI_Comm by_device = MPI_COMM_NULL;
        MPI_Comm_split(*comm, 0, g, &by_device);
        MPI_Comm_free(comm);
        *comm = by_device;
      }
      rank_ = g;
      break;
    }
  // The transport's communicators: this replica's pipeline (ranked by device) and this
  // device's replicas.
  pipeline_devices_ = plan.devices;
  MPI_Comm_split(comms_->transport, rank_ / plan.devices, rank_ % plan.devices, &comms_->pipeline);
  MPI_Comm_split(comms_->transport, rank_ % plan.devices, rank_ / plan.devices, &comms_->replicas);
  std::snprintf(stop_note.prefix, sizeof stop_note.prefix, "stagerun: %s: ",
                rank_name(rank_).c_str());
  return {rank_};
}

std::string World::distribute(RunOptions& options, const Pipeline& pipeline,
                              const std::string& transport) {
  const plan::Plan& plan = pipeline.plan();
  timeout_s_ = options.timeout_s;
  const int P = plan.devices, replica = rank_ / P;
  Layout layout;
  for (const plan::Stage& stage : plan.stages) layout.stage_rank.push_back(stage.device);
  std::set<std::string> shared;
  for (const plan::Stage& stage : plan.stages)
    for (const plan::SharedWeight& w : stage.shared_weights) shared.insert(w.name);
  layout.shared_weights.assign(shared.begin(), shared.end());
  // The ranks of the pipeline communicator are this replica's devices; those of the replicas'
  // are this device in every replica.
  for (int d = 0; d < P; ++d) layout.rank_names.push_back(rank_name(replica * P + d));
  for (int r = 0; r < plan.data_parallel; ++r)
    layout.replica_names.push_back(rank_name(r * P + rank_ % P));
  const std::string chosen = make_transports(options, pipeline, layout, transport);
  options.step_barrier = [this](StepFlags flags, std::vector<double>& squares) {
    return barrier(flags, squares);
  };
  if (rank_ != 0) options.progress = nullptr;

  // The texts of this rank's instructions, for the line it prints when stopped: a receive
  // names the rank it waits for.
  stop_note.texts.clear();
  for (int device : pipeline.local_devices())
    for (const schedule::Instruction& ins :
         pipeline.schedule().at(static_cast<size_t>(device % P))) {
      std::string text = schedule::to_string(ins);
      if (ins.op == schedule::Op::kRecvAct || ins.op == schedule::Op::kRecvGrad)
        text += fmt::format(
            ", on {}",
            rank_name(replica * P + layout.stage_rank.at(static_cast<size_t>(ins.peer_stage))));
      stop_note.texts.push_back(std::move(text));
    }
  stop_note.texts_ready = true;
  options.before_instruction = [hook = std::move(options.before_instruction)](
                                   int device, int64_t step, size_t index) {
    stop_note.step = step;
    stop_note.index = static_cast<int64_t>(index);
    stop_note.phase = StopNote::kInstruction;
    if (hook) hook(device, step, index);
  };
  return chosen;
}

void World::gather(RunReport& report, const plan::Plan& plan) const {
  stop_note.phase = StopNote::kGather;
  if (rank_ != 0) {
    std::vector<char> part = rank_part(report, rank_);
    MPI_Request request;
    MPI_Isend(part.data(), static_cast<int>(part.size()), MPI_BYTE, 0, kGatherTag,
              comms_->control, &request);
    auto sent = [&] {
      int flag = 0;
      MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    };
    if (!poll_until(sent, timeout_s_))
      fail(ErrorKind::kTimeout,
           "{} took no report for {:g} s: it died or stopped answering (stagerun --timeout)",
           rank_name(0), timeout_s_);
    return;
  }
  const int with_loss = loss_device(plan), P = plan.devices, replicas = plan.data_parallel;
  // Rank 0's own part (replica 0's device 0).
  Collected collected;
  collected.losses.resize(static_cast<size_t>(replicas));
  if (with_loss == 0) collected.losses[0] = report.losses;
  for (auto& [name, tensor] : report.outputs) {
    collected.outputs[name].resize(static_cast<size_t>(replicas));
    collected.outputs[name][0] = tensor;
  }
  for (int rank = 1; rank < size_; ++rank) {
    MPI_Status status;
    auto arrived = [&] {
      int flag = 0;
      MPI_Iprobe(rank, kGatherTag, comms_->control, &flag, &status);
      return flag != 0;
    };
    if (!poll_until(arrived, timeout_s_))
      fail(ErrorKind::kTimeout,
           "{} sent no report for {:g} s: it died or stopped answering (stagerun --timeout)",
           rank_name(rank), timeout_s_);
    int size = 0;
    MPI_Get_count(&status, MPI_BYTE, &size);
    std::vector<char> part(static_cast<size_t>(size));
    MPI_Recv(part.data(), size, MPI_BYTE, rank, kGatherTag, comms_->control, MPI_STATUS_IGNORE);
    take_part(part, rank, rank / P, rank % P == with_loss, report, collected);
  }
  if (with_loss >= 0) report.losses = replica_mean(collected.losses, report.step_s.size());
  // The outputs: the replicas' rows one after another, as the batch holds them.
  report.outputs.clear();
  for (auto& [name, parts] : collected.outputs) report.outputs[name] = concat_rows(parts);
  // The bubble over every device: each rank's busy time in its median step against rank 0's
  // (the ranks start and end every step together).
  const double step = report.step_s.at(static_cast<size_t>(report.reported_step));
  double busy = 0;
  for (const DeviceReport& d : report.devices) busy += d.busy_s;
  const double slots = static_cast<double>(report.devices.size()) * step;
  report.bubble_fraction = slots > 0 ? std::max(0.0, 1.0 - busy / slots) : 0.0;
}

std::vector<double> World::replica_losses(const std::vector<double>& losses,
                                          const plan::Plan& plan) const {
  const int with_loss = loss_device(plan), P = plan.devices;
  if (with_loss < 0)
    fail(ErrorKind::kInternal, "losses gathered over the replicas of a plan without a loss");
  const int count = static_cast<int>(losses.size());
  std::vector<double> all(rank_ == 0 ? losses.size() * static_cast<size_t>(size_) : 0);
  MPI_Request request;
  MPI_Igather(losses.data(), count, MPI_DOUBLE, all.data(), count, MPI_DOUBLE, 0, comms_->control,
              &request);
  complete(request, "gather of the evaluation's losses to rank 0", timeout_s_);
  if (rank_ != 0) return losses;
  std::vector<std::vector<double>> per_replica;
  for (int r = 0; r < plan.data_parallel; ++r) {
    const auto from = all.begin() + static_cast<long>(r * P + with_loss) * count;
    per_replica.emplace_back(from, from + count);
  }
  return replica_mean(per_replica, losses.size());
}

void World::agree(const std::string& error, const std::string& what) const {
  struct {
    int failed;
    int rank;
  } mine{error.empty() ? 0 : 1, rank_}, worst{0, 0};
  MPI_Request request;
  MPI_Iallreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, comms_->control, &request);
  complete(request, fmt::format("check that every rank got through the {}", what), timeout_s_);
  if (!worst.failed) return;
  // Every rank says why (the first to end ends them all: its line may be the only one).
  int length = rank_ == worst.rank ? static_cast<int>(error.size()) : 0;
  MPI_Ibcast(&length, 1, MPI_INT, worst.rank, comms_->control, &request);
  complete(request, fmt::format("{}'s error", rank_name(worst.rank)), timeout_s_);
  std::string why = rank_ == worst.rank ? error : std::string(static_cast<size_t>(length), ' ');
  MPI_Ibcast(why.data(), length, MPI_CHAR, worst.rank, comms_->control, &request);
  complete(request, fmt::format("{}'s error", rank_name(worst.rank)), timeout_s_);
  if (!error.empty()) fail(ErrorKind::kIo, "{}", error);
  fail(ErrorKind::kIo, "{} (on {}, during the {})", why, rank_name(worst.rank), what);
}

std::map<std::string, optim::OptimizerState> World::whole_state(const Pipeline& pipeline,
                                                                 int stage) const {
  std::map<std::string, optim::OptimizerState> own = pipeline.optimizer_state(stage);
  const Pipeline::ShardLayout layout = pipeline.shard_layout(stage);
  if (layout.bounds.empty()) return own;
  const int replicas = pipeline.replicas(), me = rank_ / pipeline_devices_;
  optim::OptimizerConfig config;
  config.kind = pipeline.plan().optimizer;
  const std::vector<std::string> names = optim::Optimizer::make(config)->state_names();
  // Part [lo, hi) of a sharded weight that replica r keeps (offsets into the weight).
  auto part = [&](const Pipeline::ShardLayout::Part& p, int r) {
    const int64_t lo = std::max(p.offset, layout.bounds[static_cast<size_t>(r)]);
    const int64_t hi = std::min(p.offset + p.elements, layout.bounds[static_cast<size_t>(r) + 1]);
    return lo < hi ? std::pair{lo - p.offset, hi - p.offset} : std::pair<int64_t, int64_t>{0, 0};
  };
  // Every replica's slices, one after another: per sharded weight, per state name (zeros for
  // a state not made yet: no optimizer step).
  std::vector<int> counts(static_cast<size_t>(replicas), 0), offsets = counts;
  for (int r = 0; r < replicas; ++r) {
    int64_t count = 0;
    for (const auto& p : layout.parts) {
      auto [lo, hi] = part(p, r);
      count += (hi - lo) * static_cast<int64_t>(names.size());
    }
    if (count > INT_MAX)
      fail(ErrorKind::kUnsupported, "stage {}: a shard of {} state floats is more than one MPI "
           "message holds", stage, count);
    counts[static_cast<size_t>(r)] = static_cast<int>(count);
    if (r > 0) offsets[static_cast<size_t>(r)] = offsets[static_cast<size_t>(r) - 1] + counts[static_cast<size_t>(r) - 1];
  }
  std::vector<float> send;
  send.reserve(static_cast<size_t>(counts[static_cast<size_t>(me)]));
  for (const auto& p : layout.parts) {
    auto [lo, hi] = part(p, me);
    for (const std::string& name : names) {
      auto state = own.find(p.weight);
      if (state != own.end() && state->second.has(name)) {
        const float* from = state->second.at(name).as<float>();
        send.insert(send.end(), from, from + (hi - lo));
      } else {
        send.insert(send.end(), static_cast<size_t>(hi - lo), 0.0f);
      }
    }
  }
  std::vector<float> all(me == 0 ? static_cast<size_t>(offsets.back() + counts.back()) : 0);
  MPI_Request request;
  MPI_Igatherv(send.data(), counts[static_cast<size_t>(me)], MPI_FLOAT, all.data(), counts.data(),
               offsets.data(), MPI_FLOAT, 0, comms_->replicas, &request);
  complete(request, fmt::format("gather of stage {}'s optimizer state from its replicas", stage),
           timeout_s_);
  if (me != 0) return {};
  // The shared weights' state is whole on every replica; the sharded ones' put together.
  std::map<std::string, optim::OptimizerState> whole;
  for (auto& [weight, state] : own)
    if (std::none_of(layout.parts.begin(), layout.parts.end(),
                     [&w = weight](const auto& p) { return p.weight == w; }))
      whole[weight] = state;
  if (pipeline.steps_done() == 0) return whole;  // no state made yet
  const auto& weights = pipeline.stage_weights(stage);
  for (int r = 0; r < replicas; ++r) {
    const float* at = all.data() + offsets[static_cast<size_t>(r)];
    for (const auto& p : layout.parts) {
      auto [lo, hi] = part(p, r);
      for (const std::string& name : names) {
        Tensor& t = whole[p.weight].tensors[name];
        if (t.dtype == DType::kUndefined) t = Tensor::owned(DType::kFloat32, weights.at(p.weight).shape);
        std::copy(at, at + (hi - lo), t.as<float>() + lo);
        at += hi - lo;
      }
    }
  }
  return whole;
}

void World::share_running_statistics(Pipeline& pipeline) const {
  if (pipeline.plan().data_parallel < 2) return;
  // Every rank of a device's replicas holds the same stages, in the same order, with the same
  // statistics: the broadcasts pair up without a negotiation.
  const auto shared = pipeline.held_running_statistics();
  if (shared.empty()) return;
  pipeline.sync_host();
  for (const auto& [index, names] : shared) {
    const std::map<std::string, Tensor>& weights = pipeline.stage_weights(index);
    for (const std::string& name : names) {
      const Tensor& t = weights.at(name);
      MPI_Request request;
      MPI_Ibcast(t.data, static_cast<int>(t.bytes()), MPI_BYTE, 0, comms_->replicas, &request);
      complete(
          request,
          fmt::format("broadcast of stage {}'s running statistic '{}' from replica 0", index, name),
          timeout_s_);
    }
  }
}

void World::save_checkpoint(const Pipeline& pipeline, const std::string& dir,
                            const nlohmann::json& data) const {
  const MPI_Comm comm = comms_->control;
  const std::string what = fmt::format("save of checkpoint {}", dir);
  stop_note.phase = StopNote::kSave;
  // Rank 0 makes the temporary folder; every rank learns its name.
  std::string tmp, error;
  if (rank_ == 0) {
    try {
      tmp = begin_save(dir, static_cast<long>(::getpid()));
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(error, what);
  int length = static_cast<int>(tmp.size());
  MPI_Request request;
  MPI_Ibcast(&length, 1, MPI_INT, 0, comm, &request);
  complete(request, what + " (its folder's name from rank 0)", timeout_s_);
  tmp.resize(static_cast<size_t>(length));
  MPI_Ibcast(tmp.data(), length, MPI_CHAR, 0, comm, &request);
  complete(request, what + " (its folder's name from rank 0)", timeout_s_);
  // Each stage's whole optimizer state on its first replica (collective), which writes it.
  const bool writer = rank_ < pipeline_devices_;
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  std::vector<std::pair<int, std::map<std::string, optim::OptimizerState>>> states;
  for (const plan::Stage& stage : pipeline.plan().stages)
    if (pipeline.holds_stage(stage.index))
      states.emplace_back(stage.index, whole_state(pipeline, stage.index));
  if (writer) {
    try {
      for (const auto& [stage, state] : states)
        entries.push_back(save_stage(pipeline, stage, state, tmp));
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(error, what);
  // The writers' manifest entries to rank 0, which writes the manifest last.
  const std::string text = entries.dump();
  int size = static_cast<int>(text.size());
  std::vector<int> sizes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_), 0);
  MPI_Igather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm, &request);
  complete(request, what + " (the manifest entries to rank 0)", timeout_s_);
  for (int r = 1; r < size_; ++r)
    offsets[static_cast<size_t>(r)] = offsets[static_cast<size_t>(r) - 1] + sizes[static_cast<size_t>(r) - 1];
  std::string texts(rank_ == 0 ? static_cast<size_t>(offsets.back() + sizes.back()) : 0, '\0');
  MPI_Igatherv(text.data(), size, MPI_CHAR, texts.data(), sizes.data(), offsets.data(), MPI_CHAR,
               0, comm, &request);
  complete(request, what + " (the manifest entries to rank 0)", timeout_s_);
  if (rank_ == 0) {
    try {
      std::map<int, nlohmann::ordered_json> by_index;
      for (int r = 0; r < size_; ++r)
        for (auto& entry : nlohmann::ordered_json::parse(texts.substr(
                 static_cast<size_t>(offsets[static_cast<size_t>(r)]),
                 static_cast<size_t>(sizes[static_cast<size_t>(r)]))))
          by_index[entry["index"].get<int>()] = entry;
      nlohmann::ordered_json stages = nlohmann::ordered_json::array();
      for (auto& [index, entry] : by_index) stages.push_back(std::move(entry));
      if (stages.size() != pipeline.plan().stages.size())
        fail(ErrorKind::kInternal, "{}: {} of {} stages were written", what, stages.size(),
             pipeline.plan().stages.size());
      finish_save(pipeline, dir, tmp, std::move(stages), data);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(error, what);
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
  for (MPI_Comm* comm : {&comms_->pipeline, &comms_->replicas})
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  MPI_Comm_free(&comms_->transport);
  MPI_Comm_free(&comms_->control);
  MPI_Finalize();
  return exit_code;
}

}  // namespace stagecraft::rt::mpi
