//! The recording scope: the one place where tests provoke sanitizer reports. Inside it every
//! report is printed (multi-shot) and none stops the kernel; the scope returns how many reports
//! its code caused and the last one.

use super::report::{self, Report};

/// Runs `f` multi-shot without stopping the kernel; how many reports it caused (mismatches and
/// bad frees) and the last.
pub fn scope(f: impl FnOnce()) -> (u64, Option<Report>) {
    let before = report::start_recording();
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
