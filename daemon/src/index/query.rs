//! The search query language: FTS5's query syntax (what `search` has always taken),
//! parsed here into an expression the search index answers (`engine.rs`) and that a
//! chunk's terms can be checked against exactly (`Expr::matches`).
//!
//! Plain words must all match; `"a phrase"`, `word*` (a prefix), `a + b` (joined into
//! one phrase), `^word` (at the start of the chunk), `NEAR(a b, N)`, `AND`, `OR`, `NOT`,
//! parentheses and column filters (`body:`, `-heading:`, `{body heading}:`) as FTS5
//! reads them (SQLite's `fts5_expr.c` and its grammar: NOT binds tighter than AND,
//! AND than OR; words side by side are ANDed, groups in parentheses are not). Only
//! `body` is indexed, so a filter without it matches nothing. Malformed input is an
//! `invalid_query` error.

use alexandria_proto::ErrorCode;

use super::tokens;
use crate::error::ToolError;

/// One word of a phrase: a term as the tokenizer makes it, or the beginning of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    pub term: String,
    pub prefix: bool,
}

impl Word {
    pub fn matches(&self, term: &str) -> bool {
        if self.prefix {
            term.starts_with(self.term.as_str())
        } else {
            term == self.term
        }
    }
}

/// Words that must follow each other; `first`: at the start of the chunk (`^`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phrase {
    pub words: Vec<Word>,
    pub first: bool,
}

impl Phrase {
    /// Where the phrase starts in `terms`.
    fn starts<'a>(&'a self, terms: &'a [String]) -> impl Iterator<Item = usize> + 'a {
        let n = self.words.len();
        let last = if self.first {
            usize::from(terms.len() >= n)
        } else {
            (terms.len() + 1).saturating_sub(n)
        };
        (0..last).filter(move |&at| {
            self.words
                .iter()
                .zip(&terms[at..at + n])
                .all(|(word, term)| word.matches(term))
        })
    }

    /// Only plain words, no `^`: what a phrase query of the index answers exactly.
    pub fn is_plain(&self) -> bool {
        !self.first && self.words.iter().all(|w| !w.prefix)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Phrase(Phrase),
    /// Every phrase, with at most `distance` terms between them (FTS5's NEAR).
    Near {
        phrases: Vec<Phrase>,
        distance: usize,
    },
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    /// The left side without the right.
    Not(Box<Expr>, Box<Expr>),
    /// Matches no chunk (a column filter without `body`).
    Nothing,
}

impl Expr {
    /// Whether a chunk whose terms are `terms` (in order) matches.
    pub fn matches(&self, terms: &[String]) -> bool {
        match self {
            Expr::Phrase(phrase) => phrase.starts(terms).next().is_some(),
            Expr::Near { phrases, distance } => near(phrases, *distance, terms),
            Expr::And(a, b) => a.matches(terms) && b.matches(terms),
            Expr::Or(a, b) => a.matches(terms) || b.matches(terms),
            Expr::Not(a, b) => a.matches(terms) && !b.matches(terms),
            Expr::Nothing => false,
        }
    }

    /// The phrases a matching chunk may hold, for its snippet (not those after NOT),
    /// each with its NEAR group (a number, and the distance) if it is in one.
    pub fn phrases(&self) -> Vec<(&Phrase, Option<(usize, usize)>)> {
        let mut found = Vec::new();
        let mut groups = 0;
        self.collect_phrases(&mut found, &mut groups);
        found
    }

    fn collect_phrases<'a>(
        &'a self,
        found: &mut Vec<(&'a Phrase, Option<(usize, usize)>)>,
        groups: &mut usize,
    ) {
        match self {
            Expr::Phrase(phrase) => found.push((phrase, None)),
            Expr::Near { phrases, distance } => {
                found.extend(phrases.iter().map(|p| (p, Some((*groups, *distance)))));
                *groups += 1;
            }
            Expr::And(a, b) | Expr::Or(a, b) => {
                a.collect_phrases(found, groups);
                b.collect_phrases(found, groups);
            }
            Expr::Not(a, _) => a.collect_phrases(found, groups),
            Expr::Nothing => {}
        }
    }
}

/// The instances (starts) of each phrase of a NEAR group that take part in a match,
/// as FTS5's `fts5ExprNearIsMatch` keeps them (for snippets); all empty when the
/// group does not match. `starts`: each phrase's starts, ascending; `lengths`: words.
pub fn near_instances(
    starts: &[Vec<usize>],
    lengths: &[usize],
    distance: usize,
) -> Vec<Vec<usize>> {
    let n = starts.len();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    if n == 0 || starts.iter().any(Vec::is_empty) {
        return out;
    }
    // Each phrase's reader: the index of its current start.
    let mut at = vec![0usize; n];
    let position = |i: usize, at: &[usize]| starts[i][at[i]] as i64;
    let lookahead = |i: usize, at: &[usize]| starts[i].get(at[i] + 1).map(|&p| p as i64);
    'scan: loop {
        let mut max = position(0, &at);
        loop {
            let mut matched = true;
            for i in 0..n {
                let min = max - lengths[i] as i64 - distance as i64;
                if position(i, &at) < min || position(i, &at) > max {
                    matched = false;
                    while position(i, &at) < min {
                        at[i] += 1;
                        if at[i] >= starts[i].len() {
                            break 'scan;
                        }
                    }
                    max = max.max(position(i, &at));
                }
            }
            if matched {
                break;
            }
        }
        for i in 0..n {
            let p = starts[i][at[i]];
            if out[i].last() != Some(&p) {
                out[i].push(p);
            }
        }
        // Advance the reader whose next start is the lowest (the first such).
        let mut advance = 0;
        let mut lowest = i64::MAX;
        for i in 0..n {
            let next = lookahead(i, &at).unwrap_or(i64::MAX);
            if next < lowest {
                lowest = next;
                advance = i;
            }
        }
        at[advance] += 1;
        if at[advance] >= starts[advance].len() {
            break;
        }
    }
    if out[0].is_empty() {
        return vec![Vec::new(); n];
    }
    out
}

/// FTS5's NEAR: instances of every phrase such that, with the last of them starting
/// at `m`, each starts no earlier than `m - its length - distance`.
fn near(phrases: &[Phrase], distance: usize, terms: &[String]) -> bool {
    let starts: Vec<Vec<usize>> = phrases.iter().map(|p| p.starts(terms).collect()).collect();
    if starts.iter().any(Vec::is_empty) {
        return false;
    }
    starts.iter().flatten().any(|&last| {
        phrases.iter().zip(&starts).all(|(phrase, at)| {
            let earliest = last.saturating_sub(phrase.words.len() + distance);
            at.iter().any(|&s| s >= earliest && s <= last)
        })
    })
}

/// Parse a query as `search` takes it: words without FTS5 syntax are each quoted
/// (so `don't` or `c++` search for their words), anything else is read as FTS5 syntax.
pub fn parse(query: &str) -> Result<Expr, ToolError> {
    let fts = fts_query(query)?;
    let expr = Parser::new(query, &fts)?.parse()?;
    // A query of empty phrases only (`"+++"`) matches nothing.
    Ok(expr.unwrap_or(Expr::Nothing))
}

/// A user query as FTS5 syntax: plain words are quoted so punctuation cannot break
/// the syntax; a query that uses the syntax on purpose passes through.
pub fn fts_query(query: &str) -> Result<String, ToolError> {
    let trimmed = query.trim();
    if trimmed.is_empty() {
        return Err(ToolError::new(
            ErrorCode::InvalidQuery,
            "the search query is empty",
            "pass words to look for, or use mode=\"list\" to list files",
        ));
    }
    let uses_syntax = trimmed.contains(['"', '*', '(', ')', '^'])
        || trimmed
            .split_whitespace()
            .any(|w| matches!(w, "AND" | "OR" | "NOT") || w.starts_with("NEAR("));
    if uses_syntax {
        return Ok(trimmed.to_string());
    }
    let terms: Vec<String> = trimmed
        .split_whitespace()
        .map(|word| format!("\"{}\"", word.replace('"', "\"\"")))
        .collect();
    Ok(terms.join(" "))
}

fn invalid(query: &str, problem: String) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidQuery,
        format!("cannot parse the search query {query:?}: {problem}"),
        "use plain words (all must match), \"an exact phrase\", word* for a prefix, OR / NOT between words; or drop the special characters",
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    LeftParen,
    RightParen,
    LeftBrace,
    RightBrace,
    Colon,
    Comma,
    Plus,
    Star,
    Minus,
    Caret,
    And,
    Or,
    Not,
    /// A bare word or a quoted string (its text as written, quotes included).
    String(String),
    End,
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::LeftParen => "(",
            Token::RightParen => ")",
            Token::LeftBrace => "{",
            Token::RightBrace => "}",
            Token::Colon => ":",
            Token::Comma => ",",
            Token::Plus => "+",
            Token::Star => "*",
            Token::Minus => "-",
            Token::Caret => "^",
            Token::And => "AND",
            Token::Or => "OR",
            Token::Not => "NOT",
            Token::String(text) => text,
            Token::End => "",
        }
    }
}

/// FTS5's bare-word characters: ASCII letters, digits, `_`, 0x1A, and all non-ASCII.
fn is_bareword(c: char) -> bool {
    !c.is_ascii() || c.is_ascii_alphanumeric() || c == '_' || c == '\u{1a}'
}

/// `fts5ExprGetToken`.
fn lex(query: &str, fts: &str) -> Result<Vec<Token>, ToolError> {
    let mut tokens = Vec::new();
    let mut chars = fts.char_indices().peekable();
    if fts.starts_with('*') {
        // FTS5's special queries (`*reads`, `*id`) are not searches.
        return Err(invalid(query, "unknown special query".into()));
    }
    while let Some((at, c)) = chars.next() {
        let token = match c {
            ' ' | '\t' | '\n' | '\r' => continue,
            '(' => Token::LeftParen,
            ')' => Token::RightParen,
            '{' => Token::LeftBrace,
            '}' => Token::RightBrace,
            ':' => Token::Colon,
            ',' => Token::Comma,
            '+' => Token::Plus,
            '*' => Token::Star,
            '-' => Token::Minus,
            '^' => Token::Caret,
            '"' => {
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    // `""` inside a string is a quote.
                    if c == '"' && chars.next_if(|(_, c)| *c == '"').is_none() {
                        end = Some(i + 1);
                        break;
                    }
                }
                let Some(end) = end else {
                    return Err(invalid(query, "unterminated string".into()));
                };
                Token::String(fts[at..end].to_string())
            }
            c if is_bareword(c) => {
                let mut end = at + c.len_utf8();
                while let Some((i, c)) = chars.next_if(|(_, c)| is_bareword(*c)) {
                    end = i + c.len_utf8();
                }
                match &fts[at..end] {
                    "AND" => Token::And,
                    "OR" => Token::Or,
                    "NOT" => Token::Not,
                    word => Token::String(word.to_string()),
                }
            }
            c => return Err(invalid(query, format!("syntax error near \"{c}\""))),
        };
        tokens.push(token);
    }
    tokens.push(Token::End);
    Ok(tokens)
}

/// The text of a string token: a quoted one without its quotes, `""` as `"`.
fn dequote(text: &str) -> String {
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => text.to_string(),
    }
}

/// The columns of the `chunks` rows FTS5 indexed; only `body` has terms.
const COLUMNS: [&str; 3] = ["page", "heading", "body"];

/// A recursive-descent reading of FTS5's grammar (`fts5parse.y`). An expression that
/// vanishes (a phrase without a term, like `"+++"`) is None, as in FTS5, where it
/// drops out of the AND, OR or NOT it is part of.
struct Parser<'q> {
    query: &'q str,
    tokens: Vec<Token>,
    at: usize,
}

type Parsed = Result<Option<Expr>, ToolError>;

/// Words, operators and parentheses a query may hold, and how deep its groups nest.
const MAX_TOKENS: usize = 512;
const MAX_NESTING: usize = 32;

impl<'q> Parser<'q> {
    fn new(query: &'q str, fts: &str) -> Result<Parser<'q>, ToolError> {
        let tokens = lex(query, fts)?;
        // The parser, the expression and the index's query are recursive, one level
        // per group and per operator: a client's query must not overflow the stack
        // (an abort, not a panic). FTS5 refused trees deeper than 256.
        if tokens.len() > MAX_TOKENS {
            return Err(invalid(
                query,
                format!("the query is too long (at most {MAX_TOKENS} words and operators)"),
            ));
        }
        let mut depth = 0usize;
        for token in &tokens {
            match token {
                Token::LeftParen | Token::LeftBrace => depth += 1,
                Token::RightParen | Token::RightBrace => depth = depth.saturating_sub(1),
                _ => {}
            }
            if depth > MAX_NESTING {
                return Err(invalid(
                    query,
                    format!("parentheses nested too deep (at most {MAX_NESTING})"),
                ));
            }
        }
        Ok(Parser {
            query,
            tokens,
            at: 0,
        })
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.at.min(self.tokens.len() - 1)]
    }

    fn peek_second(&self) -> &Token {
        &self.tokens[(self.at + 1).min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        self.at += 1;
        token
    }

    fn syntax_error(&self, token: &Token) -> ToolError {
        invalid(
            self.query,
            format!("syntax error near \"{}\"", token.text()),
        )
    }

    fn expect(&mut self, wanted: Token) -> Result<(), ToolError> {
        let token = self.next();
        if token == wanted {
            Ok(())
        } else {
            Err(self.syntax_error(&token))
        }
    }

    fn parse(mut self) -> Parsed {
        let expr = self.or()?;
        match self.next() {
            Token::End => Ok(expr),
            token => Err(self.syntax_error(&token)),
        }
    }

    fn or(&mut self) -> Parsed {
        let mut left = self.and()?;
        while *self.peek() == Token::Or {
            self.next();
            let right = self.and()?;
            left = combine(left, right, Expr::Or);
        }
        Ok(left)
    }

    fn and(&mut self) -> Parsed {
        let mut left = self.not()?;
        while *self.peek() == Token::And {
            self.next();
            let right = self.not()?;
            // Unlike words side by side, AND with a vanished side matches nothing.
            left = match (left, right) {
                (Some(a), Some(b)) => Some(Expr::And(Box::new(a), Box::new(b))),
                _ => None,
            };
        }
        Ok(left)
    }

    fn not(&mut self) -> Parsed {
        let mut left = self.primary()?;
        while *self.peek() == Token::Not {
            self.next();
            let right = self.primary()?;
            left = match (left, right) {
                (Some(a), Some(b)) => Some(Expr::Not(Box::new(a), Box::new(b))),
                (a, None) => a,
                (None, Some(_)) => None,
            };
        }
        Ok(left)
    }

    /// `( expr )`, `colset : ( expr )`, or words side by side.
    fn primary(&mut self) -> Parsed {
        if *self.peek() == Token::LeftParen {
            self.next();
            let expr = self.or()?;
            self.expect(Token::RightParen)?;
            return Ok(expr);
        }
        let mut list = None;
        if self.starts_colset() {
            let body = self.colset()?;
            self.expect(Token::Colon)?;
            if *self.peek() == Token::LeftParen {
                self.next();
                let expr = self.or()?;
                self.expect(Token::RightParen)?;
                return Ok(expr.map(|e| filter(e, body)));
            }
            list = Some(self.nearset()?.map(|e| filter(e, body)));
        }
        // One or more (column-filtered) phrases or NEAR groups, ANDed.
        loop {
            let starts = matches!(
                self.peek(),
                Token::String(_) | Token::Caret | Token::Minus | Token::LeftBrace
            );
            if !starts {
                break;
            }
            let item = if self.starts_colset() {
                let body = self.colset()?;
                self.expect(Token::Colon)?;
                self.nearset()?.map(|e| filter(e, body))
            } else {
                self.nearset()?
            };
            list = Some(match list {
                None => item,
                Some(left) => combine(left, item, Expr::And),
            });
        }
        match list {
            Some(expr) => Ok(expr),
            None => Err(self.syntax_error(&self.peek().clone())),
        }
    }

    fn starts_colset(&self) -> bool {
        match self.peek() {
            Token::Minus | Token::LeftBrace => true,
            Token::String(_) => *self.peek_second() == Token::Colon,
            _ => false,
        }
    }

    /// A column filter; whether it keeps `body`.
    fn colset(&mut self) -> Result<bool, ToolError> {
        let invert = if *self.peek() == Token::Minus {
            self.next();
            true
        } else {
            false
        };
        let mut names = Vec::new();
        match self.next() {
            Token::LeftBrace => loop {
                match self.next() {
                    Token::String(name) => names.push(name),
                    Token::RightBrace if !names.is_empty() => break,
                    token => return Err(self.syntax_error(&token)),
                }
            },
            Token::String(name) => names.push(name),
            token => return Err(self.syntax_error(&token)),
        }
        let mut body = false;
        for name in &names {
            let name = dequote(name);
            if !COLUMNS.iter().any(|c| c.eq_ignore_ascii_case(&name)) {
                return Err(invalid(self.query, format!("no such column: {name}")));
            }
            body |= name.eq_ignore_ascii_case("body");
        }
        Ok(body != invert)
    }

    /// A phrase, `^phrase`, or `NEAR(phrase phrase … [, N])`.
    fn nearset(&mut self) -> Parsed {
        if *self.peek() == Token::Caret {
            self.next();
            let phrase = self.phrase()?;
            return Ok(phrase.map(|mut p| {
                p.first = true;
                Expr::Phrase(p)
            }));
        }
        if let Token::String(name) = self.peek().clone()
            && *self.peek_second() == Token::LeftParen
        {
            if name != "NEAR" {
                return Err(invalid(self.query, format!("syntax error near \"{name}\"")));
            }
            self.next();
            self.next();
            let mut phrases = Vec::new();
            loop {
                if let Some(phrase) = self.phrase()? {
                    phrases.push(phrase);
                }
                if !matches!(self.peek(), Token::String(_)) {
                    break;
                }
            }
            let mut distance = 10;
            if *self.peek() == Token::Comma {
                self.next();
                match self.next() {
                    Token::String(n) if n.bytes().all(|b| b.is_ascii_digit()) => {
                        distance = n.parse().unwrap_or(usize::MAX);
                    }
                    Token::String(n) => {
                        return Err(invalid(
                            self.query,
                            format!("expected integer, got \"{n}\""),
                        ));
                    }
                    token => return Err(self.syntax_error(&token)),
                }
            }
            self.expect(Token::RightParen)?;
            return Ok(match phrases.len() {
                0 => None,
                1 => phrases.pop().map(Expr::Phrase),
                _ => Some(Expr::Near { phrases, distance }),
            });
        }
        Ok(self.phrase()?.map(Expr::Phrase))
    }

    /// `string [*] (+ string [*])*`, tokenized; None when it holds no term.
    fn phrase(&mut self) -> Result<Option<Phrase>, ToolError> {
        let mut words = Vec::new();
        loop {
            let text = match self.next() {
                Token::String(text) => dequote(&text),
                token => return Err(self.syntax_error(&token)),
            };
            let from = words.len();
            words.extend(tokens::terms(&text).into_iter().map(|term| Word {
                term,
                prefix: false,
            }));
            if *self.peek() == Token::Star {
                self.next();
                if words.len() > from
                    && let Some(last) = words.last_mut()
                {
                    last.prefix = true;
                }
            }
            if *self.peek() != Token::Plus {
                break;
            }
            self.next();
        }
        Ok((!words.is_empty()).then_some(Phrase {
            words,
            first: false,
        }))
    }
}

/// AND or OR of two parts, either of which may have vanished.
fn combine(
    left: Option<Expr>,
    right: Option<Expr>,
    make: impl FnOnce(Box<Expr>, Box<Expr>) -> Expr,
) -> Option<Expr> {
    match (left, right) {
        (Some(a), Some(b)) => Some(make(Box::new(a), Box::new(b))),
        (a, None) => a,
        (None, b) => b,
    }
}

/// A column filter applied to `expr`: without `body` it matches nothing.
fn filter(expr: Expr, body: bool) -> Expr {
    if body { expr } else { without_phrases(expr) }
}

fn without_phrases(expr: Expr) -> Expr {
    match expr {
        Expr::Phrase(_) | Expr::Near { .. } | Expr::Nothing => Expr::Nothing,
        Expr::And(a, b) => Expr::And(Box::new(without_phrases(*a)), Box::new(without_phrases(*b))),
        Expr::Or(a, b) => Expr::Or(Box::new(without_phrases(*a)), Box::new(without_phrases(*b))),
        Expr::Not(a, b) => Expr::Not(Box::new(without_phrases(*a)), Box::new(without_phrases(*b))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts for FTS5 to index and our expressions to check.
    const TEXTS: &[&str] = &[
        "alpha beta gamma",
        "beta gamma delta",
        "running runner run",
        "alpha x y z beta",
        "the quick brown fox jumps over the lazy dog",
        "Café déjà vu, and the café again",
        "gamma alpha alpha beta beta",
        "don't stop: c++ and snake_case",
        "x y z",
        "delta delta delta epsilon",
        "beta",
        "quickly brown foxes jumped",
    ];

    fn fts5() -> rusqlite::Connection {
        let connection = rusqlite::Connection::open_in_memory().expect("db");
        connection
            .execute_batch(
                "CREATE VIRTUAL TABLE t USING fts5(page UNINDEXED, heading UNINDEXED, body,
                   tokenize = 'porter unicode61 remove_diacritics 2');",
            )
            .expect("fts5");
        for (i, text) in TEXTS.iter().enumerate() {
            connection
                .execute(
                    "INSERT INTO t(rowid, page, heading, body) VALUES (?1, 1, 'alpha quick', ?2)",
                    rusqlite::params![i as i64, text],
                )
                .expect("insert");
        }
        connection
    }

    /// What FTS5 answers: the matching rows, or None for an error.
    fn fts5_answer(connection: &rusqlite::Connection, fts: &str) -> Option<Vec<usize>> {
        let mut statement = connection
            .prepare("SELECT rowid FROM t WHERE t MATCH ?1 ORDER BY rowid")
            .expect("prepare");
        let rows = statement.query_map([fts], |row| row.get::<_, i64>(0));
        match rows {
            Ok(rows) => rows
                .collect::<Result<Vec<i64>, _>>()
                .ok()
                .map(|r| r.into_iter().map(|i| i as usize).collect()),
            Err(_) => None,
        }
    }

    fn our_answer(query: &str) -> Option<Vec<usize>> {
        let expr = parse(query).ok()?;
        Some(
            TEXTS
                .iter()
                .enumerate()
                .filter(|(_, text)| expr.matches(&tokens::terms(text)))
                .map(|(i, _)| i)
                .collect(),
        )
    }

    fn check(connection: &rusqlite::Connection, query: &str) {
        let Ok(fts) = fts_query(query) else {
            return;
        };
        assert_eq!(
            our_answer(query),
            fts5_answer(connection, &fts),
            "query {query:?} (as FTS5: {fts:?})"
        );
    }

    #[test]
    fn queries_match_what_fts5_matches() {
        let connection = fts5();
        let queries = [
            "alpha",
            "alpha beta",
            "\"alpha beta\"",
            "\"beta alpha\"",
            "\"+++\"",
            "\"+++\" alpha",
            "alpha \"+++\"",
            "\"\"",
            "\"\" OR beta",
            "beta NOT \"\"",
            "\"\" NOT beta",
            "(alpha) beta",
            "alpha (beta)",
            "(alpha) (beta)",
            "heading:alpha",
            "page:1",
            "body:alpha",
            "-body:alpha",
            "-heading:alpha",
            "{heading body}:alpha",
            "-{heading page}:alpha",
            "foo:alpha",
            "BODY:alpha",
            "\"body\":alpha",
            "running*",
            "runn*",
            "run*",
            "r*",
            "NEAR(alpha beta)",
            "NEAR(alpha beta, 2)",
            "NEAR(alpha beta, 3)",
            "NEAR(alpha beta, 0)",
            "NEAR(beta alpha, 0)",
            "NEAR(\"alpha beta\" gamma, 0)",
            "NEAR(alpha gamma, 0)",
            "NEAR(alpha gamma, 1)",
            "NEAR(alpha gamma z, 5)",
            "NEAR(alpha)",
            "NEAR(\"+++\" alpha)",
            "NEAR(\"+++\")",
            "near(alpha beta)",
            "NEAR alpha",
            "NEAR(alpha beta,)",
            "NEAR(alpha beta, x)",
            "NEAR(alpha beta) gamma",
            "foo(alpha)",
            "alpha AND",
            "OR alpha",
            "alpha OR OR beta",
            "alpha OR beta",
            "alpha AND beta",
            "alpha NOT beta",
            "alpha NOT beta gamma",
            "alpha OR beta NOT gamma",
            "alpha OR beta AND delta",
            "(alpha OR beta) AND delta",
            "alpha NOT beta NOT gamma",
            "NOT alpha",
            "alpha AND NOT beta",
            "alpha -beta",
            "alpha.beta",
            "don't",
            "\"don't\"",
            "c++",
            "snake_case",
            "x*y",
            "*",
            "*alpha",
            "^",
            "^alpha",
            "^beta",
            "^ alpha",
            "alpha ^beta",
            "^\"beta gamma\"",
            "alpha + beta",
            "alpha+beta",
            "gamma + alpha* + alph*",
            "\"alpha\" *",
            "\"alpha beta\" *",
            "\"alpha be\" *",
            "alpha * beta",
            "a*",
            "body:(alpha OR delta)",
            "heading:(alpha)",
            "heading:(alpha) OR beta",
            "alpha heading:beta",
            "heading:beta alpha",
            "alpha NOT heading:beta",
            "body : alpha",
            "{body}:alpha",
            "-{body}:alpha",
            "{}:alpha",
            "ÉCOLE",
            "cafe",
            "déjà",
            "\"deja vu\"",
            "alpha\tbeta",
            "alpha\u{b}beta",
            "quick brown",
            "\"the quick\"",
            "\"the lazy dog\"",
            "quick*",
            "fox*",
            "jump*",
            "(alpha",
            "alpha)",
            "\"unbalanced",
            "alpha OR",
            "alpha NOT",
            "((alpha))",
            "(alpha OR (beta NOT gamma))",
            "NEAR(alpha beta gamma, 2) OR delta",
            "delta NEAR(alpha)",
            "body:NEAR(alpha beta)",
            "body:^alpha",
            "-body:(alpha)",
            "\"x y\" + z",
            "x + \"y z\"",
            "AND",
            "OR",
            "NOT",
            "\"AND\"",
            "alpha: beta",
            "alpha:",
            ":alpha",
            "{body:alpha",
            "body:{alpha}",
        ];
        for query in queries {
            check(&connection, query);
        }
    }

    /// Random strings over the syntax's pieces: FTS5 and we agree on every one,
    /// errors included.
    #[test]
    fn random_queries_match_what_fts5_matches() {
        let connection = fts5();
        let pieces = [
            "alpha",
            "beta",
            "gamma",
            "delta",
            "x",
            "y",
            "z",
            "run",
            "runn",
            "the",
            "quick",
            "AND",
            "OR",
            "NOT",
            "NEAR",
            "(",
            ")",
            "\"",
            "*",
            "^",
            "+",
            ":",
            ",",
            "2",
            "0",
            "body",
            "heading",
            "-",
            "{",
            "}",
            " ",
            " ",
            " ",
            "\"alpha beta\"",
            "\"+++\"",
            // words more often than syntax, so that more queries match something
            "alpha",
            "beta",
            "gamma",
            "delta",
            "z",
            "al",
            "be",
            " ",
            " ",
            " ",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut query = String::new();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let length = 1 + (seed % 9) as usize;
            for _ in 0..length {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                query.push_str(pieces[(seed % pieces.len() as u64) as usize]);
                if seed & 0x100 != 0 {
                    query.push(' ');
                }
            }
            check(&connection, &query);
        }
    }

    #[test]
    fn queries_too_long_or_too_deep_are_invalid() {
        let words: Vec<String> = (0..MAX_TOKENS + 1).map(|i| format!("w{i}")).collect();
        let long = words.join(" ");
        assert_eq!(
            parse(&long).expect_err("long").code,
            ErrorCode::InvalidQuery
        );
        let deep = format!(
            "{}a{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        assert_eq!(
            parse(&deep).expect_err("deep").code,
            ErrorCode::InvalidQuery
        );
        let huge = "(".repeat(100_000);
        assert_eq!(
            parse(&huge).expect_err("huge").code,
            ErrorCode::InvalidQuery
        );
        // At the limits: parsed, and the expression is evaluated.
        let ok = format!("{}a{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        assert!(parse(&ok).is_ok());
        let ors: Vec<String> = (0..MAX_TOKENS / 2).map(|i| format!("w{i}")).collect();
        let expr = parse(&ors.join(" OR ")).expect("ors");
        assert!(expr.matches(&["w7".to_string()]));
    }

    #[test]
    fn plain_words_are_quoted() {
        assert_eq!(fts_query("hello world").expect("ok"), "\"hello\" \"world\"");
        assert_eq!(fts_query("c++ (x").expect("ok"), "c++ (x");
        assert_eq!(fts_query("don't").expect("ok"), "\"don't\"");
        assert!(fts_query("  ").is_err());
        assert_eq!(
            parse("\"unbalanced").expect_err("bad").code,
            ErrorCode::InvalidQuery
        );
    }
}
