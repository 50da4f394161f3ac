// Runs the importer over every model of ONNX's own backend test data (Debian package
// libonnx-testdata). Each model imports or is refused with a one-line Error naming the file;
// none crashes. For models that import, the output shapes stagecraft inferred must equal the
// shapes of the reference outputs shipped beside the model.
#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/format/error.h"

namespace stagecraft {
namespace {
namespace fs = std::filesystem;

const char* kTestData = "/usr/share/libonnx-testdata/data";

std::vector<fs::path> all_models() {
  std::vector<fs::path> models;
  for (const auto& suite : {"node", "pytorch-converted", "pytorch-operator", "simple", "real"}) {
    fs::path dir = fs::path(kTestData) / suite;
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (fs::exists(entry.path() / "model.onnx")) models.push_back(entry.path() / "model.onnx");
    }
  }
  std::sort(models.begin(), models.end());
  return models;
}

/// Dims of test_data_set_0/output_K.pb, or nullopt when it cannot be read.
std::optional<std::vector<int64_t>> reference_output_dims(const fs::path& model, int k) {
  fs::path pb = model.parent_path() / "test_data_set_0" / ("output_" + std::to_string(k) + ".pb");
  std::ifstream f(pb, std::ios::binary);
  onnx::TensorProto t;
  if (!f || !t.ParseFromIstream(&f)) return std::nullopt;
  return std::vector<int64_t>(t.dims().begin(), t.dims().end());
}

TEST_CASE("every ONNX conformance model imports or is refused with a clear reason") {
  auto models = all_models();
  REQUIRE_MESSAGE(models.size() > 900, "libonnx-testdata is missing: run tools/setup.sh");
  int imported = 0, refused = 0, shapes_checked = 0;
  std::map<ErrorKind, int> by_kind;
  for (const auto& path : models) {
    CAPTURE(path);
    try {
      auto model = import_model(path.string(), ImportOptions{});
      ++imported;
      // The imported graph writes back out as a model the ONNX checker accepts.
      CHECK_NOTHROW(onnx::checker::check_model(ir::model_from_graph(model.graph)));
      for (std::size_t k = 0; k < model.graph.outputs.size(); ++k) {
        auto ref = reference_output_dims(path, static_cast<int>(k));
        if (!ref) continue;
        CHECK(model.graph.value(model.graph.outputs[k]).shape == *ref);
        ++shapes_checked;
      }
    } catch (const Error& e) {
      ++refused;
      ++by_kind[e.kind()];
      std::string what = e.what();
      CHECK(what.rfind(path.string(), 0) == 0);
      CHECK(what.find('\n') == std::string::npos);
      CHECK(e.kind() != ErrorKind::kInternal);
    }
  }
  MESSAGE("conformance import: " << models.size() << " models, " << imported << " imported ("
                                 << shapes_checked << " output shapes checked against the reference), "
                                 << refused << " refused (" << by_kind[ErrorKind::kUnsupported]
                                 << " unsupported)");
  // Every model of an op on the supported list should import; a drop here is a regression.
  CHECK(imported >= 340);
}

}  // namespace
}  // namespace stagecraft
