//! A real browser for the tests of a page: Debian's Chromium, headless, driven through
//! ChromeDriver's WebDriver protocol (JSON over HTTP/1.1 to its port), both run inside
//! a network namespace the test made, so the page they load is one served there.
//!
//! Chromium starts with a fresh profile and without its background connections (this
//! machine's network is closed to it; `--disable-background-networking` and the flags
//! beside it keep it from trying). Console messages are read from ChromeDriver's browser
//! log.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{net::in_netns, process::Background};

/// Debian's Chromium and ChromeDriver (packages `chromium`, `chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// Clicks tried on an element the page keeps replacing (see [`Browser::click`]).
const CLICK_TRIES: usize = 20;

/// A headless Chromium session in a namespace. Dropping it ends the session and
/// ChromeDriver.
pub struct Browser {
    netns: PathBuf,
    driver: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
    _chromedriver: Background,
}

impl Browser {
    /// Starts ChromeDriver on `port` in `netns` (its loopback brought up) and a headless
    /// Chromium session of `width` × `height`.
    #[track_caller]
    #[must_use]
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    pub fn start(netns: &Path, port: u16, width: u32, height: u32) -> Self {
        let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("a profile directory: {e}"));
        // The driver, the browser and the page they load talk over the loopback.
        crate::process::netns_exec_ok(netns, &["ip", "link", "set", "lo", "up"]);
        let log = profile.path().join("chromedriver.log");
        let chromedriver = Background::spawn_logged(
            netns,
            &[
                CHROMEDRIVER.to_owned(),
                format!("--port={port}"),
                "--allowed-ips=127.0.0.1".to_owned(),
            ],
            &log,
        );
        let driver = SocketAddr::from(([127, 0, 0, 1], port));
        let netns = netns.to_path_buf();
        let mut last = String::new();
        let up = crate::datapath::wait_until(Duration::from_secs(10), || {
            request(&netns, driver, "GET", "/status", None)
                .map_err(|e| last = e.to_string())
                .is_ok()
        });
        assert!(
            up,
            "chromedriver did not start on {driver}: {last}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", profile.path().display()),
                    format!("--window-size={width},{height}"),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let answer = request(&netns, driver, "POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("a Chromium session: {e}"));
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session in {answer}"))
            .to_owned();
        Self {
            netns,
            driver,
            session,
            _profile: profile,
            _chromedriver: chromedriver,
        }
    }

    /// A command of the session: its `value`.
    #[track_caller]
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.try_command(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    /// [`Self::command`], the error WebDriver answered returned (its `value`).
    #[track_caller]
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    fn try_command(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Value> {
        let full = format!("/session/{}{path}", self.session);
        let answer = request(&self.netns, self.driver, method, &full, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        if answer["value"]["error"].is_string() {
            return Err(answer["value"].clone());
        }
        Ok(answer["value"].clone())
    }

    /// Loads `url`.
    #[track_caller]
    pub fn open(&self, url: &str) {
        self.command("POST", "/url", Some(&json!({"url": url})));
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    #[track_caller]
    #[must_use]
    pub fn eval(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// Clicks the first element `css` selects (fails if none). A page that redraws as
    /// data comes may replace the element found before the click reaches it (WebDriver's
    /// "stale element reference"): it is then found again, a few times.
    #[track_caller]
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    pub fn click(&self, css: &str) {
        let mut stale = Value::Null;
        for _ in 0..CLICK_TRIES {
            let found = self.command(
                "POST",
                "/element",
                Some(&json!({"using": "css selector", "value": css})),
            );
            let id = found[ELEMENT]
                .as_str()
                .unwrap_or_else(|| panic!("no element {css}: {found}"))
                .to_owned();
            match self.try_command("POST", &format!("/element/{id}/click"), Some(&json!({}))) {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" => {
                    stale = e;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => panic!("WebDriver: clicking {css}: {e}"),
            }
        }
        panic!("{css} was replaced before each of {CLICK_TRIES} clicks: {stale}");
    }

    /// The page as a PNG.
    #[track_caller]
    #[must_use]
    #[expect(clippy::panic, reason = "tests fail by panicking with a message")]
    pub fn screenshot(&self) -> Vec<u8> {
        let b64 = self.command("GET", "/screenshot", None);
        data_encoding::BASE64
            .decode(b64.as_str().unwrap_or_default().as_bytes())
            .unwrap_or_else(|e| panic!("the screenshot is not base64: {e}"))
    }

    /// The console messages since the last call: (level, text).
    #[track_caller]
    #[must_use]
    pub fn console(&self) -> Vec<(String, String)> {
        let log = self.command("POST", "/se/log", Some(&json!({"type": "browser"})));
        log.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Waits (bounded by `within`) until `script` returns `true`; whether it did.
    #[must_use]
    pub fn wait_for(&self, script: &str, within: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.eval(script) == Value::Bool(true) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = request(&self.netns, self.driver, "DELETE", &path, None);
    }
}

/// One WebDriver request from inside `netns`: the answer's JSON.
fn request(
    netns: &Path,
    to: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<Value> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {to}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let raw = in_netns(netns, move || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.write_all(head.as_bytes())?;
        s.write_all(body.as_bytes())?;
        // Read to the end of the answer its length gives (the driver may keep the
        // connection open whatever the request asked).
        let mut out = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if length.is_some_and(|n| out.len() >= end + 4 + n) {
                    return Ok(out);
                }
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    })?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let rest = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    serde_json::from_str(&rest).map_err(|e| {
        std::io::Error::other(format!("{method} {path}: not JSON ({e}): {head} {rest}"))
    })
}

/// A chunked body's data.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
