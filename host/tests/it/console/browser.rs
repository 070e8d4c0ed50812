//! A real headless browser driven over WebDriver — Debian's Chromium through `chromedriver`, or
//! Debian's Firefox ESR through `geckodriver` — the driver started on a free loopback port for
//! each browser, and `fantoccini` talking to it. Screenshots go to
//! `target/console-screenshots/<name>.png`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

pub struct Browser {
    pub client: Client,
    /// Killed when the browser is dropped.
    _driver: tokio::process::Child,
    /// The browser's profile: every process of the browser names it, so a test that fails (and
    /// never closes its session) still leaves none running ([`Drop`]); its temporary files go
    /// there too.
    profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let marker = self.profile.path().display().to_string();
        let _ = std::process::Command::new("pkill").args(["-KILL", "-f", "--", &marker]).status();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Browser {
    /// Debian's headless Chromium, through `chromedriver`.
    pub async fn start() -> Browser {
        let profile = tempfile::Builder::new().prefix("orc-console-chromium-").tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                // Root in a container: Chromium's own sandbox cannot start.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--disable-background-networking", "--disable-component-update", "--no-first-run",
                         format!("--user-data-dir={}", profile.path().display())]
            }),
        );
        Browser::connect("chromedriver", &[], caps, profile).await
    }

    /// Debian's headless Firefox ESR, through `geckodriver` (which `.ci/run` installs from
    /// crates.io), in a profile of its own.
    pub async fn firefox() -> Browser {
        let profile = tempfile::Builder::new().prefix("orc-console-firefox-").tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "moz:firefoxOptions".into(),
            json!({
                "binary": "/usr/bin/firefox-esr",
                "args": ["-headless", "-width", "1280", "-height", "900", "-profile", profile.path().display().to_string()],
                // This machine reaches nothing beyond itself: no updates, reports or lists.
                "prefs": {
                    "app.update.disabledForTesting": true,
                    "browser.shell.checkDefaultBrowser": false,
                    "browser.safebrowsing.malware.enabled": false,
                    "browser.safebrowsing.phishing.enabled": false,
                    "datareporting.policy.dataSubmissionEnabled": false,
                    "network.captive-portal-service.enabled": false,
                    "network.connectivity-service.enabled": false,
                    "toolkit.telemetry.reportingpolicy.firstRun": false,
                },
            }),
        );
        Browser::connect("geckodriver", &["--log", "fatal"], caps, profile).await
    }

    /// Starts `driver` on a free loopback port and a session with `caps`.
    async fn connect(driver: &str, args: &[&str], caps: serde_json::Map<String, serde_json::Value>, profile: tempfile::TempDir) -> Browser {
        let port = free_port();
        let child = tokio::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .args(args)
            .env("TMPDIR", profile.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{driver} (.ci/run installs it): {e}"));
        let url = format!("http://127.0.0.1:{port}");
        let client = orc_tests::wait_for(
            &format!("{driver} on {url} to start a session"),
            Duration::from_secs(60),
            async || {
                ClientBuilder::new(HttpConnector::new())
                    .capabilities(caps.clone())
                    .connect(&url)
                    .await
            },
        )
        .await;
        Browser {
            client,
            _driver: child,
            profile,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// The text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// The visible text of the whole page (read again if the page was replaced meanwhile).
    pub async fn page_text(&self) -> String {
        let mut attempts = 0;
        loop {
            let read = async {
                let body = self.client.find(Locator::Css("body")).await?;
                body.text().await
            };
            match read.await {
                Ok(text) => return text,
                Err(e) if attempts < 20 => {
                    attempts += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot read the page: {e}"),
            }
        }
    }

    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// Waits until the browser is on `path` (a form's answer may still be on its way).
    pub async fn wait_for_path(&self, path: &str) {
        orc_tests::wait_for(&format!("the browser to be on {path}"), Duration::from_secs(10), async || {
            let now = self.path().await;
            if now == path { Ok(()) } else { Err(now) }
        })
        .await
    }

    /// Waits until the page's text holds `needle`, reloading it every 200 ms when `reload`.
    pub async fn wait_for_text(&self, needle: &str, reload: bool, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.page_text().await;
            if text.contains(needle) {
                return text;
            }
            if Instant::now() >= deadline {
                let fetched = self
                    .client
                    .execute(
                        "return performance.getEntriesByType('resource').map(function (e) { return e.name; })",
                        vec![],
                    )
                    .await
                    .ok();
                panic!("the page never showed {needle:?} (requests made: {fetched:?}); it shows:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if reload {
                self.client.refresh().await.unwrap();
            }
        }
    }

    /// Waits until an element matches `css` (a form's answer may still be on its way).
    pub async fn wait_for(&self, css: &str) {
        orc_tests::wait_for(&format!("something to match {css}"), Duration::from_secs(20), async || {
            self.client.find(Locator::Css(css)).await.is_ok()
        })
        .await
    }

    /// Waits until the page follows its environment's events (its event stream is open).
    pub async fn wait_until_live(&self) {
        orc_tests::wait_for("the page's event stream to open", Duration::from_secs(10), async || {
            self.client.find(Locator::Css("html[data-live-open]")).await.is_ok()
        })
        .await
    }

    /// Saves the page as `target/console-screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a screenshot is a PNG");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}
