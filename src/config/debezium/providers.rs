//! Kafka config providers in a Debezium file: `${file:/path:key}`, `${directory:/dir:name}` and
//! `${env:NAME}` placeholders resolved in every value before the file is translated, so a
//! connector JSON that keeps its secrets out of the file works unchanged.
//!
//! Provider names come from `config.providers=a,b` with `config.providers.a.class=…`
//! (`FileConfigProvider`, `DirectoryConfigProvider`, `EnvVarConfigProvider`); without that
//! declaration the usual names `file`, `directory` and `env` work. `${name:…}` with a name that is
//! neither declared nor one of those is left alone (Debezium Server's `${VAR:default}`, the
//! EventRouter's `${routedByValue}` have other meanings); a declared provider of another class
//! is an error. Errors name the key, the provider, the file and the missing key or variable, never
//! a resolved value.

use std::collections::BTreeMap;

use crate::config::properties;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Directory,
    Env,
}

/// Resolve every placeholder in every value. `config.providers*` keys are dropped.
pub fn resolve_all(cfg: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    let providers = declared(&cfg)?;
    let mut files: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (k, v) in &cfg {
        if k == "config.providers" || k.starts_with("config.providers.") {
            continue;
        }
        out.insert(k.clone(), resolve(k, v, &providers, &mut files)?);
    }
    Ok(out)
}

/// Provider name → kind, from `config.providers` or the defaults.
fn declared(cfg: &BTreeMap<String, String>) -> Result<BTreeMap<String, Kind>, String> {
    let mut m = BTreeMap::from([
        ("file".to_owned(), Kind::File),
        ("directory".into(), Kind::Directory),
        ("env".into(), Kind::Env),
    ]);
    let Some(names) = cfg.get("config.providers") else { return Ok(m) };
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let class = cfg.get(&format!("config.providers.{name}.class")).map(String::as_str).unwrap_or_default();
        let kind = match class.rsplit('.').next().unwrap_or_default() {
            "FileConfigProvider" => Kind::File,
            "DirectoryConfigProvider" => Kind::Directory,
            "EnvVarConfigProvider" => Kind::Env,
            _ => {
                return Err(format!(
                    "config provider {name:?} has class {class:?}; outboxd resolves only FileConfigProvider, DirectoryConfigProvider and EnvVarConfigProvider: put those values in a file and use ${{file:PATH:KEY}}"
                ))
            }
        };
        m.insert(name.to_owned(), kind);
    }
    Ok(m)
}

fn resolve(
    key: &str,
    value: &str,
    providers: &BTreeMap<String, Kind>,
    files: &mut BTreeMap<String, BTreeMap<String, String>>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let inner = &after[..end];
        let kind = inner.split_once(':').and_then(|(name, _)| providers.get(name).map(|k| (*k, name)));
        match kind {
            Some((kind, name)) => {
                let arg = &inner[name.len() + 1..];
                out.push_str(&lookup(key, name, kind, arg, files)?);
            }
            None => out.push_str(&rest[start..start + 2 + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn lookup(
    key: &str,
    name: &str,
    kind: Kind,
    arg: &str,
    files: &mut BTreeMap<String, BTreeMap<String, String>>,
) -> Result<String, String> {
    let placeholder = format!("${{{name}:{arg}}}");
    let bad = |why: String| format!("{key}: {placeholder}: {why}");
    match kind {
        Kind::Env => {
            // Kafka's EnvVarConfigProvider writes `${env:NAME}`; `${env::NAME}` (empty path) too.
            let var = arg.strip_prefix(':').unwrap_or(arg);
            std::env::var(var).map_err(|_| bad(format!("environment variable {var} is not set; export it")))
        }
        Kind::File | Kind::Directory => {
            let (path, item) = arg
                .rsplit_once(':')
                .filter(|(p, k)| !p.is_empty() && !k.is_empty())
                .ok_or_else(|| bad(format!("expected ${{{name}:PATH:KEY}}")))?;
            if kind == Kind::Directory {
                let file = std::path::Path::new(path).join(item);
                return std::fs::read_to_string(&file)
                    .map_err(|e| bad(format!("cannot read {} ({e}); create it or fix the path", file.display())));
            }
            if !files.contains_key(path) {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| bad(format!("cannot read {path} ({e}); create it or fix the path")))?;
                let entries =
                    properties::parse(&text).map_err(|e| bad(format!("{path} line {}: {}", e.line, e.why)))?;
                files.insert(path.to_owned(), entries.into_iter().map(|e| (e.key, e.value)).collect());
            }
            files[path].get(item).cloned().ok_or_else(|| bad(format!("{path} has no key {item:?}; add {item}=… to it")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn file_env_and_directory_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("secrets.properties");
        std::fs::write(&f, "db.password=s3cr:et\nkafka.password = k-pass\n").unwrap();
        std::fs::write(dir.path().join("user"), "alice").unwrap();
        std::env::set_var("OUTBOXD_TEST_PROVIDER_VAR", "from-env");
        let p = f.display().to_string();
        let d = dir.path().display().to_string();
        let cfg = map(&[
            ("config.providers", "file,dir,env"),
            ("config.providers.file.class", "org.apache.kafka.common.config.provider.FileConfigProvider"),
            ("config.providers.dir.class", "org.apache.kafka.common.config.provider.DirectoryConfigProvider"),
            ("config.providers.env.class", "org.apache.kafka.common.config.provider.EnvVarConfigProvider"),
            ("database.password", &format!("${{file:{p}:db.password}}")),
            ("jaas", &format!("u=\"${{dir:{d}:user}}\" p=\"${{file:{p}:kafka.password}}\";")),
            ("e", "${env:OUTBOXD_TEST_PROVIDER_VAR}"),
            ("route", "outbox.event.${routedByValue}"),
            ("server", "${HOST:localhost}"),
        ]);
        let r = resolve_all(cfg).unwrap();
        assert_eq!(r["database.password"], "s3cr:et");
        assert_eq!(r["jaas"], "u=\"alice\" p=\"k-pass\";");
        assert_eq!(r["e"], "from-env");
        assert_eq!(r["route"], "outbox.event.${routedByValue}");
        assert_eq!(r["server"], "${HOST:localhost}");
        assert!(!r.keys().any(|k| k.starts_with("config.providers")));
    }

    #[test]
    fn missing_things_are_clear_and_show_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.properties");
        std::fs::write(&f, "other=hunter22\n").unwrap();
        let p = f.display().to_string();
        let cases = [
            (format!("${{file:{p}:pw}}"), "has no key \"pw\""),
            (format!("${{file:{p}.gone:pw}}"), "cannot read"),
            ("${env:OUTBOXD_SURELY_UNSET_VAR}".to_owned(), "OUTBOXD_SURELY_UNSET_VAR is not set"),
            ("${file:nopath}".to_owned(), "PATH:KEY"),
        ];
        for (v, want) in cases {
            let e = resolve_all(map(&[("database.password", &v)])).unwrap_err();
            assert!(e.contains(want) && e.contains("database.password") && !e.contains("hunter22"), "{e}");
        }
        let e = resolve_all(map(&[
            ("config.providers", "vault"),
            ("config.providers.vault.class", "com.example.VaultConfigProvider"),
        ]))
        .unwrap_err();
        assert!(e.contains("vault") && e.contains("FileConfigProvider"), "{e}");
    }
}
