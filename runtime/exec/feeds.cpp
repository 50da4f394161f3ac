// The run's inputs on a device's worker (device_worker.h: pin_feeds, unpin_feeds): its
// microbatches' rows page-locked for a run of several steps, so that `forward` queues each
// feed's copy with no wait for the device (DeviceContext::write_pending).
#include <exception>
#include <set>
#include <string>

#include "runtime/exec/device_worker.h"

namespace stagecraft::rt {

void DeviceWorker::pin_feeds() {
  // A run of one step (stagerun's data files run a step a run) would page-lock its inputs for
  // one copy each, which costs about what it saves.
  if (context_->host_visible() || run_.steps < 2) return;
  std::set<std::string> named;
  for (StageRuntime* st : own_stages())
    for (const ValueInfo& in : st->program.inputs()) {
      auto f = run_.feeds.find(in.name);
      if (f == run_.feeds.end() || !named.insert(in.name).second) continue;
      // This replica's microbatches: rows of one input, one range (or one tensor for all).
      const std::byte* lo = nullptr;
      const std::byte* hi = nullptr;
      for (int mb = 0; mb < run_.microbatches; ++mb) {
        const Tensor& t = f->second[batch_index(mb)];
        if (t.data == nullptr || t.bytes() == 0) continue;
        if (lo == nullptr || t.data < lo) lo = t.data;
        if (hi == nullptr || t.data + t.bytes() > hi) hi = t.data + t.bytes();
      }
      if (lo != nullptr && context_->pin_host(lo, hi - lo)) pinned_.push_back(lo);
    }
}

void DeviceWorker::unpin_feeds() {
  if (pinned_.empty()) return;
  try {
    context_->synchronize();         // no copy still reads them
  } catch (const std::exception&) {  // a failed device: the run's error says why
  }
  for (const void* p : pinned_) context_->unpin_host(p);
  pinned_.clear();
}

}  // namespace stagecraft::rt
