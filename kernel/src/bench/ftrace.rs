//! Suite `ftrace` (the call-ops thread, docs/threads.md): 100,000 calls to a trivial traced function with R relevant and I
//! irrelevant counting tracers, for the seed's (R, I) pairs, under each dispatch scheme.
//!
//! A relevant tracer traces the target; an irrelevant one traces another function that the
//! loop never calls. `per_call` is the loop's cost per call (loop + call + tracing, as the
//! seed's "Total"); `overhead` is `per_call` minus that scheme's (0, 0) figure. Every relevant
//! counter must have counted every call, or the row is not emitted.
//!
//! Case `graph` (call-ops scheme): the relevant tracer is the function-graph tracer
//! (`ftrace::graph`: an entry event, a hijacked return and an exit event per call), R = 0 or 1,
//! beside I irrelevant counting tracers; its (0, 0) row is the untraced loop. The graph tracer
//! must have recorded every entry and exit with no overflow, or the row is not emitted.

use core::hint::black_box;

use super::{Label, Plan, row, row_windows};
use crate::ftrace::{self, Scheme, graph, tracers::Counter};

const CALLS: u64 = 100_000;
/// The seed's table.
const PAIRS: [(usize, usize); 13] =
    [(0, 0), (0, 1), (0, 2), (0, 10), (0, 100), (1, 1), (1, 2), (1, 10), (1, 100), (1, 0), (2, 0), (10, 0), (100, 0)];
/// Case `graph`'s (R, I) pairs: one graph tracer at most.
const GRAPH_PAIRS: [(usize, usize); 6] = [(0, 0), (1, 0), (1, 1), (1, 2), (1, 10), (1, 100)];
const SCHEMES: [(Scheme, &str); 3] =
    [(Scheme::List, "list"), (Scheme::CallOps, "call-ops"), (Scheme::Vector, "vector")];

static COUNTERS: [Counter; 101] = [const { Counter::new() }; 101];

/// The traced function: an ordinary Rust function with its patchable entry, placed first among
/// the traceable functions (`kernel.ld`) so that its site is at its home slot in the site index
/// in every build, as nearly every site is: the rows measure dispatch, not a probe sequence that
/// depends on where the rest of the kernel landed.
#[inline(never)]
#[unsafe(link_section = ".text.ftrace_bench_target")]
fn target(x: u64) -> u64 {
    x.wrapping_add(1)
}

/// What the irrelevant tracers trace (never called while measuring).
#[inline(never)]
fn elsewhere(x: u64) -> u64 {
    x.wrapping_sub(1)
}

#[inline(never)]
fn call_loop(function: fn(u64) -> u64, calls: u64) -> u64 {
    let mut value = 0;
    for _ in 0..calls {
        value = function(value);
    }
    value
}

fn register(counters: &'static [Counter], function: u64, tracers: &mut [Option<::ftrace::TracerId>]) -> bool {
    for (counter, slot) in counters.iter().zip(tracers) {
        counter.reset();
        match ftrace::register_where(&counter.ops, |entry| entry + 8 == function) {
            Ok(tracer) => *slot = Some(tracer),
            Err(error) => {
                defmt::error!("bench ftrace: register: {}", error);
                return false;
            }
        }
    }
    true
}

/// One (scheme, R, I) measurement; `None` if a tracer could not be set up or miscounted.
fn measure(plan: &Plan, relevant: usize, irrelevant: usize) -> Option<u64> {
    let (target_address, elsewhere_address) = (target as *const () as u64, elsewhere as *const () as u64);
    let mut tracers = [None; 101];
    let (relevant_counters, others) = COUNTERS.split_at(relevant);
    let ok = register(relevant_counters, target_address, &mut tracers[..relevant])
        && register(&others[..irrelevant], elsewhere_address, &mut tracers[relevant..relevant + irrelevant]);
    let function = black_box(target as fn(u64) -> u64);
    let cost = ok.then(|| {
        plan.measure(|| {
            black_box(call_loop(function, CALLS));
        })
    });
    for tracer in tracers.into_iter().flatten() {
        if let Err(error) = ftrace::unregister(tracer) {
            defmt::error!("bench ftrace: unregister: {}", error);
        }
    }
    let counted = COUNTERS[..relevant + irrelevant].iter().map(Counter::hits);
    let expected = (0..relevant + irrelevant).map(|index| if index < relevant { CALLS } else { 0 });
    if !counted.eq(expected) {
        defmt::error!(
            "bench ftrace: R={=usize} I={=usize}: counters disagree with the calls made",
            relevant,
            irrelevant
        );
        return None;
    }
    cost
}

/// One graph measurement with `relevant` (0 or 1) graph tracers on the target and `irrelevant`
/// counters elsewhere; `None` if a tracer could not be set up or the events disagree.
fn measure_graph(plan: &Plan, relevant: usize, irrelevant: usize) -> Option<u64> {
    let (target_address, elsewhere_address) = (target as *const () as u64, elsewhere as *const () as u64);
    let mut tracers = [None; 101];
    graph::clear();
    let mut ok = register(&COUNTERS[..irrelevant], elsewhere_address, &mut tracers[..irrelevant]);
    if ok && relevant == 1 {
        match graph::register_where(|entry| entry + 8 == target_address) {
            Ok(tracer) => tracers[irrelevant] = Some(tracer),
            Err(error) => {
                defmt::error!("bench ftrace: graph: register: {}", error);
                ok = false;
            }
        }
    }
    let function = black_box(target as fn(u64) -> u64);
    let cost = ok.then(|| {
        plan.measure(|| {
            black_box(call_loop(function, CALLS));
        })
    });
    for tracer in tracers.into_iter().flatten() {
        if let Err(error) = ftrace::unregister(tracer) {
            defmt::error!("bench ftrace: unregister: {}", error);
        }
    }
    let counted = COUNTERS[..irrelevant].iter().all(|counter| counter.hits() == 0);
    if !counted || graph::written() != 2 * CALLS * relevant as u64 || graph::overflows() != 0 {
        defmt::error!(
            "bench ftrace: graph R={=usize} I={=usize}: events disagree with the calls made",
            relevant,
            irrelevant
        );
        return None;
    }
    cost
}

/// Case `graph` (see the module docs), under the call-ops scheme.
fn run_graph(plan: &Plan, unit: &str) {
    if let Err(error) = ftrace::set_scheme(Scheme::CallOps) {
        defmt::error!("bench ftrace: scheme call-ops: {}", error);
        return;
    }
    let mut baseline = None;
    for (relevant, irrelevant) in GRAPH_PAIRS {
        let Some(cost) = measure_graph(plan, relevant, irrelevant) else { continue };
        let per_call = cost as f64 / CALLS as f64;
        let base_cost = *baseline.get_or_insert(cost);
        let base = base_cost as f64 / CALLS as f64;
        let params = Label::new(format_args!("relevant={relevant},irrelevant={irrelevant}"));
        row("ftrace", "graph", params.as_str(), "per_call", unit, per_call);
        row_windows("ftrace", "graph", params.as_str(), "per_call", cost, None, CALLS);
        row("ftrace", "graph", params.as_str(), "overhead", unit, per_call - base);
        row_windows("ftrace", "graph", params.as_str(), "overhead", cost, Some(base_cost), CALLS);
    }
    graph::clear();
}

pub fn run(plan: &Plan) {
    if crate::symbols::callsites::entries().is_empty() {
        defmt::error!("bench ftrace: this build has no patchable entries (variant plain)");
        return;
    }
    if !ftrace::site_at_home(target as *const () as u64) {
        defmt::error!(
            "bench ftrace: the target's site is not at its home slot of the site index (kernel.ld places \
             `.text.ftrace_bench_target` first among traced functions): no rows"
        );
        return;
    }
    let unit = plan.unit();
    for _ in 0..plan.reps {
        for (scheme, name) in SCHEMES {
            if let Err(error) = ftrace::set_scheme(scheme) {
                defmt::error!("bench ftrace: scheme {=str}: {}", name, error);
                continue;
            }
            let mut baseline = None;
            for (relevant, irrelevant) in PAIRS {
                let Some(cost) = measure(plan, relevant, irrelevant) else { continue };
                let per_call = cost as f64 / CALLS as f64;
                let base_cost = *baseline.get_or_insert(cost);
                let base = base_cost as f64 / CALLS as f64;
                let params = Label::new(format_args!("relevant={relevant},irrelevant={irrelevant}"));
                row("ftrace", name, params.as_str(), "per_call", unit, per_call);
                row_windows("ftrace", name, params.as_str(), "per_call", cost, None, CALLS);
                row("ftrace", name, params.as_str(), "overhead", unit, per_call - base);
                row_windows("ftrace", name, params.as_str(), "overhead", cost, Some(base_cost), CALLS);
            }
        }
        run_graph(plan, unit);
    }
    if let Err(error) = ftrace::set_scheme(Scheme::CallOps) {
        defmt::error!("bench ftrace: scheme call-ops: {}", error);
    }
}
