//! The service catalog: documents validated before they are filed, filed once, read back verified;
//! locally and over HTTP through the real client.

use orc_manifest::{Digest, PluginKind};
use orc_registry::server::router;
use orc_registry::{Client, Registry, RegistryError, Store, StoreOptions};
use serde_json::{Value, json};

use crate::{EMPTY_COMPONENT, manifest, plugin};

/// A store holding one automator and one adaptor plugin; their digests.
fn store_with_plugins() -> (tempfile::TempDir, Store, Digest, Digest) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("reg"), StoreOptions::default()).unwrap();
    let mut m = manifest("redis", "1.0.0", "an automator");
    m.kind = PluginKind::Automator;
    m.world = PluginKind::Automator.world();
    m.resource_types.clear();
    let automator = store
        .publish(&orc_manifest::embed(EMPTY_COMPONENT, &m).unwrap())
        .unwrap()
        .entry
        .digest;
    let adaptor = store.publish(&plugin("file", "1.0.0", "files")).unwrap().entry.digest;
    (dir, store, automator, adaptor)
}

fn document(automator: &Digest) -> Value {
    json!({
        "name": "redis", "version": "1.0.0", "description": "a key-value store",
        "automator": automator.to_string(),
        "config_schema": {"type": "object", "properties": {"maxmemory_mb": {"type": "integer", "minimum": 1}}},
        "ports": [{"name": "kv", "port": 6379}],
        "interfaces": [{
            "name": "kv", "role": "provides", "port": "kv", "allow_multiple": true, "max_connections": 8,
            "versions": [{"version": "1.0.0", "schema": {"type": "object", "required": ["op"]}}]
        }]
    })
}

/// A change made to a good document.
type Change = Box<dyn Fn(&mut Value)>;

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[test]
fn a_service_version_is_filed_once_and_read_back_verified() {
    let (_dir, store, automator, _) = store_with_plugins();
    let doc = document(&automator);
    let first = store.publish_service(&bytes(&doc)).unwrap();
    assert!(first.created);
    assert_eq!(first.entry.reference(), "redis@1.0.0");
    assert_eq!(first.entry.digest, Digest::of(&bytes(&doc)));
    assert_eq!(first.entry.automator, automator);
    // The same bytes again: nothing new.
    let again = store.publish_service(&bytes(&doc)).unwrap();
    assert!(!again.created);
    assert_eq!(again.entry, first.entry);
    // Other bytes under the same name and version: refused, the first stays.
    let mut other = doc.clone();
    other["description"] = json!("something else");
    match store.publish_service(&bytes(&other)) {
        Err(RegistryError::VersionTaken { existing, .. }) => assert_eq!(existing, first.entry.digest),
        other => panic!("expected version_taken, got {other:?}"),
    }
    let mut newer = doc.clone();
    newer["version"] = json!("1.10.0");
    store.publish_service(&bytes(&newer)).unwrap();
    newer["version"] = json!("1.2.0");
    store.publish_service(&bytes(&newer)).unwrap();
    let versions: Vec<String> = store.service_versions("redis").unwrap().into_iter().map(|e| e.version).collect();
    assert_eq!(versions, ["1.0.0", "1.2.0", "1.10.0"]);
    assert_eq!(store.list_services().unwrap().len(), 3);
    // Plugins and services are separate indexes.
    assert_eq!(store.list().unwrap().len(), 2);
    let entry = store.resolve_service("redis", "1.0.0").unwrap();
    let read = store.service_document(&entry).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap()["interfaces"][0]["max_connections"], json!(8));
    assert!(matches!(
        store.resolve_service("redis", "9.9.9"),
        Err(RegistryError::NotFound { .. })
    ));
    assert!(matches!(store.resolve_service("../x", "1.0.0"), Err(RegistryError::InvalidName(_))));
    // A document tampered with on disk is refused when read.
    let blob = store.root().join("blobs/sha256").join(entry.digest.hex());
    std::fs::write(&blob, bytes(&other)).unwrap();
    assert!(matches!(store.service_document(&entry), Err(RegistryError::Corrupt { .. })));
}

#[test]
fn each_bad_document_is_refused_naming_its_field() {
    let (_dir, store, automator, adaptor) = store_with_plugins();
    let unknown = Digest::of(b"no such plugin");
    let cases: Vec<(&str, Change, &str, &str)> = vec![
        (
            "unknown automator",
            Box::new(move |d| d["automator"] = json!(unknown.to_string())),
            "automator",
            "no plugin published",
        ),
        (
            "an adaptor",
            Box::new(move |d| d["automator"] = json!(adaptor.to_string())),
            "automator",
            "not an automator",
        ),
        (
            "invalid schema",
            Box::new(|d| d["config_schema"] = json!({"type": 12})),
            "config_schema",
            "not a valid JSON Schema",
        ),
        (
            "a reference out of the document",
            Box::new(|d| d["interfaces"][0]["versions"][0]["schema"] = json!({"$ref": "http://127.0.0.1:9/schema.json"})),
            "interfaces[0].versions[0].schema",
            "not a valid JSON Schema",
        ),
        (
            "duplicate interface",
            Box::new(|d| {
                let copy = d["interfaces"][0].clone();
                d["interfaces"].as_array_mut().unwrap().push(copy);
            }),
            "interfaces[1].name",
            "duplicate interface `kv`",
        ),
        (
            "cardinality 0",
            Box::new(|d| d["interfaces"][0]["max_connections"] = json!(0)),
            "interfaces[0].max_connections",
            "at least 1",
        ),
        (
            "a port of no service port",
            Box::new(|d| d["interfaces"][0]["port"] = json!("web")),
            "interfaces[0].port",
            "`web`",
        ),
        ("an unknown field", Box::new(|d| d["colour"] = json!("red")), "service", "colour"),
        ("a bad name", Box::new(|d| d["name"] = json!("../etc")), "name", "service name"),
    ];
    for (what, change, path, words) in cases {
        let mut doc = document(&automator);
        change(&mut doc);
        match store.publish_service(&bytes(&doc)) {
            Err(RegistryError::InvalidService { path: p, message }) => {
                assert_eq!(p, path, "{what}: {message}");
                assert!(message.contains(words), "{what}: {message}");
            }
            other => panic!("{what}: expected invalid_service, got {other:?}"),
        }
    }
    match store.publish_service(b"name = 'toml'") {
        Err(RegistryError::InvalidService { path, message }) => {
            assert!(path == "service" && message.contains("not a JSON document"), "{message}")
        }
        other => panic!("expected invalid_service, got {other:?}"),
    }
    // Nothing refused was filed, and no blob was kept for it.
    assert!(store.list_services().unwrap().is_empty());
    assert_eq!(crate::file_names(&store.root().join("blobs/sha256")).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_is_served_and_refusals_keep_their_path() {
    let (_dir, store, automator, _) = store_with_plugins();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = router(store.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let registry = Registry::Remote(Client::new(&url).unwrap());
    let published = registry.publish_service(bytes(&document(&automator))).await.unwrap();
    assert!(published.created);
    assert!(!registry.publish_service(bytes(&document(&automator))).await.unwrap().created);
    let listed = registry.list_services().await.unwrap();
    assert_eq!(listed, vec![published.entry.clone()]);
    assert_eq!(registry.service_versions("redis").await.unwrap(), listed);
    let entry = registry.resolve_service("redis", "1.0.0").await.unwrap();
    let doc = registry.service_document(&entry).await.unwrap();
    assert_eq!(doc.reference(), "redis@1.0.0");
    let mut bad = document(&automator);
    bad["interfaces"][0]["max_connections"] = json!(0);
    bad["version"] = json!("2.0.0");
    match registry.publish_service(bytes(&bad)).await {
        Err(RegistryError::InvalidService { path, .. }) => assert_eq!(path, "interfaces[0].max_connections"),
        other => panic!("expected invalid_service, got {other:?}"),
    }
    let raw = reqwest::Client::new().get(format!("{url}/v1/services/nope")).send().await.unwrap();
    assert_eq!(raw.status().as_u16(), 404);
    let body: Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
    assert!(body["message"].as_str().unwrap().contains("service `nope`"), "{body}");
}
