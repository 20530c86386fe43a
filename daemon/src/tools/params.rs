//! Parameter helpers shared by the tools: path-glob scopes, cursors, limits, times.

use alexandria_proto::paths::{self, Layer};

use crate::error::{ToolError, ToolResult};

/// Milliseconds since the epoch as an RFC 3339 UTC timestamp (lives in `db`, which
/// names moved-aside files with it).
pub use crate::db::iso_time;

/// A caller's path glob, checked: the matcher, a SQL GLOB prefilter, the layer.
#[derive(Clone)]
pub(crate) struct Scope {
    pub(crate) matcher: crate::index::PathGlob,
    pub(crate) sql: String,
    pub(crate) layer: Layer,
}

/// Globs compiled lately, by pattern (compiling one is a few µs since `PathGlob`; it
/// cost more than the rest of a glob read of 10 pages with globset's matcher). A scope
/// depends on the pattern alone.
static SCOPES: std::sync::Mutex<Vec<(String, Scope)>> = std::sync::Mutex::new(Vec::new());
const SCOPES_KEPT: usize = 64;

pub(crate) fn scope(path: &str) -> ToolResult<Scope> {
    let found = {
        let scopes = SCOPES.lock().unwrap_or_else(|p| p.into_inner());
        scopes
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, s)| s.clone())
    };
    if let Some(found) = found {
        return Ok(found);
    }
    let compiled = compile_scope(path)?;
    let mut scopes = SCOPES.lock().unwrap_or_else(|p| p.into_inner());
    if scopes.len() >= SCOPES_KEPT {
        scopes.remove(0);
    }
    scopes.push((path.to_string(), compiled.clone()));
    Ok(compiled)
}

fn compile_scope(path: &str) -> ToolResult<Scope> {
    let checked = paths::validate_workspace_path(path, true)
        .map_err(|e| ToolError::invalid_path(e.message).with_detail("path", path))?;
    let pattern = if checked.rest().is_empty() {
        format!("{}/**", checked.path)
    } else {
        checked.path.clone()
    };
    let matcher = crate::index::PathGlob::new(&pattern).map_err(|e| {
        ToolError::invalid_argument(
            format!("'{path}' is not a valid glob: {e}"),
            "use * within a directory, ** across directories, {a,b} for alternatives",
        )
    })?;
    // SQLite GLOB prefilter: a superset of the glob (its * also matches '/').
    let mut sql = String::new();
    let mut in_braces = false;
    for c in pattern.chars() {
        match c {
            '{' => {
                in_braces = true;
                sql.push('*');
            }
            '}' => in_braces = false,
            _ if in_braces => {}
            _ => sql.push(c),
        }
    }
    let sql = sql.replace("**", "*").replace("[!", "[^");
    Ok(Scope {
        matcher,
        sql,
        layer: checked.layer,
    })
}

pub(crate) fn parse_cursor(cursor: Option<&str>) -> ToolResult<usize> {
    match cursor.map(str::trim).filter(|c| !c.is_empty()) {
        None => Ok(0),
        Some(c) => c.parse().map_err(|_| {
            ToolError::invalid_argument(
                format!("'{c}' is not a cursor this server issued"),
                "pass the next_cursor value from the previous result unchanged, or omit cursor",
            )
        }),
    }
}

/// The `limit` a caller gave, or `default`. Outside `1..=max` it is refused rather
/// than clamped: `limit: 0` meaning "one result" surprises everyone. Every tool that
/// takes a limit goes through here, and says the range in its schema.
pub(crate) fn limit_in_range(given: Option<u32>, default: u32, max: u32) -> ToolResult<usize> {
    match given {
        None => Ok(default as usize),
        Some(n) if (1..=max).contains(&n) => Ok(n as usize),
        Some(n) => Err(ToolError::invalid_argument(
            format!("limit={n} is out of range"),
            format!("pass a limit from 1 to {max} (or omit it: the default is {default}), and page through more with cursor"),
        )
        .with_detail("min", 1)
        .with_detail("max", max)),
    }
}

/// Parse a time bound into epoch milliseconds.
pub fn parse_time(text: &str, now: i64) -> Option<i64> {
    let text = text.trim();
    if let Some(unit) = text.chars().last().filter(|c| c.is_ascii_alphabetic())
        && let Ok(amount) = text[..text.len() - 1].parse::<i64>()
    {
        let ms = match unit {
            's' => 1000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 604_800_000,
            _ => return None,
        };
        return Some(now - amount * ms);
    }
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> { text.get(range)?.parse().ok() };
    if bytes.len() < 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let (y, m, d) = (number(0..4)?, number(5..7)?, number(8..10)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let (mut hh, mut mm, mut ss) = (0, 0, 0);
    if bytes.len() >= 19 && matches!(bytes[10], b'T' | b' ') {
        hh = number(11..13)?;
        mm = number(14..16)?;
        ss = number(17..19)?;
    } else if bytes.len() != 10 {
        return None;
    }
    // Days from civil (Howard Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400) + hh * 3600 + mm * 60 + ss) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_time(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso_time(951_782_400_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn limits() {
        assert_eq!(limit_in_range(None, 10, 1000).expect("default"), 10);
        assert_eq!(limit_in_range(Some(1), 10, 1000).expect("min"), 1);
        assert_eq!(limit_in_range(Some(1000), 10, 1000).expect("max"), 1000);
        for bad in [0, 1001, u32::MAX] {
            let error = limit_in_range(Some(bad), 10, 1000).expect_err("out of range");
            assert_eq!(error.code, alexandria_proto::ErrorCode::InvalidArgument);
            assert!(error.hint.contains("1 to 1000"), "{}", error.hint);
        }
    }

    #[test]
    fn times_parse() {
        let now = 1_000_000_000_000;
        assert_eq!(parse_time("24h", now), Some(now - 86_400_000));
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z", now),
            Some(1_700_000_000_000)
        );
        assert_eq!(parse_time("2000-02-29", now), Some(951_782_400_000));
        for bad in ["yesterday", "2023-13-01", "2023-11-14T", "5x", ""] {
            assert_eq!(parse_time(bad, now), None, "{bad}");
        }
    }
}
