//! Demo part 5: the function tracer on a few functions for a short window, its ring streamed.
//!
//! The traced functions are the `traced` module's: a small checksum whose calls nest, so the
//! trace shows callers (`function <-caller`). xtask prints the streamed ring like Linux's
//! `trace` file and writes it to `target/trace/` (xtask/src/trace.rs).

use crate::ftrace::tracers::FUNCTION_TRACER;
use core::hint::black_box;

const PATTERN: &str = "kernel::demo::ftrace::traced::*";

pub fn show(boot_trace: Option<&str>) {
    if crate::symbols::callsites::entries().is_empty() {
        defmt::info!(
            "demo: skipped: variant {=str} has no patchable function entries to trace (use --variant prod or full)",
            crate::build_info::VARIANT
        );
        return;
    }
    if let Some(pattern) = boot_trace {
        defmt::info!(
            "demo: skipped: the function tracer is tracing {=str} from boot (--ftrace); its ring is streamed at the end",
            pattern
        );
        return;
    }
    FUNCTION_TRACER.clear();
    let tracer = match crate::ftrace::register(&FUNCTION_TRACER.ops, PATTERN) {
        Ok(tracer) => tracer,
        Err(error) => {
            defmt::error!("demo: ftrace: cannot trace {=str}: {}", PATTERN, error);
            return;
        }
    };
    defmt::info!("demo: function tracer on {=str}", PATTERN);
    let sum = traced::checksum(black_box(b"tracelab"));
    if let Err(error) = crate::ftrace::unregister(tracer) {
        defmt::error!("demo: ftrace: cannot stop the tracer: {}", error);
        return;
    }
    defmt::info!("demo: checksum {=u64:#x}; {=u64} calls traced", sum, FUNCTION_TRACER.written());
    // Nothing else runs in the window: the boot task is the only runnable task here.
    let task = crate::bench::Label::new(format_args!("{}-{}", crate::task::current_name(), crate::task::current().0));
    FUNCTION_TRACER.stream(task.as_str());
}

mod traced {
    use core::hint::black_box;

    #[inline(never)]
    pub fn checksum(bytes: &[u8]) -> u64 {
        let mut state = seed();
        for chunk in bytes.chunks(4) {
            state = mix(state, fold(chunk));
        }
        finish(state)
    }

    #[inline(never)]
    fn seed() -> u64 {
        black_box(0xcbf2_9ce4_8422_2325)
    }

    #[inline(never)]
    fn fold(chunk: &[u8]) -> u64 {
        chunk.iter().fold(0, |word, &byte| word << 8 | u64::from(byte))
    }

    #[inline(never)]
    fn mix(state: u64, word: u64) -> u64 {
        (state ^ word).wrapping_mul(0x100_0000_01b3)
    }

    #[inline(never)]
    fn finish(state: u64) -> u64 {
        black_box(state ^ state >> 29)
    }
}
