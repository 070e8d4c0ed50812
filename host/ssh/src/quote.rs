//! The one place a command line for the node's shell is built: sshd runs every exec request as
//! `$SHELL -c '<string>'`, so argv, environment, working directory and the remote timeout are all
//! turned into one POSIX-shell string here, each word single-quoted.

use std::time::Duration;

use orc_node::{NodeCommand, NodeError, NodeErrorKind};

/// `PATH` of every command, as `LocalNode` sets it: the rest of the environment is cleared.
pub const COMMAND_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Seconds between `timeout`'s TERM and its KILL of a command that outlived its time.
pub const KILL_AFTER_S: u32 = 2;

/// Quotes one word for a POSIX shell: inside single quotes nothing is special except `'` itself,
/// which becomes `'\''`. The result is one word whatever the input (spaces, `$`, `"`, newlines,
/// globs, leading `-`), and the empty string stays an (empty) word.
pub fn quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    push_quoted(&mut out, [word]);
    out
}

/// Appends the words of `parts`, concatenated, to `line` as one quoted word (see [`quote`]):
/// a run between two `'` is copied whole, not char by char (an environment variable can carry
/// a service's whole configuration).
fn push_quoted<'a>(line: &mut String, parts: impl IntoIterator<Item = &'a str>) {
    line.push('\'');
    for part in parts {
        let mut runs = part.split('\'');
        if let Some(first) = runs.next() {
            line.push_str(first);
        }
        for run in runs {
            line.push_str("'\\''");
            line.push_str(run);
        }
    }
    line.push('\'');
}

/// The shell string for a command: `cd` into its directory, then `timeout` (which the remote side
/// enforces even when sshd refuses signal requests, as it does for root sessions) running `env -i`
/// with `PATH` and the given variables (sshd drops `env` requests unless `AcceptEnv` allows them),
/// running argv. Refuses what a shell string or `env` cannot carry: NUL bytes, variable names with
/// `=`, and a program name with `=` (which `env` would take for another assignment).
pub fn command_line(command: &NodeCommand, timeout: Duration) -> Result<String, NodeError> {
    let invalid = |m: String| NodeError::new(NodeErrorKind::InvalidInput, m);
    let Some(program) = command.argv.first() else {
        return Err(invalid("command has an empty argv".into()));
    };
    if program.is_empty() {
        return Err(invalid("command has an empty program name".into()));
    }
    if program.contains('=') {
        return Err(invalid(format!("program name `{program}` contains `=`")));
    }
    for word in &command.argv {
        if word.contains('\0') {
            return Err(invalid(format!("argument `{}` contains a NUL byte", word.escape_debug())));
        }
    }
    let mut line = String::new();
    if let Some(cwd) = &command.cwd {
        if !cwd.starts_with('/') || cwd.contains('\0') {
            return Err(invalid(format!(
                "working directory `{}` is not an absolute path",
                cwd.escape_debug()
            )));
        }
        line.push_str("cd ");
        line.push_str(&quote(cwd));
        line.push_str(" && ");
    }
    // Millisecond precision: GNU and busybox `timeout` both take fractional seconds.
    let secs = format!("{}.{:03}", timeout.as_secs(), timeout.subsec_millis());
    line.push_str(&format!("exec timeout -k {KILL_AFTER_S} {secs} env -i "));
    line.push_str(&quote(&format!("PATH={COMMAND_PATH}")));
    for (key, value) in &command.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(invalid(format!("environment variable name `{}` is not valid", key.escape_debug())));
        }
        if value.contains('\0') {
            return Err(invalid(format!("environment variable `{key}` contains a NUL byte")));
        }
        line.push(' ');
        line.reserve(key.len() + value.len() + 3);
        push_quoted(&mut line, [key.as_str(), "=", value.as_str()]);
    }
    for word in &command.argv {
        line.push(' ');
        push_quoted(&mut line, [word.as_str()]);
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `sh -c 'printf "%s\n" <quoted words>'` locally and checks every word comes back whole.
    #[test]
    fn quoted_words_survive_the_shell() {
        let nasty = [
            "",
            " ",
            "plain",
            "two words",
            "it's",
            "''",
            "'\\''",
            "\"double\"",
            "$HOME",
            "${PATH}",
            "$(echo injected)",
            "`echo injected`",
            "a;b&&c||d|e",
            "*",
            "-n",
            "--",
            "back\\slash",
            "new\nline",
            "tab\there",
            "!bang",
            "~",
            "#comment",
            "ünïcödé ✓",
        ];
        let script = format!("for w in {}; do printf '%s\\0' \"$w\"; done", nasty.map(quote).join(" "));
        let out = std::process::Command::new("/bin/sh").arg("-c").arg(&script).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let words: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
        assert_eq!(words.len(), nasty.len() + 1, "{:?}", String::from_utf8_lossy(&out.stdout));
        for (got, want) in words.iter().zip(nasty) {
            assert_eq!(*got, want.as_bytes());
        }
    }

    #[test]
    fn command_lines_clear_the_environment_and_carry_the_timeout() {
        let cmd = NodeCommand {
            argv: vec!["sh".into(), "-c".into(), "echo \"$A\"".into()],
            env: vec![("A".into(), "x 'y' $z".into())],
            cwd: Some("/tmp/a dir".into()),
            ..Default::default()
        };
        let line = command_line(&cmd, Duration::from_millis(1500)).unwrap();
        assert_eq!(
            line,
            format!("cd '/tmp/a dir' && exec timeout -k 2 1.500 env -i 'PATH={COMMAND_PATH}' 'A=x '\\''y'\\'' $z' 'sh' '-c' 'echo \"$A\"'")
        );
        // Run it locally through a shell, the way sshd would.
        let mut cmd = cmd;
        cmd.cwd = Some("/".into());
        let line = command_line(&cmd, Duration::from_secs(5)).unwrap();
        let out = std::process::Command::new("/bin/sh").arg("-c").arg(&line).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "x 'y' $z\n");
    }

    #[test]
    fn what_a_shell_string_cannot_carry_is_refused() {
        let with = |argv: &[&str], env: &[(&str, &str)]| NodeCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        for cmd in [
            with(&[], &[]),
            with(&[""], &[]),
            with(&["A=B"], &[]),
            with(&["echo", "nul\0"], &[]),
            with(&["true"], &[("", "v")]),
            with(&["true"], &[("A=B", "v")]),
            with(&["true"], &[("A", "nul\0")]),
        ] {
            let err = command_line(&cmd, Duration::from_secs(1)).unwrap_err();
            assert_eq!(err.kind, NodeErrorKind::InvalidInput, "{cmd:?}");
        }
    }
}
