// The --dot view: a Graphviz digraph of the plan's ops by stage.
//
// The plan keeps each stage's nodes in execution order and the tensors at its boundary, not the
// op-level edges of the graph (those live in the stage files, which stagedump does not parse).
// So ops are drawn as a chain in execution order inside their stage's cluster, and each pair of
// stages that exchange tensors gets one edge between the clusters, labelled with the tensors and
// their bytes per microbatch. Graph inputs and outputs are ellipses outside the clusters.
#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace {

/// A DOT double-quoted string.
std::string dot_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// A label listing up to three tensor names, then "+N more", and the total bytes.
std::string tensors_label(const std::vector<const plan::StageTensor*>& tensors) {
  std::string label;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i < 3) label += tensors[i]->name + "\n";
    total += tensors[i]->bytes;
  }
  if (tensors.size() > 3) label += fmt::format("+{} more\n", tensors.size() - 3);
  return label + format_bytes(static_cast<double>(total));
}

}  // namespace

std::string render_dot(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  std::unordered_map<std::string, const plan::OpRecord*> ops;
  for (const plan::OpRecord& op : plan.ops) ops.emplace(op.name, &op);

  std::string dot = "digraph plan {\n";
  dot += "  graph [compound=true, rankdir=TB, fontname=\"Helvetica\"];\n";
  dot += "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n";
  dot += "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  // The one memory figure per device, under the drawing.
  std::string peaks = "predicted peak per device:";
  for (const plan::DevicePeak& d : plan.device_memory)
    peaks +=
        fmt::format("\n device {}: {}", d.device, format_bytes(static_cast<double>(d.peak_bytes)));
  dot += fmt::format("  label={}; labelloc=b; labeljust=l;\n", dot_string(peaks));

  // One cluster per stage; node ids are "s<stage>_<position>".
  for (const plan::Stage& stage : plan.stages) {
    std::string label =
        fmt::format("stage {} (device {}{})\n{}, fwd {:.3f} ms, bwd {:.3f} ms", stage.index,
                    stage.device, plan.chunks > 1 ? fmt::format(", chunk {}", stage.chunk) : "",
                    plural(stage.nodes.size(), "op"), stage.fwd_ms, stage.bwd_ms);
    dot += fmt::format(
        "  subgraph cluster_stage{} {{\n    label={}; style=rounded; color=\"{}\"; penwidth=2;\n",
        stage.index, dot_string(label), stage_colour(stage.index));
    for (size_t i = 0; i < stage.nodes.size(); ++i) {
      auto op = ops.find(stage.nodes[i]);
      std::string node_label =
          op == ops.end() ? stage.nodes[i] : stage.nodes[i] + "\n" + op->second->op_type;
      dot += fmt::format("    s{}_{} [label={}, fillcolor=\"{}\"];\n", stage.index, i,
                         dot_string(node_label), stage_colour(stage.index));
    }
    for (size_t i = 1; i < stage.nodes.size(); ++i) {
      dot += fmt::format("    s{}_{} -> s{}_{};\n", stage.index, i - 1, stage.index, i);
    }
    dot += "  }\n";
  }

  // Cut tensors, grouped per (producer, consumer) pair of stages.
  std::map<std::pair<int, int>, std::vector<const plan::StageTensor*>> links;
  for (const plan::Stage& stage : plan.stages) {
    for (const plan::StageTensor& output : stage.outputs) {
      for (int peer : output.peer_stages) links[{stage.index, peer}].push_back(&output);
    }
  }
  for (const auto& [pair, tensors] : links) {
    const auto& [from, to] = pair;
    dot += fmt::format(
        "  s{}_{} -> s{}_0 [ltail=cluster_stage{}, lhead=cluster_stage{}, label={}, penwidth=2];\n",
        from, plan.stages[from].nodes.size() - 1, to, from, to, dot_string(tensors_label(tensors)));
  }

  // Graph inputs (one ellipse per name, an edge to each stage reading it) and graph outputs.
  std::map<std::string, std::vector<int>> graph_inputs;
  for (const plan::Stage& stage : plan.stages) {
    for (const plan::StageTensor& input : stage.inputs) {
      if (input.peer_stage == -1) graph_inputs[input.name].push_back(stage.index);
    }
  }
  size_t index = 0;
  for (const auto& [name, readers] : graph_inputs) {
    dot += fmt::format("  in{} [label={}, shape=ellipse, style=solid];\n", index, dot_string(name));
    for (int stage : readers) {
      dot += fmt::format("  in{} -> s{}_0 [lhead=cluster_stage{}];\n", index, stage, stage);
    }
    ++index;
  }
  index = 0;
  for (const plan::Stage& stage : plan.stages) {
    for (const plan::StageTensor& output : stage.outputs) {
      if (!output.graph_output) continue;
      dot += fmt::format("  out{} [label={}, shape=ellipse, style=solid];\n", index,
                         dot_string(output.name));
      dot += fmt::format("  s{}_{} -> out{} [ltail=cluster_stage{}];\n", stage.index,
                         stage.nodes.size() - 1, index, stage.index);
      ++index;
    }
  }
  return dot + "}\n";
}

}  // namespace stagecraft::dump
