//! The kinds of names orc accepts, each rule written once: plugins and resource types,
//! environments, nodes, services (and the clusters and templates named like them), host-held
//! secrets. Names become path components, parts of resource keys or environment variable values,
//! so every kind is plain ASCII; [`NameRule::check`] says which part of its rule a name breaks.

/// What a name must start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// A lowercase letter.
    Letter,
    /// A letter or a digit.
    LetterOrDigit,
    /// Any character the rule allows.
    Any,
}

/// One kind of name: its length, its characters and its first character.
#[derive(Debug, Clone, Copy)]
pub struct NameRule {
    /// What the name names, for messages (`environment`, `node`).
    pub kind: &'static str,
    pub max_len: usize,
    /// Uppercase letters are allowed (lowercase and digits always are).
    pub uppercase: bool,
    /// The punctuation allowed besides letters and digits.
    pub punctuation: &'static [u8],
    pub first: First,
}

/// Plugins and resource types: 1–64 of `a-z 0-9 - _`, starting with a letter.
pub const PLUGIN: NameRule = NameRule {
    kind: "plugin",
    max_len: 64,
    uppercase: false,
    punctuation: b"-_",
    first: First::Letter,
};

/// Environments (they name directories on the host): 1–63 of `a-z 0-9 - _`, starting with a
/// letter or digit.
pub const ENVIRONMENT: NameRule = NameRule {
    kind: "environment",
    max_len: 63,
    uppercase: false,
    punctuation: b"-_",
    first: First::LetterOrDigit,
};

/// Nodes (they appear in resource ids and may be host names): 1–63 of `a-z 0-9 - _ .`, starting
/// with a letter or digit.
pub const NODE: NameRule = NameRule {
    kind: "node",
    max_len: 63,
    uppercase: false,
    punctuation: b"-_.",
    first: First::LetterOrDigit,
};

/// Services of a cluster template, and clusters and templates (they become parts of resource
/// keys and of environment variable values): 1–63 of `a-z 0-9 - _`, starting with a letter.
pub const SERVICE: NameRule = NameRule {
    kind: "service",
    max_len: 63,
    uppercase: false,
    punctuation: b"-_",
    first: First::Letter,
};

/// Host-held secrets: 1–64 of `A-Z a-z 0-9 - _ .`.
pub const SECRET: NameRule = NameRule {
    kind: "secret",
    max_len: 64,
    uppercase: true,
    punctuation: b"-_.",
    first: First::Any,
};

/// Which part of its rule a name breaks; the message names the rule, not the name (callers
/// quote the name, clipped, where they say what it was for).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NameError(pub String);

impl NameRule {
    /// Checks `name` against the rule.
    pub fn check(&self, name: &str) -> Result<(), NameError> {
        if name.is_empty() || name.len() > self.max_len {
            return Err(NameError(format!("it must have 1 to {} characters", self.max_len)));
        }
        let allowed = |b: u8| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (self.uppercase && b.is_ascii_uppercase()) || self.punctuation.contains(&b)
        };
        if !name.bytes().all(allowed) {
            return Err(NameError(format!("use {}", self.alphabet())));
        }
        let first = name.as_bytes()[0];
        match self.first {
            First::Letter if !first.is_ascii_lowercase() => Err(NameError("it must start with a lowercase letter".into())),
            First::LetterOrDigit if !first.is_ascii_alphanumeric() => Err(NameError("it must start with a letter or digit".into())),
            _ => Ok(()),
        }
    }

    /// Whether `name` follows the rule.
    pub fn accepts(&self, name: &str) -> bool {
        self.check(name).is_ok()
    }

    /// The whole rule in words, for messages that state it up front.
    pub fn describe(&self) -> String {
        let first = match self.first {
            First::Letter => ", starting with a lowercase letter",
            First::LetterOrDigit => ", starting with a letter or digit",
            First::Any => "",
        };
        format!("1 to {} of {}{first}", self.max_len, self.alphabet())
    }

    fn alphabet(&self) -> String {
        let letters = if self.uppercase { "letters" } else { "lowercase letters" };
        let marks: Vec<String> = self.punctuation.iter().map(|b| format!("`{}`", *b as char)).collect();
        format!("{letters}, digits and {}", marks.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_keeps_its_rule() {
        for rule in [PLUGIN, ENVIRONMENT, NODE, SERVICE, SECRET] {
            assert!(rule.accepts("a"), "{}", rule.kind);
            assert!(rule.accepts(&"a".repeat(rule.max_len)), "{}", rule.kind);
            assert!(!rule.accepts(&"a".repeat(rule.max_len + 1)), "{}", rule.kind);
            assert!(!rule.accepts(""), "{}", rule.kind);
            assert!(!rule.accepts("a b"), "{}", rule.kind);
            assert!(!rule.accepts("a/b"), "{}", rule.kind);
            assert!(!rule.accepts("é"), "{}", rule.kind);
        }
        assert!(ENVIRONMENT.accepts("1prod") && NODE.accepts("1web") && !SERVICE.accepts("1redis") && !PLUGIN.accepts("1file"));
        assert!(NODE.accepts("web1.example") && !ENVIRONMENT.accepts("a.b") && SECRET.accepts("API.token"));
        assert!(!PLUGIN.accepts("File") && SECRET.accepts("Token") && SECRET.accepts("-x") && !NODE.accepts("-x"));
        assert!(!ENVIRONMENT.accepts("_x") && !SERVICE.accepts("_x"));
    }

    #[test]
    fn messages_say_which_part_is_broken() {
        assert_eq!(ENVIRONMENT.check("").unwrap_err().0, "it must have 1 to 63 characters");
        assert_eq!(NODE.check("a b").unwrap_err().0, "use lowercase letters, digits and `-`, `_`, `.`");
        assert_eq!(SERVICE.check("9x").unwrap_err().0, "it must start with a lowercase letter");
        assert_eq!(SECRET.describe(), "1 to 64 of letters, digits and `-`, `_`, `.`");
    }
}
