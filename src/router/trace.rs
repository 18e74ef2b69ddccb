//! W3C trace context from an outbox column (Debezium's `tracing.span.context.field`, by default
//! `tracingspancontext`): the writer's `traceparent` and `tracestate`, which the router puts on the
//! record as headers of those names, so every sink carries them (Kafka headers, NATS headers,
//! AMQP headers, HTTP headers).
//!
//! The column holds either a bare `traceparent` (`00-<trace id>-<parent id>-<flags>`) or what
//! Debezium's instrumentation writes there: `java.util.Properties` text (`key=value` lines,
//! `#` comments, backslash escapes), of which `traceparent` and `tracestate` are read. A value
//! that is not valid trace context is left out (the event still goes), never trusted.

/// One event's trace context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// Read the column's text.
pub fn parse(text: &[u8]) -> Result<TraceContext, String> {
    let text = std::str::from_utf8(text).map_err(|_| "it is not UTF-8 text".to_owned())?.trim();
    if valid_traceparent(text) {
        return Ok(TraceContext { traceparent: text.to_owned(), tracestate: None });
    }
    let (mut parent, mut state) = (None, None);
    for line in text.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let (key, value) = split_property(line);
        match key.as_str() {
            "traceparent" => parent = Some(value),
            "tracestate" => state = Some(value).filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    let parent = parent.ok_or_else(|| "it holds no traceparent (a bare one, or a traceparent= line)".to_owned())?;
    if !valid_traceparent(&parent) {
        return Err(format!("traceparent {parent:?} is not W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)"));
    }
    if let Some(s) = &state {
        if s.len() > 512 || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err("tracestate is longer than 512 characters or not printable ASCII".into());
        }
    }
    Ok(TraceContext { traceparent: parent, tracestate: state })
}

/// `version-traceid-parentid-flags`, lowercase hex; version `ff` and all-zero ids are invalid.
fn valid_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match parts.as_slice() {
        [version, trace, parent, flags, rest @ ..] => {
            hex(version, 2)
                && *version != "ff"
                // Version 00 has exactly four fields; later versions may add more.
                && (rest.is_empty() || *version != "00")
                && hex(trace, 32)
                && hex(parent, 16)
                && hex(flags, 2)
                && trace.bytes().any(|b| b != b'0')
                && parent.bytes().any(|b| b != b'0')
        }
        _ => false,
    }
}

/// A `java.util.Properties` line as key and value: the key ends at the first unescaped `=`, `:` or
/// whitespace; escapes (`\=`, `\:`, `\t`, `\uXXXX`, …) are undone in both.
fn split_property(line: &str) -> (String, String) {
    let mut key = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.push(unescape(&mut chars)),
            '=' | ':' => break,
            c if c.is_whitespace() => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('=' | ':')) {
                    chars.next();
                }
                break;
            }
            c => key.push(c),
        }
    }
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
    let mut value = String::new();
    while let Some(c) = chars.next() {
        if c == '\\' {
            value.push(unescape(&mut chars));
        } else {
            value.push(c);
        }
    }
    (key, value.trim_end().to_owned())
}

fn unescape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> char {
    match chars.next() {
        Some('t') => '\t',
        Some('n') => '\n',
        Some('r') => '\r',
        Some('f') => '\u{c}',
        Some('u') => {
            let hex: String = chars.by_ref().take(4).collect();
            u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or('\u{fffd}')
        }
        Some(c) => c,
        None => '\\',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_bare_traceparent_and_debeziums_properties_text() {
        assert_eq!(parse(TP.as_bytes()).unwrap(), TraceContext { traceparent: TP.into(), tracestate: None });
        // What java.util.Properties.store writes: a date comment, '=' and ':' escaped in values.
        let props = format!(
            "#Thu Dec 03 10:00:00 UTC 2026\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\ntraceparent={TP}\n"
        );
        assert_eq!(
            parse(props.as_bytes()).unwrap(),
            TraceContext { traceparent: TP.into(), tracestate: Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into()) }
        );
        assert_eq!(parse(format!("traceparent : {TP}").as_bytes()).unwrap().traceparent, TP);
    }

    #[test]
    fn what_is_not_trace_context_is_refused() {
        for bad in [
            "",
            "hello",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "traceparent=00-abc-def-01",
            "tracestate=x=1",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(parse(&[0xff, 0xfe]).is_err());
        assert!(parse(format!("traceparent={TP}\ntracestate=caf\\u00e9=1").as_bytes()).is_err());
    }
}
