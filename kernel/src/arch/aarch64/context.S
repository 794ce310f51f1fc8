// Task switch, IRQs on the per-CPU IRQ stack, and the overflow paths (the Rust halves are the
// trap layer's `trap_*` entries).
//
// The SP and x18 (shadow call stack) of a context always change together with all of DAIF
// masked: an exception between the two steps would run on one task's stack with another's
// shadow stack (the 2025 Linux bug). Exception entry masks DAIF itself; switch_to masks it.

.section .text.noprobe, "ax"

// switch_to(prev: *mut Context, next: *const Context): saves the callee-saved registers, LR, SP,
// x18 and DAIF of the running task in prev and resumes next where it last called switch_to (or
// at the first instruction its creator put in the context's LR). Context layout: x19..x28, x29,
// x30, sp, x18, daif (task/mod.rs `Context`).
// CFI as a leaf (the SFrame table's rows): CFA = SP, the return address in x30. Only its first
// and last instructions run unmasked, and at both SP, x29 and x30 belong to one task.
.global switch_to
switch_to:
    .cfi_startproc
    mrs     x9, daif
    msr     daifset, #0xf
    stp     x19, x20, [x0, #0]
    stp     x21, x22, [x0, #16]
    stp     x23, x24, [x0, #32]
    stp     x25, x26, [x0, #48]
    stp     x27, x28, [x0, #64]
    stp     x29, x30, [x0, #80]
    mov     x10, sp
    stp     x10, x18, [x0, #96]
    str     x9, [x0, #112]
    ldp     x19, x20, [x1, #0]
    ldp     x21, x22, [x1, #16]
    ldp     x23, x24, [x1, #32]
    ldp     x25, x26, [x1, #48]
    ldp     x27, x28, [x1, #64]
    ldp     x29, x30, [x1, #80]
    ldp     x10, x18, [x1, #96]
    mov     sp, x10
    ldr     x9, [x1, #112]
    msr     daif, x9
    ret
    .cfi_endproc

// IRQ handler called by exception_entry (x0 = frame on the interrupted stack, x29 = the frame's
// boundary marker): runs trap_irq on this CPU's IRQ stack and IRQ shadow stack, then, back on
// the interrupted stack, trap_irq_exit (which may switch tasks).
.global call_irq_on_irq_stack
call_irq_on_irq_stack:
    mov     x22, x30
    mov     x23, x0
    mrs     x19, tpidr_el1
    str     x0, [x19, #{percpu_irq_frame}]
    mov     x20, sp
    mov     x21, x18
    ldr     x9, [x19, #{percpu_irq_stack_top}]
    mov     sp, x9
    ldr     x18, [x19, #{percpu_irq_shadow_stack}]
    bl      trap_irq
    mov     sp, x20
    mov     x18, x21
    str     xzr, [x19, #{percpu_irq_frame}]
    mov     x0, x23
    bl      trap_irq_exit
    mov     x30, x22
    ret

// Stack overflow, from the vector (see vectors.S): x0 = the SP that did not fit (frame base),
// SP = that value + the original x0. Move to this CPU's overflow stack without touching memory
// of the overflowed one, then save the frame there as usual.
.global stack_overflow_entry
stack_overflow_entry:
    msr     tpidr_el0, x0
    sub     x0, sp, x0
    msr     tpidrro_el0, x0
    mrs     x0, tpidr_el1
    ldr     x0, [x0, #{percpu_overflow_stack_top}]
    mov     sp, x0
    sub     sp, sp, #({frame_size} + {gap})
    mrs     x0, tpidrro_el0
    stp     x0, x1, [sp, #0]
    adrp    x1, stack_overflow_call
    add     x1, x1, :lo12:stack_overflow_call
    b       exception_entry

stack_overflow_call:
    mrs     x9, tpidr_el1
    ldr     x18, [x9, #{percpu_overflow_shadow_stack}]
    b       trap_stack_overflow
