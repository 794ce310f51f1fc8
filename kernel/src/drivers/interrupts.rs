//! IRQ dispatch: the GIC says which interrupt, the handler for it runs; SGIs between CPUs.

use super::gic::{Gic, GicConfig, SPECIAL_INTID_START};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

static GIC: spin::Once<Gic> = spin::Once::new();
static TIMER_INTID: AtomicU32 = AtomicU32::new(0);
static UNHANDLED: AtomicU64 = AtomicU64::new(0);
/// Other private interrupts and their handlers, registered at init by their owners (the
/// profiler's PMU overflow, the task layer's wake-up SGI): the tick stays the first compare.
static PRIVATE: crate::sync::Hooks<(u32, fn()), 3> = crate::sync::Hooks::new("private interrupt handlers");

pub fn init(config: GicConfig, timer_intid: u32) {
    let gic = GIC.call_once(|| Gic::init(config));
    TIMER_INTID.store(timer_intid, Ordering::Relaxed);
    gic.enable_private(timer_intid);
}

/// Enables the private interrupt `intid` of this CPU and runs `handler` for it (IRQ context;
/// the handler clears its device's interrupt condition before returning). At init.
pub fn register_private(intid: u32, handler: fn()) {
    PRIVATE.register((intid, handler));
    if let Some(gic) = GIC.get() {
        gic.enable_private(intid);
    }
}

/// The SGI that wakes a CPU to look at what another CPU asked of it (an IPI).
pub const SGI_WAKE: u32 = 1;

/// Sets up a secondary CPU's GIC interface and enables the wake-up SGI and the timer there (the
/// other private interrupts, the profiler's PMU overflow, stay the boot CPU's). On that CPU, after `init` ran on the boot CPU.
pub fn init_this_cpu() {
    let gic = GIC.get().expect("interrupts::init runs before the secondaries start");
    gic.init_this_cpu();
    gic.enable_private(SGI_WAKE);
    gic.enable_private(TIMER_INTID.load(Ordering::Relaxed));
}

/// Sends the wake-up SGI to CPU `cpu` (online, past `init_this_cpu`).
pub fn send_wake(cpu: usize) {
    if let Some(gic) = GIC.get() {
        gic.send_sgi(SGI_WAKE, cpu);
    }
}

pub fn gic_version() -> u8 {
    GIC.get().map_or(0, Gic::version)
}

/// Interrupts that arrived without a handler (a test checks this stays zero).
pub fn unhandled() -> u64 {
    UNHANDLED.load(Ordering::Relaxed)
}

pub fn handle_irq() {
    let Some(gic) = GIC.get() else { return };
    let intid = gic.acknowledge();
    if intid >= SPECIAL_INTID_START {
        return;
    }
    if intid == TIMER_INTID.load(Ordering::Relaxed) {
        super::timer::handle_tick();
    } else if let Some((_, handler)) = PRIVATE.iter().find(|(owned, _)| *owned == intid) {
        handler();
    } else {
        UNHANDLED.fetch_add(1, Ordering::Relaxed);
    }
    gic.end_of_interrupt(intid);
}
