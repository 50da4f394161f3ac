#pragma once
/// \file
/// The pieces of stagedump's HTML page that live in their own files (tools/dump/html*.cpp).

#include <string>
#include <string_view>

#include "tools/dump/measured.h"
#include "tools/dump/view.h"

namespace stagecraft::dump::html {

/// `text` with & < > " escaped for HTML and SVG.
std::string escaped(std::string_view text);

/// The timeline: an inline SVG (viewBox: it scales to the page's width) with a time axis and its
/// ticks in ms, one row per device, one box (`rect.instr`) per instruction of the predicted step
/// coloured by kind (F, B, W, optimizer, all-reduce, receive wait; sends in a thin lane under the
/// row), and, for a traced `measured` run, its median step's timed instructions under each row
/// (`rect.measured`); the predicted and measured step ends marked.
std::string timeline_svg(const PlanView& view, const MeasuredRun* measured);

/// The letter of `op`'s kind in kKindColours (sends and receives by direction-free kind).
char kind_of(schedule::Op op);

/// The colours of the instruction kinds, shared by the timeline and its legend.
struct KindColour {
  std::string_view kind;  ///< "F", "B", ...
  std::string_view label;
  std::string_view colour;
};
inline constexpr KindColour kKindColours[] = {{"F", "forward", "#4e79a7"},
                                              {"B", "backward (B: input gradient)", "#f28e2b"},
                                              {"W", "weight gradient", "#59a14f"},
                                              {"O", "optimizer step", "#7f7f7f"},
                                              {"A", "all-reduce", "#b07aa1"},
                                              {"R", "receive: waiting for data", "#d9d9d9"},
                                              {"S", "send (transfer on the link)", "#9c755f"}};

}  // namespace stagecraft::dump::html
