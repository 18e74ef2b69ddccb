//! JSON-semantic comparison of a legacy payload with its shadow copy, as a list of JSON Pointer
//! paths (RFC 6901) where they differ.
//!
//! What counts as equal, decided once here:
//! * objects: the same keys with equal values; key order and whitespace never matter;
//! * numbers: by value, so `1`, `1.0` and `1e0` are equal. Two integers compare exactly (even past
//!   2^53); an integer against a fraction compares as `f64`;
//! * strings, booleans and `null`: exactly; `null` and a missing key differ (the key's path);
//! * arrays: element by element; extra elements on either side are one path each;
//! * a value of another type: its path, once, without descending.
//!
//! A payload that is not JSON is compared byte for byte; so are a missing payload (a tombstone)
//! against anything. Either way a difference is reported at the root path `""`.
//!
//! `--ignore POINTER` drops differences at that path and below; a `*` segment matches any one
//! key or array index (`/items/*/sentAt`). A key that is literally `*` cannot be named then, which
//! no event we know of needs.

use serde_json::{Number, Value};

/// One segment of an `--ignore` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Any,
    Token(String),
}

/// The `--ignore` patterns.
#[derive(Clone, Debug, Default)]
pub struct Ignore {
    patterns: Vec<Vec<Seg>>,
}

impl Ignore {
    /// Parses each pattern; the error names the bad one.
    pub fn parse(list: &[String]) -> Result<Ignore, String> {
        let mut patterns = Vec::with_capacity(list.len());
        for p in list {
            let tokens = parse_pointer(p).map_err(|why| format!("--ignore {p:?}: {why}"))?;
            if tokens.is_empty() {
                return Err(format!(
                    "--ignore {p:?} would ignore the whole payload; name a field, e.g. /sentAt or /items/*/sentAt"
                ));
            }
            patterns.push(tokens.into_iter().map(|t| if t == "*" { Seg::Any } else { Seg::Token(t) }).collect());
        }
        Ok(Ignore { patterns })
    }

    /// Whether differences at `path` (and so below it) are ignored.
    fn covers(&self, path: &[String]) -> bool {
        self.patterns.iter().any(|p| {
            p.len() == path.len()
                && p.iter().zip(path).all(|(s, t)| match s {
                    Seg::Any => true,
                    Seg::Token(want) => want == t,
                })
        })
    }
}

/// Splits an RFC 6901 pointer into unescaped tokens; `""` is the root (no tokens).
pub fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err("a JSON Pointer starts with '/', e.g. /order/total".into());
    };
    rest.split('/').map(unescape).collect()
}

fn unescape(t: &str) -> Result<String, String> {
    let mut out = String::with_capacity(t.len());
    let mut chars = t.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            _ => return Err("'~' must be followed by 0 ('~') or 1 ('/')".into()),
        }
    }
    Ok(out)
}

/// Tokens back to a pointer, escaped.
pub fn render_pointer(tokens: &[String]) -> String {
    let mut s = String::new();
    for t in tokens {
        s.push('/');
        s.push_str(&t.replace('~', "~0").replace('/', "~1"));
    }
    s
}

/// A record's value as the comparison sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    Json(Value),
    /// Not JSON: compared byte for byte.
    Raw(Vec<u8>),
    /// No value at all (a tombstone).
    Absent,
}

impl Payload {
    pub fn from_bytes(bytes: Option<&[u8]>) -> Payload {
        match bytes {
            None => Payload::Absent,
            Some(b) => match serde_json::from_slice(b) {
                Ok(v) => Payload::Json(v),
                Err(_) => Payload::Raw(b.to_vec()),
            },
        }
    }
}

/// The paths where `shadow` differs from `legacy`, minus ignored ones, in document order (keys
/// sorted). Empty means the two match.
pub fn diff(legacy: &Payload, shadow: &Payload, ignore: &Ignore) -> Vec<String> {
    match (legacy, shadow) {
        (Payload::Json(a), Payload::Json(b)) => {
            let mut out = Vec::new();
            walk(a, b, &mut Vec::new(), ignore, &mut out);
            out
        }
        (a, b) if a == b => Vec::new(),
        _ => vec![String::new()],
    }
}

fn walk(a: &Value, b: &Value, path: &mut Vec<String>, ignore: &Ignore, out: &mut Vec<String>) {
    if ignore.covers(path) {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            // serde_json's map is ordered by key, so merging the two key lists keeps paths sorted.
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                path.push(k.clone());
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => walk(va, vb, path, ignore, out),
                    _ => leaf(path, ignore, out),
                }
                path.pop();
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                path.push(i.to_string());
                match (x.get(i), y.get(i)) {
                    (Some(va), Some(vb)) => walk(va, vb, path, ignore, out),
                    _ => leaf(path, ignore, out),
                }
                path.pop();
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            if !numbers_equal(x, y) {
                out.push(render_pointer(path));
            }
        }
        _ => {
            if a != b {
                out.push(render_pointer(path));
            }
        }
    }
}

fn leaf(path: &[String], ignore: &Ignore, out: &mut Vec<String>) {
    if !ignore.covers(path) {
        out.push(render_pointer(path));
    }
}

fn numbers_equal(a: &Number, b: &Number) -> bool {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return x == y;
    }
    if a.is_f64() || b.is_f64() {
        return a.as_f64() == b.as_f64();
    }
    // One negative integer and one above i64::MAX.
    false
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ig(list: &[&str]) -> Ignore {
        Ignore::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn d(a: &str, b: &str, ignore: &[&str]) -> Vec<String> {
        diff(&Payload::from_bytes(Some(a.as_bytes())), &Payload::from_bytes(Some(b.as_bytes())), &ig(ignore))
    }

    #[test]
    fn key_order_whitespace_and_number_spelling_do_not_matter() {
        assert!(d(r#"{"a":1,"b":{"c":[1,2.5]}}"#, r#"{ "b": {"c": [1.0, 25e-1]}, "a": 1e0 }"#, &[]).is_empty());
        assert!(d("18446744073709551615", "18446744073709551615", &[]).is_empty());
        assert_eq!(d("9007199254740993", "9007199254740992", &[]), vec![""], "integers compare exactly");
        assert_eq!(d("-1", "18446744073709551615", &[]), vec![""]);
    }

    #[test]
    fn each_difference_has_its_path() {
        let a = r#"{"total":10,"items":[{"sku":"a","qty":1},{"sku":"b"}],"note":null,"gone":1,"t":"x"}"#;
        let b = r#"{"total":11,"items":[{"sku":"a","qty":2}],"note":"n","new":true,"t":["x"]}"#;
        assert_eq!(d(a, b, &[]), vec!["/gone", "/items/0/qty", "/items/1", "/new", "/note", "/t", "/total"]);
        // null and a missing key differ.
        assert_eq!(d(r#"{"a":null}"#, "{}", &[]), vec!["/a"]);
        // Keys needing escapes come back escaped.
        assert_eq!(d(r#"{"a/b":{"c~d":1}}"#, r#"{"a/b":{"c~d":2}}"#, &[]), vec!["/a~1b/c~0d"]);
    }

    #[test]
    fn ignore_drops_the_path_and_below_with_star_for_any_segment() {
        let a = r#"{"sentAt":"1","meta":{"trace":"x","v":1},"items":[{"at":1,"p":1},{"at":2,"p":2}],"total":5}"#;
        let b = r#"{"sentAt":"2","meta":{"trace":"y","v":2},"items":[{"at":3,"p":1},{"at":4,"p":3}],"total":5}"#;
        assert_eq!(d(a, b, &[]), vec!["/items/0/at", "/items/1/at", "/items/1/p", "/meta/trace", "/meta/v", "/sentAt"]);
        assert_eq!(d(a, b, &["/sentAt", "/meta", "/items/*/at"]), vec!["/items/1/p"]);
        // An ignored field missing on one side is ignored too.
        assert!(d(r#"{"a":1,"sentAt":"x"}"#, r#"{"a":1}"#, &["/sentAt"]).is_empty());
        assert!(d(r#"{"a":[1,2]}"#, r#"{"a":[1]}"#, &["/a/*"]).is_empty());
        // `*` is one segment only.
        assert_eq!(d(r#"{"a":{"b":{"c":1}}}"#, r#"{"a":{"b":{"c":2}}}"#, &["/*/c"]), vec!["/a/b/c"]);
    }

    #[test]
    fn non_json_and_missing_payloads_compare_as_bytes_at_the_root() {
        let raw = |s: &str| Payload::from_bytes(Some(s.as_bytes()));
        assert!(diff(&raw("not json"), &raw("not json"), &Ignore::default()).is_empty());
        assert_eq!(diff(&raw("not json"), &raw("not jsoN"), &Ignore::default()), vec![""]);
        assert_eq!(diff(&raw("{}"), &Payload::Absent, &Ignore::default()), vec![""]);
        assert!(diff(&Payload::Absent, &Payload::Absent, &Ignore::default()).is_empty());
        assert_eq!(Payload::from_bytes(Some(b" {\"a\": 1} ")), Payload::Json(json!({"a": 1})));
    }

    #[test]
    fn pointers_parse_and_bad_patterns_are_refused_by_name() {
        assert_eq!(parse_pointer("").unwrap(), Vec::<String>::new());
        assert_eq!(parse_pointer("/a~1b/~0/").unwrap(), vec!["a/b", "~", ""]);
        assert_eq!(render_pointer(&parse_pointer("/a~1b/~0/").unwrap()), "/a~1b/~0/");
        for bad in ["total", "/a~2", "/a~"] {
            assert!(parse_pointer(bad).is_err(), "{bad}");
            let e = Ignore::parse(&[bad.to_string()]).unwrap_err();
            assert!(e.contains("--ignore") && e.contains(bad), "{e}");
        }
        assert!(Ignore::parse(&["".into()]).unwrap_err().contains("whole payload"));
    }
}
