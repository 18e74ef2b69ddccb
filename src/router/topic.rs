//! Topic naming: Debezium's `route.topic.regex` + `route.topic.replacement`, with Java semantics.
//!
//! The regex must match the whole routed value (Java's `Matcher.matches()`); then the replacement is
//! expanded with `${name}` for named groups and `$N` for numbered ones (`\$` is a literal dollar,
//! `\\` a backslash). A value the regex does not match becomes the topic as it is. Unlike Debezium,
//! a group the regex does not define is refused when the rule is built, not on every record.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use regex::Regex;

/// Distinct route-by values a [`TopicMemo`] keeps before it starts over.
const MEMO_CAP: usize = 4096;

/// Topics already built for route-by values (the column's raw text), so the usual handful of
/// event types costs one lookup per record instead of a rule expansion and a name check. Only legal
/// topics are kept; past [`MEMO_CAP`] distinct values the memo is emptied, so memory stays bounded
/// whatever the values. A clone starts empty.
#[derive(Debug, Default)]
// foldhash, not SipHash: one lookup per record; the keys are bounded in number and the seed is
// random per process.
// The topic is kept as shared text: a record's copy is a reference count, not an allocation.
pub struct TopicMemo(Mutex<HashMap<Bytes, super::Text, foldhash::fast::RandomState>>);

impl Clone for TopicMemo {
    fn clone(&self) -> Self {
        TopicMemo::default()
    }
}

impl TopicMemo {
    pub fn get(&self, raw: &[u8]) -> Option<super::Text> {
        self.0.lock().ok()?.get(raw).cloned()
    }

    pub fn put(&self, raw: &[u8], topic: &super::Text) {
        if let Ok(mut m) = self.0.lock() {
            if m.len() >= MEMO_CAP {
                m.clear();
            }
            // A copy of the value, not a slice of the message it came in: the memo must not keep
            // whole WAL messages alive.
            m.insert(Bytes::copy_from_slice(raw), topic.clone());
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Index(usize),
    Name(String),
}

/// A compiled regex + replacement pair.
#[derive(Clone, Debug)]
pub struct TopicRule {
    regex_text: String,
    replacement_text: String,
    regex: Regex,
    parts: Vec<Part>,
    /// Fast path for the default rule: the replacement only wraps the whole value.
    whole_value: Option<(String, String)>,
}

/// Two rules are equal when built from the same texts (the rest is compiled from them).
impl PartialEq for TopicRule {
    fn eq(&self, other: &Self) -> bool {
        self.regex_text == other.regex_text && self.replacement_text == other.replacement_text
    }
}

impl TopicRule {
    /// Build a rule; errors name the problem and, for unknown groups, list the defined ones.
    pub fn new(regex: &str, replacement: &str) -> Result<TopicRule, String> {
        let anchored = format!("^(?:{regex})$");
        let re = Regex::new(&anchored).map_err(|e| format!("--route-topic-regex {regex:?} does not compile: {e}"))?;
        let parts = parse_replacement(replacement)?;
        let names: Vec<&str> = re.capture_names().flatten().collect();
        let groups = re.captures_len() - 1;
        let defined = || {
            let mut d: Vec<String> = names.iter().map(|n| format!("${{{n}}}")).collect();
            d.extend((1..=groups).map(|i| format!("${i}")));
            if d.is_empty() {
                "none".to_owned()
            } else {
                d.join(", ")
            }
        };
        for p in &parts {
            match p {
                Part::Name(n) if !names.contains(&n.as_str()) => {
                    return Err(format!(
                        "--route-topic-replacement {replacement:?} uses group ${{{n}}}, which --route-topic-regex {regex:?} does not define; defined groups: {}",
                        defined()
                    ))
                }
                Part::Index(i) if *i > groups => {
                    return Err(format!(
                        "--route-topic-replacement {replacement:?} uses group ${i}, which --route-topic-regex {regex:?} does not define; defined groups: {}",
                        defined()
                    ))
                }
                _ => {}
            }
        }
        // `(?<g>.*)` with `prefix${g}suffix`: the topic is prefix + value + suffix.
        let lit = |p: Option<&Part>| match p {
            Some(Part::Literal(s)) => Some(s.clone()),
            None => Some(String::new()),
            _ => None,
        };
        let whole_value = match parts.iter().position(|p| matches!(p, Part::Name(n) if regex == format!("(?<{n}>.*)")))
        {
            Some(i) if i <= 1 && parts.len() - i <= 2 => {
                let pre = if i == 1 { lit(parts.first()) } else { Some(String::new()) };
                let post = lit(parts.get(i + 1));
                pre.zip(post)
            }
            _ => None,
        };
        Ok(TopicRule {
            regex_text: regex.to_owned(),
            replacement_text: replacement.to_owned(),
            regex: re,
            parts,
            whole_value,
        })
    }

    pub fn regex_text(&self) -> &str {
        &self.regex_text
    }

    pub fn replacement_text(&self) -> &str {
        &self.replacement_text
    }

    /// The topic for one routed value.
    pub fn topic(&self, value: &str) -> String {
        if let Some((pre, post)) = &self.whole_value {
            if !value.contains('\n') {
                return format!("{pre}{value}{post}");
            }
        }
        let Some(caps) = self.regex.captures(value) else { return value.to_owned() };
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Index(i) => out.push_str(caps.get(*i).map_or("", |m| m.as_str())),
                Part::Name(n) => out.push_str(caps.name(n).map_or("", |m| m.as_str())),
            }
        }
        out
    }
}

fn parse_replacement(s: &str) -> Result<Vec<Part>, String> {
    let bad = |why: &str| format!("--route-topic-replacement {s:?}: {why}");
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => lit.push(chars.next().ok_or_else(|| bad("ends with a lone backslash"))?),
            '$' => {
                if !lit.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut lit)));
                }
                match chars.peek() {
                    Some('{') => {
                        chars.next();
                        let mut name = String::new();
                        loop {
                            match chars.next() {
                                Some('}') => break,
                                Some(ch) if ch.is_ascii_alphanumeric() => name.push(ch),
                                _ => {
                                    return Err(bad(
                                        "a ${ is not closed by } around a group name of letters and digits",
                                    ))
                                }
                            }
                        }
                        if name.is_empty() || !name.starts_with(|ch: char| ch.is_ascii_alphabetic()) {
                            return Err(bad("group names start with a letter"));
                        }
                        parts.push(Part::Name(name));
                    }
                    Some(d) if d.is_ascii_digit() => {
                        let mut n = 0usize;
                        while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                            n = n.saturating_mul(10).saturating_add(d as usize);
                            chars.next();
                        }
                        parts.push(Part::Index(n));
                    }
                    _ => {
                        return Err(bad(
                            "$ must be followed by a group number or {name}; write \\$ for a literal dollar",
                        ))
                    }
                }
            }
            c => lit.push(c),
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Literal(lit));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_rules() {
        let cases: &[(&str, &str, &str, &str)] = &[
            ("(?<routedByValue>.*)", "${routedByValue}.events", "order.paid.v1", "order.paid.v1.events"),
            ("(?<routedByValue>.*)", "outbox.event.${routedByValue}", "Order", "outbox.event.Order"),
            (r"(?<agg>[a-z]+)\.(?<evt>.*)", "${agg}-topic", "order.paid", "order-topic"),
            (r"([a-z]+)\.(.*)", "$2.$1", "order.paid", "paid.order"),
            // No match: the plain value.
            (r"(?<agg>[a-z]+)\.(?<evt>.*)", "${agg}-topic", "NOMATCH", "NOMATCH"),
            // Whole-value match only, as Java's matches().
            (r"(?<agg>[a-z]+)", "${agg}.x", "order.paid", "order.paid"),
            ("(?<routedByValue>.*)", r"\$${routedByValue}", "a", "$a"),
        ];
        for (re, rep, value, want) in cases {
            let r = TopicRule::new(re, rep).unwrap();
            assert_eq!(r.topic(value), *want, "{re} / {rep} on {value}");
        }
    }

    #[test]
    fn topic_memo_is_bounded_and_clones_empty() {
        let m = TopicMemo::default();
        m.put(b"order", &"order.events".into());
        assert_eq!(m.get(b"order").as_deref(), Some("order.events"));
        assert_eq!(m.get(b"other"), None);
        assert_eq!(m.clone().get(b"order"), None);
        for i in 0..(MEMO_CAP * 2 + 7) {
            m.put(format!("v{i}").as_bytes(), &"t".into());
            assert!(m.len() <= MEMO_CAP);
        }
    }

    #[test]
    fn unknown_groups_fail_at_startup_listing_defined_ones() {
        let e = TopicRule::new(r"(?<agg>[a-z]+)\.(.*)", "${r}.events").unwrap_err();
        assert!(e.contains("${r}") && e.contains("${agg}") && e.contains("$1") && e.contains("$2"), "{e}");
        let e = TopicRule::new("(?<routedByValue>.*)", "$3").unwrap_err();
        assert!(e.contains("$3") && e.contains("${routedByValue}"), "{e}");
        assert!(TopicRule::new("(", "x").unwrap_err().contains("does not compile"));
        assert!(TopicRule::new(".*", "${").is_err());
        assert!(TopicRule::new(".*", "cost$").is_err());
    }
}
