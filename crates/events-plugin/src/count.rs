//! The whole-run mode (`count=on`): every executed instruction counted on its vCPU, and the
//! machine's total at each user program's counter read (`events::count`).
//!
//! No windows, classes or cache model: a run in this mode counts a whole boot, and with
//! `vectors=ADDRESS` the exceptions taken (executions of the table's 16 entries). The count is an
//! execution callback per instruction, not an inline add: with QEMU 10.0.2, per-vCPU inline
//! adds crash a round-robin run (`-icount`) of more than one vCPU (a segfault in the generated
//! code before the guest prints anything; one vCPU, or several without `-icount`, run), and a
//! multi-CPU guest's boot is what this mode counts. The callbacks cost the emulation a helper
//! call per instruction: the allocation trace's 4-CPU boot took 117 to 196 s against about 100.
// SPDX-License-Identifier: GPL-2.0-or-later

use events::VectorEntry;
use events::count::{Mark, WholeRun, is_user_counter_read};
use qemu_plugin::{TranslationBlock, VCPUIndex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The vCPUs counted apart; any beyond share the last slot (the totals stay whole).
const VCPU_SLOTS: usize = 64;

pub struct WholeRunCount {
    /// Per vCPU, the instructions it executed.
    executed: [AtomicU64; VCPU_SLOTS],
    /// The guest kernel's vector table, if given.
    vectors: Option<u64>,
    exceptions: AtomicU64,
    marks: Mutex<Vec<Mark>>,
}

impl WholeRunCount {
    pub fn new(vectors: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            executed: std::array::from_fn(|_| AtomicU64::new(0)),
            vectors,
            exceptions: AtomicU64::new(0),
            marks: Mutex::default(),
        })
    }

    fn total(&self) -> u64 {
        self.executed.iter().map(|count| count.load(Ordering::Relaxed)).sum()
    }

    /// Whether `vaddr` is the first instruction of one of the vector table's 16 entries.
    fn vector_entry(&self, vaddr: u64) -> bool {
        self.vectors.is_some_and(|base| {
            let offset = vaddr.wrapping_sub(base);
            offset < 16 * VectorEntry::STRIDE && offset % VectorEntry::STRIDE == 0
        })
    }

    fn executed(&self, vcpu: VCPUIndex) {
        self.executed[(vcpu as usize).min(VCPU_SLOTS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// A user counter read on `vcpu` at `pc`: the total before the read counts itself.
    fn mark(&self, vcpu: VCPUIndex, pc: u64) {
        let instructions = self.total();
        let mut marks = self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let exceptions = self.exceptions.load(Ordering::Relaxed);
        marks.push(Mark { cpu: vcpu, pc, instructions, exceptions });
    }

    /// Every instruction of `tb` gets its count; a user counter read first gets its mark.
    pub fn translate(self: &Arc<Self>, tb: TranslationBlock) {
        for instruction in tb.instructions() {
            let vaddr = instruction.vaddr();
            let word = match instruction.data().as_slice() {
                [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
                _ => 0,
            };
            // Registered first: the mark sees the total without its own read.
            if is_user_counter_read(word, vaddr) {
                let counter = self.clone();
                instruction.register_execute_callback(move |vcpu| counter.mark(vcpu, vaddr));
            }
            if self.vector_entry(vaddr) {
                let counter = self.clone();
                instruction.register_execute_callback(move |_| {
                    counter.exceptions.fetch_add(1, Ordering::Relaxed);
                });
            }
            let counter = self.clone();
            instruction.register_execute_callback(move |vcpu| counter.executed(vcpu));
        }
    }

    /// The run's lines, marks first and the end line last, each ending in a newline.
    pub fn text(&self) -> String {
        let marks = self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let run = WholeRun {
            instructions: self.total(),
            exceptions: self.exceptions.load(Ordering::Relaxed),
            vcpus: self.executed.iter().filter(|count| count.load(Ordering::Relaxed) > 0).count() as u32,
            marks,
        };
        let mut text = String::new();
        for mark in &run.marks {
            let _ = mark.write_line(&mut text);
            text.push('\n');
        }
        let _ = run.write_end(&mut text);
        text.push('\n');
        text
    }
}
