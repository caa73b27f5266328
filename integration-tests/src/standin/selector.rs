//! Prometheus-style label selectors, `{service_name="x",service_version!="1.2"}`.
//!
//! The stand-in supports `=` and `!=`; regular-expression matchers are refused with an
//! error rather than silently matched.

use std::collections::BTreeMap;

/// How a matcher compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`: the label equals the value (an absent label equals "").
    Eq,
    /// `!=`.
    Ne,
}

/// One `name op "value"` term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matcher {
    /// Label name.
    pub name: String,
    /// Operator.
    pub op: MatchOp,
    /// Value (unescaped).
    pub value: String,
}

impl Matcher {
    /// Whether `labels` satisfy this matcher.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.name).map(String::as_str).unwrap_or("");
        match self.op {
            MatchOp::Eq => actual == self.value,
            MatchOp::Ne => actual != self.value,
        }
    }
}

/// Parses `{name="value", ...}` (an empty `{}` selects everything).
pub fn parse_selector(input: &str) -> Result<Vec<Matcher>, String> {
    let s = input.trim();
    let inner = s
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| format!("label selector {input:?}: expected {{...}}"))?;
    let chars: Vec<char> = inner.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    let skip_ws = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= chars.len() {
            break;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let name: String = chars[start..i].iter().collect();
        if name.is_empty() {
            return Err(format!(
                "label selector {input:?}: expected a label name at {start}"
            ));
        }
        skip_ws(&mut i);
        let op = match (chars.get(i), chars.get(i + 1)) {
            (Some('!'), Some('=')) => {
                i += 2;
                MatchOp::Ne
            }
            (Some('=' | '!'), Some('~')) => {
                return Err(format!(
                    "label selector {input:?}: regex matchers are not supported by the stand-in"
                ))
            }
            (Some('='), _) => {
                i += 1;
                MatchOp::Eq
            }
            _ => {
                return Err(format!(
                    "label selector {input:?}: expected = or != after {name}"
                ))
            }
        };
        skip_ws(&mut i);
        if chars.get(i) != Some(&'"') {
            return Err(format!(
                "label selector {input:?}: expected a quoted value for {name}"
            ));
        }
        i += 1;
        let mut value = String::new();
        loop {
            match chars.get(i) {
                None => return Err(format!("label selector {input:?}: unterminated value")),
                Some('"') => {
                    i += 1;
                    break;
                }
                Some('\\') => {
                    match chars.get(i + 1) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(*c),
                        None => return Err(format!("label selector {input:?}: bad escape")),
                    }
                    i += 2;
                }
                Some(c) => {
                    value.push(*c);
                    i += 1;
                }
            }
        }
        out.push(Matcher { name, op, value });
        skip_ws(&mut i);
        match chars.get(i) {
            None => break,
            Some(',') => i += 1,
            Some(c) => return Err(format!("label selector {input:?}: unexpected {c:?}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_eq_and_ne() {
        let m = parse_selector(r#"{service_name="a b", service_version!="1.2",x="q\"x"}"#).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].value, "a b");
        assert_eq!(m[1].op, MatchOp::Ne);
        assert_eq!(m[2].value, "q\"x");
        assert!(parse_selector("{}").unwrap().is_empty());
        assert!(parse_selector(r#"{a=~"x"}"#).is_err());
        assert!(parse_selector("a=\"x\"").is_err());
    }
}
