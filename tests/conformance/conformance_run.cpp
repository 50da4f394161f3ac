// Runs ONNX's own backend conformance cases (Debian package libonnx-testdata) on a runtime
// backend (--backend NAME, default cpu) and compares every output with the reference at rtol
// 1e-3 / atol 1e-5, and with the CPU backend's result on the same inputs (the reference every
// backend is held to; bit for bit on the CPU itself). Adding a backend is adding its name.
//
//   stagecraft-conformance [--data DIR] [--skips FILE] [--filter TEXT] [--verbose]
//                          [--write-skips FILE]
//
// Each case is a folder with model.onnx and test_data_set_N/{input,output}_K.pb. The model goes
// through the compiler's import (checker, strict shape inference with the test data's dims
// bound), is written back with every shape recorded, as stagec writes a stage file, and runs
// as one program. Cases listed in the skip file (one per line: "suite/case  reason") are not
// run; every other case must pass, and a listed case that passes is reported so the list stays
// honest. Exit status 0 only when nothing failed.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"

namespace fs = std::filesystem;
using namespace stagecraft;

namespace {

struct Outcome {
  enum Kind { kPass, kFail, kRefused, kNoKernel } kind = kPass;
  std::string detail;
};

// IEEE half precision to double (exact).
double half_to_double(uint16_t h) {
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

// Compares one output; "" when equal within tolerance.
std::string compare(const rt::Tensor& got, const rt::Tensor& want, double rtol, double atol) {
  if (got.dtype != want.dtype)
    return fmt::format("dtype {} vs reference {}", dtype_name(got.dtype), dtype_name(want.dtype));
  if (got.shape != want.shape)
    return fmt::format("shape {} vs reference {}", rt::shape_string(got.shape),
                       rt::shape_string(want.shape));
  int64_t n = got.numel();
  auto as_double = [](const rt::Tensor& t, int64_t i) -> double {
    switch (t.dtype) {
      case DType::kFloat32:
        return t.as<float>()[i];
      case DType::kFloat64:
        return t.as<double>()[i];
      case DType::kInt64:
        return static_cast<double>(t.as<int64_t>()[i]);
      case DType::kInt32:
        return t.as<int32_t>()[i];
      case DType::kInt16:
        return t.as<int16_t>()[i];
      case DType::kInt8:
        return t.as<int8_t>()[i];
      case DType::kUInt8:
      case DType::kBool:
        return t.as<uint8_t>()[i];
      case DType::kUInt16:
        return t.as<uint16_t>()[i];
      case DType::kUInt32:
        return t.as<uint32_t>()[i];
      case DType::kUInt64:
        return static_cast<double>(t.as<uint64_t>()[i]);
      case DType::kFloat16:
        return half_to_double(t.as<uint16_t>()[i]);
      case DType::kBFloat16: {
        uint32_t bits = static_cast<uint32_t>(t.as<uint16_t>()[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }
      default:
        fail(ErrorKind::kUnsupported, "cannot compare {} tensors", dtype_name(t.dtype));
    }
  };
  bool exact = !is_floating(got.dtype);
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = as_double(got, i), b = as_double(want, i);
    bool ok;
    if (exact)
      ok = a == b;
    else if (std::isnan(b))
      ok = std::isnan(a);
    else if (std::isinf(b))
      ok = a == b;
    else
      ok = std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
      worst = std::max(worst, std::fabs(a - b));
    }
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} values differ (first at {}: {} vs {}; largest difference {:.3g})",
                     bad, n, first, as_double(got, first), as_double(want, first), worst);
}

// Runs `program` once on a fresh device of `backend`, its intermediates in the device's arena.
std::vector<rt::Tensor> run_program(const rt::Program& program, const rt::Backend& backend,
                                    const std::vector<rt::Tensor>& args) {
  auto device = backend.make_device(0, 1);
  auto arena = device->allocate(program.arena_bytes());
  return rt::run_from_host(program, *device, args, arena->base());
}

// The largest magnitude of a float output (1 for other types and for smaller values).
double scale_of(const rt::Tensor& t) {
  double scale = 1;
  if (t.dtype == DType::kFloat32)
    for (int64_t i = 0; i < t.numel(); ++i) scale = std::max(scale, std::fabs(double{t.as<float>()[i]}));
  return scale;
}

// The backend under test against the CPU backend, the reference every backend is held to: ""
// when every output agrees (bit for bit when the backend under test is the CPU's, else at
// rtol 1e-4 and atol 1e-6 of the output's largest magnitude), else the first difference. The
// atol scales because a value near 0 carries the rounding of its neighbours' magnitude: oneDNN's
// log(1) is -1.4e-6 beside log(10) = 2.3, where CUDA's logf(1) is exactly 0.
std::string against_cpu(const onnx::ModelProto& model, const rt::Backend& backend,
                        const std::vector<rt::Tensor>& args, const std::vector<rt::Tensor>& got,
                        const fs::path& model_path) {
  const rt::Backend& cpu = rt::cpu_backend();
  std::vector<rt::Tensor> want;
  try {
    want = run_program(rt::Program::from_model(model, cpu, model_path.string()), cpu, args);
  } catch (const Error& e) {
    return fmt::format("the cpu reference fails: {}", e.what());
  }
  const bool exact = &backend == &cpu;
  for (size_t k = 0; k < got.size(); ++k)
    if (std::string diff =
            compare(got[k], want[k], exact ? 0 : 1e-4, exact ? 0 : 1e-6 * scale_of(want[k]));
        !diff.empty())
      return fmt::format("output {} differs from the cpu backend's: {}", k, diff);
  return "";
}

Outcome run_case(const fs::path& dir, const rt::Backend& backend) {
  fs::path model_path = dir / "model.onnx";
  onnx::ModelProto original;
  {
    std::ifstream in(model_path, std::ios::binary);
    if (!in || !original.ParseFromIstream(&in))
      return {Outcome::kRefused, "model.onnx does not parse"};
  }
  std::set<std::string> initializers;
  for (const auto& init : original.graph().initializer()) initializers.insert(init.name());
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const auto& in : original.graph().input())
    if (!initializers.count(in.name())) inputs.push_back(&in);
  // Sequences, maps and optionals: the runtime runs plain tensors only.
  for (const auto* list : {&original.graph().input(), &original.graph().output()})
    for (const auto& v : *list)
      if (!v.type().has_tensor_type())
        return {Outcome::kRefused,
                fmt::format("'{}' is a sequence, map or optional; the runtime runs tensors only",
                            v.name())};

  std::vector<fs::path> sets;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(entry.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {Outcome::kRefused, "no test_data_set_N folder"};

  for (const fs::path& set : sets) {
    // Reference inputs; their dims bind whatever the model leaves symbolic.
    std::map<std::string, rt::Tensor> feeds;
    ImportOptions options;
    for (size_t k = 0; k < inputs.size(); ++k) {
      fs::path pb = set / fmt::format("input_{}.pb", k);
      if (!fs::exists(pb)) continue;  // an optional input the case leaves out
      rt::Tensor t;
      try {
        t = rt::read_tensor_pb(pb.string());
      } catch (const Error& e) {
        return {Outcome::kRefused, e.what()};
      }
      const auto& type = inputs[k]->type().tensor_type();
      for (int d = 0; d < type.shape().dim_size() && d < t.rank(); ++d) {
        const auto& dim = type.shape().dim(d);
        if (dim.has_dim_value()) continue;
        if (dim.has_dim_param() && !dim.dim_param().empty())
          options.dims[dim.dim_param()] = t.shape[d];
        else
          options.dims[fmt::format("{}:{}", inputs[k]->name(), d)] = t.shape[d];
      }
      feeds[inputs[k]->name()] = std::move(t);
    }
    onnx::ModelProto model;
    rt::Program program;
    try {
      ImportedModel imported = import_model(model_path.string(), options);
      model = ir::model_from_graph(imported.graph);
      program = rt::Program::from_model(model, backend, model_path.string());
    } catch (const Error& e) {
      // An op the CPU runs but the backend under test does not have yet (listed in
      // tests/gpu/cuda_table_covers_cpu_test.cpp): counted apart, not as a failure.
      const std::string no_kernel = fmt::format(" has no {} kernel", backend.name());
      if (&backend != &rt::cpu_backend() && std::string(e.what()).find(no_kernel) != std::string::npos)
        return {Outcome::kNoKernel, e.what()};
      return {Outcome::kRefused, e.what()};
    }
    std::vector<rt::Tensor> args;
    for (const rt::ValueInfo& in : program.inputs()) {
      auto it = feeds.find(in.name);
      if (it == feeds.end())
        return {Outcome::kFail, fmt::format("no reference data for input '{}'", in.name)};
      args.push_back(it->second);
    }
    std::vector<rt::Tensor> outputs;
    try {
      outputs = run_program(program, backend, args);
    } catch (const Error& e) {
      return {Outcome::kFail, e.what()};
    }
    for (size_t k = 0; k < outputs.size(); ++k) {
      fs::path pb = set / fmt::format("output_{}.pb", k);
      if (!fs::exists(pb)) continue;
      rt::Tensor want = rt::read_tensor_pb(pb.string());
      std::string diff = compare(outputs[k], want, 1e-3, 1e-5);
      if (!diff.empty())
        return {Outcome::kFail, fmt::format("{}: output {} ('{}'): {}", set.filename().string(), k,
                                            program.outputs()[k].name, diff)};
    }
    if (std::string diff = against_cpu(model, backend, args, outputs, model_path); !diff.empty())
      return {Outcome::kFail, fmt::format("{}: {}", set.filename().string(), diff)};
  }
  return {Outcome::kPass, ""};
}

// Reduces a refusal to a short reason for the skip list: the error without the file names.
std::string skip_reason(const std::string& detail) {
  std::smatch m;
  static const std::regex op_re(
      R"(op (\w+) \(node .*, domain '?([\w.]*)'?, opset \d+\) is not supported)");
  if (std::regex_search(detail, m, op_re)) {
    std::string domain = m[2];
    if (domain == "ai.onnx.preview.training")
      return fmt::format("training-domain op {} (ai.onnx.preview.training)", std::string(m[1]));
    if (domain != "ai.onnx" && !domain.empty())
      return fmt::format("op {} of domain {}", std::string(m[1]), domain);
    return fmt::format("unsupported op {}", std::string(m[1]));
  }
  if (detail.find("element type 8") != std::string::npos) return "string tensors";
  if (detail.find("sequence, map or optional") != std::string::npos)
    return "sequence, map or optional values";
  if (detail.find("ONNX shape inference") != std::string::npos)
    return "ONNX 1.12 shape inference refuses the model: " +
           detail.substr(detail.find("ONNX shape inference") + 22);
  // Otherwise the message after the last file name.
  auto at = detail.rfind(".onnx: ");
  if (at == std::string::npos) at = detail.rfind(".pb: ");
  std::string reason = at == std::string::npos ? detail : detail.substr(detail.find(": ", at) + 2);
  return reason;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main("stagecraft-conformance", [&] {
    CLI::App app{"Runs ONNX's backend conformance cases on a stagecraft backend."};
    std::string data = "/usr/share/libonnx-testdata/data", skips_file, filter, write_skips,
                backend_name = "cpu";
    bool verbose = false;
    app.add_option("--data", data,
                   "Folder of suites (node, pytorch-converted, pytorch-operator, simple)");
    app.add_option("--skips", skips_file, "Versioned skip list: 'suite/case  reason' per line");
    app.add_option("--filter", filter, "Only cases whose name contains this text");
    app.add_option("--backend", backend_name,
                   "Backend to run on and compare with the cpu backend (default cpu)");
    app.add_option("--write-skips", write_skips,
                   "Write every case that does not pass as a skip list (for review)");
    app.add_flag("-v,--verbose", verbose, "Print every case");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    const rt::Backend& backend = rt::backend_by_name(backend_name);

    std::map<std::string, std::string> skips;
    if (!skips_file.empty()) {
      std::ifstream in(skips_file);
      if (!in) fail(ErrorKind::kIo, "{}: cannot open", skips_file);
      std::string line;
      int number = 0;
      while (std::getline(in, line)) {
        ++number;
        if (line.empty() || line[0] == '#') continue;
        std::istringstream ss(line);
        std::string name, reason;
        ss >> name;
        std::getline(ss, reason);
        auto first = reason.find_first_not_of(" \t");
        if (first == std::string::npos)
          fail(ErrorKind::kFormat, "{}:{}: skip of '{}' gives no reason", skips_file, number, name);
        skips[name] = reason.substr(first);
      }
    }

    std::vector<std::pair<std::string, fs::path>> cases;
    for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
      fs::path dir = fs::path(data) / suite;
      if (!fs::exists(dir)) continue;
      for (const auto& entry : fs::directory_iterator(dir))
        if (fs::exists(entry.path() / "model.onnx"))
          cases.push_back(
              {fmt::format("{}/{}", suite, entry.path().filename().string()), entry.path()});
    }
    std::sort(cases.begin(), cases.end());
    if (cases.empty())
      fail(ErrorKind::kIo, "{}: no conformance cases (install libonnx-testdata)", data);

    int passed = 0, failed = 0, skipped = 0, unexpected = 0, no_kernel = 0;
    std::vector<std::string> failures;
    std::ofstream skip_out;
    if (!write_skips.empty()) {
      skip_out.open(write_skips);
      skip_out << "# ONNX conformance cases the cpu backend does not run, with the reason.\n";
    }
    for (const auto& [name, dir] : cases) {
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      auto skip = skips.find(name);
      if (verbose) fmt::print("run  {}\n", name), std::fflush(stdout);
      Outcome outcome = run_case(dir, backend);
      if (outcome.kind == Outcome::kNoKernel && skip == skips.end()) {
        ++no_kernel;
        if (verbose) fmt::print("no kernel {}: {}\n", name, outcome.detail);
        continue;
      }
      if (skip != skips.end()) {
        if (outcome.kind == Outcome::kPass) {
          ++unexpected;
          failures.push_back(
              fmt::format("{}: passes but is listed as skipped ({})", name, skip->second));
        } else {
          ++skipped;
          if (verbose) fmt::print("skip {}: {}\n", name, skip->second);
        }
        if (skip_out.is_open() && outcome.kind != Outcome::kPass)
          skip_out << name << "  " << skip->second << "\n";
        continue;
      }
      if (outcome.kind == Outcome::kPass) {
        ++passed;
        if (verbose) fmt::print("pass {}\n", name);
      } else {
        ++failed;
        failures.push_back(fmt::format("{}: {}{}", name,
                                       outcome.kind == Outcome::kRefused ? "refused: " : "",
                                       outcome.detail));
        if (skip_out.is_open()) skip_out << name << "  " << skip_reason(outcome.detail) << "\n";
      }
    }
    for (const std::string& f : failures) fmt::print("FAIL {}\n", f);
    fmt::print("conformance ({}): passed {}, failed {}, skipped {}{}{}\n", backend.name(), passed,
               failed + unexpected, skipped,
               unexpected ? fmt::format(" ({} listed as skipped pass)", unexpected) : "",
               no_kernel ? fmt::format(", {} not run (an op without a {} kernel)", no_kernel,
                                       backend.name())
                         : "");
    return failed + unexpected == 0 ? 0 : 1;
  });
}
