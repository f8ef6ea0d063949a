//! Files an operator's tool writes answers and exports to, safe on a shared host: readable by
//! their owner only, never written through a symbolic link, never over an existing file unless
//! asked, and never left half-written: the content goes to a new file beside the destination,
//! which takes the destination's name only once it is complete.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// A file being written; it appears at its destination on [`OutputFile::finish`], and is removed
/// if dropped before.
#[derive(Debug)]
pub struct OutputFile {
    file: Option<File>,
    partial: PathBuf,
    destination: PathBuf,
    replace: bool,
}

impl OutputFile {
    /// Starts a file that will be `destination`. Refused: a destination that is a symbolic
    /// link, or that exists when `replace` is false.
    pub fn create(destination: &Path, replace: bool) -> io::Result<OutputFile> {
        match std::fs::symlink_metadata(destination) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "is a symbolic link; give the file itself",
                ));
            }
            Ok(_) if !replace => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists; --force replaces it",
                ));
            }
            Ok(meta) if !meta.is_file() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "is not a regular file",
                ));
            }
            _ => {}
        }
        let name = destination
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "names no file"))?;
        let mut partial_name = std::ffi::OsString::from(".");
        partial_name.push(name);
        partial_name.push(format!(".{}.partial", std::process::id()));
        let partial = destination.with_file_name(partial_name);
        let mut options = OpenOptions::new();
        // A new file (never one already there, nor a link planted under its name).
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let file = options.open(&partial)?;
        Ok(OutputFile {
            file: Some(file),
            partial,
            destination: destination.to_owned(),
            replace,
        })
    }

    /// The file to write to.
    pub fn writer(&mut self) -> &mut File {
        self.file.as_mut().expect("open until finished")
    }

    /// Puts the complete file at its destination: replacing it when asked (a rename, which
    /// replaces a link planted since rather than follow it), otherwise only if nothing took
    /// the name meanwhile (a hard link, which never replaces).
    pub fn finish(mut self) -> io::Result<()> {
        let file = self.file.take().expect("open until finished");
        file.sync_all()?;
        drop(file);
        if self.replace {
            std::fs::rename(&self.partial, &self.destination)
        } else {
            std::fs::hard_link(&self.partial, &self.destination)?;
            std::fs::remove_file(&self.partial)
        }
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.partial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fenced-jobs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("folder");
        dir
    }

    fn write(path: &Path, replace: bool, text: &str) -> io::Result<()> {
        let mut out = OutputFile::create(path, replace)?;
        out.writer().write_all(text.as_bytes())?;
        out.finish()
    }

    #[test]
    fn a_file_is_its_owners_only_and_replaced_only_when_asked() {
        let dir = folder("owner");
        let path = dir.join("answer.json");
        write(&path, false, "one").expect("written");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let refused = write(&path, false, "two").expect_err("exists");
        assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "one");
        write(&path, true, "two").expect("replaced");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "two");
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 1);
        std::fs::remove_dir_all(dir).expect("clean");
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_is_never_written_through() {
        let dir = folder("link");
        let target = dir.join("victim");
        std::fs::write(&target, "precious").expect("target");
        let link = dir.join("answer.json");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        for replace in [false, true] {
            assert!(write(&link, replace, "overwritten").is_err());
        }
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "precious");
        std::fs::remove_dir_all(dir).expect("clean");
    }

    #[test]
    fn a_failed_write_leaves_no_file() {
        let dir = folder("partial");
        let path = dir.join("export.jsonl");
        {
            let mut out = OutputFile::create(&path, false).expect("started");
            out.writer().write_all(b"half of it").expect("written");
            // The export fails here: the file is dropped unfinished.
        }
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
        std::fs::remove_dir_all(dir).expect("clean");
    }
}
