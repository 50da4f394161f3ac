// stagecraft-ops-table: the supported-ops table of docs/ops.md, generated from the op table
// (compiler/ir/ops.def) so that the two cannot drift apart.
//
//   stagecraft-ops-table                 prints the table (Markdown)
//   stagecraft-ops-table --write FILE    replaces the table between FILE's markers
//   stagecraft-ops-table --check FILE    fails, in one line saying what to run, when FILE's table
//                                        is not the one ops.def gives (cli.ops_table_readme)
//
// The table sits between a line starting with kBegin and a line starting with kEnd.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/ir/ops.h"
#include "runtime/format/error.h"
#include "tools/cli_common.h"

namespace {

using namespace stagecraft;

constexpr std::string_view kBegin = "<!-- ops-table begin";
constexpr std::string_view kEnd = "<!-- ops-table end";

std::string_view family_name(OpFamily family) {
  switch (family) {
    case OpFamily::kMatMul:
      return "matmul";
    case OpFamily::kConv:
      return "conv";
    case OpFamily::kNorm:
      return "norm";
    case OpFamily::kPool:
      return "pool";
    case OpFamily::kElementwise:
      return "elementwise";
    case OpFamily::kReduce:
      return "reduce";
    case OpFamily::kData:
      return "data";
    case OpFamily::kShape:
      return "shape";
  }
  return "?";
}

// Which inputs carry a gradient: "all", "none" or "0, 2".
std::string gradient_inputs(const OpInfo& op) {
  if (op.differentiable == 0) return "none";
  if (op.differentiable == ~InputMask{0}) return "all";
  std::string out;
  for (int k = 0; k < 64; ++k)
    if ((op.differentiable >> k) & 1u) out += fmt::format("{}{}", out.empty() ? "" : ", ", k);
  return out;
}

std::string flops(const FlopRule& rule) {
  switch (rule.kind) {
    case FlopKind::kNone:
      return "0";
    case FlopKind::kMatMul:
      return "2 per multiply-add (+ bias)";
    case FlopKind::kConv:
      return "2 per multiply-add over the window (+ bias)";
    case FlopKind::kConvTranspose:
      return "2 per multiply-add: each input times its window (+ bias)";
    case FlopKind::kRecurrent:
      return "2 per multiply-add of X W^T and H R^T per step (+ gates)";
    case FlopKind::kAttention:
      return "2 per multiply-add of Q K^T and P V (+ 5 per score; causal about half)";
    case FlopKind::kPool:
      return "the window per output";
    case FlopKind::kPerOutput:
      return fmt::format("{:g} per output", rule.per_element);
    case FlopKind::kPerInput:
      return fmt::format("{:g} per input", rule.per_element);
  }
  return "?";
}

std::string flags(const OpInfo& op) {
  std::vector<std::string> out;
  if (op.view()) out.emplace_back("view");
  if (op.host_folds()) out.emplace_back("folds on constants");
  std::string joined;
  for (const std::string& f : out) joined += (joined.empty() ? "" : ", ") + f;
  return joined;
}

// The lines between the markers: the supported ops, then the fold-only ones.
std::vector<std::string> table() {
  std::vector<std::string> lines = {
      "| op | family | gradient to inputs | forward FLOPs | flags |",
      "|---|---|---|---|---|",
  };
  std::string fold_only;
  for (const OpInfo& op : op_table()) {
    if (!op.supported) {
      fold_only += fmt::format("{}{}", fold_only.empty() ? "" : ", ", op.op_type);
      continue;
    }
    lines.push_back(fmt::format("| {} | {} | {} | {} | {} |", op.op_type, family_name(op.family),
                                gradient_inputs(op), flops(op.flops), flags(op)));
  }
  if (!fold_only.empty()) {
    lines.emplace_back("");
    lines.push_back(
        fmt::format("Folded when their inputs are constant, refused otherwise: {}.", fold_only));
  }
  // Ops no backend runs because import rewrites them into the ones above (passes/).
  lines.emplace_back("");
  lines.emplace_back(
      "Rewritten at import into the ops above: Einsum of one or two operands, into ReduceSum, "
      "Transpose, Reshape and MatMul (passes/lower_einsum.cpp; a letter repeated in one operand, "
      "three operands or broadcasting between operands are refused); ScatterElements into "
      "ScatterND over index tuples from coordinate grids, and OneHot (a constant depth) into "
      "Equal and Where (passes/lower_indexing.cpp); CastLike into the Cast to its target's type; "
      "at opsets 18 to 22, Gelu and Mish into their formulas (compiler/import_opset.cpp).");
  return lines;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open", path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The positions of the marker lines in `lines`.
std::pair<size_t, size_t> markers(const std::string& path, const std::vector<std::string>& lines) {
  size_t begin = lines.size(), end = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (begin == lines.size() && lines[i].starts_with(kBegin)) begin = i;
    if (begin != lines.size() && i > begin && lines[i].starts_with(kEnd)) {
      end = i;
      break;
    }
  }
  if (begin == lines.size() || end == lines.size())
    fail(ErrorKind::kFormat, "{}: no ops-table markers (a line starting '{}' and a later one '{}')",
         path, kBegin, kEnd);
  return {begin, end};
}

int run(int argc, char** argv) {
  CLI::App app{
      "stagecraft-ops-table - the table of supported ops, from compiler/ir/ops.def (Markdown).",
      "stagecraft-ops-table"};
  std::string write_path, check_path;
  auto* write = app.add_option("--write", write_path,
                               "replace the table between the markers of this file (docs/ops.md)");
  app.add_option("--check", check_path, "fail when this file's table is not the one ops.def gives")
      ->excludes(write);
  cli::add_version_flag(app, "stagecraft-ops-table");
  if (std::optional<int> done = cli::parse(app, argc, argv)) return *done;

  const std::vector<std::string> want = table();
  if (write_path.empty() && check_path.empty()) {
    for (const std::string& line : want) fmt::print("{}\n", line);
    return 0;
  }
  const std::string& path = write_path.empty() ? check_path : write_path;
  std::vector<std::string> lines = read_lines(path);
  const auto [begin, end] = markers(path, lines);
  const std::vector<std::string> have(lines.begin() + static_cast<std::ptrdiff_t>(begin) + 1,
                                      lines.begin() + static_cast<std::ptrdiff_t>(end));
  if (!check_path.empty()) {
    if (have == want) {
      fmt::print("{}: the ops table matches compiler/ir/ops.def ({} ops)\n", path,
                 supported_ops().size());
      return 0;
    }
    size_t at = 0;
    while (at < have.size() && at < want.size() && have[at] == want[at]) ++at;
    fail(ErrorKind::kFormat,
         "{}: the ops table differs from compiler/ir/ops.def at line {} ('{}', ops.def gives "
         "'{}'); regenerate it: stagecraft-ops-table --write {}",
         path, begin + at + 2, at < have.size() ? have[at] : "end of table",
         at < want.size() ? want[at] : "end of table", path);
  }
  lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(begin) + 1,
              lines.begin() + static_cast<std::ptrdiff_t>(end));
  lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(begin) + 1, want.begin(), want.end());
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : lines) out << line << '\n';
  if (!out) fail(ErrorKind::kIo, "{}: cannot write", path);
  fmt::print("{}: wrote the table of {} ops\n", path, supported_ops().size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagecraft-ops-table", [&] { return run(argc, argv); });
}
