//! `orc-plugin new`: a plugin crate that builds as is, anywhere. It depends on the SDK this binary
//! carries (written out by [`crate::vendor`]) by path, pins wit-bindgen through it, stands alone
//! as its own workspace, and sets the release profile plugins want (small, LTO, abort on panic).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use orc_manifest::PluginKind;

pub fn new(kind: PluginKind, name: &str, dir: Option<PathBuf>) -> Result<()> {
    orc_manifest::validate_name(name)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("{} already exists and is not empty", dir.display());
    }
    let sdk = crate::vendor::ensure_sdk()?;
    write(&dir.join("Cargo.toml"), &cargo_toml(kind, name, &sdk))?;
    write(&dir.join("src/lib.rs"), &lib_rs(kind, name))?;
    write(&dir.join(".gitignore"), "/target\n")?;
    println!("created {kind} plugin `{name}` in {}", dir.display());
    println!("next: orc-plugin build {}", dir.display());
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(path.parent().expect("file has a parent")).with_context(|| format!("creating {}", path.display()))?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn cargo_toml(kind: PluginKind, name: &str, sdk: &Path) -> String {
    let (capabilities, resource_types) = match kind {
        PluginKind::Adaptor => (r#"["node-files"]"#, format!("[{name:?}]")),
        PluginKind::Solver => ("[]", "[]".to_string()),
        // `kv`: the SDK's default `check` remembers performed tasks there.
        PluginKind::Automator => (r#"["node-commands", "kv"]"#, "[]".to_string()),
    };
    let sdk = sdk.display().to_string();
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
description = "An orc {kind}"
publish = false

# A plugin is a component: a cdylib built for wasm32-wasip2 by `orc-plugin build`.
[lib]
crate-type = ["cdylib"]

[dependencies]
orc-sdk = {{ path = {sdk:?}, features = ["{kind}"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

# What the host reads: the kind, the host capabilities the plugin asks for (log is always
# granted; kv, node-files, node-commands and http must be granted by the environment), the
# resource types it handles.
[package.metadata.orc]
kind = "{kind}"
capabilities = {capabilities}
resource-types = {resource_types}

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
panic = "abort"

# A plugin crate is its own workspace, wherever it is created.
[workspace]
"#
    )
}

fn lib_rs(kind: PluginKind, name: &str) -> String {
    let ty = type_name(name);
    match kind {
        PluginKind::Adaptor => format!(
            r#"//! `{name}`: an orc adaptor. A resource `{name}[NODE,/path]` is a text file holding a greeting.

use orc_sdk::node::{{self, Mode}};
use orc_sdk::{{Adaptor, Change, Changes, Result, Target}};
use serde::{{Deserialize, Serialize}};

pub struct {ty};

orc_sdk::export!(adaptor: {ty});

/// The desired state, as the intent gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {{
    greeting: String,
}}

/// The state read from the node.
#[derive(Serialize, Deserialize)]
pub struct Current {{
    greeting: String,
}}

impl Adaptor for {ty} {{
    type Desired = Desired;
    type Current = Current;

    fn read(target: &Target, _desired: &Desired) -> Result<Option<Current>> {{
        let content = node::read_file(&target.node, &target.key)?;
        Ok(content.map(|bytes| Current {{ greeting: String::from_utf8_lossy(&bytes).trim_end().to_string() }}))
    }}

    fn diff(_target: &Target, desired: &Desired, current: Option<&Current>) -> Result<Vec<Change>> {{
        Ok(Changes::new().compare("greeting", current.map(|c| &c.greeting), &desired.greeting).into_vec())
    }}

    fn apply(target: &Target, desired: &Desired, _current: Option<&Current>, _changes: &[Change]) -> Result<Vec<String>> {{
        let text = format!("{{}}\n", desired.greeting);
        node::write_file(&target.node, &target.key, text.as_bytes(), Mode::new(0o644))?;
        orc_sdk::info!("wrote {{}} bytes to {{}}", text.len(), target.key);
        Ok(vec![format!("wrote {{}}", target.key)])
    }}

    fn delete(target: &Target, _current: &Current) -> Result<Vec<String>> {{
        node::remove(&target.node, &target.key, false)?;
        Ok(vec![format!("removed {{}}", target.key)])
    }}
}}
"#
        ),
        PluginKind::Solver => format!(
            r#"//! `{name}`: an orc solver. Spreads the template's services round-robin over `size` nodes.

use orc_sdk::{{LayoutRequest, Placement, SolveError, Solver}};
use serde::Deserialize;

pub struct {ty};

orc_sdk::export!(solver: {ty});

#[derive(Deserialize)]
pub struct Template {{
    services: Vec<String>,
}}

impl Solver for {ty} {{
    type Template = Template;

    fn solve(request: LayoutRequest<Template>) -> Result<Vec<Placement>, SolveError> {{
        let size = request.size as usize;
        if request.nodes.len() < size {{
            return Err(SolveError::no_valid_layout(
                "size",
                format!("{{}} nodes requested but only {{}} available", size, request.nodes.len()),
            ));
        }}
        let mut layout: Vec<Placement> = request.nodes.iter().take(size).map(|n| Placement::new(n.name.clone(), Vec::<String>::new())).collect();
        for (i, service) in request.template.services.iter().enumerate() {{
            if let Some(p) = layout.get_mut(i % size.max(1)) {{
                p.services.push(service.clone());
            }}
        }}
        Ok(layout)
    }}
}}
"#
        ),
        PluginKind::Automator => format!(
            r#"//! `{name}`: an orc automator. Runs the script the service's configuration gives for an action.

use std::collections::BTreeMap;

use orc_sdk::node::{{self, Command}};
use orc_sdk::{{Automator, Outcome, Result, Task}};
use serde::Deserialize;

pub struct {ty};

orc_sdk::export!(automator: {ty});

#[derive(Deserialize)]
pub struct Config {{
    /// Action name (install, configure, start, ...) -> shell script.
    #[serde(default)]
    scripts: BTreeMap<String, String>,
}}

// `check` is the SDK's default: the task holds once `perform` succeeded with the same
// configuration and layout (a record in the plugin's kv). Implement `check` to look at the node
// instead, e.g. run a status command, and report what differs.
impl Automator for {ty} {{
    type Config = Config;

    fn perform(task: Task<Config>) -> Result<Outcome> {{
        let Some(script) = task.config.scripts.get(task.action.as_str()) else {{
            return Ok(Outcome::new().message(format!("nothing to do for {{}}", task.action.as_str())));
        }};
        let command = Command::new("sh").arg("-c").arg(script.clone()).env("ORC_SERVICE", task.service.clone());
        let output = node::run(&task.node, &command)?.check(&command)?;
        Ok(Outcome::new().message(output.stdout_text()))
    }}
}}
"#
        ),
    }
}

/// `my-plugin` → `MyPlugin`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}
