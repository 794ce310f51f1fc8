//! Probes from the command line, as Linux's `kprobe_event=`: `kprobe=SYMBOL[+OFFSET]:METHOD`
//! and `kretprobe=SYMBOL:METHOD` (repeatable), registered at boot, reported at the end of the run.
//!
//! Symbols come from the kernel's embedded table (`ftrace::Symbols`). A bare SYMBOL probes the
//! first instruction after the patchable entry, as a kretprobe does (ftrace owns the entry).
//! Hits are the probe subsystem's own counters. A request that cannot be honoured (unknown
//! symbol, offset off an instruction boundary or past the function, refused instruction) gives
//! one line with the reason; the run goes on.

use crate::args::Args;
use crate::probes::{self as kprobes, Method, Registers, kretprobe};
use protocol::cmdline as key;

/// Requests kept from the command line (more are reported and dropped).
pub const MAX_REQUESTS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kprobe,
    Kretprobe,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Kretprobe => "kretprobe",
        }
    }
}

#[derive(Clone, Copy)]
struct Request {
    kind: Kind,
    /// The argument as written: `SYMBOL[+OFFSET]:METHOD`.
    spec: &'static str,
}

/// The `kprobe=`/`kretprobe=` words of the command line, in order.
pub struct Requests {
    requests: [Option<Request>; MAX_REQUESTS],
}

impl Requests {
    pub const fn new() -> Self {
        Self { requests: [None; MAX_REQUESTS] }
    }

    /// The `kprobe=` and `kretprobe=` words, in order.
    pub fn from_args(args: &Args) -> Self {
        let mut requests = Self::new();
        for (name, spec) in args.pairs() {
            match name {
                key::KPROBE => requests.push(Kind::Kprobe, spec),
                key::KRETPROBE => requests.push(Kind::Kretprobe, spec),
                _ => {}
            }
        }
        requests
    }

    pub fn push(&mut self, kind: Kind, spec: &'static str) {
        match self.requests.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(Request { kind, spec }),
            None => defmt::warn!("{=str}={=str}: ignored, at most {=usize} probes", kind.name(), spec, MAX_REQUESTS),
        }
    }
}

/// A probe registered at boot.
#[derive(Clone, Copy)]
struct Registered {
    kind: Kind,
    spec: &'static str,
    method: Method,
    /// The probed instruction (kprobe) or the function (kretprobe).
    address: u64,
}

static REGISTERED: crate::sync::IrqSpinLock<[Option<Registered>; MAX_REQUESTS]> =
    crate::sync::IrqSpinLock::new([None; MAX_REQUESTS]);

/// The pre-handler of every boot kprobe: the subsystem counts the hits.
fn on_hit(_: &mut Registers) {}

fn on_return(_: &mut Registers, _: u64) {}

/// Registers every request; a request that fails says why in one line.
pub fn register_all(requests: &Requests) {
    for request in requests.requests.iter().flatten() {
        match register(request) {
            Ok(registered) => {
                defmt::info!(
                    "{=str}={=str}: registered at {=u64:#x} ({=str})",
                    request.kind.name(),
                    request.spec,
                    registered.address,
                    registered.method.name()
                );
                if let Some(slot) = REGISTERED.lock().iter_mut().find(|slot| slot.is_none()) {
                    *slot = Some(registered);
                }
            }
            Err(reason) => {
                defmt::warn!("{=str}={=str}: not registered: {=str}", request.kind.name(), request.spec, reason)
            }
        }
    }
}

fn parse_method(name: &str) -> Option<Method> {
    Method::ALL.into_iter().find(|method| method.name() == name)
}

fn parse_offset(text: &str) -> Option<u64> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn register(request: &Request) -> Result<Registered, &'static str> {
    let (target, method) =
        request.spec.rsplit_once(':').ok_or("expected SYMBOL[+OFFSET]:METHOD (e.g. kernel::task::tick:simulate)")?;
    let method = parse_method(method).ok_or("unknown method (single-step, brk-step, simulate or detour)")?;
    let (symbol, offset) = match target.split_once('+') {
        Some((symbol, offset)) => (symbol, Some(parse_offset(offset).ok_or("the offset is not a number")?)),
        None => (target, None),
    };
    let symbols = crate::ftrace::Symbols::get().ok_or("the kernel has no symbol table (not built by xtask)")?;
    let function = symbols.address_of(symbol).ok_or("no such function in the kernel's symbol table")?;
    match request.kind {
        Kind::Kretprobe => {
            if offset.is_some() {
                return Err("a kretprobe takes a function, not an offset");
            }
            kretprobe::register(function, method, None, on_return, 4).map_err(|error| error.as_str())?;
            Ok(Registered { kind: Kind::Kretprobe, spec: request.spec, method, address: function })
        }
        Kind::Kprobe => {
            let address = match offset {
                Some(offset) if offset % 4 != 0 => {
                    return Err("the offset is not on an instruction boundary (A64 instructions are 4 bytes)");
                }
                Some(offset) => function + offset,
                None => kretprobe::attach_address(function),
            };
            if let Some((start, _)) = crate::symbols::callsites::function_containing(address)
                && start != function
                && function_has_entry(function)
            {
                return Err("the offset is past the end of the function");
            }
            kprobes::register(address, method, on_hit, None).map_err(|error| error.as_str())?;
            Ok(Registered { kind: Kind::Kprobe, spec: request.spec, method, address })
        }
    }
}

/// Whether `function` is instrumented (has a patchable entry), so `callsites` knows its extent.
fn function_has_entry(function: u64) -> bool {
    crate::symbols::callsites::function_containing(function).is_some_and(|(start, _)| start == function)
}

/// Prints each boot probe's hits (the subsystem's counters) and what a hit of its method costs,
/// then unregisters it. The cost is measured now with the bench's loop on the bench's push
/// target: a probe's trap, lookup, handler and step cost the same whatever function they are in
/// (within the few instructions by which simulating or stepping one instruction differs).
pub fn report(icount: bool) {
    let registered = *REGISTERED.lock();
    if registered.iter().all(Option::is_none) {
        return;
    }
    let plan = crate::bench::Plan {
        clock: if icount { crate::bench::Clock::Cycles } else { crate::bench::Clock::Nanoseconds },
        icount,
        reps: 1,
        host_cpus: None,
    };
    crate::arch::counters::start_cycle_counter();
    for probe in registered.iter().flatten() {
        let (hits, missed) = match probe.kind {
            Kind::Kprobe => kprobes::counts(probe.address),
            Kind::Kretprobe => kretprobe::counts(probe.address),
        }
        .unwrap_or((0, 0));
        let _ = match probe.kind {
            Kind::Kprobe => kprobes::unregister(probe.address),
            Kind::Kretprobe => kretprobe::unregister(probe.address),
        };
        let unprobed = super::probes::unprobed_loop(&plan);
        let per_hit = match probe.kind {
            Kind::Kprobe => super::probes::kprobe_per_hit(&plan, probe.method, unprobed),
            Kind::Kretprobe => super::probes::kretprobe_per_hit(&plan, probe.method, unprobed),
        };
        // Whole units, rounded (no_std: no f64::round; `as` takes a negative cost to 0): the
        // fraction is the loop subtraction's rounding, not a cost.
        match per_hit {
            Some(cost) => defmt::info!(
                "{=str}={=str}: {=u64} hits, {=u64} missed; a {=str} hit costs {=u64} {=str} (bench push target, measured now)",
                probe.kind.name(),
                probe.spec,
                hits,
                missed,
                probe.method.name(),
                (cost + 0.5) as u64,
                plan.unit()
            ),
            None => defmt::info!(
                "{=str}={=str}: {=u64} hits, {=u64} missed; a {=str} hit's cost could not be measured",
                probe.kind.name(),
                probe.spec,
                hits,
                missed,
                probe.method.name()
            ),
        }
    }
}
