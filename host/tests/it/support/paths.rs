//! Building API paths in tests.

/// Percent-encodes a resource id (`file[local,/etc/motd]`) for one path segment.
pub fn encode(id: &str) -> String {
    id.chars()
        .map(|c| match c {
            '[' => "%5B".to_string(),
            ']' => "%5D".to_string(),
            ',' => "%2C".to_string(),
            '/' => "%2F".to_string(),
            c => c.to_string(),
        })
        .collect()
}
