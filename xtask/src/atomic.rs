//! Outputs two xtask commands may both write: whole-file replacement by rename, and file locks.
//!
//! A command may have a kernel image memory-mapped (the symbolizer maps the ELF) while another
//! command in the same checkout rebuilds it: a file truncated and rewritten in place under a
//! mapping raises SIGBUS in the reader. So every output is written to a temporary file in its
//! own directory and renamed over the old one: a reader keeps the inode it opened, a new reader
//! sees the whole new file. An output whose content is unchanged is left alone (its inode and
//! modification time too). Where two writers must not interleave (the post-link steps of one
//! build, the files of one results directory), an advisory lock serialises them, and a command
//! that has to wait says once what it waits for, as cargo's "Blocking waiting for file lock".

use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Set (to anything but empty) in the environment, every output is truncated and rewritten in
/// place, changed or not, as xtask once did: the concurrency check of `cargo xtask test` then
/// fails (it is how that check is shown able to fail); never set it otherwise.
pub const IN_PLACE_SWITCH: &str = "XTASK_TEST_WRITE_IN_PLACE";

/// What [`write`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Written {
    /// The file already held these bytes: it was not touched.
    Unchanged,
    /// The file was created, or replaced whole by a rename.
    Replaced,
}

/// Makes `path` hold `bytes`: left alone when it already does, otherwise written to a temporary
/// file beside it and renamed over it (keeping the old file's permissions). The parent directory
/// must exist.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<Written> {
    if std::env::var_os(IN_PLACE_SWITCH).is_some_and(|value| !value.is_empty()) {
        std::fs::write(path, bytes)?;
        return Ok(Written::Replaced);
    }
    let existing = std::fs::metadata(path).ok();
    if existing.as_ref().is_some_and(|metadata| metadata.len() == bytes.len() as u64)
        && std::fs::read(path).is_ok_and(|old| old == bytes)
    {
        return Ok(Written::Unchanged);
    }
    let temporary = temporary_path(path);
    let written = (|| {
        let mut file = File::create(&temporary)?;
        file.write_all(bytes)?;
        if let Some(metadata) = &existing {
            file.set_permissions(metadata.permissions())?;
        }
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map(|()| Written::Replaced)
}

/// [`write`], creating the parent directories first.
pub fn write_creating_dirs(path: &Path, bytes: &[u8]) -> std::io::Result<Written> {
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    write(path, bytes)
}

/// A name beside `path` that no other writer uses: hidden, with this process's id and a
/// counter (two threads of one command never share one either).
pub fn temporary_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let unique = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{unique}.tmp", std::process::id()))
}

/// An exclusive advisory lock (`flock`) on a lock file, released when dropped (or when the
/// process ends, however it ends).
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

impl Lock {
    /// Takes the lock on `path` (created if missing, with its directory), printing one
    /// "waiting for lock" line naming `what` when another command holds it.
    pub fn acquire(path: &Path, what: &str) -> std::io::Result<Lock> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = File::options().read(true).write(true).create(true).truncate(false).open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                eprintln!("xtask: waiting for lock on {} ({what}): another xtask command holds it", path.display());
                file.lock()?;
            }
            Err(TryLockError::Error(error)) => return Err(error),
        }
        Ok(Lock { _file: file })
    }
}

/// Takes the lock that serialises the commands writing into `dir` (a results directory, a
/// saved run, a profile's or a trace's directory): its lock file lives in the target directory,
/// not among the outputs.
pub fn lock_dir(dir: &Path, what: &str) -> std::io::Result<Lock> {
    let absolute = std::path::absolute(dir)?;
    let name: String = absolute
        .to_string_lossy()
        .chars()
        .map(|character| if character.is_ascii_alphanumeric() || "-_.".contains(character) { character } else { '_' })
        .collect();
    Lock::acquire(&crate::build::target_dir().join("xtask-locks").join(format!("{name}.lock")), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tracelab-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_replaced_file_is_a_new_inode_and_an_unchanged_one_is_left_alone() {
        let dir = scratch("replace");
        let path = dir.join("kernel");
        assert_eq!(write(&path, b"one").unwrap(), Written::Replaced);
        let first = std::fs::metadata(&path).unwrap();
        // A reader that opened the old file keeps reading the old bytes after the replacement.
        let mut reader = File::open(&path).unwrap();
        assert_eq!(write(&path, b"two!").unwrap(), Written::Replaced);
        let second = std::fs::metadata(&path).unwrap();
        assert_ne!(first.ino(), second.ino());
        let mut old = String::new();
        std::io::Read::read_to_string(&mut reader, &mut old).unwrap();
        assert_eq!(old, "one");
        assert_eq!(write(&path, b"two!").unwrap(), Written::Unchanged);
        let third = std::fs::metadata(&path).unwrap();
        assert_eq!((second.ino(), second.mtime_nsec()), (third.ino(), third.mtime_nsec()));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, ["kernel"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_file_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("permissions");
        let path = dir.join("kernel");
        write(&path, b"one").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_held_lock_blocks_a_second_taker_until_it_is_dropped() {
        let dir = scratch("lock");
        let path = dir.join("build.lock");
        let held = Lock::acquire(&path, "test").unwrap();
        // flock locks belong to the open file description: a second open of the same path
        // conflicts, even in one process.
        let other = File::options().read(true).write(true).open(&path).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(held);
        assert!(other.try_lock().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
