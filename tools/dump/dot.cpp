// The --dot view: a Graphviz digraph of the plan's ops by stage, with the real data flow.
//
// Each stage's ops and edges come from its stage file (stage_K.onnx: node inputs and outputs;
// weights are not drawn). Long linear chains (each op feeding only the next, the next fed only
// by it) become one node, "12 ops: MatMul, Add, ...", so a 70-op model fits one screen. A tensor
// that crosses stages is an edge from the op that makes it to each op that reads it in a later
// stage, labelled with its name and bytes per microbatch as plan.json records them. Graph inputs
// and outputs are ellipses outside the clusters. A stage file that does not parse as ONNX (a
// test's placeholder) is drawn from plan.json alone: its ops chained in execution order.
#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>

#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace {

/// Runs of at least this many ops, each feeding only the next, are drawn as one node.
constexpr size_t kMinChain = 3;

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

struct Op {
  std::string name, type;
  std::vector<std::string> inputs, outputs;
};

/// A stage's ops in execution order: from its stage file, else from plan.json's node list.
struct StageOps {
  std::vector<Op> ops;
  bool from_file = false;
};

StageOps read_stage(const std::string& plan_dir, const plan::Stage& stage,
                    const std::unordered_map<std::string, const plan::OpRecord*>& records) {
  StageOps out;
  onnx::ModelProto model;
  std::ifstream in(std::filesystem::path(plan_dir) / stage.file, std::ios::binary);
  if (in && model.ParseFromIstream(&in) && model.graph().node_size() > 0) {
    out.from_file = true;
    for (const onnx::NodeProto& node : model.graph().node()) {
      Op op{node.name(), node.op_type(), {}, {}};
      for (const std::string& name : node.input())
        if (!name.empty()) op.inputs.push_back(name);
      for (const std::string& name : node.output())
        if (!name.empty()) op.outputs.push_back(name);
      out.ops.push_back(std::move(op));
    }
    return out;
  }
  // Execution order alone: op i feeds op i + 1 through a made-up tensor.
  for (size_t i = 0; i < stage.nodes.size(); ++i) {
    auto record = records.find(stage.nodes[i]);
    Op op{stage.nodes[i], record == records.end() ? "" : record->second->op_type, {}, {}};
    if (i > 0) op.inputs.push_back(fmt::format("\x01{}", i - 1));
    op.outputs.push_back(fmt::format("\x01{}", i));
    out.ops.push_back(std::move(op));
  }
  return out;
}

/// The ops of a stage grouped: each op's group, and each group's ops (in order).
struct Groups {
  std::vector<size_t> group_of;
  std::vector<std::vector<size_t>> members;
};

/// Collapses maximal linear chains of at least kMinChain ops: a -> b joins a chain when a's only
/// consumer in the stage is b, b's only producer in the stage is a, and no other stage and no
/// graph output reads a.
Groups group_chains(const std::vector<Op>& ops, const std::set<std::string>& read_outside) {
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < ops.size(); ++i)
    for (const std::string& t : ops[i].outputs) producer[t] = i;
  std::vector<std::set<size_t>> succ(ops.size()), pred(ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    for (const std::string& t : ops[i].inputs)
      if (auto p = producer.find(t); p != producer.end() && p->second != i) {
        succ[p->second].insert(i);
        pred[i].insert(p->second);
      }
  auto read_elsewhere = [&](size_t i) {
    for (const std::string& t : ops[i].outputs)
      if (read_outside.count(t)) return true;
    return false;
  };
  auto links = [&](size_t a, size_t b) {
    return succ[a].size() == 1 && *succ[a].begin() == b && pred[b].size() == 1 &&
           !read_elsewhere(a);
  };
  Groups g;
  g.group_of.assign(ops.size(), 0);
  std::vector<bool> placed(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (placed[i]) continue;
    // Start a chain only at an op that does not continue one.
    if (pred[i].size() == 1 && links(*pred[i].begin(), i) && !placed[*pred[i].begin()]) continue;
    std::vector<size_t> chain = {i};
    while (succ[chain.back()].size() == 1 && links(chain.back(), *succ[chain.back()].begin()))
      chain.push_back(*succ[chain.back()].begin());
    if (chain.size() < kMinChain) chain.resize(1);
    for (size_t op : chain) {
      placed[op] = true;
      g.group_of[op] = g.members.size();
    }
    g.members.push_back(std::move(chain));
  }
  for (size_t i = 0; i < ops.size(); ++i)  // ops a cycle check left over (none in a DAG)
    if (!placed[i]) {
      g.group_of[i] = g.members.size();
      g.members.push_back({i});
    }
  return g;
}

/// "12 ops: MatMul, Add, Reshape, ..." (the op types in order, up to four).
std::string chain_label(const std::vector<Op>& ops, const std::vector<size_t>& members) {
  std::vector<std::string> types;
  for (size_t i = 0; i < members.size() && i < 4; ++i) types.push_back(ops[members[i]].type);
  return fmt::format("{} ops: {}{}", members.size(), fmt::join(types, ", "),
                     members.size() > 4 ? ", ..." : "");
}

struct Drawn {
  std::vector<StageOps> stages;
  std::vector<Groups> groups;
  /// Tensor name -> (stage, group) that makes it.
  std::unordered_map<std::string, std::pair<int, size_t>> maker;
};

std::string node_id(int stage, size_t group) { return fmt::format("s{}_{}", stage, group); }

std::string clusters(const plan::Plan& plan, const Drawn& drawn) {
  std::string dot;
  for (const plan::Stage& stage : plan.stages) {
    const int s = stage.index;
    const StageOps& so = drawn.stages[static_cast<size_t>(s)];
    const Groups& g = drawn.groups[static_cast<size_t>(s)];
    std::string label =
        fmt::format("stage {} (device {}{})\n{}, fwd {:.3f} ms, bwd {:.3f} ms{}", s, stage.device,
                    plan.chunks > 1 ? fmt::format(", chunk {}", stage.chunk) : "",
                    plural(static_cast<int64_t>(so.ops.size()), "op"), stage.fwd_ms, stage.bwd_ms,
                    so.from_file ? "" : "\n(ops in execution order: no ONNX in its file)");
    dot += fmt::format(
        "  subgraph cluster_stage{} {{\n    label={}; style=rounded; color=\"{}\"; penwidth=2;\n",
        s, dot_string(label), stage_colour(s));
    for (size_t k = 0; k < g.members.size(); ++k) {
      const std::vector<size_t>& m = g.members[k];
      const Op& first = so.ops[m.front()];
      std::string text = m.size() == 1 ? first.name + "\n" + first.type : chain_label(so.ops, m);
      std::string tooltip =
          m.size() == 1 ? first.name : fmt::format("{} .. {}", first.name, so.ops[m.back()].name);
      dot += fmt::format("    {} [label={}, tooltip={}, fillcolor=\"{}\"{}];\n", node_id(s, k),
                         dot_string(text), dot_string(tooltip), stage_colour(s),
                         m.size() > 1 ? ", shape=box3d" : "");
    }
    // The data flow inside the stage, between groups, once per pair.
    std::set<std::pair<size_t, size_t>> edges;
    std::unordered_map<std::string, size_t> local;
    for (size_t i = 0; i < so.ops.size(); ++i)
      for (const std::string& t : so.ops[i].outputs) local[t] = g.group_of[i];
    for (size_t i = 0; i < so.ops.size(); ++i)
      for (const std::string& t : so.ops[i].inputs)
        if (auto p = local.find(t); p != local.end() && p->second != g.group_of[i])
          edges.insert({p->second, g.group_of[i]});
    for (const auto& [a, b] : edges)
      dot += fmt::format("    {} -> {};\n", node_id(s, a), node_id(s, b));
    dot += "  }\n";
  }
  return dot;
}

/// The ops (groups) of stage `s` that read tensor `name`; the first group when none is known.
std::set<size_t> readers(const Drawn& drawn, int s, const std::string& name) {
  std::set<size_t> out;
  const StageOps& so = drawn.stages[static_cast<size_t>(s)];
  for (size_t i = 0; i < so.ops.size(); ++i)
    for (const std::string& t : so.ops[i].inputs)
      if (t == name) out.insert(drawn.groups[static_cast<size_t>(s)].group_of[i]);
  if (out.empty()) out.insert(0);
  return out;
}

/// The group of stage `s` that makes `name`; the last group when none is known.
size_t maker_in(const Drawn& drawn, int s, const std::string& name) {
  auto at = drawn.maker.find(name);
  if (at != drawn.maker.end() && at->second.first == s) return at->second.second;
  return drawn.groups[static_cast<size_t>(s)].members.size() - 1;
}

/// Cut edges (one per tensor and reading op, labelled with the tensor and its bytes), then the
/// graph inputs and outputs.
std::string boundary(const plan::Plan& plan, const Drawn& drawn) {
  std::string dot;
  for (const plan::Stage& stage : plan.stages) {
    for (const plan::StageTensor& out : stage.outputs) {
      const size_t from = maker_in(drawn, stage.index, out.name);
      for (int peer : out.peer_stages) {
        for (size_t to : readers(drawn, peer, out.name)) {
          dot +=
              fmt::format("  {} -> {} [label={}, class=\"cut\", penwidth=2, color=\"#555555\"];\n",
                          node_id(stage.index, from), node_id(peer, to),
                          dot_string(fmt::format("{}\n{} ({} B)", out.name,
                                                 format_bytes(static_cast<double>(out.bytes)),
                                                 with_commas(out.bytes))));
        }
      }
    }
  }
  std::map<std::string, std::vector<int>> graph_inputs;
  for (const plan::Stage& stage : plan.stages)
    for (const plan::StageTensor& input : stage.inputs)
      if (input.peer_stage == -1) graph_inputs[input.name].push_back(stage.index);
  size_t index = 0;
  for (const auto& [name, stages] : graph_inputs) {
    dot += fmt::format("  in{} [label={}, shape=ellipse, style=solid];\n", index, dot_string(name));
    for (int s : stages)
      for (size_t to : readers(drawn, s, name))
        dot += fmt::format("  in{} -> {};\n", index, node_id(s, to));
    ++index;
  }
  index = 0;
  for (const plan::Stage& stage : plan.stages) {
    for (const plan::StageTensor& output : stage.outputs) {
      if (!output.graph_output) continue;
      dot += fmt::format("  out{} [label={}, shape=ellipse, style=solid];\n", index,
                         dot_string(output.name));
      dot += fmt::format("  {} -> out{};\n",
                         node_id(stage.index, maker_in(drawn, stage.index, output.name)), index);
      ++index;
    }
  }
  return dot;
}

}  // namespace

std::string render_dot(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  std::unordered_map<std::string, const plan::OpRecord*> records;
  for (const plan::OpRecord& op : plan.ops) records.emplace(op.name, &op);

  Drawn drawn;
  for (const plan::Stage& stage : plan.stages) {
    drawn.stages.push_back(read_stage(view.plan_dir, stage, records));
    std::set<std::string> read_outside;
    for (const plan::StageTensor& out : stage.outputs) read_outside.insert(out.name);
    drawn.groups.push_back(group_chains(drawn.stages.back().ops, read_outside));
    const StageOps& so = drawn.stages.back();
    for (size_t i = 0; i < so.ops.size(); ++i)
      for (const std::string& t : so.ops[i].outputs)
        drawn.maker[t] = {stage.index, drawn.groups.back().group_of[i]};
  }

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
  dot += clusters(plan, drawn);
  dot += boundary(plan, drawn);
  return dot + "}\n";
}

}  // namespace stagecraft::dump
