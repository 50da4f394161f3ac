// torch.distributed.pipelining's action-list CSV, written and read (torch_csv.h). The grammar
// is torch's `_Action.from_str`: [stage][type][microbatch], the type one of F I B W SEND_F RECV_F
// SEND_B RECV_B UNSHARD RESHARD REDUCE_GRAD, or a parenthesised list of actions followed by a
// type (OVERLAP_F_B).
#include "compiler/schedule/torch_csv.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

/// Larger stage or microbatch numbers are refused: no real pipeline comes near them, and a
/// hostile file must not make the reader allocate per stage.
constexpr int kMaxStages = 4096;
constexpr int kMaxMicrobatches = 1 << 20;

/// One action type of torch's grammar and what it is here.
struct ActionType {
  std::string_view name;
  std::optional<Op> compute;  ///< The compute op; none for the transfers and FSDP's actions.
  bool microbatch;            ///< Whether the action names a microbatch.
};

// Longer names first: "SEND_F" must not be read as a stage followed by an unknown "S".
constexpr std::array<ActionType, 11> kTypes = {{
    {"REDUCE_GRAD", std::nullopt, false},
    {"UNSHARD", std::nullopt, false},
    {"RESHARD", std::nullopt, false},
    {"SEND_F", std::nullopt, true},
    {"RECV_F", std::nullopt, true},
    {"SEND_B", std::nullopt, true},
    {"RECV_B", std::nullopt, true},
    {"F", Op::kForward, true},
    {"B", Op::kBackward, true},
    {"I", Op::kBackwardInput, true},
    {"W", Op::kBackwardWeight, true},
}};

/// The torch name of a compute or transfer op; empty for what torch's schedule leaves out.
std::string_view torch_name(Op op, TorchCsvForm form) {
  const bool comms = form == TorchCsvForm::kComputeComms;
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kBackwardInput:
      return "I";
    case Op::kBackwardWeight:
      return "W";
    case Op::kSendAct:
      return comms ? "SEND_F" : "";
    case Op::kRecvAct:
      return comms ? "RECV_F" : "";
    case Op::kSendGrad:
      return comms ? "SEND_B" : "";
    case Op::kRecvGrad:
      return comms ? "RECV_B" : "";
    case Op::kAllReduce:
      return comms ? "REDUCE_GRAD" : "";
    case Op::kAllReduceShared:
    case Op::kOptimizerStep:
      return "";
  }
  return "";
}

/// Reads a decimal number at the front of `text` (consumed); none when it starts with no digit.
/// Numbers past `limit` are refused by the caller; reading stops growing them there.
std::optional<int64_t> take_number(std::string_view& text) {
  size_t digits = 0;
  int64_t value = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    value = std::min<int64_t>(value * 10 + (text[digits] - '0'), int64_t{1} << 40);
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  text.remove_prefix(digits);
  return value;
}

/// Parses cells of one file and collects the compute order.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  void row(int rank, std::string_view line) {
    if (static_cast<int>(out_.order.size()) <= rank) out_.order.resize(rank + 1);
    int column = 0;
    size_t start = 0;
    while (start <= line.size()) {
      size_t comma = line.find(',', start);
      if (comma == std::string_view::npos) comma = line.size();
      ++column;
      action(rank, column, trim(line.substr(start, comma - start)), 0);
      start = comma + 1;
    }
  }

  TorchCsvSchedule finish() {
    out_.devices = static_cast<int>(out_.order.size());
    if (out_.devices == 0 || highest_stage_ < 0)
      fail(ErrorKind::kFormat, "{}: no action (torch's CSV has one row per rank of actions such "
                               "as 0F0, 0B0)",
           source_);
    const int stages = highest_stage_ + 1;
    if (stages % out_.devices != 0)
      fail(ErrorKind::kFormat,
           "{}: stages 0..{} over {} ranks: the stage count {} must be a multiple of the ranks "
           "(each rank holds the same number of stages)",
           source_, highest_stage_, out_.devices, stages);
    out_.chunks = stages / out_.devices;
    out_.microbatches = highest_microbatch_ + 1;
    // Every (stage, microbatch) needs its forward: a file with fewer cannot be a schedule, and
    // refusing it here keeps the validator's per-(stage, microbatch) tables as small as the
    // file (a fuzzed '2811B555551' asked for 1.6 billion entries).
    const int64_t needed = static_cast<int64_t>(stages) * out_.microbatches;
    if (forwards_ < needed)
      fail(ErrorKind::kFormat,
           "{}: {} forward actions for {} stages x {} microbatches: every stage needs a forward "
           "of every microbatch ({} in all)",
           source_, forwards_, stages, out_.microbatches, needed);
    return std::move(out_);
  }

 private:
  static std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '"' || s.front() == '\t'))
      s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '"' || s.back() == '\t' ||
                          s.back() == '\r'))
      s.remove_suffix(1);
    return s;
  }

  [[noreturn]] void bad(int rank, int column, std::string_view cell, std::string_view why) const {
    fail(ErrorKind::kFormat, "{}: row {} (rank {}), cell {} '{}': {}", source_, rank + 1, rank,
         column, cell.substr(0, 40), why);
  }

  void action(int rank, int column, std::string_view cell, int depth) {
    if (cell.empty()) return;  // an idle slot
    const std::string_view whole = cell;
    if (cell.front() == '(') {
      // (a;b;...)TYPE: the sub-actions in order.
      const size_t close = cell.find(')');
      if (depth > 0 || close == std::string_view::npos)
        bad(rank, column, whole, "a parenthesised list of actions must close, once, unnested");
      std::string_view list = cell.substr(1, close - 1);
      while (!list.empty()) {
        const size_t semicolon = std::min(list.find(';'), list.size());
        action(rank, column, trim(list.substr(0, semicolon)), depth + 1);
        list.remove_prefix(std::min(semicolon + 1, list.size()));
      }
      if (cell.substr(close + 1) != "OVERLAP_F_B")
        bad(rank, column, whole, "a list of actions must be followed by OVERLAP_F_B");
      return;
    }
    const std::optional<int64_t> stage = take_number(cell);
    if (!stage)
      bad(rank, column, whole,
          "an action is [stage][type][microbatch], such as 0F1; the stage is missing");
    const auto type = std::find_if(kTypes.begin(), kTypes.end(),
                                   [&](const ActionType& t) { return cell.starts_with(t.name); });
    if (type == kTypes.end())
      bad(rank, column, whole,
          "unknown action type: torch's are F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, "
          "RESHARD, REDUCE_GRAD and (a;b)OVERLAP_F_B");
    cell.remove_prefix(type->name.size());
    const std::optional<int64_t> microbatch = take_number(cell);
    if (!cell.empty()) bad(rank, column, whole, "unexpected characters after the action");
    if (type->microbatch && !microbatch)
      bad(rank, column, whole, fmt::format("a {} action names its microbatch", type->name));
    if (!type->microbatch && microbatch)
      bad(rank, column, whole, fmt::format("a {} action names no microbatch", type->name));
    if (*stage >= kMaxStages)
      bad(rank, column, whole, fmt::format("stage {} is past the {} supported", *stage, kMaxStages));
    if (microbatch && *microbatch >= kMaxMicrobatches)
      bad(rank, column, whole,
          fmt::format("microbatch {} is past the {} supported", *microbatch, kMaxMicrobatches));
    const int s = static_cast<int>(*stage);
    stages_on_rank_.resize(std::max<size_t>(stages_on_rank_.size(), static_cast<size_t>(s) + 1), -1);
    if (stages_on_rank_[s] >= 0 && stages_on_rank_[s] != rank)
      bad(rank, column, whole,
          fmt::format("stage {} is already on rank {}: a stage runs on one rank", s,
                      stages_on_rank_[s]));
    stages_on_rank_[s] = rank;
    highest_stage_ = std::max(highest_stage_, s);
    if (!type->compute) return;  // placed by stagecraft's own rule (torch_csv.h)
    const int m = static_cast<int>(*microbatch);
    highest_microbatch_ = std::max(highest_microbatch_, m);
    out_.training |= *type->compute != Op::kForward;
    forwards_ += *type->compute == Op::kForward;
    out_.order[rank].push_back({*type->compute, s, m});
  }

  std::string source_;
  TorchCsvSchedule out_;
  std::vector<int> stages_on_rank_;  ///< Per stage, the rank that runs it; -1 when none yet.
  int highest_stage_ = -1;
  int highest_microbatch_ = -1;
  int64_t forwards_ = 0;
};

}  // namespace

std::string to_torch_csv(const Schedule& schedule, TorchCsvForm form) {
  std::string out;
  for (const std::vector<Instruction>& device : schedule) {
    std::vector<std::string> cells;
    for (const Instruction& in : device) {
      const std::string_view name = torch_name(in.op, form);
      if (name.empty()) continue;
      cells.push_back(is_step_level(in.op) ? fmt::format("{}{}", in.stage, name)
                                           : fmt::format("{}{}{}", in.stage, name, in.microbatch));
    }
    out += fmt::format("{}\r\n", fmt::join(cells, ","));
  }
  return out;
}

TorchCsvSchedule read_torch_csv(std::string_view text, const std::string& source) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte-order mark
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  // Trailing blank lines are the file's end, not ranks without actions.
  while (!lines.empty() && (lines.back().empty() || lines.back() == "\r")) lines.pop_back();
  if (lines.size() > static_cast<size_t>(kMaxStages))
    fail(ErrorKind::kFormat, "{}: {} rows: more ranks than the {} supported", source,
         lines.size(), kMaxStages);
  Reader reader(source);
  for (size_t rank = 0; rank < lines.size(); ++rank)
    reader.row(static_cast<int>(rank), lines[rank]);
  TorchCsvSchedule out = reader.finish();
  for (int rank = 0; rank < out.devices; ++rank)
    for (const Instruction& in : out.order[rank])
      if (in.stage % out.devices != rank)
        fail(ErrorKind::kFormat,
             "{}: row {} (rank {}) runs stage {}, which stagecraft places on rank {} (stage mod "
             "{} ranks; V-shaped placements such as ZB-V's are not supported)",
             source, rank + 1, rank, in.stage, in.stage % out.devices, out.devices);
  return out;
}

TorchCsvSchedule read_torch_csv_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(ErrorKind::kIo, "{}: {}", path,
         std::filesystem::exists(path, ec) ? "is not a regular file" : "no such file");
  constexpr std::uintmax_t kMaxBytes = std::uintmax_t{64} << 20;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxBytes)
    fail(ErrorKind::kIo, "{}: {} bytes: a schedule CSV of over 64 MiB is refused", path, size);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open ({})", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(ErrorKind::kIo, "{}: read error", path);
  return read_torch_csv(text.str(), path);
}

Schedule check_torch_csv(const TorchCsvSchedule& csv, const PipelineShape& shape,
                         const std::string& source) {
  auto differ = [&](const char* what, int file, int plan, const char* flag) {
    if (file != plan)
      fail(ErrorKind::kUsage, "{}: the schedule has {} {} but the plan has {} ({})", source, file,
           what, plan, flag);
  };
  differ("ranks", csv.devices, shape.devices, "--devices over --data-parallel");
  differ("chunks per rank", csv.chunks, shape.chunks, "--chunks");
  differ("microbatches", csv.microbatches, shape.microbatches, "--microbatches");
  if (csv.training != shape.training)
    fail(ErrorKind::kUsage, "{}: the schedule {} backward actions but the plan is for {}", source,
         csv.training ? "has" : "has no", shape.training ? "training (--train)" : "inference");
  return with_context(source, ErrorKind::kFormat, [&] {
    Schedule schedule = schedule_from_order(csv.order, shape);
    validate_schedule(schedule, shape);
    return schedule;
  });
}

}  // namespace stagecraft::schedule
