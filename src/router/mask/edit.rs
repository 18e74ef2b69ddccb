//! Rewriting JSON text in place: only the containers on the path to a changed value are rebuilt
//! (compact, members in their original order); every other value keeps its exact bytes. So
//! numbers keep their spelling (`10.50`, 20-digit ids), keys keep their order, and a document no
//! rule changed comes back as `None`, for the caller to keep the original bytes.
//!
//! Values are addressed through borrowed [`RawValue`]s, so the text of a value is a slice of the
//! document; a container is parsed only when a rule descends into it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::rules::{Action, Node};

/// The top level of one JSON value. Keys borrow from the text unless they hold escapes.
pub enum Shape<'a> {
    Object(Vec<(Cow<'a, str>, &'a RawValue)>),
    Array(Vec<&'a RawValue>),
    Scalar,
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Shape<'de>, A::Error> {
        let mut members = Vec::new();
        while let Some(Key(k)) = m.next_key::<Key<'de>>()? {
            members.push((k, m.next_value::<&'de RawValue>()?));
        }
        Ok(Shape::Object(members))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Shape<'de>, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = s.next_element::<&'de RawValue>()? {
            items.push(v);
        }
        Ok(Shape::Array(items))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shape<'de>, E> {
        Ok(Shape::Scalar)
    }
}

/// An object key, borrowed when the text allows.
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::Deserialize<'de> for Shape<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

/// Parse the whole of `text` (surrounding whitespace allowed, nothing else).
pub fn shape(text: &str) -> Result<Shape<'_>, serde_json::Error> {
    serde_json::from_str(text)
}

/// What became of one value.
pub enum Edited {
    Keep,
    Set(String),
    Drop,
}

/// Applies one action to the JSON text of a value at a path (see [`push_token`]): `None` drops it.
pub type ActFn<'f> = dyn Fn(Action, &str, &str) -> Result<Option<String>, String> + 'f;

/// Append one JSON Pointer token (`/`, then the name with `~` as `~0` and `/` as `~1`) to `path`.
/// A value's path is where it sits: `/card/number` in a payload, `/items/3/n` for an element.
pub fn push_token(path: &mut String, name: &str) {
    path.push('/');
    for c in name.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// Apply the trie `node` to the value whose JSON text is `text` and whose path is `path`: the
/// rules below it first, then its own actions in order. `path` comes back as it went in.
pub fn edit(text: &str, node: &Node, path: &mut String, act: &ActFn) -> Result<Edited, String> {
    let mut cur = if node.children.is_empty() { None } else { edit_children(text, node, path, act)? };
    for &a in &node.actions {
        match act(a, cur.as_deref().unwrap_or(text), path)? {
            None => return Ok(Edited::Drop),
            Some(s) => cur = Some(s),
        }
    }
    Ok(cur.map_or(Edited::Keep, Edited::Set))
}

/// Apply `node`'s children to the members of the container `text`; `None` when nothing changed
/// (including when `text` is not a container: a rule's path is then missing, which is no error).
pub fn edit_children(text: &str, node: &Node, path: &mut String, act: &ActFn) -> Result<Option<String>, String> {
    let len = path.len();
    let r = edit_children_at(text, node, path, act);
    path.truncate(len);
    r
}

fn edit_children_at(text: &str, node: &Node, path: &mut String, act: &ActFn) -> Result<Option<String>, String> {
    let base = path.len();
    let first = text.trim_start().as_bytes().first().copied();
    if !matches!(first, Some(b'{' | b'[')) {
        return Ok(None);
    }
    let shape = shape(text).map_err(|e| format!("is not JSON ({e})"))?;
    match shape {
        Shape::Object(members) => {
            let mut changed = false;
            let mut kept: Vec<(Cow<str>, Option<String>, &RawValue)> = Vec::with_capacity(members.len());
            'member: for (k, v) in members {
                let mut val: Option<String> = None;
                for (tok, child) in &node.children {
                    if !tok.matches_key(&k) {
                        continue;
                    }
                    path.truncate(base);
                    push_token(path, &k);
                    match edit(val.as_deref().unwrap_or(v.get()), child, path, act)? {
                        Edited::Keep => {}
                        Edited::Set(s) => (val, changed) = (Some(s), true),
                        Edited::Drop => {
                            changed = true;
                            continue 'member;
                        }
                    }
                }
                kept.push((k, val, v));
            }
            if !changed {
                return Ok(None);
            }
            let mut out = String::with_capacity(text.len());
            out.push('{');
            for (i, (k, val, v)) in kept.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&json_string(k));
                out.push(':');
                out.push_str(val.as_deref().unwrap_or(v.get()));
            }
            out.push('}');
            Ok(Some(out))
        }
        Shape::Array(items) => {
            let mut changed = false;
            let mut kept: Vec<(Option<String>, &RawValue)> = Vec::with_capacity(items.len());
            'item: for (i, v) in items.into_iter().enumerate() {
                let mut val: Option<String> = None;
                for (tok, child) in &node.children {
                    if !tok.matches_index(i) {
                        continue;
                    }
                    path.truncate(base);
                    push_token(path, &i.to_string());
                    match edit(val.as_deref().unwrap_or(v.get()), child, path, act)? {
                        Edited::Keep => {}
                        Edited::Set(s) => (val, changed) = (Some(s), true),
                        Edited::Drop => {
                            changed = true;
                            continue 'item;
                        }
                    }
                }
                kept.push((val, v));
            }
            if !changed {
                return Ok(None);
            }
            let mut out = String::with_capacity(text.len());
            out.push('[');
            for (i, (val, v)) in kept.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(val.as_deref().unwrap_or(v.get()));
            }
            out.push(']');
            Ok(Some(out))
        }
        Shape::Scalar => Ok(None),
    }
}

/// A visitor of [`walk`]: (JSON text of a value, its path) in, a replacement or `None` out.
pub type WalkFn<'f> = dyn FnMut(&str, &str) -> Result<Option<String>, String> + 'f;

/// Visit every value of `text` (whose path is `path`), outermost first: `f` may replace a value
/// (its inside is then not visited); containers holding a replaced value are rebuilt. `None`:
/// nothing replaced. `path` comes back as it went in.
pub fn walk(text: &str, path: &mut String, f: &mut WalkFn) -> Result<Option<String>, String> {
    if let Some(s) = f(text, path)? {
        return Ok(Some(s));
    }
    let base = path.len();
    let r = match shape(text).map_err(|e| format!("is not JSON ({e})"))? {
        Shape::Object(members) => {
            let mut parts = Vec::with_capacity(members.len());
            let mut changed = false;
            for (k, v) in &members {
                path.truncate(base);
                push_token(path, k);
                let new = walk(v.get(), path, f)?;
                changed |= new.is_some();
                parts.push(format!("{}:{}", json_string(k), new.as_deref().unwrap_or(v.get())));
            }
            changed.then(|| format!("{{{}}}", parts.join(",")))
        }
        Shape::Array(items) => {
            let mut parts = Vec::with_capacity(items.len());
            let mut changed = false;
            for (i, v) in items.iter().enumerate() {
                path.truncate(base);
                push_token(path, &i.to_string());
                let new = walk(v.get(), path, f)?;
                changed |= new.is_some();
                parts.push(new.unwrap_or_else(|| v.get().to_owned()));
            }
            changed.then(|| format!("[{}]", parts.join(",")))
        }
        Shape::Scalar => None,
    };
    path.truncate(base);
    Ok(r)
}

/// The text `hash` and `last4` work on: a string's characters, else the compact JSON text.
pub fn value_text(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw).map_err(|e| format!("is not JSON ({e})"))
    } else {
        serde_json::from_str::<serde_json::Value>(raw).map(|v| v.to_string()).map_err(|e| format!("is not JSON ({e})"))
    }
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    // Serializing a str cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// Every character but the last four as `*`; a value of four characters or fewer is all `*`
/// (its "last four" would be all of it).
pub fn last4(s: &str) -> String {
    let n = s.chars().count();
    if n <= 4 {
        return "*".repeat(n);
    }
    let mut out = "*".repeat(n - 4);
    out.extend(s.chars().skip(n - 4));
    out
}
