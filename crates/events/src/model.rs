//! The cycle model: a row's events per operation costed as cycles of a Cortex-A72 (the Pi 4's
//! core), with one parameter set for every row.
//!
//! It is a model, not a measurement: nothing here has been calibrated against a core's cycle
//! counter, and everything that prints its figures says so ([`LABEL`]). The cost is additive:
//! each instruction class at the A72's documented issue throughput (Arm's Cortex-A72 Software
//! Optimization Guide, UAN 0016A, sections 2 and 3: three-wide dispatch, two integer pipes, one
//! branch, one load and one store pipe, a 4-cycle load-to-use latency), plus a fixed cost for
//! each event whose cost the guide does not give (exception entry and return, barriers, cache
//! and TLB maintenance, system register moves, modelled misses, indirect-branch mispredictions).
//! Every parameter carries its value, its range and where it comes from ([`Parameter`]);
//! `docs/design/benchmarks.md` tabulates them with their effect on each headline ratio.
//! Overlapping execution (out-of-order issue hiding latencies) is left out, so the model is an
//! upper-leaning estimate for straight-line code and says nothing about a loop's critical path.

use crate::Counter;

/// How every printed model figure is introduced.
pub const LABEL: &str = "modelled cycles (model: uncalibrated, Cortex-A72 parameters, see docs/design/benchmarks.md)";

/// The metric suffix of a row's modelled cycles: `per_hit.model_cycles`.
pub const METRIC: &str = "model_cycles";

/// The model's unit, which says it is one.
pub const UNIT: &str = "cycles (model)";

/// What a parameter's value rests on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Source {
    /// A figure of the Cortex-A72 Software Optimization Guide (UAN 0016A), by section.
    Guide(&'static str),
    /// No published figure for this core: an assumption, whose range is the point.
    Assumed(&'static str),
}

/// One cost of the model, in cycles.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Parameter {
    pub name: &'static str,
    pub value: f64,
    /// The ends the sensitivity analysis moves it to.
    pub low: f64,
    pub high: f64,
    pub source: Source,
}

/// The costs, one field per parameter, in cycles per event.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Costs {
    /// An instruction of no other class (integer data processing, moves, untaken branches,
    /// NOP-space PAC instructions): two integer pipes issue two a cycle.
    pub other: f64,
    pub load: f64,
    pub store: f64,
    pub taken_branch: f64,
    /// An exception taken (the vector entry's pipeline refill and state save by hardware).
    pub exception: f64,
    pub eret: f64,
    pub isb: f64,
    pub dsb: f64,
    pub dmb: f64,
    pub cache_maintenance: f64,
    pub tlbi: f64,
    pub system_register: f64,
    /// An L1 (instruction or data) miss served by the L2.
    pub l2_hit: f64,
    /// An L2 miss served by DRAM.
    pub memory: f64,
    /// The fraction of indirect branches (returns excluded: the return stack predicts them)
    /// that mispredict, and what one costs.
    pub indirect_mispredict_rate: f64,
    pub mispredict: f64,
}

/// The one parameter set: every row is costed with it.
pub const A72: [Parameter; 16] = [
    Parameter {
        name: "other",
        value: 0.5,
        low: 0.33,
        high: 1.0,
        source: Source::Guide(
            "sections 2 and 3, integer: two integer pipes, throughput 2/cycle; 0.33 at the 3-wide dispatch, 1.0 for dependent chains (latency 1)",
        ),
    },
    Parameter {
        name: "load",
        value: 1.0,
        low: 1.0,
        high: 4.0,
        source: Source::Guide(
            "sections 2 and 3.8, loads: one load pipe, throughput 1/cycle; 4.0 with the load-to-use latency fully exposed",
        ),
    },
    Parameter {
        name: "store",
        value: 1.0,
        low: 1.0,
        high: 2.0,
        source: Source::Guide(
            "sections 2 and 3, stores: one store pipe, throughput 1/cycle; 2.0 for pairs split in two",
        ),
    },
    Parameter {
        name: "taken_branch",
        value: 1.0,
        low: 1.0,
        high: 2.0,
        source: Source::Guide(
            "sections 2 and 3, branches: one branch pipe, throughput 1/cycle; 2.0 assumed with a fetch bubble",
        ),
    },
    Parameter {
        name: "exception",
        value: 40.0,
        low: 20.0,
        high: 100.0,
        source: Source::Assumed("a pipeline drain and refill (about 15) plus the hardware's state save"),
    },
    Parameter {
        name: "eret",
        value: 25.0,
        low: 15.0,
        high: 60.0,
        source: Source::Assumed("context synchronising: a pipeline refill at the least"),
    },
    Parameter {
        name: "isb",
        value: 20.0,
        low: 15.0,
        high: 40.0,
        source: Source::Assumed("a pipeline flush and refill"),
    },
    Parameter {
        name: "dsb",
        value: 30.0,
        low: 10.0,
        high: 100.0,
        source: Source::Assumed("waits for outstanding memory accesses; none are counted on the hit paths"),
    },
    Parameter {
        name: "dmb",
        value: 10.0,
        low: 5.0,
        high: 50.0,
        source: Source::Assumed("orders, does not drain the pipeline"),
    },
    Parameter {
        name: "dc_ic",
        value: 50.0,
        low: 20.0,
        high: 200.0,
        source: Source::Assumed("a line's maintenance broadcast to the point of unification"),
    },
    Parameter {
        name: "tlbi",
        value: 50.0,
        low: 20.0,
        high: 300.0,
        source: Source::Assumed("a broadcast invalidation, completed by the following dsb"),
    },
    Parameter {
        name: "msr_mrs",
        value: 5.0,
        low: 1.0,
        high: 30.0,
        source: Source::Assumed("the guide lists no system register moves; some are serialising"),
    },
    Parameter {
        name: "l2_hit",
        value: 21.0,
        low: 15.0,
        high: 30.0,
        source: Source::Assumed("published pointer-chase latencies of A72 parts (about 9 ns at 2.3 GHz)"),
    },
    Parameter {
        name: "memory",
        value: 150.0,
        low: 100.0,
        high: 300.0,
        source: Source::Assumed("DRAM latency of about 100 ns at the Pi 4's 1.5 GHz"),
    },
    Parameter {
        name: "indirect_mispredict_rate",
        value: 0.1,
        low: 0.0,
        high: 1.0,
        source: Source::Assumed("a measuring loop repeats one target; 1.0 with every target new"),
    },
    Parameter {
        name: "mispredict",
        value: 15.0,
        low: 11.0,
        high: 19.0,
        source: Source::Assumed("the A72's 15-stage pipeline refilled"),
    },
];

impl Costs {
    /// The costs with each parameter at its value in `parameters` (the order of [`A72`]).
    pub fn from_parameters(parameters: &[Parameter; 16]) -> Costs {
        let value = |name: &str| parameters.iter().find(|parameter| parameter.name == name).map_or(0.0, |p| p.value);
        Costs {
            other: value("other"),
            load: value("load"),
            store: value("store"),
            taken_branch: value("taken_branch"),
            exception: value("exception"),
            eret: value("eret"),
            isb: value("isb"),
            dsb: value("dsb"),
            dmb: value("dmb"),
            cache_maintenance: value("dc_ic"),
            tlbi: value("tlbi"),
            system_register: value("msr_mrs"),
            l2_hit: value("l2_hit"),
            memory: value("memory"),
            indirect_mispredict_rate: value("indirect_mispredict_rate"),
            mispredict: value("mispredict"),
        }
    }

    /// The one parameter set.
    pub fn a72() -> Costs {
        Costs::from_parameters(&A72)
    }

    /// The modelled cycles of one operation whose events per operation `events` gives. The
    /// instructions of a costed class are taken out of "other" (never below none: atomics are
    /// both a load and a store); exceptions are not instructions (their vector entry's first
    /// instruction is counted as the instruction it is).
    pub fn cycles(&self, events: impl Fn(Counter) -> f64) -> f64 {
        use Counter::*;
        let classed = [
            (Loads, self.load),
            (Stores, self.store),
            (TakenBranches, self.taken_branch),
            (ExceptionReturns, self.eret),
            (Isb, self.isb),
            (Dsb, self.dsb),
            (Dmb, self.dmb),
            (CacheMaintenance, self.cache_maintenance),
            (Tlbi, self.tlbi),
            (SystemRegisters, self.system_register),
        ];
        let classed_count: f64 = classed.iter().map(|&(counter, _)| events(counter)).sum();
        let other = (events(Instructions) - classed_count).max(0.0);
        let instructions: f64 = classed.iter().map(|&(counter, cost)| events(counter) * cost).sum();
        let misses = (events(L1iMisses) + events(L1dMisses)) * self.l2_hit + events(L2Misses) * self.memory;
        let mispredicts = events(IndirectBranches) * self.indirect_mispredict_rate * self.mispredict;
        other * self.other + instructions + events(Exceptions) * self.exception + misses + mispredicts
    }
}

/// The exception cost at which `slow` / `fast` (two rows' events per operation) would be
/// `ratio` with every other parameter as in `costs`; None where no positive cost does (the
/// two rows take as many exceptions, or the ratio is beyond what exceptions alone can reach).
pub fn implied_exception_cost(
    costs: &Costs,
    slow: impl Fn(Counter) -> f64,
    fast: impl Fn(Counter) -> f64,
    ratio: f64,
) -> Option<f64> {
    let without = Costs { exception: 0.0, ..*costs };
    let (a, b) = (without.cycles(&slow), without.cycles(&fast));
    let (x, y) = (slow(Counter::Exceptions), fast(Counter::Exceptions));
    // (a + x E) / (b + y E) = ratio  =>  E = (ratio b - a) / (x - ratio y)
    let denominator = x - ratio * y;
    if denominator.abs() < 1e-9 {
        return None;
    }
    let cost = (ratio * b - a) / denominator;
    (cost > 0.0).then_some(cost)
}

/// What each parameter multiplies in [`Costs::cycles`] for one row's events: the row's modelled
/// cycles are the sum of these times the parameters' values (in the order of [`A72`]). The
/// mispredict rate is held at `costs`' value (the model multiplies it by the penalty), so its
/// coefficient is 0 and the penalty's carries it.
pub fn coefficients(costs: &Costs, events: impl Fn(Counter) -> f64) -> [f64; 16] {
    let mut coefficients = [0.0; 16];
    for (index, parameter) in A72.iter().enumerate() {
        if parameter.name == "indirect_mispredict_rate" {
            continue;
        }
        let mut unit = A72;
        for other in unit.iter_mut() {
            other.value = 0.0;
        }
        unit[index].value = 1.0;
        let rate = A72.iter().position(|p| p.name == "indirect_mispredict_rate").unwrap_or(0);
        unit[rate].value = costs.indirect_mispredict_rate;
        let mut base = unit;
        base[index].value = 0.0;
        coefficients[index] =
            Costs::from_parameters(&unit).cycles(&events) - Costs::from_parameters(&base).cycles(&events);
    }
    coefficients
}

/// A parameter as a calibration left it.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Fitted {
    pub parameter: Parameter,
    pub value: f64,
    /// Whether any calibration row paid this event at all: a parameter no row pays keeps its
    /// value, undetermined.
    pub determined: bool,
}

/// Calibrates the parameters on rows whose events per operation (`coefficients` of each) and
/// measured cycles per operation (PMU cycles on the modelled core) are known: the least-squares
/// fit with each parameter kept within its range (coordinate descent on a convex problem, from
/// the one parameter set). Returns the fitted parameters and the largest relative residual
/// (how far the fitted model stays from the worst-fitted row).
pub fn calibrate(rows: &[([f64; 16], f64)]) -> ([Fitted; 16], f64) {
    let mut values: [f64; 16] = core::array::from_fn(|index| A72[index].value);
    let column =
        |index: usize| rows.iter().map(|(coefficients, _)| coefficients[index] * coefficients[index]).sum::<f64>();
    let norms: [f64; 16] = core::array::from_fn(column);
    for _ in 0..2000 {
        for index in 0..16 {
            if norms[index] == 0.0 {
                continue;
            }
            let gradient: f64 = rows
                .iter()
                .map(|(coefficients, cycles)| {
                    let modelled: f64 = coefficients.iter().zip(&values).map(|(c, v)| c * v).sum();
                    coefficients[index] * (cycles - modelled)
                })
                .sum();
            values[index] = (values[index] + gradient / norms[index]).clamp(A72[index].low, A72[index].high);
        }
    }
    let residual = rows
        .iter()
        .map(|(coefficients, cycles)| {
            let modelled: f64 = coefficients.iter().zip(&values).map(|(c, v)| c * v).sum();
            if *cycles == 0.0 { 0.0 } else { ((modelled - cycles) / cycles).abs() }
        })
        .fold(0.0, f64::max);
    let fitted = core::array::from_fn(|index| Fitted {
        parameter: A72[index],
        value: values[index],
        determined: norms[index] > 0.0,
    });
    (fitted, residual)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic row: 100 instructions of which 20 loads, 10 stores, 5 taken branches (2 of
    /// them indirect), 2 `eret`, 1 `isb`, 4 system register moves; 2 exceptions; 3 L1D misses,
    /// 1 L2 miss.
    fn row(counter: Counter) -> f64 {
        use Counter::*;
        match counter {
            Instructions => 100.0,
            Loads => 20.0,
            Stores => 10.0,
            TakenBranches => 5.0,
            IndirectBranches => 2.0,
            ExceptionReturns => 2.0,
            Isb => 1.0,
            SystemRegisters => 4.0,
            Exceptions => 2.0,
            L1dMisses => 3.0,
            L2Misses => 1.0,
            _ => 0.0,
        }
    }

    #[test]
    fn a_synthetic_row_costs_its_parts() {
        let costs = Costs::a72();
        // other: 100 - (20 + 10 + 5 + 2 + 1 + 4) = 58 at 0.5
        let expected = 58.0 * 0.5
            + 20.0 * 1.0
            + 10.0 * 1.0
            + 5.0 * 1.0
            + 2.0 * 25.0
            + 20.0
            + 4.0 * 5.0
            + 2.0 * 40.0
            + 3.0 * 21.0
            + 150.0
            + 2.0 * 0.1 * 15.0;
        assert!((costs.cycles(row) - expected).abs() < 1e-9);
    }

    #[test]
    fn an_empty_row_costs_nothing_and_atomics_are_not_counted_twice() {
        let costs = Costs::a72();
        assert_eq!(costs.cycles(|_| 0.0), 0.0);
        // One instruction that is both a load and a store: never a negative "other".
        let atomic = |counter: Counter| match counter {
            Counter::Instructions | Counter::Loads | Counter::Stores => 1.0,
            _ => 0.0,
        };
        assert_eq!(costs.cycles(atomic), 2.0);
    }

    #[test]
    fn every_parameter_has_its_value_within_its_range() {
        for parameter in A72 {
            assert!(parameter.low <= parameter.value && parameter.value <= parameter.high, "{}", parameter.name);
        }
        let names: Vec<&str> = A72.iter().map(|parameter| parameter.name).collect();
        for (index, name) in names.iter().enumerate() {
            assert!(!names[..index].contains(name), "{name} twice");
        }
    }

    #[test]
    fn the_implied_exception_cost_reproduces_the_ratio() {
        let costs = Costs::a72();
        let fast = |counter: Counter| match counter {
            Counter::Exceptions => 1.0,
            _ => row(counter) / 4.0,
        };
        let cost = implied_exception_cost(&costs, row, fast, 2.5).unwrap();
        let at = Costs { exception: cost, ..costs };
        assert!((at.cycles(row) / at.cycles(fast) - 2.5).abs() < 1e-9);
        // Twice the exceptions can never make more than twice the cost out of exceptions alone,
        // and rows with as many exceptions do not depend on their cost.
        assert_eq!(implied_exception_cost(&costs, row, |counter| row(counter) / 2.0, 2.0), None);
        assert_eq!(implied_exception_cost(&costs, row, row, 1.5), None);
    }

    /// A synthetic PMU fixture: rows of varied events whose cycles are what a core with known
    /// costs (each within its range, none at the one set's value) would count.
    #[test]
    fn calibration_recovers_a_synthetic_cores_costs() {
        let mut truth = A72;
        for parameter in truth.iter_mut() {
            parameter.value = parameter.low + (parameter.high - parameter.low) * 0.3;
        }
        truth[14].value = A72[14].value; // the held mispredict rate
        let core = Costs::from_parameters(&truth);
        let mut seed = 12_345u64;
        let mut next = |limit: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((seed >> 33) % limit) as f64
        };
        let counted = [
            Counter::Loads,
            Counter::Stores,
            Counter::TakenBranches,
            Counter::IndirectBranches,
            Counter::Exceptions,
            Counter::ExceptionReturns,
            Counter::Isb,
            Counter::Dsb,
            Counter::Dmb,
            Counter::CacheMaintenance,
            Counter::Tlbi,
            Counter::SystemRegisters,
            Counter::L1iMisses,
            Counter::L1dMisses,
            Counter::L2Misses,
        ];
        let rows: alloc::vec::Vec<([f64; 16], f64)> = (0..60)
            .map(|_| {
                let mut events = [0.0; Counter::COUNT];
                for counter in counted {
                    events[counter.index()] = next(20);
                }
                events[Counter::Instructions.index()] = 400.0 + next(400);
                let events = |counter: Counter| events[counter.index()];
                (coefficients(&Costs::a72(), events), core.cycles(events))
            })
            .collect();
        let (fitted, residual) = calibrate(&rows);
        assert!(residual < 1e-6, "residual {residual}");
        for (fit, truth) in fitted.iter().zip(truth) {
            assert!(fit.determined || fit.parameter.name == "indirect_mispredict_rate");
            assert!(
                (fit.value - truth.value).abs() < 1e-3 * truth.value.max(1.0),
                "{}: {} not {}",
                truth.name,
                fit.value,
                truth.value
            );
        }
        // Without rows nothing is determined: every parameter keeps the one set's value.
        let (fitted, residual) = calibrate(&[]);
        assert_eq!(residual, 0.0);
        assert!(fitted.iter().all(|fit| !fit.determined && fit.value == fit.parameter.value));
    }
}
