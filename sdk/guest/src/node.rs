//! A managed node, addressed by name (capabilities `node-files` for files, `node-commands` for `run`).
//!
//! The host picks the transport (the local node, or SSH) and holds the credentials. Paths are
//! absolute paths on the node. Every call returns the host's error kind: `unavailable` when the
//! node cannot be reached, `denied` when the capability is not granted.
//!
//! [`apt`] builds `apt-get` runs that take turns on a node, whichever plugin starts them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::Result;
use crate::bindings::node as wit;

pub mod apt;

/// A command to run on a node. `argv[0]` is the program; no shell is involved unless you run one.
///
/// ```
/// use orc_sdk::node::Command;
/// let cmd = Command::new("systemctl").args(["restart", "nginx"]).env("LC_ALL", "C").timeout(std::time::Duration::from_secs(30));
/// assert_eq!(cmd.argv(), ["systemctl", "restart", "nginx"]);
/// ```
#[derive(Debug, Clone)]
pub struct Command {
    inner: wit::Command,
}

impl Command {
    pub fn new(program: impl Into<String>) -> Self {
        Command {
            inner: wit::Command {
                argv: vec![program.into()],
                stdin: None,
                env: Vec::new(),
                cwd: None,
                timeout_ms: None,
            },
        }
    }

    #[must_use]
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.inner.argv.push(arg.into());
        self
    }

    #[must_use]
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.inner.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Bytes written to the command's standard input.
    #[must_use]
    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.inner.stdin = Some(input.into());
        self
    }

    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner.env.push((key.into(), value.into()));
        self
    }

    /// The working directory; the node's default otherwise.
    #[must_use]
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.inner.cwd = Some(dir.into());
        self
    }

    /// Kills the command after this long (millisecond precision); the host's default otherwise.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner.timeout_ms = Some(u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX));
        self
    }

    pub fn argv(&self) -> &[String] {
        &self.inner.argv
    }
}

impl fmt::Display for Command {
    /// The argv joined by spaces, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.argv.join(" "))
    }
}

/// What a finished command left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The exit code; `-1` when the command was killed by a signal.
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// Standard output as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// `Ok(self)` when the command succeeded, else [`Output::error`].
    pub fn check(self, command: &Command) -> Result<Output> {
        if self.success() {
            return Ok(self);
        }
        Err(self.error(command))
    }

    /// The run as a failure of `command`: a `permanent` error naming the command, its exit code
    /// and the end of its stderr. For a plugin that has seen the run fail ([`Output::success`]
    /// is false) and wants its own error kind with this message.
    pub fn error(&self, command: &Command) -> crate::Error {
        let stderr = self.stderr_text();
        let stderr = stderr.trim();
        const TAIL: usize = 1024;
        let tail = match stderr.char_indices().rev().nth(TAIL) {
            Some((i, _)) => format!("...{}", &stderr[i..]),
            None => stderr.to_string(),
        };
        let status = if self.exit_code == -1 {
            "was killed".to_string()
        } else {
            format!("exited with {}", self.exit_code)
        };
        let detail = if tail.is_empty() { String::new() } else { format!(": {tail}") };
        crate::Error::permanent(format!("`{command}` {status}{detail}"))
    }
}

/// Runs a command on `node` and waits for it. A non-zero exit is not an error; see
/// [`Output::check`].
pub fn run(node: &str, command: &Command) -> Result<Output> {
    let out = wit::run(node, &command.inner)?;
    Ok(Output {
        exit_code: out.exit_code,
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// The file's content; `None` when it does not exist.
pub fn read_file(node: &str, path: &str) -> Result<Option<Vec<u8>>> {
    Ok(wit::read_file(node, path)?)
}

/// Creates or replaces the file atomically; `mode` applies to a new file and to an existing one.
pub fn write_file(node: &str, path: &str, content: &[u8], mode: Option<Mode>) -> Result<()> {
    Ok(wit::write_file(node, path, content, mode.map(Mode::bits))?)
}

/// What is at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

impl FileKind {
    /// `file`, `directory`, `symlink` or `special file`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Other => "special file",
        }
    }
}

/// Metadata of a path, not following a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, without the file type.
    pub mode: Mode,
    pub uid: u32,
    pub gid: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
}

/// Metadata without following a final symlink; `None` when nothing exists at `path`.
pub fn stat(node: &str, path: &str) -> Result<Option<FileStat>> {
    Ok(wit::stat(node, path)?.map(|s| FileStat {
        kind: match s.kind {
            wit::FileKind::File => FileKind::File,
            wit::FileKind::Directory => FileKind::Directory,
            wit::FileKind::Symlink => FileKind::Symlink,
            wit::FileKind::Other => FileKind::Other,
        },
        size: s.size,
        mode: Mode(s.mode & Mode::MASK),
        uid: s.uid,
        gid: s.gid,
        mtime_ms: s.mtime_ms,
    }))
}

/// Creates a directory (and missing parents when `parents`).
pub fn create_dir(node: &str, path: &str, mode: Option<Mode>, parents: bool) -> Result<()> {
    Ok(wit::create_dir(node, path, mode.map(Mode::bits), parents)?)
}

/// Sets permission bits.
pub fn set_mode(node: &str, path: &str, mode: Mode) -> Result<()> {
    Ok(wit::set_mode(node, path, mode.bits())?)
}

/// Removes a file, a symlink or a directory (with its content when `recursive`). Returns whether
/// anything existed.
pub fn remove(node: &str, path: &str, recursive: bool) -> Result<bool> {
    Ok(wit::remove(node, path, recursive)?)
}

/// The stored target of the symlink at `path` (not resolved); `None` when nothing exists there.
/// Something other than a symlink at `path` is an `invalid-input` error.
pub fn read_link(node: &str, path: &str) -> Result<Option<String>> {
    Ok(wit::read_link(node, path)?)
}

/// Makes `path` a symlink to `target` (stored as given). An existing symlink is replaced
/// atomically; a file or directory at `path` is an `invalid-input` error (remove it first).
pub fn create_symlink(node: &str, target: &str, path: &str) -> Result<()> {
    Ok(wit::create_symlink(node, target, path)?)
}

/// Who owns a path: ids, and the names the node has for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    pub uid: u32,
    pub gid: u32,
    /// The user name of `uid` on the node, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The group name of `gid` on the node, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Ownership {
    /// Whether the owner is `user`, given as a name or as a numeric id.
    pub fn is_user(&self, user: &str) -> bool {
        self.user.as_deref() == Some(user) || user.parse() == Ok(self.uid)
    }

    /// Whether the group is `group`, given as a name or as a numeric id.
    pub fn is_group(&self, group: &str) -> bool {
        self.group.as_deref() == Some(group) || group.parse() == Ok(self.gid)
    }

    /// The user's name, or its id when it has none.
    pub fn user_shown(&self) -> String {
        self.user.clone().unwrap_or_else(|| self.uid.to_string())
    }

    /// The group's name, or its id when it has none.
    pub fn group_shown(&self) -> String {
        self.group.clone().unwrap_or_else(|| self.gid.to_string())
    }
}

/// The owner of `path`, without following a final symlink; `None` when nothing exists there.
pub fn owner(node: &str, path: &str) -> Result<Option<Ownership>> {
    Ok(wit::owner(node, path)?.map(|o| Ownership {
        uid: o.uid,
        gid: o.gid,
        user: o.user,
        group: o.group,
    }))
}

/// Changes the owner and/or group of a file or directory; names are resolved on the node, a
/// string of digits is an id, `None` leaves that part alone.
pub fn set_owner(node: &str, path: &str, user: Option<&str>, group: Option<&str>) -> Result<()> {
    Ok(wit::set_owner(node, path, user, group)?)
}

/// [`set_owner`] of the path of resource `target`, answering the message an adaptor reports
/// (`set owner of /srv/www to www-data:www-data`); an error names the resource.
pub fn set_owner_of(target: &crate::Target, path: &str, user: Option<&str>, group: Option<&str>) -> Result<String> {
    use crate::ResultExt as _;
    set_owner(&target.node, path, user, group).context(format_args!("{}: chown {path}", target.id))?;
    let shown = match (user, group) {
        (Some(u), Some(g)) => format!("{u}:{g}"),
        (Some(u), None) => u.to_string(),
        (None, Some(g)) => format!(":{g}"),
        (None, None) => String::new(),
    };
    Ok(format!("set owner of {path} to {shown}"))
}

/// Unix permission bits (`0o644`, at most `0o7777`).
///
/// In attributes it is written as an octal string (`"0644"`, `"644"`, `"0o644"`) or as an
/// integer whose decimal digits are the octal digits, as Inmanta does (`644` means `0o644`).
/// It serialises and displays as a four-digit octal string (`"0644"`).
///
/// ```
/// use orc_sdk::node::Mode;
/// let m: Mode = serde_json::from_str("\"0755\"").unwrap();
/// assert_eq!(m.bits(), 0o755);
/// assert_eq!(serde_json::from_str::<Mode>("644").unwrap(), Mode::new(0o644).unwrap());
/// assert_eq!(serde_json::to_string(&m).unwrap(), "\"0755\"");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mode(u32);

impl Mode {
    const MASK: u32 = 0o7777;

    /// `None` when `bits` has anything beyond the permission, setuid, setgid and sticky bits.
    pub const fn new(bits: u32) -> Option<Mode> {
        if bits & !Mode::MASK == 0 { Some(Mode(bits)) } else { None }
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    fn from_octal_digits(digits: &str, original: &dyn fmt::Display) -> std::result::Result<Mode, String> {
        let invalid = || format!("invalid mode {original}: expected octal permission bits like \"0644\"");
        if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(invalid());
        }
        u32::from_str_radix(digits, 8).ok().and_then(Mode::new).ok_or_else(invalid)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        let digits = s.strip_prefix("0o").or_else(|| s.strip_prefix("0O")).unwrap_or(s);
        Mode::from_octal_digits(digits, &format_args!("{s:?}"))
    }
}

impl From<Mode> for u32 {
    fn from(m: Mode) -> u32 {
        m.0
    }
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Mode, D::Error> {
        struct ModeVisitor;

        impl Visitor<'_> for ModeVisitor {
            type Value = Mode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an octal mode string like \"0644\" or an integer of octal digits like 644")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<Mode, E> {
                s.parse().map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> std::result::Result<Mode, E> {
                Mode::from_octal_digits(&n.to_string(), &n).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> std::result::Result<Mode, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!("invalid mode {n}: expected octal permission bits like \"0644\""))),
                }
            }
        }

        d.deserialize_any(ModeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> std::result::Result<Mode, String> {
        serde_json::from_str::<Mode>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn modes_parse_from_octal_strings_and_octal_digit_integers() {
        for (json, bits) in [
            ("\"0644\"", 0o644),
            ("\"644\"", 0o644),
            ("\"0o755\"", 0o755),
            ("\"4755\"", 0o4755),
            ("\"0\"", 0),
            ("600", 0o600),
            ("1777", 0o1777),
        ] {
            assert_eq!(parse(json).unwrap().bits(), bits, "{json}");
        }
    }

    #[test]
    fn bad_modes_are_refused_with_the_value() {
        assert!(parse("\"u=rw\"").unwrap_err().starts_with("invalid mode \"u=rw\": expected octal"));
        assert!(parse("\"0648\"").unwrap_err().starts_with("invalid mode \"0648\""));
        assert!(parse("\"17777\"").unwrap_err().starts_with("invalid mode \"17777\""));
        assert!(parse("\"\"").is_err());
        assert!(parse("649").unwrap_err().starts_with("invalid mode 649"));
        assert!(parse("-1").unwrap_err().starts_with("invalid mode -1"));
        assert!(parse("true").unwrap_err().contains("expected an octal mode string"));
        assert!(parse("6.44").is_err());
    }

    #[test]
    fn modes_print_as_four_octal_digits() {
        assert_eq!(Mode::new(0o644).unwrap().to_string(), "0644");
        assert_eq!(Mode::new(0o4755).unwrap().to_string(), "4755");
        assert_eq!(serde_json::to_string(&Mode::new(0o7).unwrap()).unwrap(), "\"0007\"");
        assert_eq!(Mode::new(0o10000), None);
    }

    #[test]
    fn failed_commands_name_command_code_and_stderr() {
        let cmd = Command::new("apt-get").args(["install", "-y", "nginx"]);
        let out = Output {
            exit_code: 100,
            stdout: vec![],
            stderr: b"E: Unable to locate package nginx\n".to_vec(),
        };
        let error = out.error(&cmd);
        let e = out.check(&cmd).unwrap_err();
        assert_eq!(
            e.message(),
            "`apt-get install -y nginx` exited with 100: E: Unable to locate package nginx"
        );
        assert_eq!((error.kind(), error.message()), (e.kind(), e.message()));
        let ok = Output {
            exit_code: 0,
            stdout: b"hi".to_vec(),
            stderr: vec![],
        };
        assert_eq!(ok.check(&cmd).unwrap().stdout_text(), "hi");
        let killed = Output {
            exit_code: -1,
            stdout: vec![],
            stderr: vec![],
        };
        assert_eq!(killed.check(&cmd).unwrap_err().message(), "`apt-get install -y nginx` was killed");
    }

    #[test]
    fn owners_match_by_name_or_id() {
        let o = Ownership {
            uid: 1000,
            gid: 50,
            user: Some("alice".into()),
            group: None,
        };
        assert!(o.is_user("alice") && o.is_user("1000"));
        assert!(!o.is_user("bob") && !o.is_user("0"));
        assert!(o.is_group("50") && !o.is_group("staff"));
        assert_eq!((o.user_shown(), o.group_shown()), ("alice".to_string(), "50".to_string()));
    }

    #[test]
    fn command_timeout_saturates() {
        let cmd = Command::new("sleep").timeout(Duration::from_secs(u64::MAX / 4));
        assert_eq!(cmd.inner.timeout_ms, Some(u32::MAX));
    }
}
