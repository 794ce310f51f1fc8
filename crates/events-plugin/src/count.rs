//! The whole-run mode (`count=on`): one inline add per executed instruction into a per-vCPU
//! counter, and the machine's total at each user program's counter read (`events::count`).
//!
//! No windows, classes or cache model: a run in this mode counts a whole boot, and costs the
//! emulation one add per instruction and a callback per user counter read.
// SPDX-License-Identifier: GPL-2.0-or-later

use events::count::{Mark, WholeRun, is_user_counter_read};
use qemu_plugin::sys::{qemu_plugin_op, qemu_plugin_scoreboard, qemu_plugin_u64};
use qemu_plugin::{TranslationBlock, VCPUIndex};
use std::sync::{Arc, Mutex};

pub struct WholeRunCount {
    /// `qemu_plugin_scoreboard *` of one u64 per vCPU, as an address so that closures are `Send`.
    scoreboard: usize,
    marks: Mutex<Vec<Mark>>,
}

impl WholeRunCount {
    pub fn new() -> Arc<Self> {
        // SAFETY: QEMU allocates one zeroed u64 per vCPU and grows the scoreboard as vCPUs
        // appear.
        let scoreboard = unsafe { qemu_plugin::sys::qemu_plugin_scoreboard_new(8) };
        Arc::new(Self { scoreboard: scoreboard as usize, marks: Mutex::default() })
    }

    fn entry(&self) -> qemu_plugin_u64 {
        qemu_plugin_u64 { score: self.scoreboard as *mut qemu_plugin_scoreboard, offset: 0 }
    }

    /// A user counter read on `vcpu` at `pc`: the total before the read counts itself.
    fn mark(&self, vcpu: VCPUIndex, pc: u64) {
        let instructions = qemu_plugin::qemu_plugin_scoreboard_sum(self.entry());
        let mut marks = self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        marks.push(Mark { cpu: vcpu, pc, instructions });
    }

    /// Every instruction of `tb` gets its add; a user counter read first gets its mark.
    pub fn translate(self: &Arc<Self>, tb: TranslationBlock) {
        for instruction in tb.instructions() {
            let vaddr = instruction.vaddr();
            let word = match instruction.data().as_slice() {
                [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
                _ => 0,
            };
            // Registered before the add: the mark sees the total without its own read.
            if is_user_counter_read(word, vaddr) {
                let counter = self.clone();
                instruction.register_execute_callback(move |vcpu| counter.mark(vcpu, vaddr));
            }
            qemu_plugin::qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(
                instruction.clone(),
                qemu_plugin_op::QEMU_PLUGIN_INLINE_ADD_U64,
                self.entry(),
                1,
            );
        }
    }

    /// The run's lines, marks first and the end line last, each ending in a newline.
    pub fn text(&self) -> String {
        let vcpus = qemu_plugin::qemu_plugin_num_vcpus().unwrap_or(0).max(0) as u32;
        let marks = self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let run = WholeRun {
            instructions: qemu_plugin::qemu_plugin_scoreboard_sum(self.entry()),
            vcpus: (0..vcpus).filter(|&vcpu| qemu_plugin::qemu_plugin_u64_get(self.entry(), vcpu) > 0).count() as u32,
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
