//! The XOL page of every user space: where user probes' displaced instructions run.
//!
//! The XOL page (`USER_XOL`, one per task slot, executed only at EL0) holds, per probe index
//! `i`: the step slot at `16 i`, the detour trampoline at `0x400 + 16 i`; at `0x800` the
//! uretprobe trampoline (`uretprobe.rs`); and per CPU `c` a slot at `0xc00 + 16 c`, rewritten
//! at every hit of a probe using per-CPU slots (Linux's dynamic XOL slots). Every word nobody
//! owns is `BRK #0x120`, so a stray executor traps. Written through the code alias
//! (`arch::patch`), never executed writable.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::arch::patch;
use crate::arch::percpu::{CPUS, this_cpu_index};
use crate::task::user::{self, USER_XOL};
use probes::encode_brk;

/// BRK immediate of the step back from a slot.
pub const BRK_UPROBE_STEP: u16 = 0x120;
/// SVC immediate of the detour trampolines. Below 4096, so that the trap table's compare takes
/// it as an immediate (a larger one is built in a register first: one more instruction per hit).
pub const SVC_UPROBE_DETOUR: u16 = 0x550;
const _: () = assert!(SVC_UPROBE_DETOUR < 4096, "a 12-bit compare immediate");

/// Probe indices: each owns one step slot and one detour trampoline in every XOL page.
pub const MAX_UPROBES: usize = 16;
pub const DETOUR_OFFSET: u64 = 0x400;
/// The detour trampolines' bytes in the XOL page (16 per probe index).
pub const DETOUR_AREA_BYTES: u64 = 16 * MAX_UPROBES as u64;
/// The uretprobe trampoline.
pub const RETURN_TRAMPOLINE_OFFSET: u64 = 0x800;
/// The per-CPU slots (strategy `XolSlots::PerCpu`).
const CPU_SLOTS_OFFSET: u64 = 0xc00;

pub const fn slot_offset(index: usize) -> u64 {
    16 * index as u64
}

pub const fn detour_offset(index: usize) -> u64 {
    DETOUR_OFFSET + 16 * index as u64
}

pub const fn cpu_slot_offset(cpu: usize) -> u64 {
    CPU_SLOTS_OFFSET + 16 * cpu as u64
}

const _: () = assert!(detour_offset(MAX_UPROBES) <= RETURN_TRAMPOLINE_OFFSET, "trampolines end before 0x800");
const _: () = assert!(cpu_slot_offset(CPUS) <= 4096, "the per-CPU slots fit the XOL page");

/// A detour trampoline's first word: `SVC #SVC_UPROBE_DETOUR`.
pub const SVC_DETOUR: u32 = 0xd400_0001 | ((SVC_UPROBE_DETOUR as u32) << 5);
/// One 16-byte unit of words nobody owns.
pub const FILLER: [u32; 4] = [encode_brk(BRK_UPROBE_STEP).0; 4];

/// Writes `words` at byte `offset` of the XOL page of every task slot in `slots`.
pub fn write_xol(offset: u64, words: &[u32], slots: core::ops::Range<usize>) {
    for slot in slots {
        // SAFETY: offset + 4 * words.len() stays within one 16-byte unit of the 4096-byte XOL
        // page (callers' layout), kernel data executed only at USER_XOL; the words change only
        // while no task runs the probe's slot or trampoline (registration, task creation).
        unsafe { patch::write_code_alias(user::xol_page(slot).add(offset as usize / 4), words) };
    }
}

/// Whether this CPU's slot is held by a hit in progress (from the BRK to the step back), per CPU.
static CPU_SLOT_HELD: [AtomicBool; CPUS] = [const { AtomicBool::new(false) }; CPUS];
/// Hits that found their CPU's slot held and waited for it (`XolSlots::PerCpu`).
static SLOT_WAITS: AtomicU64 = AtomicU64::new(0);

/// Hits of `XolSlots::PerCpu` probes that had to wait for their CPU's slot, since boot. None can
/// today: a hit holds its slot with IRQs masked on its CPU from the BRK to the step back, so the
/// next hit on that CPU comes after (Linux steps with IRQs on and a task may sleep holding its
/// slot: there tasks wait for a free one).
pub fn slot_waits() -> u64 {
    SLOT_WAITS.load(Ordering::Relaxed)
}

/// How long a hit waits for its CPU's slot before taking it anyway (said in the log).
const SLOT_WAIT_MS: u64 = 10;

/// Takes this CPU's slot in the current task's XOL page and writes `[original, BRK #0x120]`
/// into it (unless `skip_unchanged` and it already holds them); returns the slot's user address.
#[unsafe(link_section = ".text.noprobe")]
pub fn fill_cpu_slot(original: u32, skip_unchanged: bool) -> u64 {
    let cpu = this_cpu_index();
    if CPU_SLOT_HELD[cpu].swap(true, Ordering::Acquire) {
        SLOT_WAITS.fetch_add(1, Ordering::Relaxed);
        if !crate::arch::cpu::wait_until(SLOT_WAIT_MS, || !CPU_SLOT_HELD[cpu].swap(true, Ordering::Acquire)) {
            defmt::error!("uprobe: cpu {=usize}'s XOL slot still held after {=u64} ms: taken", cpu, SLOT_WAIT_MS);
        }
    }
    let offset = cpu_slot_offset(cpu);
    let words = [original, encode_brk(BRK_UPROBE_STEP).0];
    // SAFETY: the current task's XOL page, offset inside it (the assertion by CPU_SLOTS_OFFSET).
    let slot = unsafe { user::xol_page(crate::task::current().0).add(offset as usize / 4) };
    // SAFETY: two words of this CPU's slot, kernel data; only this CPU reads or writes it now.
    let unchanged = unsafe { slot.read_volatile() == words[0] && slot.add(1).read_volatile() == words[1] };
    if !(skip_unchanged && unchanged) {
        // SAFETY: this CPU's slot of the running task's XOL page: no other CPU executes it (the
        // task runs here, IRQs masked until its step back).
        unsafe { patch::write_code_alias(slot, &words) };
    }
    USER_XOL + offset
}

/// Gives this CPU's slot back (its step ended, or faulted).
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub fn release_cpu_slot(cpu: usize) {
    CPU_SLOT_HELD[cpu].store(false, Ordering::Release);
}
