// What a training plan trains beside what the exporter wrote (trained_weights.h).
#include "compiler/plan/trained_weights.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <span>

#include "passes/autodiff.h"
#include "runtime/format/error.h"

namespace stagecraft::plan {
namespace {

/// "a, b, c and 4 more": the first three of `items` for a one-line summary.
std::string first_three(const std::vector<std::string>& items) {
  const std::size_t shown = std::min<std::size_t>(items.size(), 3);
  std::string list;
  for (std::size_t k = 0; k < shown; ++k) list += (k ? ", " : "") + items[k];
  if (items.size() > shown) list += fmt::format(" and {} more", items.size() - shown);
  return list;
}

// Whether a --train-also pattern names the initializer `name`.
bool trained_also(const PlanOptions& o, const std::string& name) {
  return std::any_of(o.train_also.begin(), o.train_also.end(), [&](const std::string& pattern) {
    return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
  });
}

}  // namespace

void freeze_weights(PlannedModel& out, const PlanOptions& o) {
  if (o.freeze.empty()) return;
  ir::Graph& g = out.model.graph;
  int64_t count = 0, params = 0;
  for (const std::string& pattern : o.freeze) {
    int matched = 0;
    for (std::size_t i = 0; i < g.num_values(); ++i) {
      ir::Value& v = g.value(static_cast<ir::ValueId>(i));
      if (!v.is_initializer() || !v.is_weight || v.dtype != DType::kFloat32) continue;
      if (fnmatch(pattern.c_str(), v.name.c_str(), 0) != 0) continue;
      ++matched;
      if (v.frozen) continue;
      v.frozen = true;
      ++count;
      params += v.numel();
    }
    if (matched == 0)
      fail(ErrorKind::kUsage,
           "--freeze '{}' matches no float32 initializer of {} (patterns are globs: '*' any "
           "characters, '?' one; stagec --info lists the model's sizes, --list-nodes its nodes)",
           pattern, o.model_path);
  }
  out.freeze_summary = fmt::format(
      "--freeze: {} float32 initializer{} ({} parameters) left untrained: no gradient, no "
      "optimizer state\n",
      count, count == 1 ? "" : "s", params);
}

void freeze_untrainable(PlannedModel& out, const PlanOptions& o) {
  ir::Graph& g = out.model.graph;
  std::vector<std::string> frozen;
  for (std::size_t i = 0; i < g.num_values(); ++i) {
    ir::Value& v = g.value(static_cast<ir::ValueId>(i));
    if (!v.is_initializer() || !v.is_weight || v.dtype != DType::kFloat32 || v.frozen ||
        trained_also(o, v.name))
      continue;
    const std::string why = passes::untrainable_reason(g, v);
    if (why.empty()) continue;
    v.frozen = true;
    frozen.push_back(fmt::format("{} ({})", v.name, why));
  }
  if (frozen.empty()) return;
  const std::string list = first_three(frozen);
  out.freeze_summary += fmt::format(
      "{} initializer{} left untrained, as PyTorch leaves buffers: {}; --train-also PATTERN "
      "trains {}\n",
      frozen.size(), frozen.size() == 1 ? "" : "s", list, frozen.size() == 1 ? "it" : "them");
}

// An embedding table's padding row. nn.Embedding(padding_idx=k) zeroes row k and
// never gives it a gradient (a pretrained table's stays zero), but the export is a plain Gather
// and keeps no trace of it: trained as exported, the row would move from the first step. So in
// a float32 weight read by a Gather along axis 0 with indices made from the inputs, one row of
// zeros among rows that are not is taken for it: the Gathers pass it no gradient (a tied output
// head still trains it, as PyTorch's).
void keep_padding_rows(PlannedModel& out, const PlanOptions& o) {
  ir::Graph& g = out.model.graph;
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < g.num_values(); ++i) {
    ir::Value& v = g.value(static_cast<ir::ValueId>(i));
    if (!v.is_initializer() || !v.is_weight || v.frozen || v.dtype != DType::kFloat32 ||
        !v.shape_known || v.shape.size() != 2 || v.numel() == 0 || v.initializer->unwritten())
      continue;
    const bool looked_up = std::any_of(v.consumers.begin(), v.consumers.end(), [&](ir::NodeId c) {
      const ir::Node& n = g.node(c);
      return n.op_type == "Gather" && n.domain.empty() && n.inputs.size() == 2 &&
             n.inputs[0] == static_cast<ir::ValueId>(i) &&
             (n.attr_int("axis", 0) == 0 || n.attr_int("axis", 0) == -2) &&
             !g.value(n.inputs[1]).is_initializer();
    });
    if (!looked_up || trained_also(o, v.name)) continue;
    const std::span<const std::byte> bytes = v.initializer->bytes();
    if (static_cast<int64_t>(bytes.size()) != v.bytes()) continue;
    const auto* f = reinterpret_cast<const float*>(bytes.data());
    const int64_t rows = v.shape[0], cols = v.shape[1];
    auto zero_row = [&](int64_t r) {
      const float* row = f + r * cols;
      return std::all_of(row, row + cols, [](float x) { return x == 0.0f; });
    };
    // Every row of a table up to 2^26 elements (256 MiB; a row's first element ends the look
    // at almost every row). A larger one is a mapped file that planning reads little of: the
    // rows padding_idx takes in practice (0, 1, 2 and the last: BERT's, RoBERTa's and BART's
    // pad ids) and 64 rows spread over the rest, which must not be zeros.
    std::vector<int64_t> zero;
    if (v.numel() <= (int64_t{1} << 26) || rows < 128) {
      for (int64_t r = 0; r < rows && zero.size() < 2; ++r)
        if (zero_row(r)) zero.push_back(r);
    } else {
      for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{2}, rows - 1})
        if (zero_row(r)) zero.push_back(r);
      for (int64_t k = 1; k <= 64 && zero.size() == 1; ++k)
        if (const int64_t r = 3 + (rows - 4) * k / 65; zero_row(r)) zero.push_back(r);
    }
    // One zero row, as padding_idx makes; a table of zeros (zero-initialised) or with several
    // is not taken for one.
    if (zero.size() != 1 || rows < 2) continue;
    v.padding_rows = zero;
    kept.push_back(fmt::format("{} row {}", v.name, zero[0]));
  }
  if (kept.empty()) return;
  out.freeze_summary += fmt::format(
      "{} embedding row{} of zeros kept as nn.Embedding's padding_idx keeps {} (no gradient from "
      "the lookup): {}; --train-also PATTERN trains {}\n",
      kept.size(), kept.size() == 1 ? "" : "s", kept.size() == 1 ? "it" : "them", first_three(kept),
      kept.size() == 1 ? "it" : "them");
}

std::string untie_summary(const std::vector<std::string>& untied) {
  if (untied.empty()) return "";
  const std::string list = first_three(untied);
  return fmt::format(
      "{} weight{} the exporter merged into an equal one (an Identity under the duplicate's name) "
      "train{} apart, as PyTorch trains them: {}; --keep-merged keeps the exporter's sharing\n",
      untied.size(), untied.size() == 1 ? "" : "s", untied.size() == 1 ? "s" : "", list);
}

}  // namespace stagecraft::plan
