//! A private Apicurio Registry (in-memory, its Confluent-compatible API) per test, started with
//! `scripts/registry` (the launcher users can run too), and the stock-client consumer
//! `tools/registry/consume.py` (confluent-kafka's deserializers) run in its virtualenv.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/registry")
}

pub struct Registry {
    dir: Option<tempfile::TempDir>,
    /// The API root: http://127.0.0.1:PORT/apis/ccompat/v7.
    pub url: String,
    /// `--basic-auth`: the user and the password file.
    pub auth: Option<(String, PathBuf)>,
    /// `--tls`: the CA that signed the registry's certificate (clients trust it).
    pub ca: Option<PathBuf>,
    pub port: u16,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(None)
    }

    /// With basic auth for `user` and `password` (kept in a file in the registry's directory).
    pub fn start_with(auth: Option<(&str, &str)>) -> Registry {
        Registry::start_full(auth, None)
    }

    /// Serving HTTPS only, with a certificate for 127.0.0.1 from a fresh CA (kept beside it).
    pub fn start_tls() -> Registry {
        Registry::start_full(None, Some(()))
    }

    fn start_full(auth: Option<(&str, &str)>, tls: Option<()>) -> Registry {
        let dir = tempfile::Builder::new().prefix("outboxd-registry-").tempdir().expect("tempdir");
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("start").arg(dir.path()).arg("--parent").arg(std::process::id().to_string());
        let auth = auth.map(|(user, password)| {
            let file = dir.path().join("password");
            std::fs::write(&file, format!("{password}\n")).expect("password file");
            cmd.arg("--basic-auth").arg(format!("{user}:{}", file.display()));
            (user.to_owned(), file)
        });
        let ca = tls.map(|()| {
            let ca = super::certs::TestCa::new("outboxd test registry CA");
            let files = ca.server(dir.path(), "registry", &["localhost"]);
            cmd.arg("--tls").arg(&files.cert).arg(&files.key);
            ca.write_ca(dir.path(), "ca.pem")
        });
        let out = cmd.output().expect("run scripts/registry");
        assert!(
            out.status.success(),
            "scripts/registry start failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("registry.log")).unwrap_or_default()
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_owned();
        let port = std::fs::read_to_string(dir.path().join("port")).expect("port").trim().parse().expect("port number");
        Registry { dir: Some(dir), url, auth, ca, port }
    }

    /// `url` with another port (the same path): for a proxy in front of the registry.
    pub fn url_via(&self, port: u16) -> String {
        self.url.replace(&format!(":{}/", self.port), &format!(":{port}/"))
    }

    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method, "-H", "Content-Type: application/json"]);
        if let Some((user, file)) = &self.auth {
            let password = std::fs::read_to_string(file).unwrap_or_default();
            cmd.arg("-u").arg(format!("{user}:{}", password.trim_end()));
        }
        if let Some(b) = body {
            cmd.arg("--data-binary").arg(b);
        }
        if let Some(ca) = &self.ca {
            cmd.arg("--cacert").arg(ca);
        }
        let out = cmd.arg(format!("{}{path}", self.url)).output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// Register `schema` (its text) of `kind` (AVRO, PROTOBUF, JSON) under `subject`; its id.
    pub fn register(&self, subject: &str, kind: &str, schema: &str) -> u32 {
        let body = serde_json::json!({"schema": schema, "schemaType": kind}).to_string();
        let (code, answer) = self.curl("POST", &format!("/subjects/{subject}/versions"), Some(&body));
        assert_eq!(code, 200, "register {subject}: {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).expect("register answer");
        v["id"].as_u64().expect("id") as u32
    }

    /// A GET below the API root: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.curl("GET", path, None)
    }

    /// The id of the latest version of `subject`, if it has one.
    pub fn latest_id(&self, subject: &str) -> Option<u32> {
        let (code, body) = self.get(&format!("/subjects/{subject}/versions/latest"));
        if code == 404 {
            return None;
        }
        assert_eq!(code, 200, "latest of {subject}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("latest answer");
        Some(v["id"].as_u64().expect("id") as u32)
    }

    /// The versions registered under `subject` (none when it does not exist).
    pub fn versions(&self, subject: &str) -> Vec<u64> {
        let (code, body) = self.get(&format!("/subjects/{subject}/versions"));
        if code == 404 {
            return Vec::new();
        }
        assert_eq!(code, 200, "versions of {subject}: {body}");
        serde_json::from_str(&body).expect("versions answer")
    }

    /// Set `subject`'s compatibility rule (BACKWARD, FULL, NONE, …).
    pub fn set_compatibility(&self, subject: &str, level: &str) {
        let body = serde_json::json!({ "compatibility": level }).to_string();
        let (code, answer) = self.curl("PUT", &format!("/config/{subject}"), Some(&body));
        assert_eq!(code, 200, "compatibility of {subject}: {answer}");
    }

    pub fn log(&self) -> String {
        self.dir
            .as_ref()
            .map(|d| std::fs::read_to_string(d.path().join("registry.log")).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Read `count` records of `topic` with the stock deserializer for `format`; one JSON value
    /// per record ({topic, partition, offset, key, headers, schema_id, value}).
    pub fn consume(&self, bootstrap: &str, topic: &str, format: &str, count: usize) -> Vec<serde_json::Value> {
        self.consume_keyed(bootstrap, topic, "string", format, count)
    }

    /// As [`Registry::consume`], with keys decoded as `key_format`.
    pub fn consume_keyed(
        &self,
        bootstrap: &str,
        topic: &str,
        key_format: &str,
        format: &str,
        count: usize,
    ) -> Vec<serde_json::Value> {
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg("python")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/registry/consume.py"))
            .args(["--bootstrap", bootstrap, "--topic", topic, "--registry", &self.url, "--format", format])
            .args(["--key-format", key_format])
            .args(["--count", &count.to_string(), "--timeout", "60"]);
        if let Some((user, file)) = &self.auth {
            cmd.arg("--basic-auth").arg(format!("{user}:{}", file.display()));
        }
        if let Some(ca) = &self.ca {
            cmd.arg("--ca").arg(ca);
        }
        let out = cmd.output().expect("consume.py");
        assert!(
            out.status.success(),
            "consume.py {topic} ({format}) failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("consume.py line {l:?}: {e}")))
            .collect()
    }

    pub fn stop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = Command::new("bash").arg(script()).arg("stop").arg(d.path()).arg("--kill").status();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            if let Some(d) = self.dir.take() {
                eprintln!("[harness] keeping registry dir {}", d.keep().display());
            }
        }
    }
}
