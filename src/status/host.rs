//! Which `Host` the status page answers: the defence against DNS rebinding.
//!
//! A page on any web site, open in a browser on the machine that runs outboxd, can point a name
//! of its own at 127.0.0.1 and then read that name's answers as its own origin: the status page's
//! routed values and dead-letter ids, unless the page refuses names it does not know. So the page
//! (`/`, `/status.json` and its assets) answers only a `Host` that is
//! - an IP address (v4, or v6 in brackets), with or without a port: a browser that asked for an
//!   address has no foreign origin to read with, and probes and port-forwards (a pod's IP) use one;
//! - `localhost` or a name under `.localhost`, which browsers resolve to loopback themselves;
//! - a name the operator lists in `--status-page-allowed-hosts` (checked by the config): `name`
//!   for that name, `.domain` for the domain and every name under it, `*` for any.
//!
//! A request without `Host` (HTTP/1.0) is answered: a browser always sends one. `/metrics`,
//! `/healthz` and `/readyz` are not checked: they carry no event data, and probes and scrapers
//! address a process by whatever name their service discovery has.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Whether the page answers a request with this `Host` header value (`None`: no header).
pub fn allowed(host: Option<&str>, listed: &[String]) -> bool {
    let Some(host) = host else { return true };
    let name = strip_port(host.trim()).to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if name.is_empty() {
        return false;
    }
    let is_address = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().is_ok(),
        None => name.parse::<Ipv4Addr>().is_ok(),
    };
    if is_address {
        return true;
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    listed.iter().any(|l| {
        let l = l.to_ascii_lowercase();
        l == "*" || l == name || l.strip_prefix('.').is_some_and(|d| name == d || name.ends_with(&format!(".{d}")))
    })
}

/// `host` without its `:port`; a bracketed IPv6 address keeps its brackets.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        // One colon: a port. More: an unbracketed IPv6 address, which is not a valid Host.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The `Host` header's value in a request head, if it has one.
pub fn header(head: &str) -> Option<&str> {
    head.split("\r\n")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("host")).map(|(_, v)| v.trim()))
}

/// The 403 body for a refused `Host`.
pub fn refusal(host: &str) -> String {
    let shown: String = host.chars().filter(|c| !c.is_control()).take(100).collect();
    format!(
        "the status page answers Host localhost, an IP address, or a name in --status-page-allowed-hosts; {shown:?} is none of them (add it there to use that name)\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_localhost_and_listed_names_only() {
        let listed = vec!["status.example.com".to_owned(), ".ops.example".to_owned()];
        for (host, want) in [
            (Some("127.0.0.1:9464"), true),
            (Some("127.0.0.1"), true),
            (Some("10.2.3.4:9464"), true), // a pod IP: kubelet probes, port-forwards
            (Some("[::1]:9464"), true),
            (Some("[::1]"), true),
            (Some("localhost:9464"), true),
            (Some("LOCALHOST."), true),
            (Some("app.localhost:9464"), true),
            (Some("status.example.com:9464"), true),
            (Some("Status.Example.com"), true),
            (Some("ops.example"), true),
            (Some("a.b.ops.example:1"), true),
            (None, true),
            (Some("attacker.example:9464"), false),
            (Some("rebind.attacker.example"), false),
            (Some("example.com"), false),
            (Some("evilops.example"), false),
            (Some("localhost.attacker.example"), false),
            (Some("127.0.0.1.nip.io"), false),
            (Some(""), false),
            (Some("[not-an-address]"), false),
        ] {
            assert_eq!(allowed(host, &listed), want, "{host:?}");
        }
        assert!(allowed(Some("anything.example"), &["*".to_owned()]));
    }

    #[test]
    fn the_header_is_found_in_any_case() {
        let head = "GET /status.json HTTP/1.1\r\nAccept: */*\r\nhOsT:  evil.example:9464 \r\n\r\n";
        assert_eq!(header(head), Some("evil.example:9464"));
        assert_eq!(header("GET / HTTP/1.0\r\n\r\nHost: body.example"), None);
    }
}
