//! The sha256 digest that addresses every plugin artifact.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A sha256 digest, written `sha256:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

#[derive(Debug, thiserror::Error)]
#[error("`{input}` is not a digest: expected `sha256:` followed by 64 lowercase hex digits")]
pub struct DigestError {
    input: String,
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// The digest of `parts` one after another, as if concatenated (without concatenating them).
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        Digest(hasher.finalize().into())
    }

    /// The 64 hex digits, without the `sha256:` prefix (used as a file name).
    pub fn hex(&self) -> String {
        self.text().as_str()[PREFIX.len()..].to_string()
    }

    /// `sha256:<64 hex digits>` as bytes, without allocating: a digest is written as text for
    /// every state a scheduler stores, and `hex::encode` goes a char at a time.
    fn text(&self) -> TextBuf {
        let mut out = [0u8; PREFIX.len() + 64];
        out[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        hex::encode_to_slice(self.0, &mut out[PREFIX.len()..]).expect("64 hex digits fit");
        TextBuf(out)
    }

    pub fn from_hex(hex_digits: &str) -> Result<Digest, DigestError> {
        let err = || DigestError {
            input: hex_digits.chars().take(100).collect(),
        };
        if hex_digits.len() != 64 || !hex_digits.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
            return Err(err());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut out).map_err(|_| err())?;
        Ok(Digest(out))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A short form for logs and progress lines: `sha256:0123abcd…`.
    pub fn short(&self) -> String {
        format!("sha256:{}", &self.hex()[..12])
    }
}

const PREFIX: &str = "sha256:";

/// A digest's text, on the stack.
struct TextBuf([u8; PREFIX.len() + 64]);

impl TextBuf {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("ASCII")
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text().as_str())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("sha256:") {
            Some(hex_digits) => Digest::from_hex(hex_digits).map_err(|_| DigestError {
                input: s.chars().take(100).collect(),
            }),
            None => Err(DigestError {
                input: s.chars().take(100).collect(),
            }),
        }
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.to_string(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        for bad in [
            "",
            "sha256:",
            "md5:abc",
            "sha256:../../etc/passwd",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            let err = bad.parse::<Digest>().unwrap_err();
            assert!(err.to_string().contains("is not a digest"), "{bad}");
        }
    }
}
