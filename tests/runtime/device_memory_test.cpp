// The executor with a device whose memory is not the host's, proved without a GPU: a test
// backend runs the CPU's kernels but says its memory is its own (`host_visible` false) and
// checks, at every kernel call, that each input and output lies in memory the device itself
// allocated (its arena, its tensors). So the plumbing CUDA relies on — weights and optimizer
// state copied to the device for a run and back to the host before every checkpoint and at the
// end, feeds uploaded, results downloaded, messages adopted — is tested here on every sample:
// the losses, outputs, checkpointed and final weights equal the CPU backend's bit for bit.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

// Every live allocation of the test devices: first byte -> size.
class Registry {
 public:
  void add(const std::byte* p, int64_t n) {
    std::lock_guard lock(mutex_);
    live_[p] = n;
  }
  void remove(const std::byte* p) {
    std::lock_guard lock(mutex_);
    live_.erase(p);
  }
  bool holds(const std::byte* p, int64_t n) {
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(p);
    if (it == live_.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
  }

 private:
  std::mutex mutex_;
  std::map<const std::byte*, int64_t> live_;
};

Registry& registry() {
  static Registry r;
  return r;
}

class RegisteredBuffer final : public Buffer {
 public:
  explicit RegisteredBuffer(std::unique_ptr<Buffer> inner) : inner_(std::move(inner)) {
    registry().add(inner_->base(), inner_->size());
  }
  ~RegisteredBuffer() override { registry().remove(inner_->base()); }
  std::byte* base() const override { return inner_->base(); }
  int64_t size() const override { return inner_->size(); }

 private:
  std::unique_ptr<Buffer> inner_;
};

// Bytes copied between the host and the test devices, all of them together.
struct Traffic {
  std::atomic<int64_t> written{0}, read{0};
};

Traffic& traffic() {
  static Traffic t;
  return t;
}

// The CPU device, but its memory counts as its own.
class SeparateContext final : public cpu::CpuContext {
 public:
  SeparateContext() : cpu::CpuContext(1) {}
  bool host_visible() const override { return false; }
  void write(Tensor& dst, const void* host, int64_t bytes) override {
    traffic().written += bytes;
    cpu::CpuContext::write(dst, host, bytes);
  }
  void read(const Tensor& src, void* host, int64_t bytes) override {
    traffic().read += bytes;
    cpu::CpuContext::read(src, host, bytes);
  }
  std::unique_ptr<Buffer> allocate(int64_t bytes) override {
    return std::make_unique<RegisteredBuffer>(cpu::CpuContext::allocate(bytes));
  }
  Tensor new_tensor(DType dtype, Shape shape, bool zeroed) override {
    Tensor t = cpu::CpuContext::new_tensor(dtype, std::move(shape), zeroed);
    std::byte* p = t.data;
    registry().add(p, std::max<int64_t>(t.bytes(), 1));
    t.storage = std::shared_ptr<std::byte[]>(
        p, [inner = t.storage](std::byte* q) { registry().remove(q); });
    return t;
  }
};

void expect_on_device(const KernelArgs& a, const Tensor& t, const char* role, size_t k) {
  if (t.bytes() > 0 && !registry().holds(t.data, t.bytes()))
    fail(ErrorKind::kInternal, "node '{}' ({}): {} {} ({}) is not in the device's memory", a.name,
         a.op_type, role, k, t.describe());
}

// Checks every operand, then runs the CPU kernel.
void checked_kernel(const KernelArgs& a) {
  // A bare input (a forward value the gradient reads for its shape only: grad_reads.h) has no
  // bytes anywhere.
  for (size_t k = 0; k < a.in.size(); ++k)
    if (a.in[k] != nullptr && a.in[k]->data != nullptr) expect_on_device(a, *a.in[k], "input", k);
  for (size_t k = 0; k < a.out.size(); ++k)
    if (a.out[k] != nullptr) expect_on_device(a, *a.out[k], "output", k);
  cpu_backend().kernel(a.op_type)(a);
}

class SeparateMemoryBackend final : public Backend {
 public:
  SeparateMemoryBackend() {
    for (KernelEntry e : cpu_backend().table()) {
      e.run = checked_kernel;
      table_.push_back(e);
    }
  }
  std::string_view name() const override { return "cpu (memory of its own)"; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::span<const KernelEntry> table() const override { return table_; }
  std::unique_ptr<DeviceContext> make_device(int, int) const override {
    return std::make_unique<SeparateContext>();
  }
  Physical physical_device(int device) const override {
    return cpu_backend().physical_device(device);
  }

 private:
  std::vector<KernelEntry> table_;
};

plan::PlanOptions options_for(const std::string& file, const std::string& loss, int devices,
                              bool training, const std::string& schedule) {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/" + file;
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.training = training;
  o.schedule = stagecraft::parse_schedule(training ? schedule : "inference");
  if (training && schedule == "interleaved") o.chunks = 2;
  if (training) {
    o.optimizer = stagecraft::OptimizerKind::kAdam;
    o.training_config.lr = 0.01;
    o.loss.kind = loss;
  }
  o.device_spec = "cpu";
  if (file == "gpt_tiny.onnx") o.dims["seq"] = 8;
  return o;
}

// Every weight of every stage, copied.
using Snapshot = std::vector<std::map<std::string, std::vector<std::byte>>>;

Snapshot snapshot(const Pipeline& p) {
  Snapshot s(p.plan().stages.size());
  for (size_t k = 0; k < s.size(); ++k)
    for (const auto& [name, t] : p.stage_weights(static_cast<int>(k)))
      s[k][name].assign(t.data, t.data + t.bytes());
  return s;
}

struct Outcome {
  RunReport report;
  std::vector<Snapshot> checkpoints;  // the weights the checkpoint hook saw, each time
  Snapshot final_weights;
  std::vector<double> second_run;  // losses of a second run (state carried over)
};

// Training: a first run without checkpoints (its weights come back at its end), then a second
// of 3 steps saving every 2 (the weights come back mid-run, at step 2, and at its end).
Outcome run_on(const Backend& backend, const plan::PlanOptions& o, int steps) {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), backend, 1);
  Outcome out;
  RunOptions options;
  options.steps = steps;
  out.report = pipeline->run(pipeline->synthetic_inputs(), options);
  out.final_weights = snapshot(*pipeline);
  if (o.training) {
    options.steps = 3;
    options.checkpoint_every = 2;
    options.checkpoint = [&](int64_t) { out.checkpoints.push_back(snapshot(*pipeline)); };
    out.second_run = pipeline->run(pipeline->synthetic_inputs(), options).losses;
  }
  return out;
}

// The weights a freshly loaded plan starts from.
Snapshot snapshot_of_initial(const plan::PlanOptions& o) {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  return snapshot(*Pipeline::load(dir.file("plan"), cpu_backend(), 1));
}

TEST_CASE("a device of its own memory runs plans as the host does, bit for bit") {
  const SeparateMemoryBackend separate;
  struct Case {
    std::string file, loss, schedule;
    int devices;
  };
  const Case cases[] = {{"toy.onnx", "mse", "1f1b", 2},
                        {"mnist_cnn.onnx", "cross-entropy", "zb-h1", 2},
                        {"gpt_tiny.onnx", "cross-entropy", "interleaved", 2},
                        {"resnet_small.onnx", "mse", "gpipe", 3}};
  for (const Case& c : cases)
    for (bool training : {false, true}) {
      CAPTURE(c.file);
      CAPTURE(training);
      plan::PlanOptions o = options_for(c.file, c.loss, c.devices, training, c.schedule);
      Outcome want = run_on(cpu_backend(), o, 4), got = run_on(separate, o, 4);
      CHECK(got.report.losses == want.report.losses);
      CHECK(got.second_run == want.second_run);
      REQUIRE(got.report.outputs.size() == want.report.outputs.size());
      for (const auto& [name, w] : want.report.outputs) {
        const Tensor& g = got.report.outputs.at(name);
        REQUIRE(g.bytes() == w.bytes());
        CHECK(std::equal(g.data, g.data + g.bytes(), w.data));
      }
      CHECK(got.checkpoints.size() == (training ? 2u : 0u));
      CHECK(got.checkpoints == want.checkpoints);
      CHECK(got.final_weights == want.final_weights);
      if (training) CHECK(got.final_weights != snapshot_of_initial(o));
    }
}

int64_t weight_bytes(const Snapshot& s) {
  int64_t total = 0;
  for (const auto& stage : s)
    for (const auto& [name, bytes] : stage) total += static_cast<int64_t>(bytes.size());
  return total;
}

// A training loop of one run per step (stagerun --data, --tokens) on a device of its own
// memory: the weights and optimizer state stay on the device from run to run, the host gets
// them when it asks between runs, and what the host writes then is what the next run trains.
TEST_CASE("a device of its own memory keeps the weights between runs") {
  const SeparateMemoryBackend separate;
  plan::PlanOptions o = options_for("gpt_tiny.onnx", "cross-entropy", 2, true, "1f1b");
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  auto host = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  auto device = Pipeline::load(dir.file("plan"), separate, 1);
  const auto inputs = host->synthetic_inputs();
  const int64_t weights = weight_bytes(snapshot(*host));
  REQUIRE(weights > 100000);
  RunOptions one;
  one.steps = 1;
  RunOptions eval = one;
  eval.forward_only = true;

  // Four runs of a step, an evaluation after the second: as the CPU's, bit for bit.
  std::vector<int64_t> written, read;
  for (int s = 0; s < 4; ++s) {
    const int64_t w0 = traffic().written, r0 = traffic().read;
    CHECK(device->run(inputs, one).losses == host->run(inputs, one).losses);
    written.push_back(traffic().written - w0);
    read.push_back(traffic().read - r0);
    if (s == 1) CHECK(device->run(inputs, eval).losses == host->run(inputs, eval).losses);
  }
  // The first run uploads the weights; the later ones move only their inputs and results.
  CHECK(written[0] > weights);
  for (int s = 1; s < 4; ++s) {
    CAPTURE(s);
    CHECK(written[s] == written[1]);
    CHECK(written[s] < weights / 10);
    CHECK(read[s] < weights / 10);
  }
  // Asked between runs, the host gets the trained weights back (Adam's state too: the next
  // steps agree only if it came back and goes up again).
  int64_t r0 = traffic().read;
  const Snapshot trained = snapshot(*device);
  CHECK(traffic().read - r0 >= 2 * weights);
  CHECK(trained == snapshot(*host));
  CHECK(trained != snapshot_of_initial(o));

  // What the host writes between runs is what the next run trains on.
  for (Pipeline* p : {host.get(), device.get()})
    for (const auto& [name, t] : p->stage_weights(0)) {
      if (t.dtype != DType::kFloat32) continue;
      float* v = reinterpret_cast<float*>(t.data);
      for (int64_t k = 0; k < t.numel(); ++k) v[k] *= 0.5f;
    }
  const int64_t w0 = traffic().written;
  const std::vector<double> halved = host->run(inputs, one).losses;
  CHECK(device->run(inputs, one).losses == halved);
  CHECK(traffic().written - w0 > weights);
  CHECK(snapshot(*device) == snapshot(*host));
}

}  // namespace
}  // namespace stagecraft::rt
