//! Real databases for the store tests: a SQLite file in a temporary directory, and a fresh
//! database on the PostgreSQL cluster of the test run (`orc_tests::pg`).

use anyhow::Result;
use orc_host::store::{SQLITE_FILE, Store};
use tempfile::TempDir;

/// A store under test and how to reach its database again.
pub struct TestDb {
    pub store: Store,
    /// What `Store::connect` takes to open the same database again.
    pub location: String,
    _dir: Option<TempDir>,
}

impl TestDb {
    /// A second, independent connection pool to the same database (runs the migrations again).
    pub async fn reopen(&self) -> Result<Store> {
        Ok(Store::connect(&self.location).await?)
    }
}

pub async fn sqlite() -> Result<TestDb> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("data").join(SQLITE_FILE);
    let store = Store::open_sqlite(&path).await?;
    Ok(TestDb {
        store,
        location: format!("sqlite:{}", path.display()),
        _dir: Some(dir),
    })
}

pub async fn postgres() -> Result<TestDb> {
    let location = orc_tests::pg::fresh_database().await?;
    let store = Store::connect(&location).await?;
    Ok(TestDb {
        store,
        location,
        _dir: None,
    })
}

/// A small seeded generator (xorshift64*): the seed is printed by the tests that use it, so
/// that a failing mix of choices can be told apart from another.
pub struct Dice(pub u64);

impl Dice {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}
