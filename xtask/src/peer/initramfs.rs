//! An initramfs written in Rust: the kernel's `newc` cpio format, uncompressed.
//!
//! Linux unpacks it into its rootfs before running `/init`
//! (Documentation/driver-api/early-userspace/buffer-format.rst). Written here rather than by
//! the `cpio` tool so that a device node (`/dev/console`, which the kernel opens for init's
//! standard streams) needs no root, and every header field (owner, times) is fixed: the same
//! files give the same bytes.

/// One entry of the archive.
pub enum Entry<'a> {
    Directory {
        path: &'a str,
    },
    File {
        path: &'a str,
        mode: u32,
        data: &'a [u8],
    },
    /// A character device, by major and minor number.
    CharDevice {
        path: &'a str,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

/// The archive of `entries`, in their order (a directory before what it holds).
pub fn archive(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let inode = index as u32 + 1;
        match entry {
            Entry::Directory { path } => header(&mut out, inode, S_IFDIR | 0o755, 2, path, &[], (0, 0)),
            Entry::File { path, mode, data } => header(&mut out, inode, S_IFREG | mode, 1, path, data, (0, 0)),
            Entry::CharDevice { path, major, minor } => {
                header(&mut out, inode, S_IFCHR | 0o600, 1, path, &[], (*major, *minor))
            }
        }
    }
    header(&mut out, 0, 0, 1, "TRAILER!!!", &[], (0, 0));
    out
}

/// `070701`, thirteen 8-digit hexadecimal fields, the NUL-terminated name and the data, each
/// padded to 4 bytes.
fn header(out: &mut Vec<u8>, inode: u32, mode: u32, links: u32, path: &str, data: &[u8], device: (u32, u32)) {
    let fields = [
        inode,
        mode,
        0, // uid
        0, // gid
        links,
        0, // mtime
        u32::try_from(data.len()).expect("initramfs files are under 4 GiB"),
        0, // devmajor: the file system's device
        0, // devminor
        device.0,
        device.1,
        u32::try_from(path.len() + 1).expect("short names"),
        0, // check: unused by newc
    ];
    out.extend_from_slice(b"070701");
    for field in fields {
        out.extend_from_slice(format!("{field:08X}").as_bytes());
    }
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    pad(out);
    out.extend_from_slice(data);
    pad(out);
}

fn pad(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_headers_names_and_padding() {
        let bytes = archive(&[
            Entry::Directory { path: "dev" },
            Entry::CharDevice { path: "dev/console", major: 5, minor: 1 },
            Entry::File { path: "init", mode: 0o755, data: b"abcde" },
        ]);
        assert!(bytes.len().is_multiple_of(4));
        let text = String::from_utf8_lossy(&bytes);
        // dev: inode 1, a directory, 2 links, name length 4 ("dev" and its NUL).
        assert!(text.starts_with("07070100000001000041ED000000000000000000000002000000000000000000000000"), "{text}");
        // The console: mode 020600, rdev 5:1.
        let console = text.find("0707010000000200002180").unwrap();
        assert_eq!(&text[console + 6 + 9 * 8..console + 6 + 11 * 8], "0000000500000001");
        // The file's data follows its name, padded with the 110-byte header to 4 bytes.
        let init = text.find("init\0").unwrap();
        assert_eq!((init - 110) % 4, 0);
        assert_eq!(&text[init + 6..init + 11], "abcde");
        assert!(text.trim_end_matches('\0').ends_with("TRAILER!!!"));
        // The `cpio` tool, when installed, lists the same names.
        let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        else {
            return;
        };
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let listing = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&listing.stdout), "dev\ndev/console\ninit\n");
    }
}
