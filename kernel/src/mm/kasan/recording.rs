//! The recording scope: the one place where tests provoke sanitizer reports. Inside it every
//! report is printed (multi-shot) and none stops the kernel; the scope returns how many reports
//! its code caused and the last one. Its counting mode ([`counting`]) prints none: a fuzz that
//! provokes hundreds of thousands classifies them from what the scope returns.

use super::report::{self, Report};

/// Runs `f` multi-shot without stopping the kernel; how many reports it caused (mismatches and
/// bad frees) and the last.
pub fn scope(f: impl FnOnce()) -> (u64, Option<Report>) {
    finish(report::start_recording(), f)
}

/// As [`scope`], but the reports are counted and kept, not printed.
pub fn counting(f: impl FnOnce()) -> (u64, Option<Report>) {
    finish(report::start_counting(), f)
}

fn finish(before: u64, f: impl FnOnce()) -> (u64, Option<Report>) {
    f();
    #[cfg(feature = "mte")]
    {
        // A synchronous tag check fault resumed its context with checks suppressed (mte.rs); an
        // asynchronous one is reported at this check point.
        crate::arch::mte::resume_checks();
        super::mte::check_async(0);
    }
    report::stop_recording(before)
}
