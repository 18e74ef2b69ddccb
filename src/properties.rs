//! Java `.properties` text, strictly: what `--kafka-property-file` and Kafka's `${file:PATH:KEY}`
//! config provider read.
//!
//! A line is `key=value`, `key = value`, `key: value` or `key value` (the first unescaped `=`, `:`
//! or blank ends the key, as in `java.util.Properties`); `#` and `!` start comments; blank lines
//! are skipped; a line ending in an odd number of `\` continues on the next one (its leading blanks
//! dropped); `\t`, `\n`, `\r`, `\\`, `\=`, `\:`, `\#`, `\!` and `\ ` are escapes. Unlike Java, a
//! key with no value at all is an error (a typo rather than an intended empty value: write `key=`),
//! and so is an empty key. Errors carry the line number and the key, never a value.

/// One `key=value` entry and the (first) line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub line: usize,
    pub key: String,
    pub value: String,
}

/// Why a line is not a property; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub why: String,
}

/// Parse the whole text; the first bad line is the error.
pub fn parse(text: &str) -> Result<Vec<Entry>, LineError> {
    let mut out = Vec::new();
    let mut logical = String::new();
    let mut start_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if logical.is_empty() {
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            start_line = i + 1;
        }
        let trailing = line.bytes().rev().take_while(|b| *b == b'\\').count();
        if trailing % 2 == 1 {
            logical.push_str(&line[..line.len() - 1]);
            continue;
        }
        logical.push_str(line);
        out.push(entry(start_line, &std::mem::take(&mut logical))?);
    }
    if !logical.is_empty() {
        return Err(LineError {
            line: start_line,
            why: "the last line ends in a `\\` continuation with nothing after it; remove the `\\`".into(),
        });
    }
    Ok(out)
}

fn entry(line: usize, text: &str) -> Result<Entry, LineError> {
    let mut key = String::new();
    let mut chars = text.chars().peekable();
    let mut separated = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.push(unescape(chars.next())),
            '=' | ':' => {
                separated = true;
                break;
            }
            c if c == ' ' || c == '\t' || c == '\u{c}' => {
                // Blanks, then optionally one `=` or `:`.
                while chars.peek().is_some_and(|c| matches!(c, ' ' | '\t' | '\u{c}')) {
                    chars.next();
                }
                if chars.peek().is_some_and(|c| matches!(c, '=' | ':')) {
                    chars.next();
                }
                separated = true;
                break;
            }
            c => key.push(c),
        }
    }
    if key.is_empty() {
        return Err(LineError { line, why: "the line has no key before its `=`; write key=value".into() });
    }
    if !separated {
        return Err(LineError {
            line,
            why: format!("{key:?} has no value; write {key}=VALUE (or {key}= for an empty value)"),
        });
    }
    while chars.peek().is_some_and(|c| matches!(c, ' ' | '\t' | '\u{c}')) {
        chars.next();
    }
    let mut value = String::new();
    while let Some(c) = chars.next() {
        if c == '\\' {
            value.push(unescape(chars.next()));
        } else {
            value.push(c);
        }
    }
    Ok(Entry { line, key, value })
}

fn unescape(c: Option<char>) -> char {
    match c {
        Some('t') => '\t',
        Some('n') => '\n',
        Some('r') => '\r',
        Some('f') => '\u{c}',
        Some(other) => other,
        None => '\\',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse(text).unwrap().into_iter().map(|e| (e.key, e.value)).collect()
    }

    #[test]
    fn every_separator_form() {
        let text = "# comment\n! also\n\n a=1\nb = 2\nc: 3\nd 4\ne=\nf = x=y:z \nurl=https\\://h/p\n";
        assert_eq!(
            pairs(text),
            [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", ""), ("f", "x=y:z "), ("url", "https://h/p")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn continuations_and_escapes() {
        let e = parse("sasl.jaas.config=a \\\n    b\\\\\nk\\ ey=v\\tw\n").unwrap();
        assert_eq!((e[0].line, e[0].value.as_str()), (1, "a b\\"));
        assert_eq!((e[1].line, e[1].key.as_str(), e[1].value.as_str()), (3, "k ey", "v\tw"));
    }

    #[test]
    fn bad_lines_name_the_line_and_never_the_value() {
        let e = parse("a=1\n\nsasl.password\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.why.contains("sasl.password=VALUE"), "{}", e.why);
        let e = parse("a=1\n=hunter2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(!e.why.contains("hunter2"), "{}", e.why);
        let e = parse("a=1\nb=hunter2\\").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(!e.why.contains("hunter2"), "{}", e.why);
    }
}
