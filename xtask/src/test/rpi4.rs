//! The Raspberry Pi 4 paths checked without a board: the SD card image and the serial line.

use super::tally::Tally;
use crate::Failure;
use crate::build::{self, Board, BuildVariant};
use crate::qemu::{self, CpuVariant, Machine};
use protocol::bench::Row;
use std::time::Duration;

/// The baseline suite's plain call row (`baseline call - per_op insn N`), when `fields` are it.
fn call_row(fields: &str) -> Option<Row<'_>> {
    Row::parse(fields).filter(|row| {
        (row.suite, row.case, row.params, row.metric, row.unit) == ("baseline", "call", "-", "per_op", "insn")
    })
}

/// The Raspberry Pi 4 paths that need no board: the SD card image (written with the real boot
/// files, then opened and checked), and bench rows read from QEMU `raspi4b` through a
/// pseudo-terminal, as from a real board's serial line.
pub fn rpi4_checks(boot_files: &crate::bootfiles::BootFileArgs, tally: &mut Tally) -> Result<(), Failure> {
    let image = build::kernel(Board::Rpi4, BuildVariant::Prod)?;
    let files = crate::bootfiles::get(boot_files)?;
    let read = |path: &std::path::Path| std::fs::read(path).map_err(|error| Failure::usage(error.to_string()));
    let kernel = read(&image.raw)?;
    let card = build::target_dir().join("rpi4/test-sd.img");
    std::fs::create_dir_all(card.parent().expect("has a parent")).map_err(|error| Failure::usage(error.to_string()))?;
    let boot = vec![
        crate::sdimage::BootFile { name: "kernel8.img", data: kernel.clone() },
        crate::sdimage::BootFile { name: "config.txt", data: crate::sdimage::CONFIG_TXT.into() },
        crate::sdimage::BootFile { name: "cmdline.txt", data: b"run=test\n".to_vec() },
        crate::sdimage::BootFile { name: "start4.elf", data: read(&files.start4)? },
        crate::sdimage::BootFile { name: "fixup4.dat", data: read(&files.fixup4)? },
        crate::sdimage::BootFile { name: crate::bootfiles::DTB_NAME, data: read(&files.dtb)? },
    ];
    let written = crate::sdimage::write(&card, &boot).map_err(|error| error.to_string());
    let verified = written.and_then(|()| crate::sdimage::verify(&card, &kernel));
    tally.check("rpi4 SD card image verifies", verified.as_ref().err());

    let machine = Machine {
        board: Board::Rpi4,
        cpu: CpuVariant::CortexA72,
        el: 2,
        gic: 2,
        icount: true,
        dtb: Some(files.dtb),
        mte: false,
        smp: 1,
    };
    // `exit=park`, as on the real board: the kernel prints its exit sentinel and parks, and
    // xtask quits QEMU after reading it. With semihosting QEMU could exit (closing the pty and
    // discarding what xtask had not read yet) before the last rows were read: a race seen under load.
    let bootargs = "run=bench bench=baseline reps=1 clock=cycles icount=1 exit=park";
    let run = qemu::run_via_pty(&machine, &image, bootargs, Duration::from_secs(120))?;
    let rows: Vec<_> = run.log.iter().filter_map(|line| Row::fields(&line.text)).collect();
    let call = rows.iter().find(|fields| call_row(fields).is_some());
    let problem = match (run.status, call) {
        (Some(0), Some(fields)) if call_row(fields).is_some_and(|row| row.value == 2.0) => None,
        (_, row) => {
            Some(format!("{}; call row: {}; {} rows", run.ending, row.map_or("none", |fields| fields), rows.len()))
        }
    };
    tally.check("rpi4 bench rows through a pseudo-terminal", problem.as_ref());
    Ok(())
}
