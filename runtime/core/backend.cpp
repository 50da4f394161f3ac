#include "runtime/core/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <span>

#include "runtime/format/error.h"

#ifdef STAGECRAFT_WITH_CUDA
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#endif

namespace stagecraft::rt {

const KernelEntry* Backend::find(std::string_view op_type) const {
  for (const KernelEntry& entry : table())
    if (entry.op_type == op_type) return &entry;
  return nullptr;
}

namespace {

/// `types` with every 16-bit float (bfloat16, float16) made float32.
std::vector<DType> widened(std::span<const DType> types) {
  std::vector<DType> out(types.begin(), types.end());
  for (DType& d : out)
    if (is_16bit_float(d)) d = DType::kFloat32;
  return out;
}

bool has_half(const OpSignature& s) {
  return std::any_of(s.inputs.begin(), s.inputs.end(), is_16bit_float) ||
         std::any_of(s.outputs.begin(), s.outputs.end(), is_16bit_float);
}

}  // namespace

std::string Backend::check(const OpSignature& signature) const {
  const KernelEntry* entry = find(signature.op_type);
  if (entry == nullptr) return fmt::format("op '{}' has no {} kernel", signature.op_type, name());
  std::string why = entry->check(signature);
  if (why.empty() || !runs_widened(signature)) return why;
  return "";
}

bool Backend::runs_widened(const OpSignature& signature) const {
  const KernelEntry* entry = find(signature.op_type);
  if (entry == nullptr || !has_half(signature) || entry->check(signature).empty()) return false;
  const std::vector<DType> in = widened(signature.inputs), out = widened(signature.outputs);
  return entry->check(OpSignature{signature.op_type, in, out, signature.attrs}).empty();
}

const KernelEntry& Backend::entry(std::string_view op_type) const {
  const KernelEntry* entry = find(op_type);
  if (entry == nullptr) fail(ErrorKind::kUnsupported, "op '{}' has no {} kernel", op_type, name());
  return *entry;
}

KernelFn Backend::kernel(std::string_view op_type) const { return entry(op_type).run; }

namespace {

const Backend* cpu_backend_ptr() { return &cpu_backend(); }

// The registry: every backend by name; `get` gives null for one this build lacks.
struct Registered {
  std::string_view name;
  const Backend* (*get)();
};
constexpr Registered kBackends[] = {
    {"cpu", cpu_backend_ptr},
    {"cuda", cuda_backend},
};

}  // namespace

#ifdef STAGECRAFT_WITH_CUDA
namespace {

// The CUDA plugin, loaded once: the backend, or why there is none.
struct CudaPlugin {
  const Backend* backend = nullptr;
  std::string why;
};

// Where the plugin may be: $STAGECRAFT_CUDA_PLUGIN, beside the executable, in ../lib or
// ../lib/stagecraft from it (an installed prefix), where `cmake --install` puts it by default,
// and where this build made it.
std::vector<std::string> plugin_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("STAGECRAFT_CUDA_PLUGIN"); env != nullptr && *env != '\0')
    return {env};
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / "libstagecraft_cuda.so").string());
    out.push_back((exe.parent_path().parent_path() / "lib" / "libstagecraft_cuda.so").string());
    out.push_back(
        (exe.parent_path().parent_path() / "lib" / "stagecraft" / "libstagecraft_cuda.so").string());
  }
  out.push_back(STAGECRAFT_CUDA_PLUGIN_INSTALLED);  // a program embedding an installed runtime
  out.push_back(STAGECRAFT_CUDA_PLUGIN_BUILT);
  return out;
}

const CudaPlugin& cuda_plugin() {
  static const CudaPlugin plugin = [] {
    CudaPlugin p;
    std::vector<std::string> tried;
    for (const std::string& path : plugin_candidates()) {
      if (!std::filesystem::exists(path)) {
        tried.push_back(path);
        continue;
      }
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed
      if (handle == nullptr) {
        p.why = fmt::format("the CUDA backend {} cannot be loaded: {}", path, ::dlerror());
        return p;
      }
      using Entry = const Backend* (*)();
      auto entry = reinterpret_cast<Entry>(::dlsym(handle, "stagecraft_cuda_backend"));
      if (entry == nullptr) {
        p.why =
            fmt::format("{} is not a stagecraft CUDA backend (no stagecraft_cuda_backend)", path);
        return p;
      }
      p.backend = entry();
      return p;
    }
    p.why =
        fmt::format("the CUDA backend plugin is missing (looked for {})", fmt::join(tried, ", "));
    return p;
  }();
  return plugin;
}

}  // namespace

const Backend* cuda_backend() { return cuda_plugin().backend; }

std::string cuda_backend_missing() { return cuda_plugin().why; }
#else
const Backend* cuda_backend() { return nullptr; }

std::string cuda_backend_missing() {
  return "this build has no CUDA backend (CMake found no CUDA compiler)";
}
#endif

std::string shared_device_warning(const Backend& backend, std::span<const int> devices) {
  if (backend.name() == "cpu" || devices.empty()) return "";
  std::map<int, std::string> physical;  // index -> name
  for (int device : devices) {
    Backend::Physical p = backend.physical_device(device);
    physical.emplace(p.index, p.name);
  }
  if (physical.size() >= devices.size()) return "";
  std::vector<std::string> names;
  for (const auto& [index, name] : physical) names.push_back(name);
  return fmt::format(
      "the plan's {} devices run on {} {} ({}): its predicted step has them compute at once, but "
      "devices that share a GPU take turns, so expect about the sum of their work (measured on "
      "an H100: a 2-device GPT-2 plan predicted 210 ms and took 353 ms, its 1-device plan 337 ms); "
      "plan with --devices {} to predict this machine",
      devices.size(), physical.size(), physical.size() == 1 ? "GPU" : "GPUs",
      fmt::join(names, ", "), physical.size());
}

std::string cuda_unusable() {
  const Backend* cuda = cuda_backend();
  return cuda == nullptr ? cuda_backend_missing() : cuda->unavailable();
}

const Backend& auto_backend(std::string* why) {
  const Backend* cuda = cuda_backend();
  std::string reason = cuda_unusable();
  if (reason.empty()) {
    if (why != nullptr) *why = "a GPU is visible";
    return *cuda;
  }
  if (why != nullptr) *why = reason;
  return cpu_backend();
}

std::vector<std::string_view> backend_names() {
  std::vector<std::string_view> names;
  for (const Registered& r : kBackends) names.push_back(r.name);
  return names;
}

const Backend& backend_by_name(std::string_view name) {
  if (name == "auto") return auto_backend();
  for (const Registered& r : kBackends) {
    if (r.name != name) continue;
    const Backend* backend = r.get();
    if (backend == nullptr)
      fail(ErrorKind::kUnsupported, "--backend {}: {}; use --backend cpu", name,
           cuda_backend_missing());
    if (std::string why = backend->unavailable(); !why.empty())
      fail(ErrorKind::kUnsupported, "--backend {}: {}; use --backend cpu", name, why);
    return *backend;
  }
  fail(ErrorKind::kUsage, "unknown backend '{}' (valid: auto, {})", name,
       fmt::join(backend_names(), ", "));
}

Tensor clone_on(DeviceContext& device, const Tensor& t) {
  Tensor copy = device.new_tensor(t.dtype, t.shape, false);
  device.copy(t, copy);
  return copy;
}

bool DeviceContext::unscale_many(Tensor* const* grads, size_t count, float factor) {
  bool finite = true;
  for (size_t k = 0; k < count; ++k) finite &= unscale(*grads[k], factor);
  return finite;
}

void DeviceContext::adam_many(const AdamTensors* items, size_t count, const AdamUpdate& u,
                              bool zero_grads) {
  for (const AdamTensors& t : std::span(items, count)) {
    adam(*t.w, *t.g, *t.m, *t.v, u);
    if (zero_grads) fill_zero(*t.g);
  }
}

double DeviceContext::time_ms(const std::function<void()>& body) {
  auto start = std::chrono::steady_clock::now();
  body();
  synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

namespace {

Tensor to_device_by(DeviceContext& device, const Tensor& host, bool pending) {
  if (device.host_visible() || host.dtype == DType::kUndefined) return host;
  Tensor t = device.new_tensor(host.dtype, host.shape, false);
  if (host.bytes() > 0 && pending)
    device.write_pending(t, host.data, host.bytes());
  else if (host.bytes() > 0)
    device.write(t, host.data, host.bytes());
  // Small integer operands keep a host mirror (Tensor::host_mirror): kernels that read shapes
  // and axes then never synchronise the device for them.
  constexpr int64_t kMirrorElements = 64;
  if ((host.dtype == DType::kInt64 || host.dtype == DType::kInt32) && host.bytes() > 0 &&
      host.numel() <= kMirrorElements) {
    std::shared_ptr<std::byte[]> mirror(new std::byte[static_cast<size_t>(host.bytes())]);
    std::memcpy(mirror.get(), host.data, static_cast<size_t>(host.bytes()));
    t.host_mirror = std::move(mirror);
  }
  return t;
}

}  // namespace

Tensor to_device(DeviceContext& device, const Tensor& host) {
  return to_device_by(device, host, false);
}

Tensor to_device_pending(DeviceContext& device, const Tensor& host) {
  return to_device_by(device, host, true);
}

Tensor to_host(DeviceContext& device, const Tensor& t) {
  if (device.host_visible() || t.dtype == DType::kUndefined) return t;
  Tensor host = Tensor::uninitialized(t.dtype, t.shape);
  if (t.bytes() > 0) device.read(t, host.data, t.bytes());
  return host;
}

float read_float(DeviceContext& device, const Tensor& t) {
  if (t.dtype != DType::kFloat32 || t.numel() != 1)
    fail(ErrorKind::kInternal, "reading a float from {} (one float32 element only)", t.describe());
  float value = 0;
  device.read(t, &value, sizeof value);
  return value;
}

Tensor scalar_on(DeviceContext& device, float value) {
  Tensor t = device.new_tensor(DType::kFloat32, {}, false);
  device.write(t, &value, sizeof value);
  return t;
}

}  // namespace stagecraft::rt
