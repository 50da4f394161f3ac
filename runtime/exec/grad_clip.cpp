// Gradient clipping by the global norm (plan.json training_config.clip_grad_norm, stagec
// --clip-grad-norm C), as PyTorch's torch.nn.utils.clip_grad_norm_: norm = sqrt(sum of the
// squares of every trained weight's gradient), each gradient multiplied by
// min(1, C / (norm + 1e-6)) before the optimizer step.
//
// The norm is over the gradients the optimizer reads: after the data-parallel replicas' sum
// (ALLREDUCE) and the shared weights' (the holders' sum, finished by OPT_STEP), and after loss
// scaling's unscale. Each device adds the squares it holds at its OPT_STEPs, counting every
// weight once (`count_gradient_squares`); the sum across the devices is the collective: in
// one process through `RunState::grad_squares` (every worker at the step's end barrier), over
// processes carried by that barrier (RunOptions::step_barrier, runtime/mpi/world.cpp). Every
// device then sums the devices' squares in device order, so all get the same norm's bits and
// the copies of a shared or replicated weight stay identical.
#include <fmt/format.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "runtime/exec/device_worker.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {

namespace {

/// The sum of the squares of `t`'s elements (float32), in double, read where the host can see
/// them (a device of its own memory copies them out: clipping reads every gradient once).
double sum_of_squares(DeviceContext& device, const Tensor& t) {
  if (t.dtype != DType::kFloat32)
    fail(ErrorKind::kInternal, "gradient clipping: a gradient of dtype {}, not float32",
         dtype_name(t.dtype));
  const int64_t n = t.numel();
  std::vector<float> host;
  const float* x = nullptr;
  if (device.host_visible()) {
    x = t.as<float>();
  } else {
    host.resize(static_cast<size_t>(n));
    device.read(t, host.data(), t.bytes());
    x = host.data();
  }
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

}  // namespace

double RunState::grad_norm(int step) const {
  double sum = 0;
  for (double squares : grad_squares.at(static_cast<size_t>(step))) sum += squares;
  return std::sqrt(sum);
}

void DeviceWorker::count_gradient_squares(int stage_index) {
  StageRuntime& st = stage(stage_index);
  auto& grads = grad_acc_[stage_index];
  // A weight several stages hold: every holder has the summed gradient; the first counts it.
  std::set<std::string> counted_elsewhere;
  for (const plan::SharedWeight& w : st.stage->shared_weights)
    if (w.stages.front() != stage_index) counted_elsewhere.insert(w.name);
  // Replicas hold the same summed gradients (all-reduced), the first counts them; ZeRO-1's
  // reduce-scatter leaves each replica the sum of its own shard only, which it counts.
  const bool first_replica = replica_ == 0;
  double sum = 0;
  if (st.shard_bounds.empty()) {
    if (first_replica)
      for (const auto& [name, weight] : st.weights)
        if (auto g = grads.find(name); g != grads.end() && !counted_elsewhere.contains(name))
          sum += sum_of_squares(*context_, g->second);
  } else {
    for (const StageRuntime::FlatWeight& part : st.flat)
      if (!st.is_sharded(part) && first_replica && !counted_elsewhere.contains(part.name))
        sum += sum_of_squares(*context_, grads.at(part.name));
    if (st.shard_hi > st.shard_lo)
      sum +=
          sum_of_squares(*context_, slice_rows(buckets_.at(stage_index), st.shard_lo, st.shard_hi));
  }
  run_.grad_squares[static_cast<size_t>(step_)][static_cast<size_t>(device_)] += sum;
}

void DeviceWorker::clip_gradients() {
  const double norm = run_.grad_norm(step_);
  // PyTorch's coefficient, clamped at 1 (a norm under C leaves the gradients as they are).
  const double coefficient = run_.clip_grad_norm / (norm + 1e-6);
  if (!(coefficient < 1)) return;
  for (int stage_index : deferred_) scale_gradients(stage_index, static_cast<float>(coefficient));
}

}  // namespace stagecraft::rt
