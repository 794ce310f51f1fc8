//! EL0 tasks: user address spaces in TTBR0, the way into EL0, syscalls and user faults.
//!
//! A user task is a kernel task (its own kernel stack and shadow call stack) whose entry
//! function builds an exception frame for EL0 and returns through `exception_return`. From then
//! on every exception from EL0 saves the user context on that kernel stack (vectors.S: x0-x30,
//! SP_EL0, PC, PSTATE and TPIDR_EL0; x18 becomes the kernel's shadow-call-stack pointer again).
//!
//! Address space (TTBR0, 39-bit VA, one L1, one L2 and one L3 table per task slot, ASID = slot
//! + 1, so a switch only writes TTBR0; every user page is non-global):
//!
//! | VA                                   | what                       | EL0 / EL1 access        |
//! |--------------------------------------|----------------------------|-------------------------|
//! | `USER_TEXT` ..                       | `.text.user` of the image  | read + execute / PXN    |
//! | `USER_XOL` (one page)                | per-task uprobe XOL page   | read + execute / PXN    |
//! | `USER_STACK_TOP - 8 KiB` .. top      | the task's stack           | read-write, XN          |
//!
//! Kernel pages have AP[1] = 0 (no EL0 access) and UXN. Where the CPU has FEAT_PAN,
//! PSTATE.PAN is set and SCTLR_EL1.SPAN cleared, so EL1 cannot touch user pages by accident
//! (the uprobe simulator reaches user memory with LDTR/STTR, which act as EL0 accesses). Kernel
//! tasks run with TTBR0 on an empty table (EPD0 is cleared once, by `init`).
//!
//! PAC keys: where the CPU has PAuth, every user task gets its own APIA key at spawn. The
//! exception vectors load it on every return to EL0 and restore the kernel's key on every entry
//! from EL0 (two MSRs each way, plus an ISB on entry before the kernel's next PACIASP). The
//! other keys (IB, DA, DB, GA) are not used by the kernel and are not switched.
//!
//! Syscalls: `SVC #0`, number in x8, arguments in x0.., result in x0 (`Syscall`). The trap table
//! (trap/mod.rs) sends them here; an abort, alignment fault, undefined instruction or PAC failure
//! from EL0 that no uprobe claims is a user fault: it is reported (ESR, FAR, user PC) and kills
//! the task, never the kernel.

use core::sync::atomic::{AtomicBool, Ordering};

use super::stacks::TASK_SLOTS;
use super::{CpuMask, SpawnError, TaskId};
use crate::arch::exception::{Esr, ExceptionFrame, STACK_GAP};
use crate::arch::mmu::pa_of;
use crate::sync::{Hooks, IrqMask};

/// Where `.text.user` is mapped in every user space.
pub const USER_TEXT: u64 = 0x40_0000;
/// The per-task out-of-line page (uprobes).
pub const USER_XOL: u64 = 0x50_0000;
/// The initial user SP; the stack is the `STACK_PAGES` pages below.
pub const USER_STACK_TOP: u64 = 0x60_0000;
pub const STACK_PAGES: usize = 2;
pub const USER_STACK_BASE: u64 = USER_STACK_TOP - STACK_PAGES as u64 * PAGE;
const PAGE: u64 = 4096;

/// `SVC` immediates from EL0: 0 is a syscall; the uprobe detour trampolines use their own.
pub const SVC_SYSCALL: u16 = 0;

/// Syscall numbers (x8).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum Syscall {
    /// `exit(code)`: ends the task; `exit_code` returns `code`.
    Exit = 0,
    /// `yield()`: lets the other runnable tasks run.
    Yield = 1,
    /// `counter() -> CNTVCT_EL0`.
    Counter = 2,
}

/// Result of an unknown syscall number (Linux's -ENOSYS).
pub const ENOSYS: u64 = -38i64 as u64;

/// Stage 1 page descriptor bits (ARM ARM D8.3): page, Normal memory (MAIR index 1), inner
/// shareable, accessed, non-global, EL0-accessible.
const USER_PAGE: u64 = 0b11 | (1 << 2) | (3 << 8) | (1 << 10) | (1 << 11) | (1 << 6);
const AP_READ_ONLY: u64 = 1 << 7;
const PXN: u64 = 1 << 53;
const UXN: u64 = 1 << 54;
const USER_CODE: u64 = USER_PAGE | AP_READ_ONLY | PXN;
const USER_DATA: u64 = USER_PAGE | PXN | UXN;
const TABLE: u64 = 0b11;

#[repr(C, align(4096))]
pub struct Page(pub [u64; 512]);

/// One task slot's user address space: its tables, XOL page and stack.
#[repr(C, align(4096))]
struct Space {
    l1: Page,
    l2: Page,
    l3: Page,
    xol: Page,
    stack: [Page; STACK_PAGES],
}

const EMPTY_PAGE: Page = Page([0; 512]);

/// A `static mut`, not a lock: the page-table walker reads these pages without any lock, and the
/// uprobes write a slot's XOL page through a raw pointer; a slot is written only while its task
/// is not running (`spawn`) or with IRQs masked.
static mut SPACES: [Space; TASK_SLOTS] = [const {
    Space { l1: EMPTY_PAGE, l2: EMPTY_PAGE, l3: EMPTY_PAGE, xol: EMPTY_PAGE, stack: [EMPTY_PAGE; STACK_PAGES] }
}; TASK_SLOTS];

/// TTBR0's table while a kernel task runs: nothing mapped.
static EMPTY_L1: Page = EMPTY_PAGE;

/// A user fault as the task saw it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, defmt::Format)]
pub struct UserFault {
    pub esr: u64,
    pub far: u64,
    pub pc: u64,
}

/// The EL0 half of a task (a field of the scheduler's task, under its rules: IRQs masked).
#[derive(Clone, Copy)]
pub(super) struct UserTask {
    active: bool,
    entry: u64,
    arguments: [u64; 3],
    spsr: u64,
    exit_code: Option<u64>,
    fault: Option<UserFault>,
    apia: [u64; 2],
}

impl UserTask {
    pub(super) const NONE: Self =
        Self { active: false, entry: 0, arguments: [0; 3], spsr: 0, exit_code: None, fault: None, apia: [0; 2] };
}

/// Task slot `slot`'s user state. Callers hold IRQs masked (exception handlers, the scheduler,
/// `spawn`) or read the slot of an ended task, as for every scheduler field.
fn user(slot: usize) -> &'static mut UserTask {
    super::user_state(slot)
}

fn space(slot: usize) -> &'static mut Space {
    // SAFETY: as for `users`: a space is written while its task is not running (spawn) or by
    // registration code with IRQs masked; the hardware only reads it.
    unsafe { &mut *core::ptr::addr_of_mut!(SPACES[slot]) }
}

static INITIALISED: AtomicBool = AtomicBool::new(false);
static HAS_PAN: AtomicBool = AtomicBool::new(false);

/// ID_AA64MMFR1_EL1.PAN != 0.
fn cpu_has_pan() -> bool {
    let mmfr1: u64;
    // SAFETY: reads an ID register.
    unsafe { core::arch::asm!("mrs {}, id_aa64mmfr1_el1", out(reg) mmfr1, options(nomem, nostack, preserves_flags)) };
    (mmfr1 >> 20) & 0xf != 0
}

/// Whether PSTATE.PAN is on (FEAT_PAN CPUs, after `init`).
pub fn pan_enabled() -> bool {
    HAS_PAN.load(Ordering::Relaxed)
}

/// Turns on TTBR0 walks (on an empty table), PAN where the CPU has it, and EL0 access to the
/// virtual counter and the PMU cycle counter (the user bench loops read them), on this CPU; the
/// secondaries run `init_this_cpu` as they come up (after this). Once.
pub fn init() {
    if INITIALISED.swap(true, Ordering::SeqCst) {
        return;
    }
    HAS_PAN.store(cpu_has_pan(), Ordering::Relaxed);
    init_this_cpu();
}

/// `init`'s per-CPU half: this CPU's copy of the kernel's APIA key (vectors.S switches keys on
/// every entry from and return to EL0), TTBR0 walks on an empty table, EL0 counter access, PAN.
pub fn init_this_cpu() {
    assert!(INITIALISED.load(Ordering::Relaxed), "task::user::init first");
    if crate::arch::cpu::PointerAuth::detect() != crate::arch::cpu::PointerAuth::None {
        let (low, high): (u64, u64);
        // SAFETY: reads the APIA key registers, which exist on this CPU (PAuth detected; boot.S
        // loaded the kernel's key there).
        unsafe {
            core::arch::asm!("mrs {l}, S3_0_C2_C1_0", "mrs {h}, S3_0_C2_C1_1", l = out(reg) low, h = out(reg) high,
                options(nomem, nostack, preserves_flags))
        };
        let cpu = super::stacks::this_cpu();
        cpu.kernel_apia[0].store(low, Ordering::Relaxed);
        cpu.kernel_apia[1].store(high, Ordering::Relaxed);
        cpu.pauth_keys.store(1, Ordering::Relaxed);
    }
    let has_pan = HAS_PAN.load(Ordering::Relaxed);
    let empty = pa_of(core::ptr::addr_of!(EMPTY_L1) as u64);
    // SAFETY: TTBR0 gets a valid (empty) table before EPD0 lets the walker use it; the TLB is
    // flushed after. CNTKCTL_EL1.EL0VCTEN (bit 1) and PMUSERENR_EL0.EN|CR (bits 0, 2) only grant
    // EL0 counter reads. Touches no memory the compiler knows of.
    unsafe {
        core::arch::asm!(
            "msr ttbr0_el1, {empty}",
            "isb",
            "mrs {tcr}, tcr_el1",
            "bic {tcr}, {tcr}, #(1 << 7)",
            "msr tcr_el1, {tcr}",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            "mrs {tcr}, cntkctl_el1",
            "orr {tcr}, {tcr}, #2",
            "msr cntkctl_el1, {tcr}",
            "mov {tcr}, #5",
            "msr pmuserenr_el0, {tcr}",
            "isb",
            empty = in(reg) empty,
            tcr = out(reg) _,
            options(nostack, preserves_flags),
        )
    };
    if has_pan {
        // SAFETY: clears SCTLR_EL1.SPAN (bit 23: exceptions to EL1 then set PSTATE.PAN) and sets
        // PSTATE.PAN (`msr pan, #1`, encoded for assemblers without FEAT_PAN). Nothing in the
        // kernel accesses user pages with ordinary loads or stores.
        unsafe {
            core::arch::asm!(
                "mrs {s}, sctlr_el1",
                "bic {s}, {s}, #(1 << 23)",
                "msr sctlr_el1, {s}",
                ".inst 0xd500419f",
                "isb",
                s = out(reg) _,
                options(nostack, preserves_flags),
            )
        };
    }
}

unsafe extern "C" {
    static __user_text_start: u8;
    static __user_text_end: u8;
    fn enter_user(frame_words: *const u64) -> !;
}

/// Kernel address of the user text mapped at `USER_TEXT`, and its length.
pub fn user_text() -> (u64, u64) {
    // SAFETY: only the addresses of the linker symbols are taken.
    let (start, end) = unsafe { (&__user_text_start as *const u8 as u64, &__user_text_end as *const u8 as u64) };
    (start, end - start)
}

/// The user VA of a `.text.user` symbol.
pub fn user_address(kernel_address: u64) -> u64 {
    let (start, length) = user_text();
    assert!((start..start + length).contains(&kernel_address), "not a .text.user address");
    USER_TEXT + (kernel_address - start)
}

/// The kernel (linear map) address of user text at `user_address`, if it is user text.
pub fn kernel_text_address(user_address: u64) -> Option<u64> {
    let (start, length) = user_text();
    (USER_TEXT..USER_TEXT + length).contains(&user_address).then(|| start + (user_address - USER_TEXT))
}

/// The kernel address of slot `slot`'s XOL page (written by uprobes).
pub fn xol_page(slot: usize) -> *mut u32 {
    core::ptr::addr_of_mut!(space(slot).xol).cast()
}

/// How a user task starts.
#[derive(Clone, Copy)]
pub struct Options {
    /// Run EL0 with IRQs masked (benches: no tick lands in a measured loop).
    pub irqs_masked: bool,
    /// Leave the lowest stack page unmapped (the stack-fault tests).
    pub unmap_lowest_stack_page: bool,
}

impl Options {
    pub const DEFAULT: Self = Self { irqs_masked: false, unmap_lowest_stack_page: false };
}

/// What runs when an EL0 task's address space is built, before it first runs, IRQs masked
/// (uprobes write the new space's XOL page).
static USER_SPAWN_HOOKS: Hooks<fn(usize), 2> = Hooks::new("user task spawn hooks");

/// Adds `hook(slot index)` to what every EL0 spawn runs. At init.
pub fn on_spawn(hook: fn(usize)) {
    USER_SPAWN_HOOKS.register(hook);
}

/// Starts an EL0 task at user text address `entry` with x0..x2 = `arguments`, runnable at the
/// next scheduling point.
pub fn spawn(name: &'static str, entry: u64, arguments: [u64; 3], options: Options) -> Result<TaskId, SpawnError> {
    assert!(INITIALISED.load(Ordering::Relaxed), "task::user::init first");
    assert!(kernel_text_address(entry).is_some(), "user entry must be user text");
    let _masked = IrqMask::new();
    // Starts on this CPU (no other CPU may pick it before its space is built), with IRQs
    // masked until it enters EL0 when the options say so.
    let daif = if options.irqs_masked { 0x3c0 } else { 0 };
    let id = super::spawn_with(CpuMask::one(super::this_cpu()), name, user_task_main, 0, daif)?;
    build_space(id.0, options);
    for hook in USER_SPAWN_HOOKS.iter() {
        hook(id.0);
    }
    let spsr = if options.irqs_masked { 0x3c0 } else { 0 };
    *user(id.0) = UserTask { active: true, entry, arguments, spsr, exit_code: None, fault: None, apia: new_key(id.0) };
    Ok(id)
}

/// A fresh APIA key: the virtual count and the slot, mixed (splitmix64).
fn new_key(slot: usize) -> [u64; 2] {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let seed = crate::arch::counters::virtual_count() ^ ((slot as u64) << 56);
    [mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)), mix(seed.wrapping_add(0x3c6e_f372_fe94_f82a))]
}

fn asid(slot: usize) -> u64 {
    slot as u64 + 1
}

fn build_space(slot: usize, options: Options) {
    let space = space(slot);
    space.l1.0 = [0; 512];
    space.l2.0 = [0; 512];
    space.l3.0 = [0; 512];
    for page in &mut space.stack {
        page.0 = [0; 512];
    }
    space.l1.0[0] = pa_of(core::ptr::addr_of!(space.l2) as u64) | TABLE;
    space.l2.0[(USER_TEXT >> 21) as usize & 511] = pa_of(core::ptr::addr_of!(space.l3) as u64) | TABLE;
    let l3_index = |va: u64| ((va >> 12) & 511) as usize;
    let (text, length) = user_text();
    const _: () = assert!(USER_TEXT >> 21 == (USER_STACK_TOP - 1) >> 21, "one L3 table");
    for offset in (0..length).step_by(PAGE as usize) {
        space.l3.0[l3_index(USER_TEXT + offset)] = pa_of(text + offset) | USER_CODE;
    }
    space.l3.0[l3_index(USER_XOL)] = pa_of(core::ptr::addr_of!(space.xol) as u64) | USER_CODE;
    for (index, page) in space.stack.iter().enumerate() {
        if index == 0 && options.unmap_lowest_stack_page {
            continue;
        }
        space.l3.0[l3_index(USER_STACK_BASE + index as u64 * PAGE)] = pa_of(page as *const Page as u64) | USER_DATA;
    }
    // Publishes the tables and drops whatever an earlier space of this ASID left in the TLB of
    // every CPU (the slot's last task may have run on another one); its task has not run yet.
    crate::arch::mmu::invalidate_asid(asid(slot));
}

/// Points TTBR0 at the address space of task slot `next` (called by the scheduler, IRQs masked).
pub(super) fn switch_address_space(next: usize) {
    if !INITIALISED.load(Ordering::Relaxed) {
        return;
    }
    let user = user(next);
    if user.active {
        let cpu = super::stacks::this_cpu();
        cpu.user_apia[0].store(user.apia[0], Ordering::Relaxed);
        cpu.user_apia[1].store(user.apia[1], Ordering::Relaxed);
    }
    let ttbr0 = if user.active {
        pa_of(core::ptr::addr_of!(space(next).l1) as u64) | asid(next) << 48
    } else {
        pa_of(core::ptr::addr_of!(EMPTY_L1) as u64)
    };
    // SAFETY: the table is a complete user space (or empty); kernel code never runs from TTBR0.
    unsafe { core::arch::asm!("msr ttbr0_el1, {}", "isb", in(reg) ttbr0, options(nostack, preserves_flags)) };
}

/// The kernel half of a user task: enters EL0 and never comes back here (exit and faults end
/// the task from the exception handler).
extern "C" fn user_task_main(_: u64) {
    let slot = super::current().0;
    let user = {
        let _masked = IrqMask::new();
        *user(slot)
    };
    // The frame `exception_return` reloads: x0-x30, sp, elr, spsr (see ExceptionFrame).
    let mut words = [0u64; 34];
    words[..3].copy_from_slice(&user.arguments);
    words[31] = USER_STACK_TOP;
    words[32] = user.entry;
    words[33] = user.spsr;
    // SAFETY: `words` is the x/sp/elr/spsr prefix of an ExceptionFrame; enter_user copies it
    // onto this task's kernel stack and returns to EL0 through the normal exception return.
    unsafe { enter_user(words.as_ptr()) }
}

core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
// enter_user(words): x0 = 34 words (x0-x30, sp, elr, spsr). Builds an exception frame where an
// entry from EL0 will put the next one (below this SP by frame + gap) and returns through it.
    .global enter_user
enter_user:
    msr     daifset, #0xf
    sub     sp, sp, #({frame_size} + {gap})
    mov     x1, sp
    mov     x2, #0
1:  ldr     x3, [x0, x2, lsl #3]
    str     x3, [x1, x2, lsl #3]
    add     x2, x2, #1
    cmp     x2, #34
    b.ne    1b
    str     xzr, [sp, #{off_tpidr_el0}]
    b       exception_return
"#,
    frame_size = const core::mem::size_of::<ExceptionFrame>(),
    gap = const STACK_GAP,
    off_tpidr_el0 = const core::mem::offset_of!(ExceptionFrame, tpidr_el0),
);

/// How an ended user task ended: its `exit` code, or the fault that killed it.
pub fn exit_code(id: TaskId) -> Option<u64> {
    let _masked = IrqMask::new();
    user(id.0).exit_code
}

pub fn fault(id: TaskId) -> Option<UserFault> {
    let _masked = IrqMask::new();
    user(id.0).fault
}

/// Runs `entry(arguments)` at EL0 to its end and returns its exit code, or the fault.
pub fn run(entry: u64, arguments: [u64; 3], options: Options) -> Result<u64, UserFault> {
    run_on(super::this_cpu(), entry, arguments, options)
}

/// `run` in a task pinned to CPU `cpu`.
pub fn run_on(cpu: usize, entry: u64, arguments: [u64; 3], options: Options) -> Result<u64, UserFault> {
    let id = {
        // Masked from spawn to the move, so the task never starts on this CPU.
        let _masked = IrqMask::new();
        let id = spawn("user", entry, arguments, options).expect("a free task slot");
        super::set_affinity(id, CpuMask::one(cpu));
        id
    };
    super::join(id);
    match (exit_code(id), fault(id)) {
        (Some(code), _) => Ok(code),
        (None, Some(fault)) => Err(fault),
        (None, None) => panic!("user task ended without exit or fault"),
    }
}

/// `SVC #SVC_SYSCALL` from EL0 (the trap table), IRQs masked.
#[unsafe(link_section = ".text.noprobe")]
pub fn syscall(frame: &mut ExceptionFrame) {
    const EXIT: u64 = Syscall::Exit as u64;
    const YIELD: u64 = Syscall::Yield as u64;
    const COUNTER: u64 = Syscall::Counter as u64;
    match frame.x[8] {
        EXIT => {
            let slot = super::current().0;
            user(slot).exit_code = Some(frame.x[0]);
            end_user_task(slot);
            super::task_exit_current()
        }
        YIELD => {
            super::schedule();
            frame.x[0] = 0;
        }
        COUNTER => frame.x[0] = crate::arch::counters::virtual_count(),
        _ => frame.x[0] = ENOSYS,
    }
}

fn end_user_task(slot: usize) {
    user(slot).active = false;
    switch_address_space(slot);
}

/// Reports a user fault and kills the task (never returns). Also used by uprobes for a fault
/// that a simulated instruction raised at the probed address.
#[unsafe(link_section = ".text.noprobe")]
pub fn kill_with_fault(fault: UserFault) -> ! {
    let class = Esr(fault.esr).class();
    defmt::error!(
        "user fault in task {=str}: {} (ESR {=u64:#x}), FAR {=u64:#x}, user PC {=u64:#x}: task killed",
        super::current_name(),
        class,
        fault.esr,
        fault.far,
        fault.pc
    );
    let slot = super::current().0;
    user(slot).fault = Some(fault);
    end_user_task(slot);
    super::kill_current(super::KillReason::UserFault)
}

// Unprivileged accesses to user memory for the uprobe simulator (LDTR/STTR: EL0 permissions,
// not blocked by PAN). A fault in one of the marked instructions resumes after it with the ESR in
// the result register (`fixup_user_access`), so the simulator sees exactly the access the user's
// instruction would have made fail.
core::arch::global_asm!(
    r#"
    .section .text.noprobe, "ax"
// user_load_u64(address) -> x0 = value, x1 = 0 or the ESR of the fault.
    .global user_load_u64
user_load_u64:
    mov     x1, xzr
user_load_u64_access:
    ldtr    x0, [x0]
    ret
// user_load_u32(address) -> x0 = value, x1 = 0 or ESR.
    .global user_load_u32
user_load_u32:
    mov     x1, xzr
user_load_u32_access:
    ldtr    w0, [x0]
    ret
// user_store_pair(address, first, second) -> x0 = 0 or ESR.
    .global user_store_pair
user_store_pair:
    mov     x3, x0
    mov     x0, xzr
user_store_pair_access:
    sttr    x1, [x3]
user_store_pair_access2:
    sttr    x2, [x3, #8]
user_store_pair_done:
    ret
    .global user_access_fixups
    .balign 8
user_access_fixups:
    .quad user_load_u64_access, user_load_u64_access + 4, 1
    .quad user_load_u32_access, user_load_u32_access + 4, 1
    .quad user_store_pair_access, user_store_pair_done, 0
    .quad user_store_pair_access2, user_store_pair_done, 0
"#
);

unsafe extern "C" {
    static user_access_fixups: [[u64; 3]; 4];
}

/// A data abort at EL1: if it is one of the user accessors above, resume after the access with
/// the ESR in the accessor's result register and return true.
#[unsafe(link_section = ".text.noprobe")]
pub fn fixup_user_access(frame: &mut ExceptionFrame) -> bool {
    // SAFETY: a read-only table defined above.
    let fixups = unsafe { &user_access_fixups };
    for &[access, resume, register] in fixups {
        if frame.elr == access {
            frame.x[register as usize] = frame.esr;
            frame.elr = resume;
            return true;
        }
    }
    false
}

/// ESR of a user data abort as EL0 would have taken it, from the one an unprivileged access at
/// EL1 took: EC "data abort from a lower EL", IL, and WnR/DFSC/S1PTW/CM/EA/FnV (ISS[10:0]);
/// ISV is clear, as for the pair instructions that are simulated.
pub fn lower_el_data_abort(esr: u64) -> u64 {
    Esr(esr).as_lower_el_data_abort().0
}

/// What the user load accessors return in x0/x1.
#[repr(C)]
struct Loaded {
    value: u64,
    esr: u64,
}

unsafe extern "C" {
    fn user_load_u64(address: u64) -> Loaded;
    fn user_load_u32(address: u64) -> Loaded;
    fn user_store_pair(address: u64, first: u64, second: u64) -> u64;
}

/// Reads user memory as EL0 would: the value, or the ESR of the fault.
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub fn load_u64(address: u64) -> Result<u64, u64> {
    // SAFETY: an unprivileged load whose fault is caught (fixup_user_access).
    let Loaded { value, esr } = unsafe { user_load_u64(address) };
    if esr == 0 { Ok(value) } else { Err(esr) }
}

#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub fn load_u32(address: u64) -> Result<u32, u64> {
    // SAFETY: as above.
    let Loaded { value, esr } = unsafe { user_load_u32(address) };
    if esr == 0 { Ok(value as u32) } else { Err(esr) }
}

/// Writes two doublewords as EL0 would (two STTR: there is no unprivileged pair store).
#[unsafe(link_section = ".text.noprobe")]
#[inline(always)]
pub fn store_pair(address: u64, values: [u64; 2]) -> Result<(), u64> {
    // SAFETY: unprivileged stores whose faults are caught (fixup_user_access).
    let esr = unsafe { user_store_pair(address, values[0], values[1]) };
    if esr == 0 { Ok(()) } else { Err(esr) }
}
