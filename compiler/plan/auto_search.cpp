// stagec --auto: plans and simulates every configuration of the space and keeps the best that
// fits. Each configuration is a whole make_plan (the split search included), so that what the
// search compares is exactly what `stagec --schedule ... --microbatches ...` would predict.
#include "compiler/plan/auto_search.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "cost_models/device_spec.h"
#include "runtime/format/bytes.h"
#include "runtime/format/error.h"
#include "runtime/format/schedule.h"

namespace stagecraft::plan {
namespace {

/// The most microbatches per pipeline device the space tries (M <= kMicrobatchesPerDevice x P).
constexpr int kMicrobatchesPerDevice = 8;

/// Whether the plan (training or not) admits schedule `kind` at all: its rules for a small
/// shape that every admitted schedule runs (2 devices, its chunks, 4 microbatches: dualpipev
/// needs 2P).
bool admits(ScheduleKind kind, bool training) {
  const int fixed = schedule::fixed_chunks(kind);
  schedule::PipelineShape shape{2, fixed > 0 ? fixed : 2, 4, training, 1};
  shape.placement = schedule::placement_of(kind);
  try {
    check_schedule_shape(kind, shape, ErrorKind::kUsage);
    return true;
  } catch (const Error&) {
    return false;
  }
}

/// The chunk counts of `kind` in the space: its fixed count, or 2..4 (or the given --chunks).
std::vector<int> chunk_counts(ScheduleKind kind, const PlanOptions& o, const AutoFixed& fixed) {
  const int own = schedule::fixed_chunks(kind);
  if (own > 0) {
    if (fixed.chunks && o.chunks != own) return {};  // --chunks 3 holds out 1-chunk schedules
    return {own};
  }
  if (fixed.chunks) return {o.chunks};
  return {2, 3, 4};
}

/// The options of one configuration: `o` with its choices, planned alone.
PlanOptions options_of(const PlanOptions& o, const AutoCandidate& c) {
  PlanOptions one = o;
  one.schedule = parse_schedule(c.schedule);
  one.chunks = c.chunks;
  one.microbatches = c.microbatches;
  one.data_parallel = c.data_parallel;
  one.data_parallel_auto = false;
  one.recompute = parse_recompute(c.recompute);
  one.shard_optimizer = o.shard_optimizer && c.data_parallel > 1;  // one replica: nothing to shard
  one.keep_over_memory = true;
  return one;
}

/// Whether `c`'s schedule runs weight gradients apart from the input gradients (zb-h1, zb-v,
/// dualpipev), off a microbatch's critical pass through the pipeline.
bool defers_weights(const AutoCandidate& c) {
  return c.schedule == "zb-h1" || c.schedule == "zb-v" || c.schedule == "dualpipev";
}

/// A closed-form guess at the bubble, to plan the likely best first (the sooner a good step is
/// found, the more the lower bound prunes): (P - 1) / (V M + P - 1), a third of that for the
/// zero-bubble schedules (dualpipev, which defers some of its weight gradients, with them).
double bubble_guess(const AutoCandidate& c, int devices) {
  const double p = devices / c.data_parallel;
  const double fill = (p - 1) / (c.chunks * c.microbatches + p - 1);
  return defers_weights(c) ? fill / 3 : fill;
}

/// Candidates ranked: fitting ones by the objective's key, then those over memory by peak, then
/// the pruned, then the refused (each in the order tried).
bool better(const AutoCandidate& a, const AutoCandidate& b, Objective objective) {
  auto group = [](const AutoCandidate& c) {
    return c.status == "chosen"        ? 0
           : c.status == "fits"        ? 0
           : c.status == "over_memory" ? 1
           : c.status == "pruned"      ? 2
                                       : 3;
  };
  if (group(a) != group(b)) return group(a) < group(b);
  const auto peak = [](const AutoCandidate& c) { return static_cast<double>(c.peak_memory_bytes); };
  if (group(a) == 1) return peak(a) < peak(b);
  if (group(a) > 1) return false;
  if (objective == Objective::kMemory)
    return peak(a) != peak(b) ? peak(a) < peak(b) : a.step_ms < b.step_ms;
  return a.step_ms != b.step_ms ? a.step_ms < b.step_ms : peak(a) < peak(b);
}

/// Whether `c` is recompute auto with the prediction of recompute none's plan of the same
/// schedule, chunks, microbatches and replicas in `search`: auto chose no stage to recompute.
bool same_as_none(const AutoCandidate& c, const std::vector<AutoCandidate>& search) {
  if (c.recompute != "auto" || c.step_ms == 0) return false;
  return std::any_of(search.begin(), search.end(), [&](const AutoCandidate& n) {
    return n.recompute == "none" && n.schedule == c.schedule && n.chunks == c.chunks &&
           n.microbatches == c.microbatches && n.data_parallel == c.data_parallel &&
           n.step_ms == c.step_ms && n.peak_memory_bytes == c.peak_memory_bytes;
  });
}

/// "1f1b, 8 microbatches of 2, 1 replica, recompute none" (chunks where the schedule has more
/// than one).
std::string config_name(const AutoCandidate& c) {
  return fmt::format("{}{}, {} microbatch{} of {}, {} replica{}, recompute {}", c.schedule,
                     c.chunks > 1 ? fmt::format(" x{} chunks", c.chunks) : "", c.microbatches,
                     c.microbatches == 1 ? "" : "es", c.microbatch_size, c.data_parallel,
                     c.data_parallel == 1 ? "" : "s", c.recompute);
}

/// "step 3.214 ms, bubble 12.3%, peak 1.20 GiB".
std::string figures(const AutoCandidate& c) {
  return fmt::format("step {:.3f} ms, bubble {:.1f}%, peak {}", c.step_ms, 100 * c.bubble_fraction,
                     format_bytes(static_cast<double>(c.peak_memory_bytes)));
}

}  // namespace

std::vector<AutoCandidate> auto_space(const PlanOptions& o, const AutoFixed& fixed) {
  if (!o.batch)
    fail(ErrorKind::kUsage,
         "--auto needs --batch B: the microbatch counts it tries are the divisors of the global "
         "batch");
  if (!o.schedule_csv.empty())
    fail(ErrorKind::kUsage,
         "--auto searches the built-in schedules; --schedule-csv {} fixes the whole order: give "
         "one of them",
         o.schedule_csv);
  if (o.devices < 1) fail(ErrorKind::kUsage, "--devices {} must be at least 1", o.devices);
  std::vector<ScheduleKind> kinds;
  if (fixed.schedule && o.schedule) {
    kinds.push_back(*o.schedule);
  } else {
    for (std::string_view name : schedule_names()) {
      const ScheduleKind kind = parse_schedule(name);
      if (kind != ScheduleKind::kCustom && admits(kind, o.training)) kinds.push_back(kind);
    }
  }
  std::vector<int> replicas;
  for (int r = 1; r <= o.devices; ++r)
    if (o.devices % r == 0 && (!fixed.data_parallel || r == o.data_parallel)) replicas.push_back(r);
  std::vector<Recompute> recomputes{o.recompute};
  if (o.training && !fixed.recompute) recomputes = {Recompute::kNone, Recompute::kAuto};
  std::vector<AutoCandidate> space;
  for (int r : replicas) {
    const int pipeline = o.devices / r;
    const int64_t per_replica = *o.batch / r;
    if (*o.batch % r != 0) continue;  // the batch does not split over r replicas
    std::vector<int> counts;
    if (fixed.microbatches) {
      if (o.microbatches > 0 && per_replica % o.microbatches == 0) counts.push_back(o.microbatches);
    } else {
      for (int64_t m = 1; m <= per_replica && m <= int64_t{kMicrobatchesPerDevice} * pipeline; ++m)
        if (per_replica % m == 0) counts.push_back(static_cast<int>(m));
    }
    for (ScheduleKind kind : kinds)
      for (int v : chunk_counts(kind, o, fixed))
        for (int m : counts)
          for (Recompute rc : recomputes) {
            AutoCandidate c;
            c.schedule = std::string(to_string(kind));
            c.chunks = v;
            c.microbatches = m;
            c.microbatch_size = per_replica / m;
            c.data_parallel = r;
            c.recompute = std::string(to_string(rc));
            space.push_back(std::move(c));
          }
  }
  if (space.empty())
    fail(ErrorKind::kUsage,
         "--auto: no configuration to search: no replica count R dividing --devices {} splits "
         "--batch {} into R x {} equal microbatches",
         o.devices, *o.batch,
         fixed.microbatches ? fmt::format("--microbatches {}", o.microbatches) : "M");
  return space;
}

PlannedModel auto_plan(const PlanOptions& o, const AutoFixed& fixed, const AutoProgress& progress) {
  std::vector<AutoCandidate> space = auto_space(o, fixed);
  std::stable_sort(space.begin(), space.end(), [&](const AutoCandidate& a, const AutoCandidate& b) {
    return bubble_guess(a, o.devices) < bubble_guess(b, o.devices);
  });
  const auto start = std::chrono::steady_clock::now();
  PlanOptions shared = o;  // the model is imported once per microbatch size, not per plan
  if (!shared.import_cache) shared.import_cache = std::make_shared<ImportCache>();
  // Per microbatch size: one microbatch's forward and backward through every op, ms (the op
  // costs depend on the microbatch size alone).
  std::map<int64_t, double> work_ms;
  std::optional<PlannedModel> best;
  auto key = [](const AutoCandidate& c) {
    return std::tuple(c.schedule, c.chunks, c.microbatches, c.data_parallel);
  };
  // The weights, gradients and optimizer state of the whole model, each weight once (the ops'
  // param_bytes), and the device's memory: known after the first plan, the same for every
  // configuration. 0 until then, and with --shard-optimizer (whose state depends on R).
  double state_bytes = 0, capacity = 0, smallest_bound = 0;
  for (std::size_t i = 0; i < space.size(); ++i) {
    AutoCandidate& c = space[i];
    if (progress)
      progress(static_cast<int>(i), static_cast<int>(space.size()),
               best ? &best->plan.auto_search.front() : nullptr,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    // The fullest device holds at least its share of the model's state: a configuration whose
    // share is over the device's memory cannot fit (5% slack for what the planner counts
    // elsewhere, such as mixed precision's 16-bit weight copies kept with the activations).
    const double share = 0.95 * state_bytes / (o.devices / c.data_parallel);
    if (state_bytes > 0 && share > capacity) {
      c.status = "pruned";
      c.note = fmt::format(
          "over memory: its {} pipeline devices hold at least {} each of weights, gradients and "
          "optimizer state; the device has {}",
          o.devices / c.data_parallel, format_bytes(share), format_bytes(capacity));
      smallest_bound = smallest_bound == 0 ? share : std::min(smallest_bound, share);
      continue;
    }
    // The busiest device computes at least its share of the batch, and a step takes at least
    // one microbatch's pass through every op (forward, then backward).
    if (auto w = work_ms.find(c.microbatch_size);
        w != work_ms.end() && best && o.objective == Objective::kSpeed) {
      const double pipeline = static_cast<double>(o.devices / c.data_parallel);
      // The zero-bubble schedules defer the weight gradients off that pass: their share alone.
      const double bound =
          w->second * std::max(defers_weights(c) ? 0.0 : 1.0, c.microbatches / pipeline);
      if (bound >= best->plan.predicted.step_ms) {
        c.status = "pruned";
        c.note = fmt::format("lower bound {:.3f} ms (the compute alone) >= the best step {:.3f} ms",
                             bound, best->plan.predicted.step_ms);
        continue;
      }
    }
    try {
      PlannedModel planned = make_plan(options_of(shared, c));
      const Prediction& p = planned.plan.predicted;
      c.status = p.fits ? "fits" : "over_memory";
      c.step_ms = p.step_ms;
      c.bubble_fraction = p.bubble_fraction;
      c.samples_per_s = p.samples_per_s;
      c.peak_memory_bytes = p.peak_memory_bytes;
      double work = 0, state = 0;
      for (const OpRecord& op : planned.plan.ops) {
        work += op.fwd_ms + op.bwd_ms;
        state += static_cast<double>(op.param_bytes);
      }
      work_ms.emplace(c.microbatch_size, work);
      if (!o.shard_optimizer) state_bytes = state;
      capacity = static_cast<double>(planned.plan.device.memory_bytes);
      if (p.fits && (!best || better(c, best->plan.auto_search.front(), o.objective))) {
        planned.plan.auto_search = {c};
        best = std::move(planned);
      }
    } catch (const Error& e) {
      // A configuration the batch, the schedule's rules or the model does not allow; anything
      // else is a fault.
      if (e.kind() != ErrorKind::kUsage && e.kind() != ErrorKind::kPlan) throw;
      c.status = "refused";
      c.note = e.what();
    }
  }
  std::stable_sort(space.begin(), space.end(), [&](const AutoCandidate& a, const AutoCandidate& b) {
    return better(a, b, o.objective);
  });
  if (!best) {
    const auto over = std::find_if(space.begin(), space.end(), [](const AutoCandidate& c) {
      return c.status == "over_memory";
    });
    const std::string limit = format_bytes(
        static_cast<double>(cost::device_spec_from_name_or_file(o.device_spec).memory_bytes));
    if (over == space.end() && smallest_bound > 0)
      fail(ErrorKind::kPlan,
           "--auto: none of the {} configurations fits the device's memory: the smallest peak "
           "is at least {} of weights, gradients and optimizer state against {} per device",
           space.size(), format_bytes(smallest_bound), limit);
    if (over == space.end())
      fail(ErrorKind::kPlan,
           "--auto: none of the {} configurations could be planned; the first: {}", space.size(),
           space.front().note);
    fail(ErrorKind::kPlan,
         "--auto: none of the {} configurations fits the device's memory: the smallest peak found "
         "is {} ({}) against {} per device",
         space.size(), format_bytes(static_cast<double>(over->peak_memory_bytes)),
         config_name(*over), limit);
  }
  const AutoCandidate& chosen = best->plan.auto_search.front();
  auto same = std::find_if(space.begin(), space.end(), [&](const AutoCandidate& c) {
    return c.status == "fits" && key(c) == key(chosen) && c.recompute == chosen.recompute;
  });
  same->status = "chosen";
  std::rotate(space.begin(), same, same + 1);
  best->plan.auto_search = std::move(space);
  return std::move(*best);
}

std::string describe_auto_search(const Plan& plan, std::size_t shown) {
  const std::vector<AutoCandidate>& s = plan.auto_search;
  if (s.empty()) return "";
  const AutoCandidate& c = s.front();
  std::map<std::string, int> counts;
  int same = 0;
  // The planned configurations after the chosen one, best first, less recompute auto's where
  // it recomputes nothing (recompute none's plan, listed under that name).
  std::vector<const AutoCandidate*> others;
  for (const AutoCandidate& x : s) {
    ++counts[x.status];
    same += same_as_none(x, s) ? 1 : 0;
    if (&x != &c && (x.status == "fits" || x.status == "over_memory") && !same_as_none(x, s))
      others.push_back(&x);
  }
  const bool memory = plan.objective == Objective::kMemory;
  std::string out = fmt::format("--auto: chose {} ({} that fits): predicted {}", config_name(c),
                                memory ? "the smallest peak" : "the shortest step", figures(c));
  if (!others.empty() && others.front()->status == "fits") {
    const AutoCandidate& r = *others.front();
    const double delta = memory ? static_cast<double>(r.peak_memory_bytes) /
                                          std::max(1.0, static_cast<double>(c.peak_memory_bytes)) -
                                      1
                                : r.step_ms / c.step_ms - 1;
    out += fmt::format("; the runner-up, {}: {} ({} {:+.1f}%)", config_name(r), figures(r),
                       memory ? "peak" : "step", 100 * delta);
  } else {
    out += "; no other configuration fits";
  }
  out += fmt::format(
      "\n--auto: {} configurations: {} planned and fit ({} of them recompute auto predicting "
      "recompute none's plan), {} over the device's memory, {} pruned (by a lower "
      "bound), {} refused\n",
      s.size(), counts["chosen"] + counts["fits"], same, counts["over_memory"], counts["pruned"],
      counts["refused"]);
  for (std::size_t i = 0; i < others.size() && i < shown; ++i)
    out += fmt::format("  {}. {}: {}{}\n", i + 2, config_name(*others[i]), figures(*others[i]),
                       others[i]->status == "fits" ? "" : " (does not fit)");
  return out;
}

}  // namespace stagecraft::plan
