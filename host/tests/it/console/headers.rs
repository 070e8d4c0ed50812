//! The console's security headers: on every page, asset, stream, redirect and refusal, and the
//! API's answers beside them; and a page of another origin cannot frame the signed-in console.

use std::time::Duration;

use fantoccini::Locator;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::browser::Browser;
use super::{QUICKSTART, bare_client, console, sign_in};
use crate::support::host::Host;
use orc_host::store::Backend;

/// The console's routes a browser reads, with the environment `web` and what it holds.
const PAGES: &[&str] = &[
    "/",
    "/sign-in",
    "/environments",
    "/environments/web",
    "/environments/web/resource?id=file%5Blocal%2C%2Fetc%2Fmotd%5D",
    "/environments/web/versions",
    "/environments/web/versions/diff?from=1&to=1",
    "/environments/web/settings",
    "/environments/web/members",
    "/environments/web/processes",
    "/environments/web/timeline",
    "/environments/web/clusters",
    "/environments/web/clusters/none",
    "/environments/web/operations/00000000-0000-0000-0000-000000000000",
    "/environments/web/dryruns/00000000-0000-0000-0000-000000000000",
    "/tokens",
    "/plugins",
    "/users",
    "/nodes",
    "/console.css",
    "/console.js",
    "/no-such-page",
];

fn assert_secured(what: &str, response: &reqwest::Response) {
    let h = response.headers();
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let csp = header("content-security-policy");
    for directive in [
        "frame-ancestors 'none'",
        "script-src 'self'",
        "default-src 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{what}: CSP `{csp}` lacks {directive}");
    }
    assert!(
        !csp.contains("script-src 'self' 'unsafe-inline'"),
        "{what}: inline script allowed: {csp}"
    );
    assert_eq!(header("x-frame-options"), "DENY", "{what}");
    assert_eq!(header("x-content-type-options"), "nosniff", "{what}");
    assert_eq!(header("referrer-policy"), "same-origin", "{what}");
    // Plain HTTP: no HSTS (a browser would ignore it, and a proxy that terminates TLS says so).
    assert!(h.get("strict-transport-security").is_none(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_route_and_api_answer_carries_the_security_headers() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let (status, body, _) = host
        .send_text(
            reqwest::Method::POST,
            "/environments/web/intents",
            Some(&serde_json::from_str(QUICKSTART).unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let client = bare_client();
    let root = console(&host);
    // A session, as the sign-in form makes one.
    let signed_in = client
        .post(format!("{root}/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={}", host.token))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert_secured("POST /sign-in", &signed_in);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    for page in PAGES {
        let response = client.get(format!("{root}{page}")).header("cookie", &cookie).send().await.unwrap();
        assert!(
            response.status() != StatusCode::INTERNAL_SERVER_ERROR,
            "{page}: {}",
            response.status()
        );
        assert_secured(page, &response);
    }
    // Signed out, every page is a redirect to sign in: secured as well.
    let response = client.get(format!("{root}/environments")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_secured("signed out", &response);
    // The live stream, a refused form, and a wrong sign-in.
    let live = client
        .get(format!("{root}/environments/web/live"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    assert_secured("live", &live);
    drop(live);
    let forged = client
        .post(format!("{root}/environments/web/deploy"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("_csrf=wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_secured("forged form", &forged);
    let wrong = client
        .post(format!("{root}/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("name=nobody&password=not+the+password")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_secured("wrong sign-in", &wrong);
    // The API's answers, a refusal among them, and the registry's and metrics' routes.
    for path in [
        "/api/v1/health",
        "/api/v1/environments",
        "/api/v1/openapi.json",
        "/metrics",
        "/registry/v1/plugins",
    ] {
        let response = client.get(format!("{root}{path}")).bearer_auth(&host.token).send().await.unwrap();
        assert_secured(path, &response);
    }
    let refused = client.get(format!("{root}/api/v1/environments")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_secured("a refusal", &refused);
    // Behind a proxy that terminated TLS: HSTS too.
    let over_tls = client
        .get(format!("{root}/sign-in"))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    assert_eq!(over_tls.headers()["strict-transport-security"], "max-age=31536000");
    host.stop().await;
}

/// Serves one page, whatever is asked, on a port of its own: another origin of the same host.
async fn serve_page(html: String) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let html = html.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_port_cannot_frame_the_signed_in_console() {
    let host = Host::start(Backend::Sqlite).await;
    host.create_environment_retrying("web", 60).await;
    let browser = Browser::start().await;
    sign_in(&browser, &host).await;
    // Signed in: the console's own tab shows who.
    assert!(browser.page_text().await.contains("Signed in as admin"));
    let framing = format!(
        "<!doctype html><title>elsewhere</title><p id=outside>outside</p>\
         <iframe id=victim src=\"{}/environments\" width=800 height=400></iframe>",
        console(&host)
    );
    let port = serve_page(framing).await;
    browser.goto(&format!("http://127.0.0.1:{port}/")).await;
    browser.wait_for("#outside").await;
    // Look inside the frame until it has loaded something: the console, or the error page the
    // browser shows for a frame it refused (chrome-error://…).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let inside = loop {
        let frame = browser.client.find(Locator::Css("#victim")).await.unwrap();
        frame.enter_frame().await.unwrap();
        let seen = browser
            .client
            .execute("return [location.href, document.body ? document.body.innerText : ''];", vec![])
            .await
            .unwrap();
        browser.client.enter_parent_frame().await.unwrap();
        let url = seen[0].as_str().unwrap_or_default().to_string();
        let text = seen[1].as_str().unwrap_or_default().to_string();
        if (url != "about:blank" && !url.is_empty()) || std::time::Instant::now() > deadline {
            break (url, text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    browser.screenshot("framing-refused").await;
    assert!(
        !inside.1.contains("Signed in as") && !inside.1.contains("Environments"),
        "the console showed inside a frame of another origin: {inside:?}"
    );
    assert!(inside.0.starts_with("chrome-error:"), "the frame holds the console: {inside:?}");
    browser.close().await;
    host.stop().await;
}
