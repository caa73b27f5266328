//! The TraceQL subset the stand-in's `GET /api/search` understands, and the one metrics
//! form its `GET /api/metrics/query_range` does ([`parse_metrics_query`]): the same
//! spanset filter followed by `| quantile_over_time(duration, <q>, ...)` (quantiles from
//! 0 to 1, such as `.5` or `0.95`) and optionally `by (<attr>)` (one of `name`,
//! `resource.x`, `span.x`, `.x`); other metrics functions, fields and stages are refused
//! the same way.
//!
//! One spanset filter, `{ cond && cond && ... }` (`{}` selects every span), where a cond is
//! `<attr> <op> <value>`:
//!
//! * `<attr>`: the intrinsics `name` and `duration`, `resource.<dotted.name>`,
//!   `span.<dotted.name>`, or `.<dotted.name>` (the span attribute, else the resource's);
//! * `<op>`: `=`, `!=`, `>`, `>=`, `<`, `<=`;
//! * `<value>`: a double-quoted string (backslash escapes), an integer, or for `duration`
//!   a duration such as `100ms` or `1.5s` (units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`).
//!
//! It may be followed by `| select(<attr>, ...)`, which only adds attributes to the
//! answer. As in Tempo, a condition on an attribute the span lacks is false, `!=`
//! included, and values of different types never compare equal.
//!
//! Everything else TraceQL has (`||`, regular expressions, structural operators such as
//! `>>`, spanset operators, aggregates, other pipeline stages, other intrinsics, floats,
//! booleans, `nil`) is refused with a message starting `the stand-in supports only`
//! and naming the part, rather than answered wrongly.

use std::cmp::Ordering;

use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;

/// An intrinsic or attribute a condition or `select` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attribute {
    /// The intrinsic `name`: the span name.
    Name,
    /// The intrinsic `duration`: end − start of the span.
    Duration,
    /// `resource.<name>`: an attribute of the span's resource.
    Resource(String),
    /// `span.<name>`: an attribute of the span.
    Span(String),
    /// `.<name>`: the span attribute of that name, else the resource's.
    Unscoped(String),
}

impl Attribute {
    /// The key Tempo returns the attribute under in a search answer's span attributes:
    /// the bare name, without `resource.`/`span.`/`.`; `None` for the intrinsics, which
    /// the answer carries as span fields (`name`, `durationNanos`).
    pub fn key(&self) -> Option<&str> {
        match self {
            Attribute::Name | Attribute::Duration => None,
            Attribute::Resource(k) | Attribute::Span(k) | Attribute::Unscoped(k) => Some(k),
        }
    }

    /// The attribute's value on `span` (which arrived with `resource`); `None` when absent
    /// and for the intrinsics.
    pub fn lookup<'a>(
        &self,
        resource: Option<&'a Resource>,
        span: &'a Span,
    ) -> Option<&'a AnyValue> {
        let find = |attributes: &'a [KeyValue], key: &str| {
            attributes
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.as_ref())
        };
        let in_resource = |key: &str| resource.and_then(|r| find(&r.attributes, key));
        match self {
            Attribute::Name | Attribute::Duration => None,
            Attribute::Resource(k) => in_resource(k),
            Attribute::Span(k) => find(&span.attributes, k),
            Attribute::Unscoped(k) => find(&span.attributes, k).or_else(|| in_resource(k)),
        }
    }
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`.
    Eq,
    /// `!=`.
    Ne,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
}

impl CompareOp {
    /// Whether `actual` compared with the literal as `ordering` satisfies the operator.
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            CompareOp::Eq => ordering == Ordering::Equal,
            CompareOp::Ne => ordering != Ordering::Equal,
            CompareOp::Gt => ordering == Ordering::Greater,
            CompareOp::Ge => ordering != Ordering::Less,
            CompareOp::Lt => ordering == Ordering::Less,
            CompareOp::Le => ordering != Ordering::Greater,
        }
    }
}

/// A value a condition compares with.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    /// A double-quoted string, unescaped.
    String(String),
    /// An integer.
    Int(i64),
    /// A duration, in nanoseconds.
    Duration(u64),
}

/// One `<attr> <op> <value>` term.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    /// What is compared.
    pub attribute: Attribute,
    /// How.
    pub op: CompareOp,
    /// With what.
    pub value: Literal,
}

impl Condition {
    /// Whether `span` (of `resource`) satisfies the condition.
    pub fn matches(&self, resource: Option<&Resource>, span: &Span) -> bool {
        let ordering = match (&self.attribute, &self.value) {
            (Attribute::Name, Literal::String(s)) => Some(span.name.as_str().cmp(s)),
            (Attribute::Duration, Literal::Duration(d)) => Some(
                span.end_time_unix_nano
                    .saturating_sub(span.start_time_unix_nano)
                    .cmp(d),
            ),
            (attribute, literal) => match (
                attribute
                    .lookup(resource, span)
                    .and_then(|v| v.value.as_ref()),
                literal,
            ) {
                (Some(AnyValueKind::StringValue(a)), Literal::String(s)) => Some(a.as_str().cmp(s)),
                (Some(AnyValueKind::IntValue(a)), Literal::Int(i)) => Some(a.cmp(i)),
                // TraceQL compares integers and floats as numbers.
                (Some(AnyValueKind::DoubleValue(a)), Literal::Int(i)) => {
                    a.partial_cmp(&(*i as f64))
                }
                // Absent, or of another type: false whatever the operator, as in Tempo.
                _ => None,
            },
        };
        ordering.is_some_and(|o| self.op.holds(o))
    }
}

/// A parsed query of the supported subset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceQuery {
    /// The filter's conditions, all of which must hold (none: every span).
    pub conditions: Vec<Condition>,
    /// The attributes of `| select(...)`.
    pub select: Vec<Attribute>,
}

impl TraceQuery {
    /// Whether `span` (of `resource`) passes the filter.
    pub fn matches(&self, resource: Option<&Resource>, span: &Span) -> bool {
        self.conditions.iter().all(|c| c.matches(resource, span))
    }

    /// The attributes a search answer returns for each matched span, as Tempo does: those
    /// the conditions and `select` name, in that order, each once; intrinsics left out.
    pub fn returned_attributes(&self) -> Vec<&Attribute> {
        let mut out: Vec<&Attribute> = Vec::new();
        let named = self
            .conditions
            .iter()
            .map(|c| &c.attribute)
            .chain(&self.select);
        for attribute in named {
            if attribute.key().is_some() && !out.contains(&attribute) {
                out.push(attribute);
            }
        }
        out
    }
}

/// The refusal of anything outside the subset; `detail` names the part.
fn unsupported(detail: impl std::fmt::Display) -> String {
    format!(
        "the stand-in supports only one spanset filter {{ <attr> <op> <value> && ... }} \
         (attr: name, duration, resource.x, span.x or .x; op: = != > >= < <=; value: a \
         string, an integer or a duration), optionally followed by | select(...): {detail}"
    )
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LBrace,
    RBrace,
    LParen,
    RParen,
    Comma,
    Pipe,
    And,
    Or,
    Cmp(CompareOp),
    /// Any other operator-like text (`=~`, `>>`, `~`, `!`, `+`, ...).
    Punct(String),
    Ident(String),
    Str(String),
    /// Digits, an optional fraction and an optional unit, as written.
    Number(String),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    /// The text as written, for messages.
    text: String,
}

/// Characters runs of which form one operator token.
fn is_operator_char(c: char) -> bool {
    matches!(c, '=' | '!' | '<' | '>' | '~' | '&' | '|')
}

fn lex(input: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = input.chars().collect();
    let text = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let tok = if c.is_whitespace() {
            i += 1;
            continue;
        } else if let Some(t) = match c {
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            ',' => Some(Tok::Comma),
            _ => None,
        } {
            i += 1;
            t
        } else if c == '"' {
            i += 1;
            let mut value = String::new();
            loop {
                match chars.get(i) {
                    None => return Err(unsupported(format!("unterminated string at {start}"))),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        value.push(match chars.get(i + 1) {
                            Some('n') => '\n',
                            Some('t') => '\t',
                            Some('r') => '\r',
                            Some(c @ ('\\' | '"' | '\'')) => *c,
                            Some(c) => return Err(unsupported(format!("escape \\{c}"))),
                            None => {
                                return Err(unsupported(format!("unterminated string at {start}")))
                            }
                        });
                        i += 2;
                    }
                    Some(c) => {
                        value.push(*c);
                        i += 1;
                    }
                }
            }
            Tok::Str(value)
        } else if c.is_ascii_digit()
            || (matches!(c, '-' | '.') && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // `.5`: a number without its leading 0, as quantiles are written.
            if c != '.' {
                i += 1;
            }
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            while i < chars.len() && (chars[i].is_ascii_alphabetic() || chars[i] == 'µ') {
                i += 1;
            }
            Tok::Number(text(start, i))
        } else if c.is_ascii_alphabetic() || c == '_' || c == '.' {
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | '.' | '-' | '/'))
            {
                i += 1;
            }
            Tok::Ident(text(start, i))
        } else if is_operator_char(c) {
            while i < chars.len() && is_operator_char(chars[i]) {
                i += 1;
            }
            match text(start, i).as_str() {
                "&&" => Tok::And,
                "||" => Tok::Or,
                "|" => Tok::Pipe,
                "=" => Tok::Cmp(CompareOp::Eq),
                "!=" => Tok::Cmp(CompareOp::Ne),
                ">" => Tok::Cmp(CompareOp::Gt),
                ">=" => Tok::Cmp(CompareOp::Ge),
                "<" => Tok::Cmp(CompareOp::Lt),
                "<=" => Tok::Cmp(CompareOp::Le),
                other => Tok::Punct(other.to_string()),
            }
        } else {
            i += 1;
            Tok::Punct(c.to_string())
        };
        out.push(Token {
            tok,
            text: text(start, i),
        });
    }
    Ok(out)
}

/// Parses `input`; an empty query is `{}`. The error is the text of the 400 answer.
pub fn parse_traceql(input: &str) -> Result<TraceQuery, String> {
    let tokens = lex(input)?;
    if tokens.is_empty() {
        return Ok(TraceQuery::default());
    }
    let mut p = Parser { tokens, at: 0 };
    if let Some(Tok::Ident(name)) = p.peek() {
        return Err(unsupported(format!(
            "`{name}` outside a spanset filter (aggregates and metrics are not supported)"
        )));
    }
    let mut query = TraceQuery {
        conditions: p.spanset_filter()?,
        select: Vec::new(),
    };
    match p.next() {
        None => return Ok(query),
        Some(Tok::Pipe) => {}
        Some(_) => {
            return Err(unsupported(format!(
                "spanset operator `{}` is not supported (one spanset filter only; no structural \
                 or spanset operators)",
                p.text(p.at - 1)
            )))
        }
    }
    match p.next() {
        Some(Tok::Ident(stage)) if stage == "select" => {}
        Some(Tok::Ident(stage)) => {
            return Err(unsupported(format!(
                "pipeline stage `{stage}` is not supported (only select)"
            )))
        }
        _ => return Err(unsupported("a | not followed by select(...)")),
    }
    if p.next() != Some(Tok::LParen) {
        return Err(unsupported("select without its (...)"));
    }
    loop {
        let attribute = match p.next() {
            Some(Tok::Ident(name)) => attribute(&name)?,
            _ => return Err(unsupported("select(...) takes attributes")),
        };
        query.select.push(attribute);
        match p.next() {
            Some(Tok::Comma) => {}
            Some(Tok::RParen) => break,
            _ => {
                return Err(unsupported(
                    "select(...) takes attributes separated by commas",
                ))
            }
        }
    }
    match p.peek() {
        None => Ok(query),
        Some(Tok::Pipe) => Err(unsupported(
            "a pipeline stage after select(...) is not supported",
        )),
        Some(_) => Err(unsupported(format!("`{}` after select(...)", p.text(p.at)))),
    }
}

/// A parsed TraceQL metrics query of the supported form,
/// `<spanset filter> | quantile_over_time(duration, <q>, ...) [by (<attr>)]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsQuery {
    /// The spanset filter (its `select` always empty).
    pub filter: TraceQuery,
    /// The quantiles, from 0 to 1, in the order written, each once.
    pub quantiles: Vec<f64>,
    /// The `by (...)` attribute, with its text as written (the key of its series label).
    pub by: Option<(String, Attribute)>,
}

/// The metrics functions Tempo has that the stand-in does not answer, for a clearer
/// refusal than "unknown stage".
const OTHER_METRICS_FUNCTIONS: &[&str] = &[
    "rate",
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "sum_over_time",
    "histogram_over_time",
    "compare",
];

/// The refusal of a metrics query outside the supported form; `detail` names the part.
fn unsupported_metrics(detail: impl std::fmt::Display) -> String {
    format!(
        "the stand-in supports only metrics queries {{ <attr> <op> <value> && ... }} | \
         quantile_over_time(duration, <quantile>, ...) optionally followed by by (<attr>) \
         (attr: name, resource.x, span.x or .x): {detail}"
    )
}

/// Parses a TraceQL metrics query for `GET /api/metrics/query_range`. The error is the
/// text of the 400 answer; an error within the spanset filter is the search's.
pub fn parse_metrics_query(input: &str) -> Result<MetricsQuery, String> {
    let tokens = lex(input)?;
    let mut p = Parser { tokens, at: 0 };
    match p.peek() {
        None => return Err(unsupported_metrics("an empty query")),
        Some(Tok::Ident(name)) => {
            return Err(unsupported_metrics(format!(
                "`{name}` without a spanset filter before it (write {{ }} | ...)"
            )))
        }
        Some(_) => {}
    }
    let mut query = MetricsQuery {
        filter: TraceQuery {
            conditions: p.spanset_filter()?,
            select: Vec::new(),
        },
        ..MetricsQuery::default()
    };
    match p.next() {
        Some(Tok::Pipe) => {}
        None => {
            return Err(unsupported_metrics(
                "a spanset filter without a metrics function (for spans, use /api/search)",
            ))
        }
        Some(_) => {
            return Err(unsupported_metrics(format!(
                "spanset operator `{}` is not supported (one spanset filter only)",
                p.text(p.at - 1)
            )))
        }
    }
    match p.next() {
        Some(Tok::Ident(f)) if f == "quantile_over_time" => {}
        Some(Tok::Ident(f)) if OTHER_METRICS_FUNCTIONS.contains(&f.as_str()) => {
            return Err(unsupported_metrics(format!(
                "metrics function `{f}` is not supported (only quantile_over_time)"
            )))
        }
        Some(Tok::Ident(stage)) => {
            return Err(unsupported_metrics(format!(
                "pipeline stage `{stage}` is not supported (only quantile_over_time directly \
                 after the filter)"
            )))
        }
        _ => {
            return Err(unsupported_metrics(format!(
                "`{}` after |",
                p.text(p.at - 1)
            )))
        }
    }
    if p.next() != Some(Tok::LParen) {
        return Err(unsupported_metrics("quantile_over_time without its (...)"));
    }
    match p.next() {
        Some(Tok::Ident(field)) if field == "duration" => {}
        _ => {
            return Err(unsupported_metrics(format!(
                "quantile_over_time of `{}` is not supported (only of duration)",
                p.text(p.at - 1)
            )))
        }
    }
    loop {
        match p.next() {
            Some(Tok::Comma) => {}
            Some(Tok::RParen) if !query.quantiles.is_empty() => break,
            Some(Tok::RParen) => {
                return Err(unsupported_metrics(
                    "quantile_over_time(duration) without a quantile",
                ))
            }
            None => {
                return Err(unsupported_metrics(
                    "quantile_over_time(...) without its closing )",
                ))
            }
            _ => {
                return Err(unsupported_metrics(format!(
                    "`{}` in quantile_over_time(...) (quantiles are separated by commas)",
                    p.text(p.at - 1)
                )))
            }
        }
        let q = match p.next() {
            Some(Tok::Number(n)) => n
                .parse::<f64>()
                .ok()
                .filter(|q| (0.0..=1.0).contains(q))
                .ok_or_else(|| {
                    unsupported_metrics(format!(
                        "quantile `{n}` is not supported (a number from 0 to 1)"
                    ))
                })?,
            _ => {
                return Err(unsupported_metrics(format!(
                    "quantile `{}` is not supported (a number from 0 to 1)",
                    p.text(p.at - 1)
                )))
            }
        };
        if !query.quantiles.contains(&q) {
            query.quantiles.push(q);
        }
    }
    match p.next() {
        None => return Ok(query),
        Some(Tok::Ident(by)) if by == "by" => {}
        Some(Tok::Pipe) => {
            return Err(unsupported_metrics(format!(
                "a pipeline stage after quantile_over_time(...) (`| {}`) is not supported",
                p.text(p.at)
            )))
        }
        Some(_) => {
            return Err(unsupported_metrics(format!(
                "`{}` after quantile_over_time(...)",
                p.text(p.at - 1)
            )))
        }
    }
    if p.next() != Some(Tok::LParen) {
        return Err(unsupported_metrics("by without its (...)"));
    }
    let attribute = match p.next() {
        Some(Tok::Ident(name)) => match attribute(&name).map_err(|_| ()) {
            Ok(Attribute::Duration) | Err(()) => {
                return Err(unsupported_metrics(format!(
                    "by ({name}) is not supported (name, resource.x, span.x or .x)"
                )))
            }
            Ok(a) => (name, a),
        },
        _ => {
            return Err(unsupported_metrics(format!(
                "by ({}) is not supported (one attribute)",
                p.text(p.at - 1)
            )))
        }
    };
    match p.next() {
        Some(Tok::RParen) => {}
        Some(Tok::Comma) => {
            return Err(unsupported_metrics(
                "by (...) with more than one attribute is not supported",
            ))
        }
        _ => return Err(unsupported_metrics("by (...) without its closing )")),
    }
    query.by = Some(attribute);
    match p.peek() {
        None => Ok(query),
        Some(_) => Err(unsupported_metrics(format!(
            "`{}` after by (...) is not supported",
            p.text(p.at)
        ))),
    }
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    /// `{ cond && ... }`, from the first token.
    fn spanset_filter(&mut self) -> Result<Vec<Condition>, String> {
        match self.next() {
            Some(Tok::LBrace) => {}
            _ => return Err(unsupported(format!("a query starting `{}`", self.text(0)))),
        }
        let mut conditions = Vec::new();
        if self.peek() == Some(&Tok::RBrace) {
            self.at += 1;
            return Ok(conditions);
        }
        loop {
            conditions.push(self.condition()?);
            match self.next() {
                Some(Tok::And) => {}
                Some(Tok::RBrace) => return Ok(conditions),
                Some(Tok::Or) => return Err(unsupported("`||` is not supported")),
                Some(_) => {
                    return Err(unsupported(format!(
                        "`{}` after a condition",
                        self.text(self.at - 1)
                    )))
                }
                None => return Err(unsupported("a spanset filter without its closing }")),
            }
        }
    }

    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.at).map(|t| &t.tok)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.at).map(|t| t.tok.clone());
        self.at += 1;
        t
    }

    fn text(&self, at: usize) -> &str {
        self.tokens.get(at).map(|t| t.text.as_str()).unwrap_or("")
    }

    fn condition(&mut self) -> Result<Condition, String> {
        let attribute = match self.next() {
            Some(Tok::Ident(name)) => attribute(&name)?,
            Some(Tok::LParen) => return Err(unsupported("parentheses are not supported")),
            Some(Tok::Punct(p)) if p == "!" => {
                return Err(unsupported("negation `!` is not supported"))
            }
            Some(Tok::RBrace) => return Err(unsupported("`&&` not followed by a condition")),
            None => return Err(unsupported("a spanset filter without its closing }")),
            Some(_) => {
                return Err(unsupported(format!(
                    "`{}` where a condition should start",
                    self.text(self.at - 1)
                )))
            }
        };
        let op = match self.next() {
            Some(Tok::Cmp(op)) => op,
            Some(Tok::Punct(p)) if p == "=~" || p == "!~" => {
                return Err(unsupported(format!(
                    "regex operator `{p}` is not supported"
                )))
            }
            Some(Tok::Punct(p)) => {
                return Err(unsupported(format!("operator `{p}` is not supported")))
            }
            Some(Tok::RBrace | Tok::And | Tok::Or) | None => {
                return Err(unsupported(
                    "a bare attribute without a comparison (existence tests are not supported)",
                ))
            }
            Some(_) => {
                return Err(unsupported(format!(
                    "`{}` where a comparison operator should be",
                    self.text(self.at - 1)
                )))
            }
        };
        let value = match self.next() {
            Some(Tok::Str(s)) => Literal::String(s),
            Some(Tok::Number(n)) => number(&n)?,
            Some(_) => {
                return Err(unsupported(format!(
                    "value `{}` is not supported (a string, an integer or a duration)",
                    self.text(self.at - 1)
                )))
            }
            None => return Err(unsupported("a comparison without its value")),
        };
        // Tempo refuses these as type errors; the stand-in says so rather than matching
        // nothing.
        match (&attribute, &value) {
            (Attribute::Name, Literal::String(_)) | (Attribute::Duration, Literal::Duration(_)) => {
            }
            (Attribute::Name, _) => return Err(unsupported("`name` compared with a non-string")),
            (Attribute::Duration, _) => {
                return Err(unsupported(
                    "`duration` compared with a non-duration (write e.g. 100ms)",
                ))
            }
            (_, Literal::Duration(_)) => {
                return Err(unsupported(
                    "a duration compared with an attribute (only with `duration`)",
                ))
            }
            _ => {}
        }
        Ok(Condition {
            attribute,
            op,
            value,
        })
    }
}

/// The attribute an identifier names.
fn attribute(name: &str) -> Result<Attribute, String> {
    let scoped = |rest: &str, make: fn(String) -> Attribute| {
        if rest.is_empty() || rest.starts_with('.') || rest.ends_with('.') {
            Err(unsupported(format!("attribute `{name}`")))
        } else {
            Ok(make(rest.to_string()))
        }
    };
    if name == "name" {
        Ok(Attribute::Name)
    } else if name == "duration" {
        Ok(Attribute::Duration)
    } else if let Some(rest) = name.strip_prefix("resource.") {
        scoped(rest, Attribute::Resource)
    } else if let Some(rest) = name.strip_prefix("span.") {
        scoped(rest, Attribute::Span)
    } else if let Some(rest) = name.strip_prefix('.') {
        scoped(rest, Attribute::Unscoped)
    } else {
        Err(unsupported(format!(
            "intrinsic or scope `{name}` is not supported (name, duration, resource., span., .)"
        )))
    }
}

/// Nanoseconds in one `unit` of a TraceQL (Go) duration: `ns`, `us`/`µs`, `ms`, `s`, `m`,
/// `h`.
pub(super) fn nanos_per_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3_600e9,
        _ => return None,
    })
}

/// An integer, or a duration such as `100ms` / `1.5s`.
fn number(text: &str) -> Result<Literal, String> {
    let split = text.find(|c: char| c.is_alphabetic()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if unit.is_empty() {
        if digits.contains('.') {
            return Err(unsupported(format!("float `{text}` is not supported")));
        }
        return digits
            .parse()
            .map(Literal::Int)
            .map_err(|_| unsupported(format!("integer `{text}` out of range")));
    }
    let nanos_per_unit = nanos_per_unit(unit)
        .ok_or_else(|| unsupported(format!("`{text}` (duration units: ns us µs ms s m h)")))?;
    let value: f64 = digits
        .parse()
        .map_err(|_| unsupported(format!("`{text}`")))?;
    if value < 0.0 {
        return Err(unsupported(format!("negative duration `{text}`")));
    }
    Ok(Literal::Duration((value * nanos_per_unit).round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: AnyValueKind) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    #[test]
    fn accepts_the_subset() {
        let q = parse_traceql(
            r#"{ resource.service.name = "api \"eu\"" && name != "GET /" && duration >= 1.5s
                && span.http.status_code < 500 && .deployment.environment.name = "prod" }
               | select(span.thread.name, resource.service.version)"#,
        )
        .expect("accepted");
        assert_eq!(q.conditions.len(), 5);
        assert_eq!(
            q.conditions[0],
            Condition {
                attribute: Attribute::Resource("service.name".into()),
                op: CompareOp::Eq,
                value: Literal::String("api \"eu\"".into()),
            }
        );
        assert_eq!(q.conditions[1].op, CompareOp::Ne);
        assert_eq!(q.conditions[2].value, Literal::Duration(1_500_000_000));
        assert_eq!(q.conditions[3].value, Literal::Int(500));
        assert_eq!(
            q.conditions[4].attribute,
            Attribute::Unscoped("deployment.environment.name".into())
        );
        assert_eq!(
            q.select,
            [
                Attribute::Span("thread.name".into()),
                Attribute::Resource("service.version".into())
            ]
        );
        let keys: Vec<_> = q
            .returned_attributes()
            .iter()
            .filter_map(|a| a.key())
            .collect();
        assert_eq!(
            keys,
            [
                "service.name",
                "http.status_code",
                "deployment.environment.name",
                "thread.name",
                "service.version"
            ]
        );
        for (text, ns) in [
            ("100ms", 100_000_000),
            ("7ns", 7),
            ("2us", 2_000),
            ("3µs", 3_000),
            ("1m", 60_000_000_000),
            ("1h", 3_600_000_000_000),
        ] {
            let q = parse_traceql(&format!("{{duration > {text}}}")).expect(text);
            assert_eq!(q.conditions[0].value, Literal::Duration(ns), "{text}");
        }
        assert_eq!(parse_traceql("{}").expect("{}"), TraceQuery::default());
        assert_eq!(parse_traceql("  ").expect("empty"), TraceQuery::default());
        assert_eq!(
            parse_traceql("{span.x>-5}").expect("negative").conditions[0].value,
            Literal::Int(-5)
        );
    }

    #[test]
    fn refuses_the_rest_naming_the_part() {
        for (query, part) in [
            (r#"{ name = "a" || name = "b" }"#, "`||`"),
            (r#"{ name =~ "GET.*" }"#, "`=~`"),
            (r#"{ name !~ "GET.*" }"#, "`!~`"),
            (r#"{ name = "a" } >> { name = "b" }"#, "`>>`"),
            (r#"{ name = "a" } > { name = "b" }"#, "`>`"),
            (r#"{ name = "a" } && { name = "b" }"#, "`&&`"),
            (r#"{ name = "a" } ~ { name = "b" }"#, "`~`"),
            (r#"{ name = "a" } | count() > 2"#, "`count`"),
            (r#"{ } | avg(duration) > 1s"#, "`avg`"),
            (r#"{ name = "a" } | select(.x) | by(.y)"#, "after select"),
            ("{ status = error }", "`status`"),
            ("{ span:name = \"a\" }", "`span`"),
            ("{ .x = true }", "`true`"),
            ("{ .x = 1.5 }", "float `1.5`"),
            ("{ duration > 100 }", "`duration`"),
            ("{ name = 3 }", "`name`"),
            ("{ .x = 3s }", "a duration"),
            ("{ (name = \"a\") }", "parentheses"),
            ("{ .x }", "bare attribute"),
            ("{ name = \"a\"", "closing }"),
            ("{ name = \"a }", "unterminated string"),
            ("{ duration > 3d }", "`3d`"),
            ("rate()", "`rate`"),
            ("{ resource. = \"a\" }", "`resource.`"),
        ] {
            let e = parse_traceql(query).expect_err(query);
            assert!(e.starts_with("the stand-in supports only"), "{query}: {e}");
            assert!(e.contains(part), "{query}: {e}");
        }
    }

    #[test]
    fn accepts_quantile_over_time_by_one_attribute() {
        let q = parse_metrics_query(
            r#"{ resource.service.name = "api" && name = "GET /x" }
               | quantile_over_time(duration, .5, 0.95, .99, 0.5) by (resource.service.version)"#,
        )
        .expect("accepted");
        assert_eq!(q.filter.conditions.len(), 2);
        assert!(q.filter.select.is_empty());
        assert_eq!(q.quantiles, [0.5, 0.95, 0.99]);
        assert_eq!(
            q.by,
            Some((
                "resource.service.version".into(),
                Attribute::Resource("service.version".into())
            ))
        );
        let q = parse_metrics_query("{}|quantile_over_time(duration,1,0)").expect("no by");
        assert_eq!((q.quantiles, q.by), (vec![1.0, 0.0], None));
        assert_eq!(q.filter, TraceQuery::default());
        for (by, attribute) in [
            ("name", Attribute::Name),
            ("span.thread.name", Attribute::Span("thread.name".into())),
            (".x", Attribute::Unscoped("x".into())),
        ] {
            let q =
                parse_metrics_query(&format!("{{}} | quantile_over_time(duration, .9) by({by})"))
                    .expect(by);
            assert_eq!(q.by, Some((by.to_string(), attribute)), "{by}");
        }
        // `.5` is a number to the search too (a float, refused there).
        let e = parse_traceql("{ .x = .5 }").expect_err(".5");
        assert!(e.contains("float `.5`"), "{e}");
    }

    #[test]
    fn refuses_other_metrics_naming_the_part() {
        for (query, part) in [
            ("", "an empty query"),
            ("{ }", "without a metrics function"),
            ("{ } | rate()", "`rate`"),
            ("{ } | count_over_time() by (name)", "`count_over_time`"),
            (
                "{ } | histogram_over_time(duration)",
                "`histogram_over_time`",
            ),
            ("{ } | avg_over_time(duration)", "`avg_over_time`"),
            (
                "{ } | select(.x) | quantile_over_time(duration, .5)",
                "`select`",
            ),
            ("{ } | quantile_over_time(span.size, .5)", "`span.size`"),
            ("{ } | quantile_over_time(.x, .5)", "`.x`"),
            ("{ } | quantile_over_time(duration)", "without a quantile"),
            ("{ } | quantile_over_time(duration, 1.5)", "quantile `1.5`"),
            (
                "{ } | quantile_over_time(duration, -0.5)",
                "quantile `-0.5`",
            ),
            (
                "{ } | quantile_over_time(duration, 50ms)",
                "quantile `50ms`",
            ),
            (
                r#"{ } | quantile_over_time(duration, "a")"#,
                r#"quantile `"a"`"#,
            ),
            ("{ } | quantile_over_time(duration, .5", "closing )"),
            (
                "{ } | quantile_over_time(duration, .5) by (duration)",
                "by (duration)",
            ),
            (
                "{ } | quantile_over_time(duration, .5) by (status)",
                "by (status)",
            ),
            (
                "{ } | quantile_over_time(duration, .5) by (name, .x)",
                "more than one",
            ),
            (
                "{ } | quantile_over_time(duration, .5) by (name) | topk(2)",
                "`|`",
            ),
            (
                "{ } | quantile_over_time(duration, .5) | topk(2)",
                "`| topk`",
            ),
            (
                "{ } | quantile_over_time(duration, .5) with (sample=true)",
                "`with`",
            ),
            ("{ } >> { } | quantile_over_time(duration, .5)", "`>>`"),
            ("rate()", "`rate`"),
            (
                "{ name =~ \"a\" } | quantile_over_time(duration, .5)",
                "`=~`",
            ),
        ] {
            let e = parse_metrics_query(query).expect_err(query);
            assert!(e.starts_with("the stand-in supports only"), "{query}: {e}");
            assert!(e.contains(part), "{query}: {e}");
        }
    }

    #[test]
    fn conditions_compare_as_tempo_does() {
        let resource = Resource {
            attributes: vec![
                kv("service.name", AnyValueKind::StringValue("api".into())),
                kv("x", AnyValueKind::StringValue("from resource".into())),
            ],
            ..Resource::default()
        };
        let span = Span {
            name: "GET /report".into(),
            start_time_unix_nano: 1_000,
            end_time_unix_nano: 1_000 + 250_000_000,
            attributes: vec![
                kv("http.status_code", AnyValueKind::IntValue(200)),
                kv("ratio", AnyValueKind::DoubleValue(2.0)),
                kv("x", AnyValueKind::StringValue("from span".into())),
            ],
            ..Span::default()
        };
        let holds = |q: &str| parse_traceql(q).expect(q).matches(Some(&resource), &span);
        assert!(holds(
            r#"{ resource.service.name = "api" && name = "GET /report" }"#
        ));
        assert!(holds("{ duration > 200ms && duration <= 250ms }"));
        assert!(!holds("{ duration > 250ms }"));
        assert!(holds(
            "{ span.http.status_code >= 200 && span.http.status_code < 300 }"
        ));
        assert!(holds("{ span.ratio = 2 }"));
        assert!(holds(
            r#"{ .x = "from span" && resource.x = "from resource" }"#
        ));
        assert!(
            holds(r#"{ .service.name = "api" }"#),
            "unscoped falls back to the resource"
        );
        assert!(!holds(r#"{ span.service.name = "api" }"#));
        // Absent, or of another type: false, `!=` included.
        assert!(!holds(r#"{ span.missing != "a" }"#));
        assert!(!holds(r#"{ span.http.status_code = "200" }"#));
        assert!(!holds(r#"{ span.http.status_code != "200" }"#));
        assert!(holds(r#"{ name > "GET" }"#));
        assert!(holds("{}"));
    }
}
