//! `NodeFacts`: what a node is (OS, kernel, architecture, CPUs, memory, hostname), gathered with
//! one command and shown beside the node.

use serde::{Deserialize, Serialize};

/// The script behind [`NodeFacts`]: one line per fact, then `/etc/os-release` after a marker.
pub(crate) const SCRIPT: &str = "uname -s; uname -r; uname -m; uname -n; \
     (nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 0); \
     (sed -n 's/^MemTotal:[[:space:]]*\\([0-9]*\\).*/\\1/p' /proc/meminfo 2>/dev/null | grep . || echo 0); \
     echo ---os-release---; cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null; true";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// `ID` of os-release (`debian`, `ubuntu`, `alpine`), if the node has one.
    pub os_id: Option<String>,
    /// `PRETTY_NAME` (or `NAME`) of os-release.
    pub os_name: Option<String>,
    /// `VERSION_ID` of os-release.
    pub os_version: Option<String>,
    /// Kernel name (`uname -s`).
    pub kernel: String,
    /// Kernel release (`uname -r`).
    pub kernel_release: String,
    /// Machine architecture (`uname -m`).
    pub architecture: String,
    pub hostname: String,
    /// Online CPUs.
    pub cpus: u32,
    /// Total memory.
    pub memory_bytes: u64,
}

impl NodeFacts {
    /// Parses the output of [`SCRIPT`].
    pub(crate) fn parse(text: &str) -> Option<NodeFacts> {
        let (head, os_release) = text.split_once("---os-release---\n").unwrap_or((text, ""));
        let mut lines = head.lines().map(str::trim);
        let kernel = lines.next()?.to_string();
        let kernel_release = lines.next()?.to_string();
        let architecture = lines.next()?.to_string();
        let hostname = lines.next()?.to_string();
        let cpus = lines.next()?.parse().unwrap_or(0);
        let memory_kib: u64 = lines.next()?.parse().unwrap_or(0);
        let mut os = std::collections::HashMap::new();
        for line in os_release.lines() {
            if let Some((k, v)) = line.trim().split_once('=') {
                os.insert(k.to_string(), unquote(v));
            }
        }
        Some(NodeFacts {
            os_id: os.get("ID").cloned(),
            os_name: os.get("PRETTY_NAME").or(os.get("NAME")).cloned(),
            os_version: os.get("VERSION_ID").cloned(),
            kernel,
            kernel_release,
            architecture,
            hostname,
            cpus,
            memory_bytes: memory_kib * 1024,
        })
    }
}

/// os-release values are shell-style: optionally in `"` or `'`, with `\` escapes inside `"`.
fn unquote(v: &str) -> String {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return inner.to_string();
    }
    let inner = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_script_output() {
        let text = "Linux\n6.1.0-28-amd64\nx86_64\nweb1\n2\n8048576\n---os-release---\n\
                    PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME='Debian'\nVERSION_ID=\"12\"\nID=debian\n";
        let f = NodeFacts::parse(text).unwrap();
        assert_eq!(f.os_id.as_deref(), Some("debian"));
        assert_eq!(f.os_name.as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(f.os_version.as_deref(), Some("12"));
        assert_eq!(
            (f.kernel.as_str(), f.architecture.as_str(), f.hostname.as_str()),
            ("Linux", "x86_64", "web1")
        );
        assert_eq!((f.cpus, f.memory_bytes), (2, 8048576 * 1024));
        assert!(NodeFacts::parse("Linux\n").is_none());
    }

    #[test]
    fn the_script_runs_here() {
        let out = std::process::Command::new("/bin/sh").arg("-c").arg(SCRIPT).output().unwrap();
        let f = NodeFacts::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert_eq!(f.kernel, "Linux");
        assert!(f.cpus >= 1 && f.memory_bytes > 0, "{f:?}");
    }
}
