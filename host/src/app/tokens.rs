//! Admin tokens: created with the secret shown once (only its sha256 is stored), listed,
//! deleted (never the last), and looked up for authentication.

use super::{App, EnvError};
use crate::store::{AdminToken, StoreError, TokenId, hash_token};

impl App {
    /// Creates the first admin token when the store has none; returns it (the store keeps only
    /// its sha256).
    pub(crate) async fn ensure_admin_token(&self) -> Result<Option<String>, StoreError> {
        if self.store.count_admin_tokens().await? > 0 {
            return Ok(None);
        }
        Ok(Some(self.new_admin_token().await?.1))
    }

    /// A new admin token: its record and the secret, which only its creator ever sees.
    pub async fn create_admin_token(&self) -> Result<(AdminToken, String), EnvError> {
        Ok(self.new_admin_token().await?)
    }

    async fn new_admin_token(&self) -> Result<(AdminToken, String), StoreError> {
        // Two v4 UUIDs: 244 bits from the operating system's random source.
        let token = format!("orc_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let record = self.store.insert_admin_token(&hash_token(&token)).await?;
        Ok((record, token))
    }

    pub async fn admin_tokens(&self) -> Result<Vec<AdminToken>, EnvError> {
        Ok(self.store.list_admin_tokens().await?)
    }

    /// Revokes a token at once; the last one is kept (the host would be locked).
    pub async fn delete_admin_token(&self, id: &TokenId) -> Result<(), EnvError> {
        Ok(self.store.delete_admin_token_keeping_one(id).await?)
    }

    /// Whether `token` is one of the admin tokens.
    pub async fn is_admin_token(&self, token: &str) -> Result<bool, EnvError> {
        Ok(self.store.find_admin_token(&hash_token(token)).await?.is_some())
    }
}
