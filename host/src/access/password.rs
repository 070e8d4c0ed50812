//! Passwords: hashed with argon2id (its default parameters, a random salt; the PHC string is
//! what is stored) and checked against that hash. argon2's check compares in constant time;
//! [`verify`] also spends the same work on a user without a password or an unknown user, so the
//! time taken does not tell whether a name exists.

use std::sync::LazyLock;

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};

/// The shortest password accepted, in characters.
pub const MIN_CHARS: usize = 12;
/// The longest password accepted, in bytes (bounds the work of a hash).
pub const MAX_BYTES: usize = 1024;

/// A password that cannot be accepted, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    #[error("a password needs at least {MIN_CHARS} characters")]
    TooShort,
    #[error("a password may have at most {MAX_BYTES} bytes")]
    TooLong,
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

/// Checks `password` against the rules and hashes it: the PHC string to store. Slow on purpose
/// (tens of milliseconds): call it off the async runtime's workers.
pub fn hash(password: &str) -> Result<String, PasswordError> {
    if password.len() > MAX_BYTES {
        return Err(PasswordError::TooLong);
    }
    if password.chars().count() < MIN_CHARS {
        return Err(PasswordError::TooShort);
    }
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// A hash of no one's password, checked instead when there is none to check.
static DECOY: LazyLock<String> = LazyLock::new(|| {
    Argon2::default()
        .hash_password(b"a password that no user has, hashed once")
        .map(|h| h.to_string())
        .unwrap_or_default()
});

/// Whether `password` matches `stored` (a PHC string). `None` (an unknown user, or one
/// without a password) checks against a decoy and answers `false`, taking as long as a check.
pub fn verify(password: &str, stored: Option<&str>) -> bool {
    let (against, real) = match stored {
        Some(stored) => (stored, true),
        None => (DECOY.as_str(), false),
    };
    let Ok(parsed) = PasswordHash::new(against) else {
        return false;
    };
    let matches = password.len() <= MAX_BYTES && Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok();
    real && matches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_checks_its_password_and_no_other() {
        let stored = hash("correct horse battery").unwrap();
        assert!(stored.starts_with("$argon2id$"), "{stored}");
        assert!(!stored.contains("correct horse"));
        assert!(verify("correct horse battery", Some(&stored)));
        assert!(!verify("correct horse batterY", Some(&stored)));
        assert!(!verify("correct horse battery", None));
        assert!(!verify("anything", Some("not a phc string")));
        assert_eq!(hash("short"), Err(PasswordError::TooShort));
        assert_eq!(hash(&"x".repeat(MAX_BYTES + 1)), Err(PasswordError::TooLong));
    }
}
