//! The rule language: `--mask POINTER=ACTION` and `--encrypt POINTER`, parsed once into a trie.
//!
//! POINTER is a JSON Pointer (RFC 6901: `/`-separated tokens, `~1` for `/` and `~0` for `~`)
//! into the payload, or `headers/NAME[/...]` for a record header. The token `*` matches every
//! element of an array and every member of an object. Rules sharing a prefix share trie nodes, so
//! a payload is walked once whatever the number of rules; at a node, the rules apply in the order
//! given (`--mask` flags first, then `--encrypt`), after the rules below it.

/// What happens to a matched value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Remove the member (or array element).
    Drop,
    /// Replace with `"***"`.
    Redact,
    /// Every character but the last four becomes `*`; four or fewer: all of them.
    Last4,
    /// HMAC-SHA256 hex of the value's text (`--mask-key-file`).
    Hash,
    /// A sealed object (`--encrypt-key-file`).
    Encrypt,
}

impl Action {
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "drop" => Action::Drop,
            "redact" => Action::Redact,
            "last4" => Action::Last4,
            "hash" => Action::Hash,
            _ => return None,
        })
    }
}

/// One pointer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    Key(String),
    Any,
}

impl Token {
    /// Whether this token selects the object member `name`.
    pub fn matches_key(&self, name: &str) -> bool {
        match self {
            Token::Any => true,
            Token::Key(k) => k == name,
        }
    }

    /// Whether this token selects array element `i` (a token that is its decimal spelling).
    pub fn matches_index(&self, i: usize) -> bool {
        match self {
            Token::Any => true,
            Token::Key(k) => k.parse::<usize>().is_ok_and(|n| n == i) && (k == "0" || !k.starts_with('0')),
        }
    }
}

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Payload,
    Headers,
}

/// A parsed POINTER: for headers, the first token is the header name.
pub fn parse_pointer(p: &str) -> Result<(Target, Vec<Token>), String> {
    let (target, rest) = if let Some(rest) = p.strip_prefix("headers/") {
        (Target::Headers, rest)
    } else if let Some(rest) = p.strip_prefix('/') {
        (Target::Payload, rest)
    } else {
        return Err(format!(
            "{p:?} must start with / (a payload field, e.g. /card/number) or headers/ (a header, e.g. headers/email)"
        ));
    };
    let mut tokens = Vec::new();
    for raw in rest.split('/') {
        if raw == "*" {
            tokens.push(Token::Any);
            continue;
        }
        let mut t = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            match (c, c == '~') {
                (_, false) => t.push(c),
                (_, true) => match chars.next() {
                    Some('0') => t.push('~'),
                    Some('1') => t.push('/'),
                    _ => return Err(format!("{p:?}: `~` must be followed by 0 (for ~) or 1 (for /)")),
                },
            }
        }
        tokens.push(Token::Key(t));
    }
    if target == Target::Headers && tokens[0] == Token::Key(String::new()) {
        return Err(format!("{p:?} names no header; write headers/NAME"));
    }
    Ok((target, tokens))
}

/// A trie of rules.
#[derive(Clone, Debug, Default)]
pub struct Node {
    pub children: Vec<(Token, Node)>,
    pub actions: Vec<Action>,
}

impl Node {
    pub fn insert(&mut self, tokens: &[Token], action: Action) {
        let Some((first, rest)) = tokens.split_first() else {
            self.actions.push(action);
            return;
        };
        let i = match self.children.iter().position(|(t, _)| t == first) {
            Some(i) => i,
            None => {
                self.children.push((first.clone(), Node::default()));
                self.children.len() - 1
            }
        };
        self.children[i].1.insert(rest, action);
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty() && self.actions.is_empty()
    }

    /// Whether any rule in this trie uses `action`.
    pub fn uses(&self, action: Action) -> bool {
        self.actions.contains(&action) || self.children.iter().any(|(_, c)| c.uses(action))
    }
}
