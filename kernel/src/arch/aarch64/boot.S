// Entry from the loader, EL2 -> EL1 drop, early page tables, MMU on, jump to the upper half.
// Follows ARM ARM D1.2 (exception levels), D8 (VMSAv8-64 translation), D5.2 (PAuth keys).
//
// Runs at the physical load address with the MMU off: only PC-relative addressing (adr/adrp)
// until `high_entry`. No Rust runs before the early tables map the sanitizer shadow, so even the
// instrumented first Rust function finds a shadow (every byte 0xFF, the match-all tag).
// Registers kept across the sequence: x19 = DTB physical address, x20 = entry EL, x21 = extra
// SCTLR_EL1 bits (EnIA when the CPU has PAuth).

// EL2 -> EL1 at `target`, with EL1 free of EL2 traps. Clobbers x0 and x1 only: the boot CPU and
// every secondary run it, so that all CPUs see the same EL2 configuration.
.macro drop_to_el1 target
    // EL1 is AArch64 and may use PAuth without trapping (HCR_EL2.RW, APK, API); on a CPU with
    // MTE it may access allocation tags (HCR_EL2.ATA: without it IRG reads tag 0, STG stores
    // nothing and GCR/RGSR/TFSR accesses trap to EL2).
    ldr     x0, ={hcr_el2}
    mrs     x1, id_aa64pfr1_el1
    ubfx    x1, x1, #8, #4                   // MTE [11:8]: 2 or more is full MTE
    cmp     x1, #2
    b.lo    11f
    orr     x0, x0, #{hcr_ata}
11: msr     hcr_el2, x0
    // EL1 may read the physical counter and use both timers; no virtual offset.
    mrs     x0, cnthctl_el2
    orr     x0, x0, #3
    msr     cnthctl_el2, x0
    msr     cntvoff_el2, xzr
    // No coprocessor or system register traps to EL2.
    mov     x0, #0x33ff
    msr     cptr_el2, x0
    msr     hstr_el2, xzr
    // EL1 owns every PMU counter and its own debug exceptions (TDE = 0, HPMN = PMCR_EL0.N).
    mrs     x0, pmcr_el0
    ubfx    x0, x0, #11, #5
    msr     mdcr_el2, x0
    // EL1 sees the real MIDR/MPIDR.
    mrs     x0, midr_el1
    msr     vpidr_el2, x0
    mrs     x0, mpidr_el1
    msr     vmpidr_el2, x0
    ldr     x0, ={sctlr_mmu_off}
    msr     sctlr_el1, x0
    mov     x0, #{spsr_el1h_masked}
    msr     spsr_el2, x0
    adr     x0, \target
    msr     elr_el2, x0
    eret
.endm

.section .text.boot, "ax"
.global _start
_start:
    mov     x19, x0
    mrs     x20, CurrentEL
    lsr     x20, x20, #2
    cmp     x20, #2
    b.eq    from_el2
    cmp     x20, #1
    b.eq    at_el1
    // EL3 entry (the Pi 4 loading an ELF) is not supported: park rather than run wrongly.
1:  wfe
    b       1b

from_el2:
    drop_to_el1 at_el1

at_el1:
    msr     daifset, #0xf
    ldr     x0, ={sctlr_mmu_off}
    msr     sctlr_el1, x0
    isb

    // Clear .bss (which holds the early tables) and fill the early tables.
    adrp    x0, __bss_start
    add     x0, x0, :lo12:__bss_start
    adrp    x1, __bss_end
    add     x1, x1, :lo12:__bss_end
2:  cmp     x0, x1
    b.hs    3f
    stp     xzr, xzr, [x0], #16
    b       2b
3:
    // The shared shadow page: every granule tagged 0xFF, the tag of an untagged kernel pointer.
    adrp    x0, SHADOW_MATCH_ALL_PAGE
    mov     x1, #-1
    mov     x2, #256
4:  stp     x1, x1, [x0], #16
    subs    x2, x2, #1
    b.ne    4b
    // SHADOW_L3: 512 read-only pages, all the shared page; SHADOW_L2: 512 tables, all SHADOW_L3.
    // Together they map 1 GiB of shadow VA (the shadow of 16 GiB) with one physical page.
    adrp    x0, SHADOW_L3
    adrp    x1, SHADOW_MATCH_ALL_PAGE
    ldr     x2, ={shadow_page_attrs}
    orr     x1, x1, x2
    mov     x2, #512
5:  str     x1, [x0], #8
    subs    x2, x2, #1
    b.ne    5b
    adrp    x0, SHADOW_L2
    adrp    x1, SHADOW_L3
    orr     x1, x1, #{table}
    mov     x2, #512
6:  str     x1, [x0], #8
    subs    x2, x2, #1
    b.ne    6b

    // TTBR0: identity map of the GiB holding the image, so this code survives the MMU turning on.
    // TTBR1: the same GiB and the board's device GiB at VA = PA + offset, plus the shadow of the
    // linear map and of the text alias.
    adrp    x0, EARLY_L1_TTBR0
    ldr     x1, ={ram_block}
    str     x1, [x0, #{ram_gib} * 8]
    adrp    x0, EARLY_L1_TTBR1
    str     x1, [x0, #{ram_gib} * 8]
    ldr     x1, ={device_block}
    str     x1, [x0, #{device_gib} * 8]
    adrp    x1, SHADOW_L2
    orr     x1, x1, #{table}
    str     x1, [x0, #{linear_shadow_l1} * 8]
    str     x1, [x0, #{alias_shadow_l1} * 8]

    // The tables were written with the MMU and caches off: drop any stale cache lines for them
    // before the (cacheable) table walker reads them.
    adrp    x0, __early_tables_start
    adrp    x1, __early_tables_end
7:  dc      ivac, x0
    add     x0, x0, #64
    cmp     x0, x1
    b.lo    7b
    dsb     sy

    ldr     x0, ={mair}
    msr     mair_el1, x0
    ldr     x0, ={tcr}
    mrs     x1, id_aa64mmfr0_el1
    and     x1, x1, #7
    bfi     x0, x1, #32, #3                  // TCR_EL1.IPS = ID_AA64MMFR0_EL1.PARange
    msr     tcr_el1, x0
    adrp    x0, EARLY_L1_TTBR0
    msr     ttbr0_el1, x0
    adrp    x0, EARLY_L1_TTBR1
    msr     ttbr1_el1, x0
    isb
    tlbi    vmalle1
    dsb     nsh
    isb

    // PAuth: program the instruction A key and enable it before any Rust frame exists, because a
    // function whose paciasp ran as a NOP cannot return once EnIA is set.
    mov     x21, xzr
    mrs     x0, id_aa64isar1_el1
    tst     x0, #0xff0                       // APA [7:4], API [11:8]
    b.ne    8f
    mrs     x0, S3_0_C0_C6_2                 // ID_AA64ISAR2_EL1
    tst     x0, #0xf000                      // APA3 [15:12]
    b.eq    9f
8:  mrs     x0, cntpct_el0
    ldr     x1, ={key_lo_seed}
    eor     x1, x1, x0
    ldr     x2, ={key_hi_seed}
    eor     x2, x2, x0, ror #29
    msr     S3_0_C2_C1_0, x1                 // APIAKeyLo_EL1
    msr     S3_0_C2_C1_1, x2                 // APIAKeyHi_EL1
    ldr     x21, ={sctlr_enia}
9:
    ldr     x0, ={sctlr_mmu_on}
    orr     x0, x0, x21
    msr     sctlr_el1, x0
    isb
    ldr     x0, =high_entry
    br      x0

.global high_entry
high_entry:
    // The boot task's stack, topped by its final frame marker (0, 0, kind 0: end of task) so
    // frame-pointer walks end cleanly; its shadow call stack starts empty.
    ldr     x0, =__boot_stack_top
    sub     sp, x0, #48
    stp     xzr, xzr, [sp]
    stp     xzr, xzr, [sp, #16]
    str     xzr, [sp, #32]
    ldr     x18, =__boot_scs_base
    adr     x0, exception_vectors
    msr     vbar_el1, x0
    isb
    mov     x29, sp
    mov     x30, xzr
    mov     x0, x19
    mov     x1, x20
    bl      kernel_main
10: wfe
    b       10b

// Secondary CPUs (arch/aarch64/smp.rs) enter here with the MMU and caches off, at the physical
// address: PSCI CPU_ON passes the CPU's index in x0 (its context id); a spin-table core passes
// nothing, so `secondary_spin_entry` takes the index from MPIDR_EL1.Aff0 (the Pi 4's cores 0-3).
// The boot CPU fills the CPU's block of SECONDARY_BOOT (and cleans it to PoC) before releasing
// it, one CPU at a time. Registers kept: x19 = CPU index, x21 = extra SCTLR_EL1 bits, x22 = the
// CPU's block. An index this kernel has no block for parks.
.global secondary_spin_entry
secondary_spin_entry:
    mrs     x0, mpidr_el1
    and     x0, x0, #0xff
.global secondary_entry
secondary_entry:
    mov     x19, x0
    cmp     x19, #{boot_blocks}
    b.hs    3f
    mrs     x1, CurrentEL
    lsr     x1, x1, #2
    cmp     x1, #2
    b.ne    secondary_at_el1
    drop_to_el1 secondary_at_el1

secondary_at_el1:
    msr     daifset, #0xf
    ldr     x0, ={sctlr_mmu_off}
    msr     sctlr_el1, x0
    isb
    adrp    x22, SECONDARY_BOOT
    add     x22, x22, :lo12:SECONDARY_BOOT
    add     x22, x22, x19, lsl #{boot_block_shift}
    // The boot CPU's MAIR and TCR (TTBR0 walks on again, for the identity map below), the early
    // identity map in TTBR0 (boot.S never rewrites it), the live kernel tables in TTBR1.
    ldr     x0, ={mair}
    msr     mair_el1, x0
    ldr     x0, [x22, #{boot_tcr}]
    bic     x0, x0, #{tcr_epd0}
    msr     tcr_el1, x0
    adrp    x0, EARLY_L1_TTBR0
    msr     ttbr0_el1, x0
    ldr     x0, [x22, #{boot_ttbr1}]
    msr     ttbr1_el1, x0
    isb
    tlbi    vmalle1
    dsb     nsh
    isb
    // The kernel's APIA key is the boot CPU's (return addresses signed on one CPU authenticate
    // on another after a migration); EnIA before any Rust frame exists, as on the boot CPU.
    ldr     x21, [x22, #{boot_sctlr_extra}]
    cbz     x21, 1f
    ldr     x0, [x22, #{boot_apia_lo}]
    msr     S3_0_C2_C1_0, x0                 // APIAKeyLo_EL1
    ldr     x0, [x22, #{boot_apia_hi}]
    msr     S3_0_C2_C1_1, x0                 // APIAKeyHi_EL1
1:  ldr     x0, ={sctlr_mmu_on}
    orr     x0, x0, x21
    msr     sctlr_el1, x0
    isb
    ldr     x0, =secondary_high
    br      x0

secondary_high:
    // Now in the upper half: SECONDARY_BOOT by its kernel address. This CPU's first stack gets
    // the same final frame marker as the boot task's.
    ldr     x22, =SECONDARY_BOOT
    add     x22, x22, x19, lsl #{boot_block_shift}
    ldr     x0, [x22, #{boot_stack_top}]
    sub     sp, x0, #48
    stp     xzr, xzr, [sp]
    stp     xzr, xzr, [sp, #16]
    str     xzr, [sp, #32]
    ldr     x18, [x22, #{boot_scs_base}]
    adr     x0, exception_vectors
    msr     vbar_el1, x0
    isb
    mov     x29, sp
    mov     x30, xzr
    mov     x0, x19
    bl      secondary_main
2:  wfe
    b       2b
3:  msr     daifset, #0xf
4:  wfe
    b       4b

// Switch TTBR1_EL1 to new tables. Runs from the identity map (the caller computes this code's
// physical address) so that no upper-half translation is used between the write and the TLB
// invalidation: old block and new page entries never coexist (break-before-make).
// x0 = new TTBR1 value. Clobbers nothing else; touches no memory.
.global switch_ttbr1_idmap
switch_ttbr1_idmap:
    dsb     ishst
    msr     ttbr1_el1, x0
    isb
    tlbi    vmalle1
    dsb     nsh
    isb
    ret

// The early translation tables and the sanitizer's shared shadow. The shadow tables stay in use
// for the lifetime of the kernel: every shadow VA that does not belong to RAM maps this page.
.section .bss.page_aligned, "aw", @nobits
.balign 4096
__early_tables_start:
.global EARLY_L1_TTBR0
EARLY_L1_TTBR0: .skip 4096
.global EARLY_L1_TTBR1
EARLY_L1_TTBR1: .skip 4096
.global SHADOW_L2
SHADOW_L2: .skip 4096
.global SHADOW_L3
SHADOW_L3: .skip 4096
.global SHADOW_MATCH_ALL_PAGE
SHADOW_MATCH_ALL_PAGE: .skip 4096
__early_tables_end:
