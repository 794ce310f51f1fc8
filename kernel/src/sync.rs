//! IRQ-safe locking: an RAII interrupt mask and a spin lock that holds one while locked.
//!
//! Every piece of mutable kernel state that an interrupt handler or another CPU can reach lives
//! behind an `IrqSpinLock` (or an atomic), never behind a `static mut` and a comment: the type
//! masks IRQs for exactly as long as the data is borrowed, so a tick can never find it half
//! written, and the spin lock makes the same code correct once several CPUs run it.

use crate::arch::aarch64::cpu;
use crate::arch::percpu::{self, CPUS};
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU64, Ordering};

/// Per CPU: spins waiting for a spin lock (`IrqSpinLock`, the sanitizer heap's lock), counted
/// by their relax strategy, which runs only while another holder has the lock.
static LOCK_SPINS: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];

/// Lock spins so far on every CPU (the `cpus` bench's `lock_spins`).
pub fn lock_spins() -> u64 {
    LOCK_SPINS.iter().map(|spins| spins.load(Ordering::Relaxed)).sum()
}

/// `spin`'s relax strategy, counted in this CPU's [`LOCK_SPINS`]: an uncontended lock is
/// exactly `spin::Mutex::lock`.
pub struct CountedSpin;

impl spin::RelaxStrategy for CountedSpin {
    #[inline(always)]
    fn relax() {
        LOCK_SPINS[percpu::this_cpu_index()].fetch_add(1, Ordering::Relaxed);
        core::hint::spin_loop();
    }
}

/// IRQs and FIQs masked on this CPU from `IrqMask::new()` until the value is dropped; the
/// previous DAIF is restored then, so masks nest.
#[must_use = "interrupts are unmasked again as soon as the mask is dropped"]
pub struct IrqMask {
    daif: u64,
}

impl IrqMask {
    #[inline(always)]
    pub fn new() -> Self {
        Self { daif: cpu::mask_interrupts() }
    }
}

impl Drop for IrqMask {
    #[inline(always)]
    fn drop(&mut self) {
        cpu::restore_interrupts(self.daif);
    }
}

/// A spin lock whose guard also masks interrupts on this CPU.
pub struct IrqSpinLock<T> {
    inner: spin::mutex::Mutex<T, CountedSpin>,
}

/// Access to an `IrqSpinLock`'s data. Fields drop in order: the lock is released before
/// interrupts are unmasked, so no handler on this CPU can spin on a lock its own CPU holds.
pub struct IrqSpinLockGuard<'a, T> {
    guard: spin::mutex::MutexGuard<'a, T, CountedSpin>,
    _mask: IrqMask,
}

impl<T> IrqSpinLock<T> {
    pub const fn new(value: T) -> Self {
        Self { inner: spin::mutex::Mutex::new(value) }
    }

    /// Masks interrupts, then spins until the lock is free.
    #[inline]
    pub fn lock(&self) -> IrqSpinLockGuard<'_, T> {
        let mask = IrqMask::new();
        IrqSpinLockGuard { guard: self.inner.lock(), _mask: mask }
    }
}

impl<T> Deref for IrqSpinLockGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for IrqSpinLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A fixed set of callbacks that a lower layer runs without naming their owners (tick
/// consumers, task-lifecycle notifications). Registered at init, in order; running them reads
/// each place once and takes no lock, so it may run in IRQ context.
pub struct Hooks<F: Copy + 'static, const N: usize> {
    places: [spin::Once<F>; N],
    what: &'static str,
}

impl<F: Copy + 'static, const N: usize> Hooks<F, N> {
    /// `what` names the hook point in the panic when more than `N` register.
    pub const fn new(what: &'static str) -> Self {
        Self { places: [const { spin::Once::new() }; N], what }
    }

    /// Adds `hook` after those registered before it; panics when all `N` places are taken.
    pub fn register(&self, hook: F) {
        for place in &self.places {
            let mut taken = false;
            place.call_once(|| {
                taken = true;
                hook
            });
            if taken {
                return;
            }
        }
        panic!("{}: more than {} hooks", self.what, N);
    }

    /// The registered hooks, in registration order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = F> + '_ {
        self.places.iter().map_while(spin::Once::get).copied()
    }
}

/// `N` blocks of `SIZE` bytes of static memory, each handed out at most once, to whoever asks
/// first (a stack depot's pools). The claim is one atomic increment, so a block is never given
/// twice, from any CPU or context.
pub struct StaticBlocks<const N: usize, const SIZE: usize> {
    memory: core::cell::UnsafeCell<[[u8; SIZE]; N]>,
    claimed: core::sync::atomic::AtomicUsize,
}

// SAFETY: the memory is reached only through `claim`, which gives each block out once (an atomic
// fetch_add), so no two holders ever share a block.
unsafe impl<const N: usize, const SIZE: usize> Sync for StaticBlocks<N, SIZE> {}

impl<const N: usize, const SIZE: usize> StaticBlocks<N, SIZE> {
    pub const fn new() -> Self {
        Self { memory: core::cell::UnsafeCell::new([[0; SIZE]; N]), claimed: core::sync::atomic::AtomicUsize::new(0) }
    }

    /// The next unclaimed block, zeroed as the image loaded it; `None` once all `N` are out.
    #[expect(clippy::mut_from_ref, reason = "each block is handed out once (the atomic claim), so the &mut is unique")]
    pub fn claim(&'static self) -> Option<&'static mut [u8; SIZE]> {
        let index = self.claimed.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        if index >= N {
            return None;
        }
        // SAFETY: `index` came from the fetch_add above, so this block is handed out only here,
        // once; the memory lives in a static.
        Some(unsafe { &mut (*self.memory.get())[index] })
    }
}
