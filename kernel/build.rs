//! Link the kernel at the board's load address in the upper half (see kernel.ld).

use std::{env, fs, path::PathBuf};

use protocol::{VA_OFFSET, load_address};

fn main() {
    let virt = env::var_os("CARGO_FEATURE_BOARD_QEMU_VIRT").is_some();
    let rpi4 = env::var_os("CARGO_FEATURE_BOARD_RPI4").is_some();
    // Where the loader puts the raw image: QEMU virt at RAM + 0x80000, the Pi 4 firmware at 0x80000.
    let phys_base: u64 = match (virt, rpi4) {
        (true, false) => load_address::QEMU_VIRT,
        (false, true) => load_address::RPI4,
        _ => panic!("select exactly one board feature: board-qemu-virt or board-rpi4"),
    };
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    fs::write(
        out.join("memory.ld"),
        format!("KERNEL_PHYS_BASE = {phys_base:#x};\nKERNEL_VA_OFFSET = {VA_OFFSET:#x};\n"),
    )
    .unwrap();
    let script = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("kernel.ld");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rustc-link-arg-bins=-T{}", script.display());
    println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    println!("cargo:rerun-if-changed=kernel.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
