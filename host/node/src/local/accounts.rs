//! The local node's users and groups: the host's own (`/etc/passwd`, `/etc/group`), so its
//! owners are real uids and gids, and a plugin's names are resolved against them.

use crate::{NodeError, NodeErrorKind, check_account_name};

/// Where the host keeps its users and groups.
pub(super) const PASSWD: &str = "/etc/passwd";
pub(super) const GROUP: &str = "/etc/group";

/// `(name, id)` of every entry of a passwd- or group-format file (`name:x:id:…`).
fn accounts(file: &str) -> Vec<(String, u32)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect()
}

pub(super) fn account_name(file: &str, id: u32) -> Option<String> {
    accounts(file).into_iter().find(|(_, i)| *i == id).map(|(n, _)| n)
}

/// A name looked up in `file`, or a numeric id as is.
pub(super) fn account_id(file: &str, what: &str, name: &str) -> Result<u32, NodeError> {
    check_account_name(what, name)?;
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    accounts(file)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, id)| id)
        .ok_or_else(|| NodeError::new(NodeErrorKind::InvalidInput, format!("unknown {what} `{name}` on the local node")))
}
