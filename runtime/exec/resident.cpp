// What a device keeps between runs (stage_runtime.h's ResidentDevice): the stages' weights and
// optimizer state copied to a device of its own memory and back, and Pipeline::sync_host, which
// gives the host its copies between runs.
#include "runtime/exec/pipeline.h"
#include "runtime/exec/stage_runtime.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {

void upload_stage(DeviceContext& device, StageRuntime& st, int64_t step) {
  st.host_weights = st.weights;
  std::map<std::string, Tensor> on_device;
  for (const auto& [name, w] : st.weights) on_device[name] = to_device(device, w);
  st.program.rebind_weights(on_device);
  st.weights = std::move(on_device);
  if (st.backward) {
    st.host_backward_weights = st.backward->weights();
    std::map<std::string, Tensor> constants;
    for (const auto& [name, w] : st.host_backward_weights) constants[name] = to_device(device, w);
    st.backward->rebind_weights(constants);
  }
  st.host_opt_state = st.opt_state;
  for (auto& [name, state] : st.opt_state)
    for (auto& [key, t] : state.tensors) t = to_device(device, t);
  st.on_device = true;
  st.host_stale = false;
  st.host_step = step;
}

void download_stage(DeviceContext& device, StageRuntime& st, int64_t step) {
  if (!st.on_device) return;
  for (const auto& [name, w] : st.weights) {
    Tensor& host = st.host_weights.at(name);  // the program's own bytes: updated in place
    if (w.bytes() > 0) device.read(w, host.data, w.bytes());
  }
  for (const auto& [name, state] : st.opt_state)
    for (const auto& [key, t] : state.tensors) {
      Tensor& host = st.host_opt_state[name].tensors[key];
      if (host.dtype != t.dtype || host.shape != t.shape)
        host = Tensor::uninitialized(t.dtype, t.shape);  // made by the optimizer on the device
      if (t.bytes() > 0) device.read(t, host.data, t.bytes());
    }
  st.host_stale = false;
  st.host_step = step;
}

void release_stage(StageRuntime& st) {
  if (!st.on_device) return;
  st.program.rebind_weights(st.host_weights);
  if (st.backward) st.backward->rebind_weights(st.host_backward_weights);
  st.weights = std::move(st.host_weights);
  st.opt_state = std::move(st.host_opt_state);
  st.host_weights.clear();
  st.host_opt_state.clear();
  st.host_backward_weights.clear();
  st.on_device = false;
}

void Pipeline::sync_host() const {
  if (running_) return;
  for (const auto& st : stages_) {
    if (!st->on_device) continue;
    const size_t device = static_cast<size_t>(st->replica * plan_.devices + st->stage->device);
    ResidentDevice* home = device < resident_.size() ? resident_[device].get() : nullptr;
    if (home == nullptr || !home->context)
      fail(ErrorKind::kInternal, "stage {} of replica {} is on device {}, which kept no context",
           st->stage->index, st->replica, device);
    home->context->bind_thread();
    if (st->host_stale) download_stage(*home->context, *st, steps_done_);
    home->context->unbind_thread();
    release_stage(*st);
  }
}

}  // namespace stagecraft::rt
