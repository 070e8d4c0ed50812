//! The web console in a real browser: a real `orc-host` server (SQLite) and Debian's headless
//! Chromium driven through chromedriver. Each test saves a screenshot of the page it checked
//! under `target/console-screenshots/`.

mod browser;
mod headers;

use std::time::Duration;

use browser::Browser;
use orc_host::store::Backend;
use orc_tests::{sshd, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::host::Host;

const QUICKSTART: &str = include_str!("../../../intents/quickstart.json");

/// The console's root (`base` is the API's).
fn console(host: &Host) -> String {
    host.base.trim_end_matches("/api/v1").to_string()
}

/// Signs the browser in with the host's admin token.
async fn sign_in(browser: &Browser, host: &Host) {
    browser.goto(&format!("{}/sign-in", console(host))).await;
    browser.fill("#token", &host.token).await;
    browser.click("#sign-in").await;
    browser.wait_for_path("/environments").await;
}

/// Opens environment `env`'s live stream with the session's `cookie`, signs the browser out, and
/// checks that the stream ends with the session.
async fn sign_out_ending_a_live_stream(browser: &Browser, host: &Host, cookie: &str, env: &str) {
    let live = bare_client()
        .get(format!("{}/environments/{env}/live", console(host)))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let live_body = tokio::spawn(live.text());
    browser.click("header button[type=submit]").await;
    browser.wait_for_path("/sign-in").await;
    tokio::time::timeout(Duration::from_secs(10), live_body)
        .await
        .expect("the live stream ended with the session")
        .unwrap()
        .unwrap();
}

/// A client that keeps no cookies and follows no redirects: what it sends is what we give it.
fn bare_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_refuses_a_wrong_token_and_takes_the_right_one() {
    let host = Host::start(Backend::Sqlite).await;
    let browser = Browser::start().await;
    browser.goto(&format!("{}/environments", console(&host))).await;
    // Not signed in: sent to sign in.
    assert_eq!(browser.path().await, "/sign-in");
    browser.fill("#token", "orc_not-a-token").await;
    browser.click("#sign-in").await;
    browser
        .wait_for_text("that token is not valid", false, Duration::from_secs(20))
        .await;
    browser.screenshot("sign-in-refused").await;

    browser.fill("#token", &host.token).await;
    browser.click("#sign-in").await;
    browser.wait_for_path("/environments").await;
    let text = browser.page_text().await;
    assert!(text.contains("Signed in as admin"), "{text}");

    // Signing out ends what follows the session (a page's live stream), though the token it
    // signed in with stays valid.
    host.create_environment_retrying("dev", 60).await;
    let cookie = browser.client.get_named_cookie("orc_session").await.unwrap();
    sign_out_ending_a_live_stream(&browser, &host, &format!("orc_session={}", cookie.value()), "dev").await;
    let (status, _) = host.get("/environments").await;
    assert_eq!(status, StatusCode::OK, "the token itself still works");
    browser.close().await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_is_created_deployed_and_a_resource_shows_its_action_log() {
    let host = Host::start(Backend::Sqlite).await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;

    // A name the API refuses: the same code and message, next to the field, nothing created.
    browser.fill("#new-environment", "Not A Name!").await;
    browser.click("#create-environment").await;
    browser.wait_for("div.error").await;
    let text = browser.page_text().await;
    assert!(text.contains("invalid_name") || text.contains("invalid"), "{text}");
    assert!(text.contains("Not A Name!"), "the refused name is kept in the field's page: {text}");
    let (_, list) = host.get("/environments").await;
    assert_eq!(list["items"], json!([]));

    browser.fill("#new-environment", "web").await;
    browser.click("#create-environment").await;
    browser.wait_for_path("/environments/web").await;
    let (status, env) = host.get("/environments/web").await;
    assert_eq!(status, StatusCode::OK, "{env}");
    // The creation is in the audit trail, as the console's.
    let (_, audit) = host.get("/audit").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["route"] == "console:/environments" && e["environment"] == "web"),
        "{audit}"
    );

    browser.wait_until_live().await;
    let intent: Value = serde_json::from_str(QUICKSTART).unwrap();
    let (status, submitted) = host.post("/environments/web/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    // Six resources deployed, as the table and the status bar say: without reloading, the page
    // follows the environment's events.
    browser.wait_for_text("deployed 6", false, Duration::from_secs(60)).await;
    let rows = browser.text("#resources tbody").await;
    assert_eq!(rows.matches("deployed").count(), 6, "{rows}");
    browser.screenshot("environment").await;

    // Filtered on the server: files only.
    browser.goto(&format!("{}/environments/web?type=file", console(&host))).await;
    let rows = browser.text("#resources tbody").await;
    assert!(
        rows.contains("file[local,/etc/motd]") && !rows.contains("directory[local,/srv]"),
        "{rows}"
    );

    browser.click("a[href*='motd']").await;
    browser.wait_for("#status").await;
    assert_eq!(browser.text("#status").await, "deployed");
    let log = browser.text("#actions").await;
    assert!(log.contains("deploy") && log.contains("changed"), "{log}");
    assert!(
        log.contains("Welcome. This machine is managed by orc."),
        "the change's after value: {log}"
    );
    let page = browser.page_text().await;
    assert!(page.contains("\"content\""), "the desired attributes: {page}");
    assert_eq!(browser.text("#requires").await, "Requires: directory[local,/etc]");
    assert_eq!(browser.text("#dependents").await, "Waited for by: nothing");
    browser.screenshot("resource").await;
    // Its requirement's page names what waits for it, each a link.
    browser.click("#requires a").await;
    browser
        .wait_for_text("Waited for by: file[local,/etc/motd]", false, Duration::from_secs(10))
        .await;
    let dependents = browser.text("#dependents").await;
    assert!(dependents.contains("file[local,/etc/orc-secret.conf]"), "{dependents}");
    assert_eq!(browser.text("#requires").await, "Requires: nothing");
    browser.close().await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_post_is_refused() {
    let host = Host::start(Backend::Sqlite).await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;

    // Another site: a page whose form posts to the console as soon as it loads.
    let target = format!("{}/environments", console(&host));
    let page = format!(
        "<!doctype html><form id=f method=post action='{target}'><input name=name value=evil></form><script>document.getElementById('f').submit()</script>"
    );
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_addr = evil.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || std::future::ready(axum::response::Html(page.clone()))),
    );
    let served = tokio::spawn(async move { axum::serve(evil, app).await });
    browser.goto(&format!("http://{evil_addr}/")).await;
    // The page posts its form as it loads: wait for the console's answer to it.
    wait_for("the forged post to be refused", Duration::from_secs(10), async || {
        let text = browser.page_text().await;
        if text.contains("csrf_refused") || browser.path().await == "/sign-in" {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    browser.screenshot("cross-site-post-refused").await;
    let (_, list) = host.get("/environments").await;
    assert_eq!(list["items"], json!([]), "nothing was created");

    // With the session's own cookie but without the form's CSRF field, or from another
    // origin: refused all the same.
    let cookie = browser.client.get_named_cookie("orc_session").await.unwrap();
    let client = bare_client();
    let cookie_header = format!("orc_session={}", cookie.value());
    for (origin, form) in [(None, "name=evil"), (Some(format!("http://{evil_addr}")), "name=evil&_csrf=guess")] {
        let mut request = client
            .post(&target)
            .header("cookie", &cookie_header)
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let answer = request.body(form).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::FORBIDDEN);
        let body = answer.text().await.unwrap();
        assert!(body.contains("csrf_refused"), "{body}");
    }
    let (_, list) = host.get("/environments").await;
    assert_eq!(list["items"], json!([]), "nothing was created");
    served.abort();
    browser.close().await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_is_worthless_after_signing_out() {
    let host = Host::start(Backend::Sqlite).await;
    // A user with a password: signing in makes a token for the session.
    let (status, user) = host
        .post("/users", &json!({"name": "ada", "password": "correct horse battery"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    host.create_environment_retrying("dev", 60).await;
    let (status, member, _) = host
        .send_text(
            reqwest::Method::PUT,
            "/environments/dev/members/ada",
            Some(&json!({"role": "viewer"})),
        )
        .await;
    assert!(status.is_success(), "{status} {member}");
    let browser = Browser::start().await;
    browser.goto(&format!("{}/sign-in", console(&host))).await;
    browser.fill("input[name=name]", "ada").await;
    browser.fill("input[name=password]", "wrong password").await;
    browser.click("#sign-in").await;
    browser.wait_for("div.error").await;
    assert!(browser.page_text().await.contains("unauthorized"));
    browser.fill("input[name=name]", "ada").await;
    browser.fill("input[name=password]", "correct horse battery").await;
    browser.click("#sign-in").await;
    browser.wait_for_path("/environments").await;
    assert!(browser.page_text().await.contains("Signed in as ada"));
    let cookie = browser.client.get_named_cookie("orc_session").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(cookie.same_site().map(|s| s.to_string()).as_deref(), Some("Strict"));
    let cookie_header = format!("orc_session={}", cookie.value());
    let client = bare_client();
    let page = format!("{}/environments", console(&host));
    let answer = client.get(&page).header("cookie", &cookie_header).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK, "the cookie works while signed in");

    sign_out_ending_a_live_stream(&browser, &host, &cookie_header, "dev").await;
    browser.screenshot("signed-out").await;
    let answer = client.get(&page).header("cookie", &cookie_header).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER, "the old cookie no longer signs in");
    assert_eq!(answer.headers()["location"], "/sign-in");
    // The token the sign-in made for the session is revoked too (the admin sees every token).
    let (status, tokens) = host.get("/tokens").await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    let items = tokens["items"].as_array().unwrap();
    assert!(
        !items.is_empty() && items.iter().all(|t| t["description"] != "console session"),
        "{tokens}"
    );
    browser.close().await;
    host.stop().await;
}

/// The quickstart intent with `/etc/motd`'s content replaced.
fn quickstart_with_motd(motd: &str) -> Value {
    let mut intent: Value = serde_json::from_str(QUICKSTART).unwrap();
    for r in intent["resources"].as_array_mut().unwrap() {
        if r["id"] == "file[local,/etc/motd]" {
            r["attributes"]["content"] = json!(motd);
        }
    }
    intent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_submitted_compared_and_rolled_back_and_drift_is_found_and_repaired() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let motd = orc_host::app::node_root(host.data.path(), "web").join("etc/motd");
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    let base = format!("{}/environments/web", console(&host));

    // Pasted: a broken document is refused next to the field, the text kept, nothing stored.
    browser.goto(&format!("{base}/versions")).await;
    browser.fill("#intent", "{\"resources\": [").await;
    browser.click("#submit-intent").await;
    browser.wait_for("#intent-error").await;
    let refusal = browser.text("#intent-error").await;
    assert!(refusal.contains("invalid_json"), "{refusal}");
    assert_eq!(
        browser
            .client
            .find(fantoccini::Locator::Css("#intent"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap()
            .as_deref(),
        Some("{\"resources\": [")
    );
    let (_, versions) = host.get("/environments/web/intents").await;
    assert_eq!(versions["items"], json!([]));
    // Then the quickstart, pasted whole: version 1, released.
    browser.fill("#intent", QUICKSTART).await;
    browser.click("#submit-intent").await;
    browser.wait_for("#versions").await;
    let rows = browser.text("#versions").await;
    assert!(rows.contains("released") && rows.contains("admin"), "{rows}");
    let welcome = "Welcome. This machine is managed by orc.\n";
    wait_for_file(&motd, welcome).await;

    // Version 2, uploaded as a file, changes the motd; the diff of 1 and 2 shows the field
    // before and after.
    let upload = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    std::fs::write(upload.path(), quickstart_with_motd("Version two.\n").to_string()).unwrap();
    browser.goto(&format!("{base}/versions")).await;
    browser.fill("#intent", "").await;
    browser
        .client
        .find(fantoccini::Locator::Css("#intent-file"))
        .await
        .unwrap()
        .send_keys(&upload.path().display().to_string())
        .await
        .unwrap();
    browser.click("#submit-intent").await;
    browser.wait_for("tr[data-version='2']").await;
    wait_for_file(&motd, "Version two.\n").await;
    browser.goto(&format!("{base}/versions")).await;
    browser.click("#diff").await;
    browser.wait_for("#diff-summary").await;
    assert_eq!(browser.text("#diff-summary").await, "0 added, 0 removed, 1 changed, 5 unchanged");
    let changed = browser.text("#changed").await;
    assert!(
        changed.contains("file[local,/etc/motd]") && changed.contains("attributes/content"),
        "{changed}"
    );
    assert!(changed.contains("Welcome.") && changed.contains("Version two."), "{changed}");
    browser.screenshot("version-diff").await;

    // Roll back to version 1 (after the confirmation): a new version 3, released.
    browser.goto(&format!("{base}/versions")).await;
    browser.click("tr[data-version='1'] button.rollback").await;
    browser.client.accept_alert().await.unwrap();
    browser.wait_for_path("/environments/web/versions").await;
    wait_for_file(&motd, welcome).await;
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["released_version"], 3, "{env}");

    // Drift on disk: a dryrun finds it, before and after, and changes nothing.
    std::fs::write(&motd, "drifted\n").unwrap();
    browser.goto(&base).await;
    browser.click("#dryrun").await;
    browser.wait_for("#dryrun-status").await;
    browser.wait_for_text("would change", false, Duration::from_secs(60)).await;
    assert_eq!(browser.text("#dryrun-status").await, "done");
    let findings = browser.text("#findings").await;
    assert!(
        findings.contains("file[local,/etc/motd]") && findings.contains("drifted") && findings.contains("Welcome."),
        "{findings}"
    );
    browser.screenshot("dryrun").await;
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), "drifted\n");

    // Repair: the operation's page follows it to its outcome, and the file is restored.
    browser.goto(&base).await;
    browser.click("#repair").await;
    browser.wait_for("#operation-status").await;
    browser.wait_for_text("Outcome", false, Duration::from_secs(60)).await;
    assert_eq!(browser.text("#operation-status").await, "done");
    browser.screenshot("repair").await;
    assert_eq!(std::fs::read_to_string(&motd).unwrap(), welcome);
    browser.close().await;
    host.stop().await;
}

/// Waits until `path` holds `content`.
async fn wait_for_file(path: &std::path::Path, content: &str) {
    wait_for(
        &format!("{} to hold {content:?}", path.display()),
        Duration::from_secs(60),
        async || std::fs::read_to_string(path).ok().as_deref() == Some(content),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_change_with_the_apis_checks_and_a_stale_form_is_refused() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    let page = format!("{}/environments/web/settings", console(&host));
    browser.goto(&page).await;

    // A setting the API refuses is refused here with its message, and nothing changes.
    browser.fill("#patch", "{\"per_node_concurrency\": 0}").await;
    browser.click("#change-settings").await;
    browser.wait_for("div.error").await;
    let refusal = browser.text("div.error").await;
    assert!(
        refusal.contains("invalid_settings") && refusal.contains("per_node_concurrency"),
        "{refusal}"
    );
    // A valid change is applied.
    browser.goto(&page).await;
    browser.fill("#patch", "{\"repair_interval_s\": 600}").await;
    browser.click("#change-settings").await;
    browser
        .wait_for_text("\"repair_interval_s\": 600", false, Duration::from_secs(20))
        .await;
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["settings"]["repair_interval_s"], 600, "{env}");

    // A form shown before someone else's change is refused, naming the current settings' tag;
    // the other change stands.
    browser.goto(&page).await;
    let (status, _, _) = host
        .send_text(
            reqwest::Method::PATCH,
            "/environments/web",
            Some(&json!({"settings": {"retry_interval_s": 30}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    browser.fill("#patch", "{\"retry_interval_s\": 90}").await;
    browser.click("#change-settings").await;
    browser.wait_for("div.error").await;
    assert!(browser.text("div.error").await.contains("version_conflict"));
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["settings"]["retry_interval_s"], 30, "{env}");
    browser.screenshot("settings-conflict").await;

    // Halt and resume.
    browser.goto(&page).await;
    browser.click("#halt").await;
    browser.wait_for("#resume").await;
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["halted"], true, "{env}");
    browser.click("#resume").await;
    browser.wait_for("#halt").await;
    let (_, env) = host.get("/environments/web").await;
    assert_eq!(env["halted"], false, "{env}");

    // The environment's own body limit holds for an intent pasted here as for the API.
    let (status, _, _) = host
        .send_text(
            reqwest::Method::PATCH,
            "/environments/web",
            Some(&json!({"settings": {"limits": {"max_body_bytes": 1024}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    browser.goto(&format!("{}/environments/web/versions", console(&host))).await;
    browser.fill("#intent", &format!("{QUICKSTART}{}", " ".repeat(200))).await;
    browser.click("#submit-intent").await;
    browser.wait_for("div.error").await;
    let refusal = browser.text("div.error").await;
    assert!(refusal.contains("too_large") && refusal.contains("max_body_bytes"), "{refusal}");
    let (_, versions) = host.get("/environments/web/intents").await;
    assert_eq!(versions["items"], json!([]));
    browser.close().await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_registered_verified_and_its_changed_host_key_accepted_after_both_are_shown() {
    let host = Host::start(Backend::Sqlite).await;
    let mut sshd = sshd::Sshd::start();
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    browser.goto(&format!("{}/nodes", console(&host))).await;
    let fill_node = async |name: &str| {
        browser.fill("input[name=name]", name).await;
        browser.fill("input[name=address]", "127.0.0.1").await;
        browser.fill("input[name=port]", &sshd.port.to_string()).await;
        browser.fill("input[name=user]", sshd::TEST_USER).await;
        browser.fill("#private_key", &sshd.client_key).await;
        browser.fill("input[name=host_key]", &sshd.host_fingerprint).await;
    };
    // Refused (a name the API refuses): the fields come back, the credential never does.
    fill_node("Not A Name").await;
    browser.click("#register-node").await;
    browser.wait_for("div.error").await;
    let key_field = browser.client.find(fantoccini::Locator::Css("#private_key")).await.unwrap();
    assert_eq!(key_field.prop("value").await.unwrap().as_deref(), Some(""));
    let name_field = browser.client.find(fantoccini::Locator::Css("input[name=name]")).await.unwrap();
    assert_eq!(name_field.prop("value").await.unwrap().as_deref(), Some("Not A Name"));
    let secret_line = sshd.client_key.lines().nth(1).unwrap().to_string();
    assert!(
        !browser.client.source().await.unwrap().contains(&secret_line),
        "the key was echoed back"
    );

    fill_node("web1").await;
    browser.click("#register-node").await;
    browser.wait_for("tr[data-node='web1']").await;
    // Verified (the page follows it while it is `unidentified`), its key pinned.
    browser.wait_for_text("public", false, Duration::from_secs(30)).await;
    assert_eq!(browser.text("tr[data-node='web1'] code.pinned").await, sshd.host_fingerprint);
    assert!(
        !browser.client.source().await.unwrap().contains(&secret_line),
        "the key was echoed back"
    );

    // The node comes back with another host key: verifying shows both, and nothing is used
    // until the new one is accepted.
    let old = sshd.host_fingerprint.clone();
    sshd.replace_host_key();
    browser.goto(&format!("{}/nodes", console(&host))).await;
    browser.click("tr[data-node='web1'] button.verify").await;
    browser.wait_for("button.accept-key").await;
    assert_eq!(browser.text("tr[data-node='web1'] code.pinned").await, old);
    assert_eq!(browser.text("tr[data-node='web1'] code.presented").await, sshd.host_fingerprint);
    assert!(browser.text("tr[data-node='web1'] td.status").await.contains("host key changed"));
    browser.screenshot("node-host-key-changed").await;
    browser.click("button.accept-key").await;
    browser.wait_for_path("/nodes").await;
    let node = host
        .wait_for("/nodes/web1", "public with the new key", Duration::from_secs(30), |_, n| {
            n["status"] == "public"
        })
        .await;
    assert_eq!(node["host_key"], json!(sshd.host_fingerprint), "{node}");
    browser.goto(&format!("{}/nodes", console(&host))).await;
    assert_eq!(browser.text("tr[data-node='web1'] code.pinned").await, sshd.host_fingerprint);
    browser.close().await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_plugins_and_the_timeline_are_shown() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let intent: Value = serde_json::from_str(QUICKSTART).unwrap();
    let (status, submitted) = host.post("/environments/web/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    host.wait_for("/environments/web", "deployed", Duration::from_secs(60), |_, v| {
        v["resources"]["deployed"] == 6
    })
    .await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;

    // A token: its secret shown once, working; then revoked (after a confirmation), refused.
    browser.goto(&format!("{}/tokens", console(&host))).await;
    browser.fill("#token-description", "ci job").await;
    browser.click("#create-token").await;
    browser.wait_for("#new-token").await;
    let secret = browser.text("#new-token").await;
    let me = |token: String| {
        let url = format!("{}/me", host.base);
        async move { reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().status() }
    };
    assert_eq!(me(secret.clone()).await, StatusCode::OK);
    browser.goto(&format!("{}/tokens", console(&host))).await;
    assert!(
        !browser.client.source().await.unwrap().contains(&secret),
        "the secret was shown again"
    );
    let (_, tokens) = host.get("/tokens").await;
    let id = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["description"] == "ci job")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    browser.click(&format!("tr[data-token='{id}'] button.revoke")).await;
    browser.client.accept_alert().await.unwrap();
    wait_for("the revoked token to stop working", Duration::from_secs(10), async || {
        me(secret.clone()).await == StatusCode::UNAUTHORIZED
    })
    .await;

    // The registry's plugins, with their kinds, digests and capabilities.
    browser.goto(&format!("{}/plugins", console(&host))).await;
    let plugins = browser.text("#plugins").await;
    assert!(
        plugins.contains("file@0.1.0") && plugins.contains("adaptor") && plugins.contains("node-files"),
        "{plugins}"
    );
    assert!(plugins.contains("sha256:"), "{plugins}");

    // The deploy as a picture: a bar per action.
    browser.goto(&format!("{}/environments/web/timeline", console(&host))).await;
    let summary = browser.text("#timeline-summary").await;
    assert!(summary.starts_with("6 actions") && summary.contains("6 changed"), "{summary}");
    let bars = browser.client.find_all(fantoccini::Locator::Css("#timeline rect")).await.unwrap();
    assert!(bars.len() >= 6, "{} bars", bars.len());
    browser.screenshot("timeline").await;
    browser.close().await;
    host.stop().await;
}

/// A small stack for the cluster pages: `base` installed on every node, `web` started beside it.
fn stack(root: &std::path::Path) -> Value {
    json!({
        "services": {
            "base": {"automator": "shell@0.1.0", "config": {"root": root, "scripts": {
                "install": "mkdir -p \"$ROOT/$ORC_NODE\"",
                "remove": "rm -rf \"$ROOT/$ORC_NODE\"",
            }}},
            "web": {"automator": "shell@0.1.0", "requires": {"install": ["base"]}, "config": {"root": root, "scripts": {
                "start": "touch \"$ROOT/$ORC_NODE/web.running\"",
                "stop": "rm -f \"$ROOT/$ORC_NODE/web.running\"",
            }, "checks": {
                "start": "test -f \"$ROOT/$ORC_NODE/web.running\"",
                "stop": "test ! -f \"$ROOT/$ORC_NODE/web.running\"",
            }}},
        },
        "defaults": {"size": 2},
    })
}

/// A host with environment `web` (commands on nodes granted) and `count` sshd nodes `n1`…,
/// logged in as root and verified.
async fn host_with_nodes(count: usize) -> (Host, Vec<sshd::Sshd>) {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 1).await;
    let patch = json!({ "settings": { "capabilities": { "node_commands": true } } });
    let (status, env, _) = host.send_text(reqwest::Method::PATCH, "/environments/web", Some(&patch)).await;
    assert_eq!(status, StatusCode::OK, "{env}");
    let servers: Vec<sshd::Sshd> = (0..count).map(|_| sshd::Sshd::start()).collect();
    for (i, sshd) in (1..).zip(&servers) {
        let body = json!({
            "name": format!("n{i}"), "address": sshd.address, "port": sshd.port, "user": "root",
            "credential": { "private_key": sshd.client_key },
        });
        let (status, node) = host.post("/nodes", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
    }
    for i in 1..=count {
        host.wait_node_status(&format!("n{i}"), "public").await;
    }
    (host, servers)
}

/// The nodes of the grid's rows.
async fn grid_nodes(browser: &Browser, table: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    for row in browser
        .client
        .find_all(fantoccini::Locator::Css(&format!("#{table} tbody tr")))
        .await
        .unwrap()
    {
        nodes.push(row.attr("data-node").await.unwrap().unwrap());
    }
    nodes
}

/// Waits until the cluster's page, following it live, says `status`.
async fn wait_cluster_status(browser: &Browser, status: &str) {
    wait_for(&format!("the cluster to be {status}"), Duration::from_secs(120), async || {
        // The page swaps its parts as it follows the cluster: a read may meet a replaced element.
        let read = async {
            let cell = browser.client.find(fantoccini::Locator::Css("#cluster-status")).await?;
            cell.text().await
        };
        let now = read.await.unwrap_or_default();
        if now == status {
            return Ok(());
        }
        assert!(now != "failed", "the cluster failed: {}", browser.page_text().await);
        Err(now)
    })
    .await
}

/// A cluster in the console: created after its layout was shown; its layout as a grid of nodes ×
/// services with each task's status, following operations live; an amend shown as the layout
/// before and after and run only once confirmed; a confirmation that went stale refused; a
/// service stopped and the cluster deleted, each after a confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_layout_grid_follows_its_operations_each_confirmed_first() {
    let (host, _servers) = host_with_nodes(3).await;
    let root = tempfile::tempdir().unwrap();
    let (status, t) = host.post("/environments/web/templates/stack", &stack(root.path())).await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    let running = |node: &str| root.path().join(node).join("web.running").exists();

    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    let clusters = format!("{}/environments/web/clusters", console(&host));
    browser.goto(&clusters).await;
    assert!(browser.text("#templates").await.contains("base, web"));

    // Create: the layout is shown first, and nothing exists until it is confirmed.
    browser.fill("#cluster-name", "shop").await;
    browser.fill("#cluster-size", "2").await;
    browser.click("#create-cluster").await;
    browser.wait_for("#confirm").await;
    assert_eq!(grid_nodes(&browser, "layout-after").await.len(), 2);
    let summary = browser.text("#confirm-summary").await;
    assert!(
        summary.ends_with(" to change, 0 unchanged") && !summary.starts_with("0 "),
        "{summary}"
    );
    assert_eq!(host.get("/environments/web/clusters/shop").await.0, StatusCode::NOT_FOUND);
    browser.click("#confirm").await;
    browser.wait_for_path("/environments/web/clusters/shop").await;
    wait_cluster_status(&browser, "active").await;
    let first = grid_nodes(&browser, "layout").await;
    assert_eq!(first.len(), 2, "{first:?}");
    for node in &first {
        let row = browser.text(&format!("#layout tr[data-node='{node}']")).await;
        assert!(row.contains("install: done") && row.contains("start: done"), "{row}");
        assert!(running(node), "web does not run on {node}");
    }

    // Amend to 3: the layout now and after, then confirmed; the grid follows without a reload.
    browser.fill("#amend-size", "3").await;
    browser.click("#amend").await;
    browser.wait_for("#confirm").await;
    assert_eq!(grid_nodes(&browser, "layout-now").await, first);
    let after = grid_nodes(&browser, "layout-after").await;
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(
        host.get("/environments/web/clusters/shop").await.1["size"],
        2,
        "ran before it was confirmed"
    );
    browser.click("#confirm").await;
    browser.wait_for_path("/environments/web/clusters/shop").await;
    wait_cluster_status(&browser, "active").await;
    assert_eq!(grid_nodes(&browser, "layout").await, after);
    let grid = browser.text("#layout").await;
    assert!(!grid.contains("pending") && !grid.contains("deploying"), "{grid}");
    browser.screenshot("cluster-grid").await;

    // A confirmation acts on the cluster as it showed it: a change in between refuses it.
    browser.click("tr[data-service='web'] button.stop").await;
    browser.wait_for("#confirm").await;
    assert!(browser.text("#touched").await.contains("web/start"));
    let (status, leased) = host.post("/environments/web/clusters/shop/lease", &json!({"lease_s": 3600})).await;
    assert_eq!(status, StatusCode::OK, "{leased}");
    browser.click("#confirm").await;
    browser.wait_for("div.error").await;
    let refusal = browser.text("div.error").await;
    assert!(refusal.starts_with("version_conflict") && refusal.contains("revision"), "{refusal}");
    assert!(after.iter().all(|n| running(n)), "a stale confirmation stopped web");

    // Confirmed on the cluster as it is: web stops everywhere, and the grid says so in words.
    browser.click("tr[data-service='web'] button.stop").await;
    browser.wait_for("#confirm").await;
    browser.click("#confirm").await;
    browser.wait_for_path("/environments/web/clusters/shop").await;
    wait_cluster_status(&browser, "active").await;
    assert!(after.iter().all(|n| !running(n)), "web still runs");
    assert!(browser.text("#layout thead").await.contains("web (stopped)"));

    // Delete, confirmed: the cluster goes, and the list says so.
    browser.click("#delete").await;
    browser.wait_for("#confirm").await;
    assert!(browser.text("#confirm-what").await.starts_with("Delete cluster shop"));
    browser.click("#confirm").await;
    host.wait_for("/environments/web/clusters/shop", "deleted", Duration::from_secs(120), |code, _| {
        code == StatusCode::NOT_FOUND
    })
    .await;
    browser.goto(&clusters).await;
    assert!(browser.page_text().await.contains("No cluster yet."));
    assert!(!root.path().join(&after[0]).exists(), "base was not removed");
    browser.close().await;
    host.stop().await;
}

/// A service of the `shell` automator whose processes talk over interface `echo`.
fn peers_service(name: &str, role: &str) -> Value {
    let mut interface = json!({"name": "echo", "role": role, "allow_multiple": true,
        "versions": [{"version": "1.0.0", "schema": {"type": "object", "title": "echo"}}]});
    if role == "provides" {
        interface["port"] = json!("echo");
    }
    json!({
        "name": name, "version": "1.0.0",
        "automator": orc_plugin_artifacts::SHELL.digest,
        "config": {"scripts": {"start": "true", "stop": "true", "remove": "true"}},
        "config_schema": {"type": "object"},
        "ports": [{"name": "echo", "port": 7}],
        "connections_key": "peers",
        "interfaces": [interface]
    })
}

/// Processes and their connections as a graph: a box per process in its node's column, an arrow
/// per connection, and the same as tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_and_connections_are_drawn_as_a_graph() {
    let (host, _servers) = host_with_nodes(2).await;
    for doc in [peers_service("echo-server", "provides"), peers_service("echo-client", "requires")] {
        let resp = host
            .client
            .post(host.base.replace("/api/v1", "/registry/v1/services"))
            .bearer_auth(&host.token)
            .json(&doc)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED, "{}", resp.text().await.unwrap());
    }
    for (name, service, node, port) in [
        ("server", "echo-server", "n1", 21_001),
        ("client-a", "echo-client", "n2", 21_002),
        ("client-b", "echo-client", "n2", 21_003),
    ] {
        let body = json!({"name": name, "service": format!("{service}@1.0.0"), "node": node,
            "ports": {"echo": port}, "config": {}});
        let (status, p) = host.post("/environments/web/processes", &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{p}");
    }
    for client in ["client-a", "client-b"] {
        let body = json!({"from": {"process": client, "interface": "echo"}, "to": {"process": "server", "interface": "echo"}});
        let (status, c) = host.post("/environments/web/connections", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{c}");
    }

    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    browser.goto(&format!("{}/environments/web/processes", console(&host))).await;
    // The page follows the processes until each runs.
    browser.wait_for("#graph").await;
    let summary = browser
        .client
        .find(fantoccini::Locator::Css("#graph"))
        .await
        .unwrap()
        .attr("aria-label")
        .await
        .unwrap();
    assert_eq!(summary.as_deref(), Some("3 processes on 2 nodes, 2 connections"));
    wait_for("every process to run", Duration::from_secs(120), async || {
        let states = browser.page_text().await;
        let table = states.split("Connections").next().unwrap_or_default().to_string();
        if table.matches("running").count() >= 3 {
            Ok(())
        } else {
            Err(states)
        }
    })
    .await;
    let graph = &browser.client;
    let boxes = graph.find_all(fantoccini::Locator::Css("#graph g.process")).await.unwrap();
    assert_eq!(boxes.len(), 3);
    let mut edges = Vec::new();
    for edge in graph.find_all(fantoccini::Locator::Css("#graph g.connection")).await.unwrap() {
        edges.push((
            edge.attr("data-from").await.unwrap().unwrap(),
            edge.attr("data-to").await.unwrap().unwrap(),
        ));
    }
    edges.sort();
    assert_eq!(
        edges,
        [
            ("client-a".to_string(), "server".to_string()),
            ("client-b".to_string(), "server".to_string())
        ]
    );
    let labels = browser.text("#graph").await;
    assert!(labels.contains("node n1") && labels.contains("node n2"), "{labels}");
    let connections = browser.text("#connections").await;
    assert!(
        connections.contains("client-a.echo") && connections.contains("1.0.0"),
        "{connections}"
    );
    browser.screenshot("processes-graph").await;
    browser.close().await;
    host.stop().await;
}

/// Users and roles: an admin creates a user, grants it a role in an environment, disables and
/// deletes it; a refused role or name is shown by name, and the API agrees at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_created_given_roles_disabled_and_deleted() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    browser.goto(&format!("{}/users", console(&host))).await;

    browser.fill("#user-name", "Not A Name").await;
    browser.click("#create-user").await;
    browser.wait_for("div.error").await;
    assert!(browser.text("div.error").await.contains("name"), "the refusal names the field");
    browser.fill("#user-name", "alice").await;
    browser.fill("#user-password", "correct horse battery staple").await;
    browser.click("#create-user").await;
    browser.wait_for("tr[data-user='alice']").await;
    let (status, alice) = host.get("/users/alice").await;
    assert_eq!(status, StatusCode::OK, "{alice}");
    assert_eq!(alice["has_password"], true, "{alice}");

    // A role in `web`, from its members page; the users page shows it.
    browser.goto(&format!("{}/environments/web/members", console(&host))).await;
    browser.fill("#member-user", "alice").await;
    browser
        .client
        .find(fantoccini::Locator::Css("#member-role"))
        .await
        .unwrap()
        .select_by_value("operator")
        .await
        .unwrap();
    browser.click("#set-member").await;
    browser.wait_for("tr[data-member='alice']").await;
    assert_eq!(browser.text("tr[data-member='alice'] td.role").await, "operator");
    let (_, members) = host.get("/environments/web/members").await;
    assert!(members.to_string().contains("\"operator\""), "{members}");
    // An unknown user: refused by name, nothing granted.
    browser.fill("#member-user", "nobody").await;
    browser.click("#set-member").await;
    browser.wait_for("div.error").await;
    assert!(browser.text("div.error").await.contains("nobody"));
    browser.goto(&format!("{}/users", console(&host))).await;
    assert!(browser.text("tr[data-user='alice'] td.memberships").await.contains("web: operator"));

    // Disabled: its password no longer signs in; enabled again; then deleted.
    let login = async || {
        let body = json!({"name": "alice", "password": "correct horse battery staple"});
        reqwest::Client::new()
            .post(format!("{}/login", host.base))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(login().await, StatusCode::CREATED);
    browser.click("tr[data-user='alice'] button.disable").await;
    browser.client.accept_alert().await.unwrap();
    browser.wait_for("tr[data-user='alice'] button.enable").await;
    assert_eq!(browser.text("tr[data-user='alice'] td.status").await, "disabled");
    assert_eq!(login().await, StatusCode::UNAUTHORIZED);
    browser.click("tr[data-user='alice'] button.enable").await;
    browser.wait_for("tr[data-user='alice'] button.disable").await;
    assert_eq!(login().await, StatusCode::CREATED);
    browser.screenshot("users").await;
    browser.click("tr[data-user='alice'] button.delete").await;
    browser.client.accept_alert().await.unwrap();
    wait_for("alice to be deleted", Duration::from_secs(10), async || {
        host.get("/users/alice").await.0 == StatusCode::NOT_FOUND
    })
    .await;
    browser.close().await;
    host.stop().await;
}

/// `pairs` as a form's body (or a query string).
fn form_body(pairs: &[(&str, &str)]) -> String {
    let encode = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Signs in over plain HTTP with the admin token: the session's `Cookie` header and its CSRF field.
async fn session_of(host: &Host) -> (String, String) {
    let answer = bare_client()
        .post(format!("{}/sign-in", console(host)))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[("token", host.token.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let cookie = answer.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = bare_client()
        .get(format!("{}/environments", console(host)))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split("name=\"_csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF field")
        .to_string();
    (cookie, csrf)
}

/// What a device, a plugin or an operator wrote is shown as text, never as markup; and a bad
/// query, path or form is refused on a page in words (the API's codes), never as plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_is_shown_as_text_and_bad_requests_are_refused_in_words() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let hostile = "<img src=x onerror=alert(1)><script>alert(2)</script>";
    // The local node's files are below the environment's node root.
    let path = orc_host::app::node_root(host.data.path(), "web").join("srv/hostile.txt");
    let intent = json!({"resources": [{
        "id": "directory[local,/srv]",
        "adaptor": "directory@0.1.0",
        "attributes": {"mode": "0755"},
    }, {
        "id": "file[local,/srv/hostile.txt]",
        "adaptor": "file@0.1.0",
        "attributes": {"content": hostile, "mode": "0644"},
        "requires": ["directory[local,/srv]"],
    }]});
    let (status, submitted) = host.post("/environments/web/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    host.wait_for("/environments/web", "deployed", Duration::from_secs(60), |_, v| {
        v["resources"]["deployed"] == 2
    })
    .await;
    // A device that wrote markup into the file: the repair's diff shows it as text.
    std::fs::write(&path, "<b onmouseover=alert(3)>drift</b>").unwrap();
    host.run_to_completion("/environments/web/repair", None).await;

    let (cookie, csrf) = session_of(&host).await;
    let get = async |path: &str| {
        let answer = bare_client()
            .get(format!("{}{path}", console(&host)))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let kind = answer.headers()["content-type"].to_str().unwrap().to_string();
        (status, kind, answer.text().await.unwrap())
    };
    let query = form_body(&[("id", "file[local,/srv/hostile.txt]")]);
    let (status, _, page) = get(&format!("/environments/web/resource?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for raw in ["<img src=x", "<script>alert", "<b onmouseover"] {
        assert!(!page.contains(raw), "{raw} became markup: {page}");
    }
    assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"), "{page}");
    assert!(
        page.contains("&lt;b onmouseover=alert(3)&gt;drift"),
        "the repair's before value: {page}"
    );

    // A file that became a directory cannot be read: the dryrun's report says `unchecked`, and why.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let dryrun = host.run_to_completion("/environments/web/dryrun", None).await;
    assert_eq!(dryrun["status"], "done", "{dryrun}");
    let (status, _, report) = get(&format!("/environments/web/dryruns/{}", dryrun["id"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    let row = report
        .split("<tr>")
        .find(|row| row.contains("hostile.txt"))
        .unwrap_or_else(|| panic!("no finding for the file: {report}"));
    assert!(
        row.contains("unchecked") && row.contains("</code>: "),
        "the finding and its reason: {row}"
    );
    assert!(report.contains("1 unchecked"), "{report}");

    // Refusals: a page in words with the API's code.
    for (path, code) in [
        ("/environments/web?status=bogus", "invalid_query"),
        ("/environments/web/versions/diff?from=one&to=2", "invalid_query"),
        ("/environments/nowhere", "unknown_environment"),
        ("/environments/web/clusters/none", "unknown_cluster"),
    ] {
        let (status, kind, page) = get(path).await;
        assert!(status.is_client_error(), "{path}: {status}");
        assert!(kind.starts_with("text/html"), "{path}: {kind}");
        assert!(page.contains(code), "{path}: {page}");
    }
    let post = async |path: &str, form: &[(&str, &str)]| {
        let answer = bare_client()
            .post(format!("{}{path}", console(&host)))
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(form))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let kind = answer.headers()["content-type"].to_str().unwrap_or_default().to_string();
        (status, kind, answer.text().await.unwrap())
    };
    for (path, form, code) in [
        ("/environments/web/launch", vec![("_csrf", csrf.as_str())], "invalid_path"),
        (
            "/environments/web/versions/x/release",
            vec![("_csrf", csrf.as_str())],
            "invalid_path",
        ),
        (
            "/environments/web/members",
            vec![("_csrf", csrf.as_str()), ("user", "admin"), ("role", "emperor")],
            "invalid_role",
        ),
        (
            "/environments/web/clusters",
            vec![("_csrf", csrf.as_str()), ("name", "c"), ("template", "t"), ("size", "many")],
            "size: `many`",
        ),
    ] {
        let (status, kind, page) = post(path, &form).await;
        assert!(status.is_client_error(), "{path}: {status} {page}");
        assert!(kind.starts_with("text/html"), "{path}: {kind}");
        assert!(page.contains(code), "{path}: {page}");
    }
    host.stop().await;
}

/// The same pages in Firefox: a wrong token refused, an environment created through its form
/// (a refused name shown), the resources followed live to `deployed`, a resource's page, a dryrun
/// started by its button and followed to its report, and signing out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_firefox() {
    let host = Host::start(Backend::Sqlite).await;
    let browser = Browser::firefox().await;
    browser.goto(&format!("{}/sign-in", console(&host))).await;
    browser.fill("#token", "orc_not-a-token").await;
    browser.click("#sign-in").await;
    browser.wait_for("div.error").await;
    assert!(browser.text("div.error").await.contains("not valid"));
    sign_in(&browser, &host).await;

    browser.fill("#new-environment", "Not A Name!").await;
    browser.click("#create-environment").await;
    browser.wait_for("div.error").await;
    browser.fill("#new-environment", "web").await;
    browser.click("#create-environment").await;
    browser.wait_for_path("/environments/web").await;
    browser.wait_until_live().await;
    let intent: Value = serde_json::from_str(QUICKSTART).unwrap();
    let (status, submitted) = host.post("/environments/web/intents", &intent).await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    browser.wait_for_text("deployed 6", false, Duration::from_secs(60)).await;
    browser.screenshot("firefox-environment").await;

    browser.click("a[href*='motd']").await;
    browser.wait_for("#status").await;
    assert_eq!(browser.text("#status").await, "deployed");
    assert!(browser.text("#actions").await.contains("changed"));

    browser.goto(&format!("{}/environments/web", console(&host))).await;
    browser.click("#dryrun").await;
    browser.wait_for_text("0 would change", false, Duration::from_secs(60)).await;
    assert_eq!(browser.text("#dryrun-status").await, "done");

    browser.click("header button[type=submit]").await;
    browser.wait_for_path("/sign-in").await;
    browser.goto(&format!("{}/environments", console(&host))).await;
    browser.wait_for_path("/sign-in").await;
    browser.close().await;
    host.stop().await;
}
