// Pipeline::run: the state a run's device workers share, the workers' threads and the report.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "runtime/exec/device_worker.h"
#include "runtime/exec/pipeline.h"
#include "runtime/exec/run_state.h"
#include "runtime/exec/stage_runtime.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {

void MemoryMeter::add(int64_t bytes) {
  int64_t now = current.fetch_add(bytes) + bytes;
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

int64_t bytes_of(const std::vector<NamedTensor>& tensors) {
  int64_t total = 0;
  for (const NamedTensor& t : tensors) total += t.tensor.bytes();
  return total;
}

namespace {

// The plan's optimizer and its learning-rate schedule.
std::unique_ptr<optim::Optimizer> make_optimizer(const plan::Plan& plan,
                                                 optim::LrSchedule& lr_schedule) {
  const plan::TrainingConfig& tc = plan.training_config;
  optim::OptimizerConfig oc;
  oc.kind = plan.optimizer;
  oc.lr = static_cast<float>(tc.lr);
  oc.weight_decay = static_cast<float>(tc.weight_decay);
  oc.momentum = static_cast<float>(tc.momentum);
  oc.beta1 = static_cast<float>(tc.beta1);
  oc.beta2 = static_cast<float>(tc.beta2);
  oc.epsilon = static_cast<float>(tc.epsilon);
  auto optimizer = optim::Optimizer::make(oc);
  lr_schedule.kind = optim::parse_lr_schedule(tc.lr_schedule);
  lr_schedule.base_lr = tc.lr;
  lr_schedule.warmup_steps = tc.warmup_steps;
  lr_schedule.total_steps = tc.total_steps;
  optim::validate(lr_schedule);
  return optimizer;
}

}  // namespace

RunState::RunState(const PipelineParts& pipeline_, const std::map<std::string, Tensor>& inputs,
                   const RunOptions& options_)
    : pipeline(pipeline_),
      options(options_),
      devices(pipeline_.plan.devices * pipeline_.replicas),
      pipeline_devices(pipeline_.plan.devices),
      replicas(pipeline_.replicas),
      microbatches(pipeline_.plan.microbatches),
      steps(options_.steps),
      first_device(pipeline_.local_devices.front()),
      training(pipeline_.plan.training),
      scales_loss(pipeline_.scales_loss),
      overflow(std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(options_.steps))),
      step_scale(static_cast<size_t>(options_.steps), 0.0),
      step_skipped(static_cast<size_t>(options_.steps), false),
      clip_grad_norm(pipeline_.plan.training ? pipeline_.plan.training_config.clip_grad_norm : 0),
      grad_squares(clip_grad_norm > 0 ? static_cast<size_t>(options_.steps) : 0,
                   std::vector<double>(static_cast<size_t>(devices), 0.0)),
      step_grad_norm(clip_grad_norm > 0 ? static_cast<size_t>(options_.steps) : 0, 0.0),
      global_step(pipeline_.steps_done),
      step_loss(static_cast<size_t>(steps) * static_cast<size_t>(replicas * microbatches), NAN),
      replica_has_loss(replicas, false),
      meters(devices),
      barrier(static_cast<int>(pipeline_.local_devices.size()),
              options_.step_barrier || options_.stop_requested
                  ? std::function<void()>([this] { exchange_flags(); })
                  : std::function<void()>()),
      reports(devices),
      busy(devices, std::vector<double>(steps, 0.0)),
      allreduce(devices, std::vector<double>(steps, 0.0)),
      sends(devices, std::vector<double>(steps, 0.0)),
      host_waits(devices, std::vector<DeviceContext::HostWaits>(steps)),
      events(devices),
      memory(devices),
      node_profile(devices),
      step_start(steps, 0),
      step_end(steps, 0),
      device_step_start(devices, std::vector<double>(steps, -1)) {
  const int all = replicas * microbatches;  // R x M
  // Microbatch views of the inputs (no copies): replica r's microbatch m is rows of the
  // whole batch's microbatch r x M + m.
  for (const ModelTensor& in : pipeline.inputs) {
    const Tensor& whole = inputs.at(in.name);
    for (int mb = 0; mb < all; ++mb)
      feeds[in.name].push_back(whole.shape == in.shape
                                   ? whole
                                   : slice_rows(whole, mb * in.shape[0], (mb + 1) * in.shape[0]));
  }
  for (const auto& st : pipeline.stages) {  // the graph outputs of this process's stages
    for (size_t k : st->graph_outputs) results[st->program.outputs()[k].name].resize(all);
    if (!st->loss.empty()) replica_has_loss[static_cast<size_t>(st->replica)] = true;
  }
  if (training) optimizer = make_optimizer(pipeline.plan, lr_schedule);

  // A link holds one message in inference and two in training (schedule.h's link_capacity), so
  // a stage that runs ahead waits instead of queueing microbatches on the next device, whose
  // memory the plan counts with that many receive buffers; the validator and the simulator play
  // the schedule with the same bound.
  const int capacity = schedule::link_capacity(pipeline.shape);
  const bool all_here = static_cast<int>(pipeline.local_devices.size()) == devices;
  if (!options.make_transport && !all_here)
    fail(ErrorKind::kInternal, "a pipeline loaded for {} of {} devices runs with a transport to "
         "the others (RunOptions::make_transport)", pipeline.local_devices.size(), devices);
  // The replicas of one process sum their gradients through memory.
  auto sums = replicas > 1 && all_here && !options.make_transport
                  ? std::make_shared<ReplicaSums>(replicas, options.timeout_s)
                  : nullptr;
  transports.resize(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    bool here = false;
    for (int d : pipeline.local_devices) here |= d / pipeline_devices == r;
    if (!here) continue;
    InProcessTransport::OnDelivered delivered = [this, r](const Link& link, const Message& m) {
      const int to = pipeline.stages[static_cast<size_t>(link.to_stage)]->stage->device;
      meters[static_cast<size_t>(r * pipeline_devices + to)].add(bytes_of(m.tensors));
    };
    transports[static_cast<size_t>(r)] =
        options.make_transport
            ? options.make_transport(r, pipeline.links, capacity, delivered)
            : std::make_unique<InProcessTransport>(pipeline.links, capacity, delivered,
                                                   options.timeout_s, sums, r);
  }
  // A waiting worker watches for a message, a sum or the barrier before it sleeps, if asked.
  spin_us = std::max(options.spin_us, 0);
  barrier.set_spin(std::chrono::microseconds(spin_us));
  for (auto& transport : transports)
    if (auto* in_process = dynamic_cast<InProcessTransport*>(transport.get()))
      in_process->set_spin(std::chrono::microseconds(spin_us));
  if (!options.inject_fault.empty())
    hook.before = [this](std::string_view node, std::string_view) {
      if (node == options.inject_fault)
        fail(ErrorKind::kInternal, "fault injected at node '{}' (test hook)", node);
    };
}

void RunState::note_failure(const std::string& note) {
  std::lock_guard lock(error_mutex);
  if (!first_error) return;
  Error noted(first_error->kind(), fmt::format("{}; {}", first_error->message(), note));
  const std::vector<std::string>& context = first_error->context();  // outermost first
  for (auto it = context.rbegin(); it != context.rend(); ++it) noted.in(*it);
  first_error = std::move(noted);
}

double RunState::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool RunState::failed() {
  std::lock_guard lock(error_mutex);
  return first_error.has_value();
}

void RunState::stop_all(Error error) {
  {
    std::lock_guard lock(error_mutex);
    if (!first_error) first_error = std::move(error);
  }
  for (auto& transport : transports)
    if (transport) transport->abort();
  barrier.abort();
}

void RunState::exchange_flags() {
  const int step = barrier_step.load();
  const bool in_run = step >= 0 && step < steps;
  const bool ours = scales_loss && in_run;
  StepFlags flags{.overflow = ours && overflow[static_cast<size_t>(step)].load(),
                  .stop_signal = options.stop_requested ? options.stop_requested() : 0};
  // Clipping: this process's devices' squares of the step go out, the others' come back (the
  // devices run here keep their own: every worker of this process waits in the barrier).
  std::vector<double> squares;
  if (clip_grad_norm > 0 && in_run) squares = grad_squares[static_cast<size_t>(step)];
  if (options.step_barrier) flags = options.step_barrier(flags, squares);
  if (ours && flags.overflow) overflow[static_cast<size_t>(step)] = true;
  // A stop once agreed stays: a later barrier's exchange (a process whose flag was read
  // earlier) never clears it.
  if (flags.stop_signal != 0 && stop_signal.load() == 0) stop_signal.store(flags.stop_signal);
  if (squares.empty() || !options.step_barrier) return;
  std::vector<double>& kept = grad_squares[static_cast<size_t>(step)];
  for (size_t d = 0; d < kept.size(); ++d)
    if (!std::binary_search(pipeline.local_devices.begin(), pipeline.local_devices.end(),
                            static_cast<int>(d)))
      kept[d] = squares.at(d);
}

int RunState::steps_finished() const {
  int finished = 0;
  while (finished < steps && step_end[static_cast<size_t>(finished)] > 0) ++finished;
  return finished;
}

int median_step(const std::vector<double>& step_s, int skip) {
  if (step_s.empty()) fail(ErrorKind::kInternal, "median step of a run of no steps");
  if (step_s.size() == 1) return 0;
  std::vector<int> order;
  for (int s = 1; s < static_cast<int>(step_s.size()); ++s)
    if (s != skip) order.push_back(s);
  if (order.empty()) return skip;  // two steps, the second profiled: the warm-up is worse
  std::sort(order.begin(), order.end(), [&](int a, int b) { return step_s[a] < step_s[b]; });
  return order[(order.size() - 1) / 2];
}

namespace {

// The report of a finished run: step times, the median step's busy time and memory, events,
// losses and the last step's outputs.
RunReport make_report(RunState& run, const plan::Plan& plan) {
  const int steps = run.steps_finished(), devices = run.devices;
  RunReport report;
  report.stop_signal = run.stop_signal.load();
  for (int s = 0; s < steps; ++s) {
    bool any = false;
    for (const std::vector<double>& starts : run.device_step_start)  // this process's devices
      if (starts[s] >= 0) {
        run.step_start[s] = any ? std::min(run.step_start[s], starts[s]) : starts[s];
        any = true;
      }
    report.step_s.push_back(run.step_end[s] - run.step_start[s]);
  }
  report.step_start_s.assign(run.step_start.begin(), run.step_start.begin() + steps);
  // Per replica the mean over its microbatches, then the mean over the replicas whose loss
  // stage runs here (runtime/mpi/world.cpp's gather averages the ranks' the same way).
  if (run.training)
    for (int s = 0; s < steps; ++s) {
      double sum = 0;
      int counted = 0;
      for (int r = 0; r < run.replicas; ++r) {
        if (!run.replica_has_loss[static_cast<size_t>(r)]) continue;
        double replica_sum = 0;
        for (int mb = 0; mb < run.microbatches; ++mb)
          replica_sum += run.loss_of(s, static_cast<size_t>(r * run.microbatches + mb));
        sum += replica_sum / run.microbatches;
        ++counted;
      }
      report.losses.push_back(counted > 0 ? sum / counted : NAN);
    }
  if (run.scales_loss) {
    report.loss_scale.assign(run.step_scale.begin(), run.step_scale.begin() + steps);
    report.skipped.assign(run.step_skipped.begin(), run.step_skipped.begin() + steps);
  }
  if (run.clip_grad_norm > 0) report.grad_norm = run.step_grad_norm;
  const int profiled = run.options.profile_step - 1;
  if (profiled >= 0 && profiled < steps) {
    report.profiled_step = profiled;
    for (auto& list : run.node_profile)
      report.node_profile.insert(report.node_profile.end(), list.begin(), list.end());
  }
  report.spin_us = run.spin_us;
  report.reported_step = median_step(report.step_s, report.profiled_step);
  double step = report.step_s[report.reported_step], total_busy = 0;
  for (int d = 0; d < devices; ++d) {
    DeviceReport& r = run.reports[d];
    r.busy_s = run.busy[d][report.reported_step];
    r.send_s = run.sends[d][report.reported_step];
    r.host_waits = run.host_waits[d][report.reported_step].count;
    r.host_wait_s = run.host_waits[d][report.reported_step].seconds;
    report.allreduce_s.push_back(run.allreduce[d][report.reported_step]);
    r.peak_bytes = run.meters[d].peak.load();
    const int pipeline_device = d % plan.devices;  // every replica's is predicted alike
    if (pipeline_device < static_cast<int>(plan.predicted.device_peak_bytes.size()))
      r.predicted_peak_bytes = plan.predicted.device_peak_bytes[pipeline_device];
    total_busy += r.busy_s;
  }
  report.bubble_fraction = step > 0 ? std::max(0.0, 1.0 - total_busy / (devices * step)) : 0.0;
  report.devices = std::move(run.reports);
  for (auto& list : run.events) report.events.insert(report.events.end(), list.begin(), list.end());
  for (auto& list : run.memory) report.memory.insert(report.memory.end(), list.begin(), list.end());
  // The microbatches this process computed, in batch order (a rank of mpirun: its replica's).
  for (auto& [name, parts] : run.results) {
    std::vector<Tensor> computed;
    for (const Tensor& part : parts)
      if (part.dtype != DType::kUndefined) computed.push_back(part);
    report.outputs[name] = concat_rows(computed);
  }
  return report;
}

}  // namespace

void LossScale::check_scale(double scale, const char* flag) {
  if (!std::isfinite(scale) || scale <= 0)
    fail(ErrorKind::kUsage, "{} must be a finite number above 0, not {}", flag, scale);
}

void LossScale::check_window(int64_t window) {
  if (window < 1)
    fail(ErrorKind::kUsage, "--loss-scale-window must be at least 1 (got {})", window);
}

void Pipeline::set_loss_scale(std::optional<double> scale, std::optional<int64_t> window) {
  if (!scale && !window) return;
  if (!scales_loss())
    fail(ErrorKind::kUsage,
         "{}: {} is a{} plan of precision {}; dynamic loss scaling is for training plans of "
         "precision fp16 (stagec --train --precision fp16)",
         scale ? "--loss-scale" : "--loss-scale-window", plan_dir_,
         plan_.training ? " training" : "n inference", to_string(plan_.precision));
  if (scale) LossScale::check_scale(*scale, "--loss-scale");
  if (window) LossScale::check_window(*window);
  if (scale) loss_scale_.scale = *scale;
  if (window) loss_scale_.window = *window;
}

RunReport Pipeline::run(const std::map<std::string, Tensor>& inputs, const RunOptions& options) {
  check_inputs(inputs);
  if (options.steps < 1)
    fail(ErrorKind::kUsage, "--steps must be at least 1 (got {})", options.steps);
  if (options.forward_only && !plan_.training)
    fail(ErrorKind::kUsage,
         "an evaluation (forward only) runs a training plan's forward and loss; {} is an "
         "inference plan",
         plan_dir_);
  if (scales_loss()) {
    LossScale::check_scale(loss_scale_.scale, "--loss-scale");
    LossScale::check_window(loss_scale_.window);
    // Every stage and replica must agree on skipping a step: the overflow flag is shared
    // through this process's memory, and with other processes' by the step barrier.
    if (static_cast<int>(local_devices_.size()) != devices() && !options.step_barrier)
      fail(ErrorKind::kInternal,
           "a precision fp16 plan run on {} of its {} devices without a step barrier to agree "
           "on skipped steps with the others",
           local_devices_.size(), devices());
  }
  if (plan_.training && plan_.training_config.clip_grad_norm > 0 &&
      static_cast<int>(local_devices_.size()) != devices() && !options.step_barrier)
    fail(ErrorKind::kInternal,
         "a plan that clips gradients run on {} of its {} devices without a step barrier to sum "
         "the gradients' norm with the others",
         local_devices_.size(), devices());
  // What the run's workers read and write of this pipeline.
  const PipelineParts parts{.plan = plan_,
                            .schedule = schedule_,
                            .shape = shape_,
                            .backend = *backend_,
                            .threads_per_device = threads_per_device_,
                            .replicas = replicas_,
                            .stages = stages_,
                            .inputs = inputs_,
                            .links = links_,
                            .local_devices = local_devices_,
                            .scales_loss = scales_loss(),
                            .resident = resident_,
                            .steps_done = steps_done_,
                            .loss_scale = loss_scale_};
  resident_.resize(static_cast<size_t>(devices()));
  for (int d : local_devices_)
    if (!resident_[static_cast<size_t>(d)])
      resident_[static_cast<size_t>(d)] = std::make_shared<ResidentDevice>();
  RunState run(parts, inputs, options);
  std::vector<std::thread> threads;
  running_ = true;
  for (int d : local_devices_) threads.emplace_back([&run, d] { DeviceWorker(d, run).run(); });
  for (std::thread& t : threads) t.join();
  running_ = false;
  if (run.first_error) {
    // Steps that did not finish leave no optimizer step behind in the count (a checkpoint
    // taken during the run recorded its own); keep the count at the last finished step.
    if (run.training && !options.forward_only)
      steps_done_ = run.global_step + run.steps_finished();
    throw *run.first_error;
  }
  // A stop (RunOptions::stop_requested) ends the run after fewer steps than asked.
  // An evaluation (forward only) takes no optimizer step.
  if (!options.forward_only) steps_done_ = run.global_step + run.steps_finished();
  return make_report(run, plan_);
}

}  // namespace stagecraft::rt
