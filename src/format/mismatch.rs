//! A payload that does not fit its schema, said the same way for every format: the field's path
//! and what the schema expects there, in words, then what the payload has (`field
//! "order.lines[2].price": expected a double, got a string "twelve"`).
//!
//! The formats' own libraries report a mismatch in their internal terms (`Value::Double`,
//! `Decoded integer out of range for i32`) and mostly without the field; each format's explainer
//! ([`super::avro_fit`], [`super::proto_fit`], the JSON Schema writer) walks the payload with the
//! schema and builds a [`Mismatch`] instead. The library still decides what fits: an explainer
//! runs only after it refused the payload.

use std::fmt;

use serde_json::Value;

/// One step into a payload: a field (of a record, message or object), a map key, or an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Field(String),
    Key(String),
    Index(usize),
}

/// Where in the payload: `order.lines[2].price`, `attributes["k"]`; empty is the payload itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Path(pub Vec<Step>);

impl Path {
    /// This path with `step` after it.
    pub fn with(&self, step: Step) -> Path {
        let mut p = self.clone();
        p.0.push(step);
        p
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            match step {
                Step::Field(name) if i == 0 => write!(f, "{name}")?,
                Step::Field(name) => write!(f, ".{name}")?,
                Step::Key(key) => write!(f, "[{key:?}]")?,
                Step::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// Where the payload does not fit, and why, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub path: Path,
    /// What is wrong there, e.g. `expected an int (32-bit), got 1099511627776`.
    pub why: String,
}

impl Mismatch {
    pub fn new(path: &Path, why: impl Into<String>) -> Mismatch {
        Mismatch { path: path.clone(), why: why.into() }
    }

    /// `expected {what}, got {the value in words}`.
    pub fn expected(path: &Path, what: &str, got: &Value) -> Mismatch {
        Mismatch::new(path, format!("expected {what}, got {}", words(got)))
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.0.is_empty() {
            write!(f, "the payload: {}", self.why)
        } else {
            write!(f, "field \"{}\": {}", self.path, self.why)
        }
    }
}

/// Longest quoted string shown, in characters: the reason names the value, it does not copy it.
const SHOWN_CHARS: usize = 40;

/// A JSON value in words: `null`, `true`, `1099511627776`, `a string "twelve"`, `an object`.
pub fn words(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("a string {}", quoted(s)),
        Value::Array(a) => format!("an array of {} item{}", a.len(), if a.len() == 1 { "" } else { "s" }),
        Value::Object(_) => "an object".into(),
    }
}

/// `s` in double quotes, cut to [`SHOWN_CHARS`] characters.
pub fn quoted(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}

/// A list of names as `[A, B, C]`, cut after 10.
pub fn list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
    let more = if names.len() > 10 { format!(", … ({} in all)", names.len()) } else { String::new() };
    format!("[{}{more}]", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_and_values_read_as_words() {
        let p = Path::default().with(Step::Field("order".into())).with(Step::Field("lines".into()));
        let p = p.with(Step::Index(2)).with(Step::Key("k".into()));
        assert_eq!(
            Mismatch::expected(&p, "a double", &json!("twelve")).to_string(),
            r#"field "order.lines[2]["k"]": expected a double, got a string "twelve""#
        );
        assert_eq!(
            Mismatch::expected(&Path::default(), "an object", &json!([1])).to_string(),
            "the payload: expected an object, got an array of 1 item"
        );
        assert_eq!(words(&json!(1099511627776u64)), "1099511627776");
        assert_eq!(words(&json!("x".repeat(100))), format!("a string \"{}\"…", "x".repeat(40)));
        assert_eq!(list(&["EUR".into(), "USD".into()]), "[EUR, USD]");
    }
}
