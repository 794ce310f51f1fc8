#!/usr/bin/env python3
"""Checks the detour relocator against an independent emulator (Unicorn, QEMU's CPU core).

For every form the relocator accepts, `examples/relocator_cases.rs` draws instruction words,
probed addresses and trampoline positions and prints the crate's real relocated sequences.
This script runs, from random register and flag states, the original instruction at its
address and the relocated sequence at its trampoline's address, and compares the next PC,
x0..x30, SP, NZCV, PSTATE, the bytes written and the loads made outside the trampoline.

    python3 crates/probes/tools/check_relocator.py            # the whole check
    python3 crates/probes/tools/check_relocator.py --sample   # the short sample
    python3 crates/probes/tools/check_relocator.py --bugs     # also each deliberate bug

Needs `pip install unicorn` (2.x). Exits 0 when there is no mismatch (and, with --bugs, when
every deliberate bug produces mismatches), 1 otherwise, 2 on bad usage or a missing module.

Known differences are counted apart, not as mismatches: BTYPE after a relocated BLR (it
becomes `BR`, BTYPE 01 instead of 10; latent without BTI, see docs/design/probes.md).
"""

import argparse
import array
import json
import os
import random
import subprocess
import sys
import time

try:
    from unicorn import UC_ARCH_ARM64, UC_HOOK_MEM_READ, UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE
    from unicorn import UC_MODE_ARM, UC_PROT_ALL, Uc, UcError
    from unicorn import arm64_const as arm64
except ImportError:
    print("check_relocator: the unicorn module is missing: pip install unicorn", file=sys.stderr)
    sys.exit(2)

PAGE = 4096
CHUNK_BYTES = 512
# SP and the registers a pair access goes through point here (inside the 48-bit physical space
# that Unicorn's MMU-off addressing accepts), 16-aligned.
DATA_BASE = 0x30_0000_0000
DATA_SPAN = 1 << 20
NZCV_MASK = 0xF << 28
BTYPE_MASK = 3 << 10
MAX_STEPS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

X_REGISTERS = [getattr(arm64, f"UC_ARM64_REG_X{n}") for n in range(29)] + [
    arm64.UC_ARM64_REG_X29,
    arm64.UC_ARM64_REG_X30,
]
STATE_REGISTERS = X_REGISTERS + [arm64.UC_ARM64_REG_SP, arm64.UC_ARM64_REG_PC, arm64.UC_ARM64_REG_PSTATE]
# Written before each run: the rest of PSTATE (EL1, BTYPE 0) is Unicorn's and the same in both.
WRITTEN_REGISTERS = X_REGISTERS + [arm64.UC_ARM64_REG_SP, arm64.UC_ARM64_REG_PC, arm64.UC_ARM64_REG_NZCV]


BACKGROUND = {}


def background(page):
    """The bytes of an untouched page: fixed per page, so that both runs load the same values.

    Each word is `ADD Xd, Xn, #imm` with 23 random bits: loads still tell every address apart,
    and a branch into untouched memory finds code Unicorn translates without trouble (its
    translator aborts the process on some random SIMD words, even ones never executed).
    """
    if page not in BACKGROUND:
        if len(BACKGROUND) > 4096:
            BACKGROUND.clear()
        rng = random.Random(page)
        BACKGROUND[page] = array.array("I", (0x9100_0000 | rng.getrandbits(23) for _ in range(PAGE // 4))).tobytes()
    return BACKGROUND[page]


class Machine:
    """One Unicorn CPU (`max`, so BTYPE exists) whose pages appear, filled, when touched."""

    def __init__(self):
        self.uc = Uc(UC_ARCH_ARM64, UC_MODE_ARM)
        self.uc.ctl_set_cpu_model(arm64.UC_CPU_ARM64_MAX)
        self.mapped = set()
        self.dirty = set()
        self.writes = {}
        self.loads = []
        self.uc.hook_add(UC_HOOK_MEM_UNMAPPED, self._on_unmapped)
        self.uc.hook_add(UC_HOOK_MEM_WRITE, self._on_write)
        self.uc.hook_add(UC_HOOK_MEM_READ, self._on_read)

    def ensure(self, address, size=4):
        for page in range(address // PAGE, (address + size - 1) // PAGE + 1):
            if page not in self.mapped:
                self.uc.mem_map(page * PAGE, PAGE, UC_PROT_ALL)
                self.uc.mem_write(page * PAGE, background(page))
                self.mapped.add(page)

    def _on_unmapped(self, uc, access, address, size, value, data):
        self.ensure(address, size)
        return True

    def _on_write(self, uc, access, address, size, value, data):
        for offset in range(size):
            self.writes[address + offset] = None
        self.dirty.update(range(address // PAGE, (address + size - 1) // PAGE + 1))

    def _on_read(self, uc, access, address, size, value, data):
        self.loads.append((address, size))

    def put(self, address, words):
        self.ensure(address, 4 * len(words))
        self.uc.mem_write(address, b"".join(w.to_bytes(4, "little") for w in words))
        self.dirty.update(range(address // PAGE, (address + 4 * len(words) - 1) // PAGE + 1))
        # Translated blocks of earlier runs must not outlive the words they came from.
        self.uc.ctl_remove_cache(address, address + 4 * len(words))

    def reset(self):
        """Untouched memory again, for the next run."""
        for page in self.dirty:
            self.uc.mem_write(page * PAGE, background(page))
            self.uc.ctl_remove_cache(page * PAGE, (page + 1) * PAGE)
        self.dirty.clear()
        self.writes.clear()
        self.loads.clear()

    def run(self, state, pc, inside):
        """Runs from `pc` with `state` while the PC is in `inside` (at least one instruction)."""
        self.uc.reg_write_batch(list(zip(WRITTEN_REGISTERS, state[:32] + [pc, state[32]])))
        error = None
        for _ in range(MAX_STEPS):
            try:
                self.uc.emu_start(pc, 1, count=1)
            except UcError as raised:
                error = str(raised)
                break
            pc = self.uc.reg_read(arm64.UC_ARM64_REG_PC)
            if not inside(pc):
                break
        else:
            error = "did not leave the trampoline"
        values = self.uc.reg_read_batch(STATE_REGISTERS)
        return values, error


# A state is x0..x30, SP, then the NZCV bits.
def random_state(rng, case):
    x = []
    for _ in range(31):
        choice = rng.randrange(8)
        if choice == 0:
            x.append(0)
        elif choice == 1:
            x.append(rng.getrandbits(32) << 32)  # zero in W, not in X
        elif choice == 2:
            x.append(DATA_BASE + 16 * rng.randrange(DATA_SPAN // 16))
        else:
            x.append(rng.getrandbits(64))
    sp = DATA_BASE + 16 * rng.randrange(1024, DATA_SPAN // 16 - 1024)
    base = case.get("base")
    if base is not None and base != 31:
        x[base] = DATA_BASE + 16 * rng.randrange(1024, DATA_SPAN // 16 - 1024)
    return x + [sp, rng.randrange(16) << 28]


def compare(original, relocated, case, state):
    """The first difference between the two runs, or None; and whether BTYPE alone differs."""
    (expected, expected_error), (actual, actual_error) = original, relocated
    if expected_error or actual_error:
        if expected_error and actual_error:
            return None, "both-raise"
        return f"exception: original {expected_error}, relocated {actual_error}", None
    names = [f"x{n}" for n in range(31)] + ["sp", "pc", "pstate"]
    for name, want, got in zip(names, expected, actual):
        if name == "pstate":
            if (want ^ got) & ~BTYPE_MASK:
                return f"pstate {want:#x} != {got:#x}", None
            if (want ^ got) & BTYPE_MASK:
                blr = case["word"] & 0xFFFFFC1F == 0xD63F0000
                return (None, "btype-blr") if blr else (f"btype {want:#x} != {got:#x}", None)
        elif want != got:
            return f"{name} {want:#x} != {got:#x}", None
    return None, None


def check_case(machines, case, rng, states):
    """Runs one case from `states` random states; returns (mismatches, known, both_raise)."""
    original_machine, relocated_machine = machines
    slot = case["slot"]
    chunk = range(slot, slot + CHUNK_BYTES)
    mismatches, known, both_raise = [], 0, 0
    for _ in range(states):
        state = random_state(rng, case)
        original_machine.put(case["address"], [case["word"]])
        original = original_machine.run(state, case["address"], lambda pc: False)
        # The probed word stays readable at its address for both (a literal may overlap it).
        relocated_machine.put(case["address"], [case["word"]])
        relocated_machine.put(slot, case["code"])
        relocated_machine.put(slot + 4 * case["literal_pool"], case["literals"] or [0])
        relocated = relocated_machine.run(state, slot, lambda pc: pc in chunk)
        difference, note = compare(original, relocated, case, state)
        if difference is None and note is None:
            difference = compare_memory(original_machine, relocated_machine, chunk)
        if note == "btype-blr":
            known += 1
        elif note == "both-raise":
            both_raise += 1
        if difference:
            mismatches.append(difference)
        original_machine.reset()
        relocated_machine.reset()
    return mismatches, known, both_raise


def compare_memory(original_machine, relocated_machine, chunk):
    written = set(original_machine.writes) | {a for a in relocated_machine.writes if a not in chunk}
    for address in sorted(written):
        original_machine.ensure(address, 1)
        relocated_machine.ensure(address, 1)
        want = original_machine.uc.mem_read(address, 1)
        got = relocated_machine.uc.mem_read(address, 1)
        if want != got:
            return f"memory at {address:#x}: {want.hex()} != {got.hex()}"
    loads = [load for load in relocated_machine.loads if load[0] not in chunk]
    if loads != original_machine.loads:
        return f"loads {original_machine.loads} != {loads}"
    return None


def cases(seed, per_form, bug):
    command = [
        "cargo", "run", "--quiet", "-p", "probes", "--features", "injected-bugs",
        "--example", "relocator_cases", "--", "--seed", str(seed), "--per-form", str(per_form),
    ]  # fmt: skip
    if bug:
        command += ["--bug", bug]
    output = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in output.splitlines()]


def run(seed, per_form, states, bug, verbose):
    """Checks every case; returns (cases compared, states compared, mismatching cases, ...)."""
    machines = None
    rng = random.Random(seed)
    compared = refused = runs = known = both_raise = 0
    mismatching = {}
    for case in cases(seed, per_form, bug):
        if "refused" in case:
            refused += 1
            continue
        if machines is None or compared % 2000 == 0:
            # Fresh CPUs now and then keep the set of mapped pages small.
            machines = (Machine(), Machine())
        found, case_known, case_both = check_case(machines, case, rng, states)
        compared += 1
        runs += states
        known += case_known
        both_raise += case_both
        if found:
            mismatching.setdefault(case["form"], []).append((case, found[0]))
    return compared, refused, runs, known, both_raise, mismatching


def report(label, result, verbose):
    compared, refused, runs, known, both_raise, mismatching = result
    count = sum(len(cases) for cases in mismatching.values())
    forms = ", ".join(f"{form} {len(cases)}" for form, cases in sorted(mismatching.items()))
    print(
        f"{label}: {compared} cases ({runs} states), {count} mismatching cases"
        + (f" ({forms})" if forms else "")
        + f"; {refused} refused by the relocator; {known} BLR BTYPE differences (known, latent);"
        + f" {both_raise} states raising in both runs",
        flush=True,
    )
    for form, found in sorted(mismatching.items()):
        for case, difference in found[: 3 if verbose else 1]:
            print(
                f"  {form} {case['word']:#010x} at {case['address']:#x}, slot {case['slot']:#x}: {difference}"
            )
    return count


BUGS = ["literal-offset-by-4", "tbz-bit5-dropped", "adr-based-at-pc-plus-4"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-form", type=int, default=1000, help="words per form (default 1000)")
    parser.add_argument("--states", type=int, default=4, help="random states per word (default 4)")
    parser.add_argument("--sample", action="store_true", help="40 words per form, 2 states each")
    parser.add_argument("--bugs", action="store_true", help="also run with each deliberate bug")
    parser.add_argument("--verbose", action="store_true")
    arguments = parser.parse_args()
    if arguments.sample:
        arguments.per_form, arguments.states = 40, 2
    started = time.monotonic()
    failed = False
    clean = run(arguments.seed, arguments.per_form, arguments.states, None, arguments.verbose)
    failed |= report("relocator", clean, arguments.verbose) != 0
    if arguments.bugs:
        for bug in BUGS:
            result = run(arguments.seed, arguments.per_form, arguments.states, bug, arguments.verbose)
            if report(f"with bug {bug}", result, arguments.verbose) == 0:
                print(f"  the check missed the deliberate bug {bug}")
                failed = True
    print(f"check_relocator: {'FAILED' if failed else 'ok'} in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
