//! tmp
use anyhow::Result;
use orc_manifest::PluginKind;
use std::path::PathBuf;
pub fn new(_k: PluginKind, _n: &str, _d: Option<PathBuf>) -> Result<()> { anyhow::bail!("x") }
