//! `--postgres-url` read as libpq reads it: every URI of PostgreSQL's own libpq regression inputs
//! (`src/interfaces/libpq/test/regress.in`) and libpq's key/value quoting and escaping rules,
//! each parsed by this machine's libpq (`PQconninfoParse` through `tests/data/libpq_conninfo.py`)
//! and by outboxd. Where libpq refuses, outboxd refuses; where libpq accepts, outboxd connects to
//! the same hosts, ports and addresses as the same user to the same database, or refuses with a
//! message naming what it does not support. No error message shows a password.

use std::collections::BTreeMap;
use std::path::PathBuf;

use outboxd::config::postgres::{Fallbacks, PgHost, PgTarget};

/// PostgreSQL's libpq URI regression inputs (regress.in), in its order.
const REGRESS_URIS: &[&str] = &[
    "postgresql://uri-user:secret@host:12345/db",
    "postgresql://uri-user@host:12345/db",
    "postgresql://uri-user@host/db",
    "postgresql://host:12345/db",
    "postgresql://host/db",
    "postgresql://uri-user@host:12345/",
    "postgresql://uri-user@host/",
    "postgresql://uri-user@",
    "postgresql://host:12345/",
    "postgresql://host:12345",
    "postgresql://host/db",
    "postgresql://host/",
    "postgresql://host",
    "postgresql://",
    "postgresql://?hostaddr=127.0.0.1",
    "postgresql://example.com?hostaddr=63.1.2.4",
    "postgresql://%68ost/",
    "postgresql://host/db?user=uri-user",
    "postgresql://host/db?user=uri-user&port=12345",
    "postgresql://host/db?u%73er=someotheruser&port=12345",
    "postgresql://host/db?u%7aer=someotheruser&port=12345",
    "postgresql://host:12345?user=uri-user",
    "postgresql://host?user=uri-user",
    "postgresql://host?",
    "postgresql://[::1]:12345/db",
    "postgresql://[::1]/db",
    "postgresql://[2001:db8::1234]/",
    "postgresql://[200z:db8::1234]/",
    "postgresql://[::1]",
    "postgres://",
    "postgres:///",
    "postgres:///db",
    "postgres://uri-user@/db",
    "postgres://?host=/path/to/socket/dir",
    "postgresql://host?uzer=",
    "postgre://",
    "postgres://[::1",
    "postgres://[]",
    "postgres://[::1]z",
    "postgresql://host?zzz",
    "postgresql://host?value1&value2",
    "postgresql://host?key=key=value",
    "postgres://host?dbname=%XXfoo",
    "postgresql://a%00b",
    "postgresql://%zz",
    "postgresql://%1",
    "postgresql://%",
    "postgres://@host",
    "postgres://host:/",
    "postgres://:12345/",
    "postgres://otheruser@?host=/no/such/directory",
    "postgres://otheruser@/?host=/no/such/directory",
    "postgres://otheruser@:12345?host=/no/such/socket/path",
    "postgres://otheruser@:12345/db?host=/path/to/socket",
    "postgres://:12345/db?host=/path/to/socket",
    "postgres://:12345?host=/path/to/socket",
    "postgres://%2Fvar%2Flib%2Fpostgresql/dbname",
];

/// More inputs: libpq's key/value rules, host lists, hostaddr, escapes near a password.
const MORE: &[&str] = &[
    "host=a port=1",
    "  host = a   port =1  ",
    r"host='a b' dbname='x\'y'",
    r"dbname=a\ b user=u",
    r"dbname='a\\b' user='u\x'",
    "password='' host=h",
    "host= port=5432",
    "host='a'dbname=b",
    "host=a dbname",
    "host='open",
    "=x",
    "host=a bogus=1",
    "keepalives_retries=3 host=h",
    "host=a,b,c port=1,2,3",
    "host=a,,c port=7",
    "host=/tmp,b port=5,6",
    "hostaddr=127.0.0.1 port=6543",
    "host=db.example hostaddr=10.0.0.7",
    "host=a,b hostaddr=10.0.0.1,::1",
    // An empty hostaddr entry: that host is reached by its name (libpq's connectOptions2).
    "host=a,b hostaddr=,10.0.0.2",
    "host=a,b,/tmp hostaddr=10.0.0.1,,",
    "hostaddr=,127.0.0.1",
    "user=u user=v dbname=d",
    "dbname='' user=u",
    "application_name='my app' options='-c search_path=x' host=h",
    "fallback_application_name=fb host=h",
    "postgresql://host/db?port=12345",
    "postgresql://u:p%40ss@h1:1,h2:2/db?application_name=x%20y",
    "postgresql://h1:1,h2/db",
    "postgresql://h?ssl=true",
    "postgresql://h/db?sslmode=disable&host=h2",
    "postgresql://[::1]:5433,[fe80::1]/db",
    "postgresql://h:/db",
    "postgresql://h/db?",
    "postgresql://h/db?a=1&",
    "postgresql://h/db?user=a&&port=1",
    "postgresql://u:s3cret@h/db?%zz=1",
    "postgresql://u:s%zzcret@h/db",
    "postgresql://u:s3cret@h/db?password=x%zz",
    "postgresql://user:pw@h/db?host=%2Ftmp%2Fpg",
    "POSTGRES://h/db",
];

/// Inputs libpq accepts (its parse does not check these values, or it knows the keyword) that
/// outboxd refuses, with a text the refusal must contain.
const REFUSED: &[(&str, &str)] = &[
    ("host=a,b port=1,2,3", "2 hosts but 3 ports"),
    ("postgresql://h:abc/db", "port \"abc\""),
    ("host=a hostaddr=not-an-ip", "hostaddr \"not-an-ip\""),
    ("host=a,b hostaddr=10.0.0.1", "2 host names but 1 hostaddr"),
    ("host=/tmp hostaddr=10.0.0.1", "socket directory"),
    ("gssencmode=disable host=h", "gssencmode is a libpq parameter outboxd does not support"),
    ("postgresql://h/db?service=x", "service is a libpq parameter outboxd does not support"),
    ("postgresql://h/db?replication=database", "replication is a libpq parameter"),
    ("host=h client_encoding=LATIN1", "client_encoding"),
    ("host=h channel_binding=maybe", "channel_binding"),
    ("host=h sslmode=sometimes", "sslmode"),
];

/// What libpq said about one input.
#[derive(Debug)]
enum Libpq {
    Ok(BTreeMap<String, String>),
    Err(String),
}

fn libpq(inputs: &[&str]) -> Vec<Libpq> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/libpq_conninfo.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    serde_json::to_writer(child.stdin.take().unwrap(), inputs).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the libpq helper failed (is libpq5 installed?)");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("libpq version {}", v["version"]);
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match (r.get("ok"), r.get("err")) {
            (Some(ok), _) => Libpq::Ok(serde_json::from_value(ok.clone()).unwrap()),
            (_, Some(e)) => Libpq::Err(e.as_str().unwrap().to_owned()),
            _ => panic!("{r}"),
        })
        .collect()
}

fn ours(s: &str) -> Result<PgTarget, String> {
    let none = |_: &str| None;
    PgTarget::parse_with(s, &Fallbacks { env: &none, password_file: None }).map_err(|e| e.to_string())
}

/// Where libpq would connect, from the options it parsed, by libpq's documented defaults (no
/// environment): one entry per host (or hostaddr) name, an empty one meaning the default socket
/// directory; an empty hostaddr entry meaning the host's name; a missing port 5432; one port for
/// every host.
#[allow(clippy::type_complexity)]
fn libpq_hosts(d: &BTreeMap<String, String>) -> (Vec<(PgHost, u16)>, Vec<Option<std::net::IpAddr>>) {
    let list = |k: &str| -> Vec<String> {
        d.get(k).filter(|v| !v.is_empty()).map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default()
    };
    let (names, addrs, ports) = (list("host"), list("hostaddr"), list("port"));
    let addrs: Vec<Option<std::net::IpAddr>> = addrs.iter().map(|a| a.parse().ok()).collect();
    let n = names.len().max(addrs.len()).max(1);
    let port = |i: usize| -> u16 {
        let p = if ports.len() == 1 { &ports[0] } else { ports.get(i).map(String::as_str).unwrap_or("") };
        if p.is_empty() {
            5432
        } else {
            p.parse().unwrap()
        }
    };
    let hosts = (0..n)
        .map(|i| {
            let name = names.get(i).map(String::as_str).unwrap_or("");
            let h = if name.is_empty() {
                match addrs.get(i).copied().flatten() {
                    Some(a) => PgHost::Tcp(a.to_string()),
                    None => PgHost::Unix("/var/run/postgresql".into()),
                }
            } else if name.starts_with('/') {
                PgHost::Unix(name.into())
            } else {
                PgHost::Tcp(name.to_owned())
            };
            (h, port(i))
        })
        .collect();
    (hosts, addrs)
}

/// One input's verdict: `Ok` when outboxd agrees with libpq, `Err` saying how it does not.
fn compare(input: &str, lib: &Libpq, got: &Result<PgTarget, String>) -> Result<(), String> {
    match (lib, got) {
        (Libpq::Err(_), Err(_)) => Ok(()),
        (Libpq::Err(e), Ok(t)) => Err(format!("libpq refuses ({e}) but outboxd accepts: {t:?}")),
        (Libpq::Ok(d), Err(e)) => Err(format!("libpq accepts {d:?} but outboxd refuses: {e}")),
        (Libpq::Ok(d), Ok(t)) => {
            let (hosts, addrs) = libpq_hosts(d);
            let nonempty = |k: &str| d.get(k).filter(|v| !v.is_empty()).cloned();
            let user = nonempty("user").unwrap_or_else(|| "postgres".into());
            let want = (
                hosts,
                addrs,
                user.clone(),
                nonempty("dbname").unwrap_or(user),
                nonempty("password"),
                nonempty("application_name").or(nonempty("fallback_application_name")).unwrap_or("outboxd".into()),
                nonempty("options"),
            );
            let have = (
                t.hosts.clone(),
                t.hostaddrs.clone(),
                t.user.clone(),
                t.dbname.clone(),
                t.password.clone(),
                t.application_name.clone(),
                t.options.clone(),
            );
            if want == have {
                Ok(())
            } else {
                Err(format!("{input}: libpq {d:?}\n  want {want:?}\n  have {have:?}"))
            }
        }
    }
}

#[test]
fn outboxd_reads_connection_strings_as_libpq_does() {
    let inputs: Vec<&str> = REGRESS_URIS.iter().chain(MORE).copied().collect();
    assert_eq!(REGRESS_URIS.len(), 57, "every regress.in line");
    let lib = libpq(&inputs);
    let mut bad = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for (input, lib) in inputs.iter().zip(&lib) {
        let got = ours(input);
        match compare(input, lib, &got) {
            Ok(()) => {
                if got.is_ok() {
                    accepted += 1
                } else {
                    refused += 1
                }
            }
            Err(why) => bad.push(format!("{input}\n  {why}")),
        }
        if let Err(e) = &got {
            // One line, and never a password.
            assert!(!e.contains('\n'), "{input}: {e}");
            for secret in ["secret", "s3cret", "zzcret", "p@ss", "pw@"] {
                assert!(!e.contains(secret), "{input}: the error shows the password: {e}");
            }
        }
    }
    assert!(bad.is_empty(), "{} of {} inputs disagree with libpq:\n{}", bad.len(), inputs.len(), bad.join("\n"));
    // Both outcomes are exercised.
    assert!(accepted >= 40 && refused >= 15, "accepted {accepted}, refused {refused}");
}

#[test]
fn what_outboxd_does_not_support_is_refused_by_name() {
    let inputs: Vec<&str> = REFUSED.iter().map(|(s, _)| *s).collect();
    let lib = libpq(&inputs);
    for ((input, needle), lib) in REFUSED.iter().zip(&lib) {
        assert!(
            matches!(lib, Libpq::Ok(_)),
            "{input}: libpq's parse refuses it, so it belongs in the other table: {lib:?}"
        );
        let e = ours(input).err().unwrap_or_else(|| panic!("{input}: accepted"));
        assert!(e.contains(needle) && e.starts_with("--postgres-url: "), "{input}: {e}");
    }
}

/// The fields the comparison cannot see: hostaddr is where the connection goes, and it survives
/// `outboxd config`'s masked URL.
#[test]
fn hostaddr_is_used_and_round_trips() {
    let t = ours("host=db.example hostaddr=10.0.0.7 port=6000 user=u dbname=d sslmode=disable").unwrap();
    assert_eq!(t.hosts, vec![(PgHost::Tcp("db.example".into()), 6000)]);
    assert_eq!(t.hostaddrs, vec![Some("10.0.0.7".parse::<std::net::IpAddr>().unwrap())]);
    let url = t.to_url_masked();
    assert!(url.contains("hostaddr=10.0.0.7"), "{url}");
    assert!(ours(&url).unwrap() == t, "{url}");
    let c = t.to_tokio_postgres(0, t.hostaddrs[0]);
    assert_eq!(c.get_hostaddrs(), &["10.0.0.7".parse::<std::net::IpAddr>().unwrap()]);
    // An empty entry leaves its host to its name, and survives the masked URL too.
    let t = ours("host=a,b hostaddr=,10.0.0.8 port=6000 user=u dbname=d sslmode=disable").unwrap();
    assert_eq!(t.hostaddrs, vec![None, Some("10.0.0.8".parse().unwrap())]);
    let url = t.to_url_masked();
    assert!(url.contains("hostaddr=%2C10.0.0.8") || url.contains("hostaddr=,10.0.0.8"), "{url}");
    assert!(ours(&url).unwrap() == t, "{url}");
}
