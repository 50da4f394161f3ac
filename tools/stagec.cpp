// stagec: the offline compiler's command line.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "compiler/import.h"
#include "compiler/model_info.h"
#include "runtime/format/error.h"

namespace {

int run(int argc, char** argv) {
  using namespace stagecraft;
  CLI::App app{
      "stagec - compile an ONNX model into a pipeline-parallel plan.\n\n"
      "Import checks the model (ONNX checker, strict shape inference), binds symbolic input dims\n"
      "from --batch and --dim, and folds the shape arithmetic exporters emit into constants.\n"
      "Today stagec answers --info; planning (-o PLAN_DIR --devices N ...) is being built.",
      "stagec"};
  std::string model_path;
  bool info = false;
  bool json = false;
  std::optional<int64_t> batch;
  std::vector<std::string> dims;
  app.add_option("model", model_path, "ONNX model file (.onnx); external weight files must sit in its folder")
      ->required();
  app.add_flag("--info", info,
               "print what the model is: opset, inputs/outputs with bound shapes, node count by op, "
               "parameters, forward FLOPs, which dims were bound");
  app.add_flag("--json", json, "with --info: print the same facts as one JSON object");
  app.add_option("--batch", batch, "bind the first dim of every input whose first dim is symbolic");
  app.add_option("--dim", dims,
                 "bind a symbolic dim by name, NAME=VALUE (e.g. --dim seq=512), or an unnamed one "
                 "as INPUT:INDEX=VALUE; repeatable");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  ImportOptions options;
  options.batch = batch;
  for (const auto& d : dims) parse_dim_binding(d, options);
  if (!info) {
    fail(ErrorKind::kUsage, "nothing to do: give --info (planning with -o PLAN_DIR is not built yet)");
  }
  if (json && !info) fail(ErrorKind::kUsage, "--json needs --info");

  ImportedModel model = import_model(model_path, options);
  ModelInfo facts = describe_model(model);
  if (json) {
    fmt::print("{}\n", to_json(facts).dump(2));
  } else {
    fmt::print("{}", render_text(facts));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagec", [&] { return run(argc, argv); });
}
