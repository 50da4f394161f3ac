#pragma once
/// \file
/// The versions of the tools' JSON outputs. Every JSON output carries its `format_version`; the
/// `--json` outputs are JSON Lines (one JSON value per line, each line complete). Each version
/// is bumped whenever a reader of the older output would misread the newer one (a key removed,
/// renamed or given another meaning; keys are added without a bump). The schemas are JSON Schema
/// files under docs/schemas/, checked against real outputs by tests/cli/json_schema_test.cpp.
/// Outputs before these versions carried none.

namespace stagecraft::tools {

/// `stagec MODEL --info --json`: one line (docs/schemas/stagec-info.schema.json).
inline constexpr int kInfoJsonVersion = 1;

/// `stagec MODEL --list-nodes --json`: one line (docs/schemas/stagec-list-nodes.schema.json).
inline constexpr int kListNodesJsonVersion = 1;

/// `stagedump PLAN --json`: one line (docs/schemas/stagedump.schema.json).
inline constexpr int kDumpJsonVersion = 1;

/// `stagerun PLAN --json`: one line per step ("type": "step"), then one summary line ("type":
/// "summary") (docs/schemas/stagerun.schema.json).
inline constexpr int kRunJsonVersion = 1;

/// `stagedump --trace` and `stagerun --trace`: a Chrome trace (Trace Event Format) whose
/// `otherData` holds the version (docs/schemas/trace.schema.json). Version 2: one process per
/// device and run ("predicted / device 0", "measured / device 0"), threads for steps, compute,
/// waits and sends, slices for every instruction (version 1: one process, a thread per device,
/// compute only).
inline constexpr int kTraceJsonVersion = 2;

}  // namespace stagecraft::tools
