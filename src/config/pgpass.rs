//! libpq's password file (`passfile`, `PGPASSFILE`, `~/.pgpass`): `host:port:db:user:password`
//! lines, a field of just `*` matching anything and `\` escaping `:`, `\` and `*`.
//!
//! As libpq does, each host of the conninfo is looked up on its own (a multi-host conninfo may
//! need a different password per server), and a Unix socket directory matches the host field
//! `localhost` only when it is the default socket directory; any other directory matches its own
//! path (PostgreSQL docs, "The Password File"). A file that group or others can read is ignored,
//! with a warning, as libpq ignores it.

use std::path::Path;

use super::postgres::host::{PgHost, DEFAULT_SOCKET_DIR};

/// Each host's password from `file`, by position in `hosts`; `None` where no line matches.
pub fn lookup_each(file: &Path, hosts: &[(PgHost, u16)], db: &str, user: &str) -> Vec<Option<String>> {
    let Some(text) = read(file) else {
        return vec![None; hosts.len()];
    };
    let lines: Vec<Vec<Field>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(split)
        .filter(|f| f.len() >= 5)
        .collect();
    hosts
        .iter()
        .map(|(host, port)| {
            let name = host_key(host);
            let port = port.to_string();
            let m = |f: &Field, v: &str| f.any || f.text == v;
            lines
                .iter()
                .find(|f| m(&f[0], &name) && m(&f[1], &port) && m(&f[2], db) && m(&f[3], user))
                .map(|f| f[4].text.clone())
        })
        .collect()
}

/// The host field a host is matched against: its name, `localhost` for the default socket
/// directory, and any other socket directory's path as written.
fn host_key(host: &PgHost) -> String {
    match host {
        PgHost::Tcp(h) => h.clone(),
        PgHost::Unix(d) if d.as_os_str() == DEFAULT_SOCKET_DIR => "localhost".into(),
        PgHost::Unix(d) => d.display().to_string(),
    }
}

fn read(file: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(file) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(file = %file.display(), "password file has group or world access; ignored as libpq does (chmod 0600 it)");
                return None;
            }
        }
    }
    std::fs::read_to_string(file).ok()
}

/// One field of a line, unescaped; `any` when it was a bare `*` (an escaped `\*` is a star).
struct Field {
    text: String,
    any: bool,
}

fn split(line: &str) -> Vec<Field> {
    let mut out = Vec::new();
    let (mut text, mut escaped) = (String::new(), false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                escaped = true;
                text.extend(chars.next());
            }
            // The fifth field, the password, keeps any further colons.
            ':' if out.len() < 4 => {
                out.push(Field { any: text == "*" && !escaped, text: std::mem::take(&mut text) });
                escaped = false;
            }
            c => text.push(c),
        }
    }
    out.push(Field { any: false, text });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pgpass");
        std::fs::write(&f, text).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        (dir, f)
    }

    #[test]
    fn every_host_is_looked_up_on_its_own() {
        let (_d, f) = file("# old primary\na:5432:*:*:pw-a\nb:5433:app:u:pw\\:b\n*:*:*:other:x\n");
        let hosts = [(PgHost::Tcp("a".into()), 5432), (PgHost::Tcp("b".into()), 5433), (PgHost::Tcp("c".into()), 5432)];
        assert_eq!(lookup_each(&f, &hosts, "app", "u"), vec![Some("pw-a".to_owned()), Some("pw:b".to_owned()), None]);
    }

    /// A bare `*` matches anything; an escaped one is a star (libpq's pwdfMatchesString).
    #[test]
    fn only_a_bare_star_is_a_wildcard() {
        let (_d, f) = file("\\*:*:*:*:star-host\n*:*:*:*:any\n");
        let hosts = [(PgHost::Tcp("h".into()), 1), (PgHost::Tcp("*".into()), 1)];
        assert_eq!(lookup_each(&f, &hosts, "d", "u"), vec![Some("any".to_owned()), Some("star-host".to_owned())]);
    }

    #[test]
    fn only_the_default_socket_directory_is_localhost() {
        let (_d, f) = file("localhost:5432:*:*:local\n/tmp/pg:5432:*:*:tmp\n");
        let hosts = [
            (PgHost::Unix(DEFAULT_SOCKET_DIR.into()), 5432),
            (PgHost::Unix("/tmp/pg".into()), 5432),
            (PgHost::Unix("/run/other".into()), 5432),
        ];
        assert_eq!(lookup_each(&f, &hosts, "d", "u"), vec![Some("local".to_owned()), Some("tmp".to_owned()), None]);
    }
}
