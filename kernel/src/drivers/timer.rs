//! The EL1 virtual timer as the periodic tick (ARM ARM D11.2, "The Generic Timer").

use crate::sync::Hooks;
use aarch64_cpu::registers::{CNTFRQ_EL0, CNTV_CTL_EL0, CNTV_CVAL_EL0, CNTVCT_EL0, Readable, Writeable};
use core::sync::atomic::{AtomicU64, Ordering};

/// What runs on every tick, in registration order (set at init; a tick reads each once).
static CONSUMERS: Hooks<fn(), 4> = Hooks::new("timer tick consumers");
static INTERVAL: AtomicU64 = AtomicU64::new(0);
static HZ: AtomicU64 = AtomicU64::new(0);

pub fn frequency() -> u64 {
    CNTFRQ_EL0.get()
}

pub fn counter() -> u64 {
    CNTVCT_EL0.get()
}

/// Starts this CPU's periodic tick at `hz` (each CPU's virtual timer is its own). The compare
/// value advances by a fixed interval per tick, so the rate does not drift with interrupt
/// latency.
pub fn start(hz: u64) {
    let interval = frequency() / hz;
    INTERVAL.store(interval, Ordering::Relaxed);
    HZ.store(hz, Ordering::Relaxed);
    start_this_cpu();
}

/// Starts this CPU's tick at the rate `start` set (a secondary, after the boot CPU's `start`).
pub fn start_this_cpu() {
    CNTV_CVAL_EL0.set(counter() + INTERVAL.load(Ordering::Relaxed));
    CNTV_CTL_EL0.write(CNTV_CTL_EL0::ENABLE::SET + CNTV_CTL_EL0::IMASK::CLEAR);
}

/// Brings the next tick forward to `delay` counter ticks from now (tests that want an IRQ at a
/// chosen point). The periodic schedule continues from there.
pub fn fire_in(delay: u64) {
    CNTV_CVAL_EL0.set(counter() + delay);
}

/// The configured tick rate.
pub fn hz() -> u64 {
    HZ.load(Ordering::Relaxed)
}

/// Ticks this CPU took (each CPU counts its own: a window of ticks is one CPU's).
pub fn ticks() -> u64 {
    crate::arch::percpu::this_cpu().ticks.load(Ordering::Relaxed)
}

/// Adds `consumer` to what every tick runs (IRQ context, after the count). At init, before the
/// timer starts.
pub fn on_tick(consumer: fn()) {
    CONSUMERS.register(consumer);
}

/// The tick interrupt: count it, run the consumers, arm the next one.
pub fn handle_tick() {
    crate::arch::percpu::this_cpu().ticks.fetch_add(1, Ordering::Relaxed);
    for consumer in CONSUMERS.iter() {
        consumer();
    }
    let next = CNTV_CVAL_EL0.get() + INTERVAL.load(Ordering::Relaxed);
    CNTV_CVAL_EL0.set(next);
}
