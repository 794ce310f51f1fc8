// Exception vectors: save the interrupted context as an ExceptionFrame, call Rust, restore, eret.
// Follows ARM ARM D1.10 (exception entry) and the vector table layout of D1.10.2. Every handler
// called from here is a `trap_*` entry of the trap layer (trap/mod.rs), which sits above arch/.
//
// Stack layout on entry from EL1 with SP_EL1 (EL1h), growing down from the interrupted SP:
//   [interrupted SP - {gap}, interrupted SP)   a gap the handler never touches, so that a probe
//                                              handler can emulate a store below the interrupted
//                                              SP (`stp x29, x30, [sp, #-16]!`) without landing
//                                              on the frame (x86 Linux does this for its push)
//   [frame, frame + {frame_size})              the ExceptionFrame
// On return the context resumes on the frame's `sp`, which such an emulation may have moved:
// x0/x1 are stashed just below the resume SP (inside the gap) and reloaded after SP is switched.
// Contexts that run on SP_EL0 (EL1t, EL0) keep their SP in SP_EL0, saved and restored here.
// From EL0 the frame also holds the user's TPIDR_EL0 (the stack-overflow path uses
// that register as scratch), x18 is switched to the task's kernel shadow call stack (kept in the
// per-CPU data by the last return to EL0), the APIA key is switched between the task's and the
// kernel's where the CPU has PAuth, and the boundary marker is a final one (kind 0), so
// no unwinder follows the user's x29.
//
// The frame ends with an exception-boundary marker record (0, 0, kind = 1, elr, x29) and x29
// points at it while the handler runs, so a frame-pointer walk continues in the interrupted
// context. x18 (the shadow call stack pointer) is kept: an exception from EL1 keeps using the
// interrupted task's shadow stack. No instrumented code runs before the frame is saved.

// Reloads x2..x30 from the frame at SP (both return paths).
.macro RESTORE_X2_TO_X30
    ldp     x2, x3, [sp, #1 * 16]
    ldp     x4, x5, [sp, #2 * 16]
    ldp     x6, x7, [sp, #3 * 16]
    ldp     x8, x9, [sp, #4 * 16]
    ldp     x10, x11, [sp, #5 * 16]
    ldp     x12, x13, [sp, #6 * 16]
    ldp     x14, x15, [sp, #7 * 16]
    ldp     x16, x17, [sp, #8 * 16]
    ldp     x18, x19, [sp, #9 * 16]
    ldp     x20, x21, [sp, #10 * 16]
    ldp     x22, x23, [sp, #11 * 16]
    ldp     x24, x25, [sp, #12 * 16]
    ldp     x26, x27, [sp, #13 * 16]
    ldp     x28, x29, [sp, #14 * 16]
    ldr     x30, [sp, #15 * 16]
.endm

.macro VECTOR handler
    .balign 0x80
    sub     sp, sp, #({frame_size} + {gap})
    // Stack overflow check (stack.rs): a valid SP has bit 14 set. Swap x0 and SP to test
    // the new SP without a free register or a store.
    add     sp, sp, x0
    sub     x0, sp, x0
    tbz     x0, #{stack_bit}, stack_overflow_entry
    sub     x0, sp, x0
    sub     sp, sp, x0
    stp     x0, x1, [sp, #0 * 16]
    adrp    x1, \handler
    add     x1, x1, :lo12:\handler
    b       exception_entry
.endm

.section .text.vectors, "ax"
.balign 0x800
.global exception_vectors
exception_vectors:
    // Current EL with SP_EL0 (EL1t: the probe tests' harness runs instructions this way).
    VECTOR  trap_el1_sync
    VECTOR  call_irq_on_irq_stack
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector
    // Current EL with SP_ELx.
    VECTOR  trap_el1_sync
    VECTOR  call_irq_on_irq_stack
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector
    // Lower EL, AArch64: EL0 tasks.
    VECTOR  trap_el0_sync
    VECTOR  call_irq_on_irq_stack
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector
    // Lower EL, AArch32: never.
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector
    VECTOR  trap_unexpected_vector

// Common entry: the vector slot saved x0/x1 and put the handler's address in x1.
exception_entry:
    stp     x2, x3, [sp, #1 * 16]
    stp     x4, x5, [sp, #2 * 16]
    stp     x6, x7, [sp, #3 * 16]
    stp     x8, x9, [sp, #4 * 16]
    stp     x10, x11, [sp, #5 * 16]
    stp     x12, x13, [sp, #6 * 16]
    stp     x14, x15, [sp, #7 * 16]
    stp     x16, x17, [sp, #8 * 16]
    stp     x18, x19, [sp, #9 * 16]
    stp     x20, x21, [sp, #10 * 16]
    stp     x22, x23, [sp, #11 * 16]
    stp     x24, x25, [sp, #12 * 16]
    stp     x26, x27, [sp, #13 * 16]
    stp     x28, x29, [sp, #14 * 16]
    mrs     x2, elr_el1
    mrs     x3, spsr_el1
    stp     x2, x3, [sp, #{off_elr}]
.if {mte_checks}
    // Build variant `mte`: exception entry set PSTATE.TCO; handlers run with tag checks on (as
    // Linux's kernel_entry), and so does code a handler resumes without ERET (a user task's
    // exit returning to its kernel caller). ERET restores the context's own TCO from SPSR.
    msr     S3_3_C4_C2_7, xzr                // TCO
.endif
    // The interrupted SP: SP_EL1 above the frame and gap, or SP_EL0 (SPSR.M[0] = 0).
    add     x4, sp, #({frame_size} + {gap})
    mrs     x5, sp_el0
    tst     x3, #1
    csel    x4, x4, x5, ne
    stp     x30, x4, [sp, #15 * 16]
    mrs     x4, esr_el1
    mrs     x5, far_el1
    stp     x4, x5, [sp, #{off_esr}]
    // Boundary marker: (fp = 0, lr = 0, kind = exception, pc = elr, fp = interrupted x29); from
    // EL0 (SPSR.M[3:0] = 0) kind = 0 and the kernel's x18 and the user's TPIDR_EL0 are switched.
    mov     x5, #{marker_exception}
    tst     x3, #0xf
    b.ne    3f
    mov     x5, xzr
    mrs     x4, tpidr_el0
    str     x4, [sp, #{off_tpidr_el0}]
    mrs     x4, tpidr_el1
    ldr     x18, [x4, #{percpu_user_kernel_x18}]
    // The kernel's APIA key back (user tasks have their own), before any PACIASP runs.
    ldr     x6, [x4, #{percpu_pauth_keys}]
    cbz     x6, 3f
    ldp     x6, x7, [x4, #{percpu_kernel_apia}]
    msr     S3_0_C2_C1_0, x6                 // APIAKeyLo_EL1
    msr     S3_0_C2_C1_1, x7                 // APIAKeyHi_EL1
    isb
3:  add     x4, sp, #{off_marker}
    stp     xzr, xzr, [x4]
    stp     x5, x2, [x4, #16]
    str     x29, [x4, #32]
    mov     x29, x4
    mov     x0, sp
.if {scs_check}
    // Shadow call stack overflow (stack.rs): in an SP_EL1 context a valid x18 has bits
    // 12-14 clear. Continue on this CPU's overflow shadow stack (the stack itself is fine).
    tbz     x3, #0, 2f
    tst     x18, #{scs_mask}
    b.eq    2f
    mrs     x9, tpidr_el1
    ldr     x18, [x9, #{percpu_overflow_shadow_stack}]
    adrp    x1, trap_shadow_stack_overflow
    add     x1, x1, :lo12:trap_shadow_stack_overflow
2:
.endif
    blr     x1
    // fall through
.global exception_return
exception_return:
    ldp     x0, x1, [sp, #{off_elr}]
    msr     elr_el1, x0
    msr     spsr_el1, x1
    ldr     x0, [sp, #{off_sp}]              // the SP to resume with
    tbnz    x1, #0, 1f
    // SP_EL0 context: SP_EL1 just drops the frame. To EL0: the user's TPIDR_EL0 back, and the
    // kernel's x18 kept for the next entry from EL0.
    msr     sp_el0, x0
    tst     x1, #0xf
    b.ne    2f
    ldr     x0, [sp, #{off_tpidr_el0}]
    msr     tpidr_el0, x0
    mrs     x0, tpidr_el1
    str     x18, [x0, #{percpu_user_kernel_x18}]
    // The task's own APIA key; ERET synchronises the change.
    ldr     x1, [x0, #{percpu_pauth_keys}]
    cbz     x1, 2f
    ldp     x2, x3, [x0, #{percpu_user_apia}]
    msr     S3_0_C2_C1_0, x2                 // APIAKeyLo_EL1
    msr     S3_0_C2_C1_1, x3                 // APIAKeyHi_EL1
2:  ldp     x0, x1, [sp, #0 * 16]
    RESTORE_X2_TO_X30
    add     sp, sp, #({frame_size} + {gap})
    eret
1:  // SP_EL1 context: resume on the frame's SP. Stash x0/x1 below it (inside the gap, clear of
    // the frame as long as the SP moved down by at most gap - 16: probes::simulate checks this).
    ldp     x2, x3, [sp, #0 * 16]
    stp     x2, x3, [x0, #-16]
    RESTORE_X2_TO_X30
    mov     sp, x0
    ldp     x0, x1, [sp, #-16]
    eret
