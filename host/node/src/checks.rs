//! What every backend checks the same way: a plugin's symlink targets and account names, and
//! what a node read may return (a regular file of at most [`MAX_READ`]).

use crate::{MAX_READ, NodeError, NodeErrorKind};

/// Checks a symlink target a plugin gives: not empty, no NUL byte.
pub fn check_link_target(target: &str) -> Result<(), NodeError> {
    if target.is_empty() {
        return Err(NodeError::new(NodeErrorKind::InvalidInput, "symlink target is empty"));
    }
    if target.contains('\0') {
        return Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("symlink target `{}` contains a NUL byte", target.escape_debug()),
        ));
    }
    Ok(())
}

/// Checks a user or group name a plugin gives for `set_owner`: a name or a numeric id, never
/// something a command line or a `user:group` pair could misread.
pub fn check_account_name(what: &str, name: &str) -> Result<(), NodeError> {
    let ok = !name.is_empty()
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'));
    if ok {
        Ok(())
    } else {
        Err(NodeError::new(
            NodeErrorKind::InvalidInput,
            format!("{what} `{}` is not a valid name or id", name.escape_debug()),
        ))
    }
}

/// What a node read refuses, for every backend: anything but a regular file (a FIFO would block
/// the read, a device or a socket has no end), and a file larger than [`MAX_READ`]. `mode` is
/// the file's `st_mode`, type bits included (`None` when the node did not say); `path` is shown.
pub fn check_readable(path: &str, mode: Option<u32>, size: u64) -> Result<(), NodeError> {
    if let Some(mode) = mode {
        match mode & S_IFMT {
            S_IFREG => {}
            S_IFDIR => return Err(NodeError::new(NodeErrorKind::InvalidInput, format!("{path} is a directory"))),
            other => {
                return Err(NodeError::new(
                    NodeErrorKind::InvalidInput,
                    format!("cannot read {path}: it is a {}, not a regular file", file_type_name(other)),
                ));
            }
        }
    }
    if size > MAX_READ {
        return Err(too_large(path, Some(size)));
    }
    Ok(())
}

/// The `TooLarge` refusal of a read of `path` (its message starts with `too_large:`, a
/// plugin's error has no code of its own): `size` as the node reports it, or `None` when the
/// file grew past [`MAX_READ`] while it was read.
pub fn too_large(path: &str, size: Option<u64>) -> NodeError {
    let size = match size {
        Some(size) => format!("is {size} bytes"),
        None => format!("grew past {MAX_READ} bytes while it was read"),
    };
    NodeError::new(
        NodeErrorKind::TooLarge,
        format!("too_large: {path} {size}; a node read returns at most {MAX_READ} bytes (16 MiB)"),
    )
}

/// The file type bits of `st_mode`.
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// What the type bits of an `st_mode` name, for messages.
fn file_type_name(kind: u32) -> &'static str {
    match kind {
        0o010000 => "FIFO",
        0o020000 => "character device",
        0o060000 => "block device",
        0o140000 => "socket",
        0o120000 => "symlink",
        S_IFDIR => "directory",
        S_IFREG => "file",
        _ => "special file",
    }
}
