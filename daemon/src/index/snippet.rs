//! Snippets for the search index's hits (`engine.rs`), made from the chunk's stored
//! text the way FTS5's `snippet(chunks, 2, '**', '**', '…', N)` makes them (SQLite's
//! `fts5SnippetFunction`): the window of N tokens with the most distinct phrases
//! (a window starting a sentence gets a bonus), matches in bold. Asking FTS5 for the
//! snippet cost a `MATCH` per hit, which for common words walks their position lists.

use super::query::{Phrase, Word, near_instances};
use super::tokens::Terms;

/// One token: its byte range and which of the query's words it is (bit i: word i).
struct Token {
    start: usize,
    end: usize,
    words: u64,
}

/// A phrase found in the text: its phrase number and first token.
#[derive(Clone, Copy)]
struct Instance {
    phrase: usize,
    at: usize,
}

/// The snippet of `text` for `phrases`, `size` tokens long; None when no phrase is in
/// the text. Only words whose first letter starts one of the query's words are
/// stemmed (stemming keeps the first letter), which is most of a snippet's cost.
pub fn snippet(
    text: &str,
    phrases: &[(&Phrase, Option<(usize, usize)>)],
    size: usize,
) -> Option<String> {
    // The query's distinct words (up to 64: one bit each); phrases by word number.
    let mut words: Vec<&Word> = Vec::new();
    let groups: Vec<Option<(usize, usize)>> = phrases.iter().map(|(_, group)| *group).collect();
    let phrases: Vec<(bool, Vec<usize>)> = phrases
        .iter()
        .map(|(phrase, _)| {
            let ids = phrase
                .words
                .iter()
                .map(|word| {
                    words.iter().position(|w| *w == word).unwrap_or_else(|| {
                        words.push(word);
                        words.len() - 1
                    })
                })
                .collect();
            (phrase.first, ids)
        })
        .collect();
    let mut first_bytes = [false; 256];
    for word in &words {
        if let Some(&b) = word.term.as_bytes().first() {
            first_bytes[usize::from(b)] = true;
        }
    }
    // Room for every token from the start (a word and its space are rarely under five
    // bytes): growing the vector was a quarter of a snippet's time.
    let mut tokens = Vec::with_capacity(text.len() / 5 + 8);
    let mut sentences = Vec::new();
    // The tokens that are one of the query's words: where a phrase may start.
    let mut matching = Vec::new();
    let mut terms = Terms::new(text);
    while let Some((range, folded)) = terms.advance_if(&first_bytes) {
        let mut matched = 0u64;
        if folded {
            terms.stem();
            for (i, word) in words.iter().enumerate().take(64) {
                if word.matches(terms.term()) {
                    matched |= 1 << i;
                }
            }
            if matched != 0 {
                matching.push(tokens.len());
            }
        }
        if tokens.is_empty() || starts_sentence(text, range.start) {
            sentences.push(tokens.len());
        }
        tokens.push(Token {
            start: range.start,
            end: range.end,
            words: matched,
        });
    }
    // Where each phrase starts (at a token that is its first word).
    let mut starts: Vec<Vec<usize>> = vec![Vec::new(); phrases.len()];
    for &at in &matching {
        for (phrase, (first, ids)) in phrases.iter().enumerate() {
            let found = !ids.is_empty()
                && (!first || at == 0)
                && at + ids.len() <= tokens.len()
                && ids
                    .iter()
                    .zip(&tokens[at..])
                    .all(|(id, token)| *id < 64 && token.words & (1 << id) != 0);
            if found {
                starts[phrase].push(at);
            }
        }
    }
    let lengths: Vec<usize> = phrases.iter().map(|(_, ids)| ids.len()).collect();
    // A NEAR group keeps the instances that take part in a match.
    let mut seen_groups = Vec::new();
    for (phrase, group) in groups.iter().enumerate() {
        let Some((group, distance)) = *group else {
            continue;
        };
        if seen_groups.contains(&group) {
            continue;
        }
        seen_groups.push(group);
        let members: Vec<usize> = (phrase..groups.len())
            .filter(|&i| groups[i].is_some_and(|(g, _)| g == group))
            .collect();
        let kept = near_instances(
            &members
                .iter()
                .map(|&i| starts[i].clone())
                .collect::<Vec<_>>(),
            &members.iter().map(|&i| lengths[i]).collect::<Vec<_>>(),
            distance,
        );
        for (i, kept) in members.into_iter().zip(kept) {
            starts[i] = kept;
        }
    }
    // By token, then phrase.
    let mut instances: Vec<Instance> = starts
        .iter()
        .enumerate()
        .flat_map(|(phrase, starts)| starts.iter().map(move |&at| Instance { phrase, at }))
        .collect();
    instances.sort_unstable_by_key(|instance| (instance.at, instance.phrase));
    instances.dedup_by(|a, b| a.at == b.at && a.phrase == b.phrase);
    if instances.is_empty() {
        return None;
    }
    let start = best_start(&instances, &lengths, &sentences, tokens.len(), size);
    Some(highlight(text, &tokens, &instances, &lengths, start, size))
}

/// FTS5's sentence finder: a token starts a sentence when the text before it, past
/// white space (at least one character of it), ends with '.' or ':'.
fn starts_sentence(text: &str, start: usize) -> bool {
    let before = text[..start].trim_end_matches([' ', '\t', '\n', '\r']);
    before.len() != start && (before.ends_with('.') || before.ends_with(':'))
}

/// `fts5SnippetScore`: 1000 for each phrase's first instance in the window starting at
/// `from`, 1 for each further one; and the start that centres those instances.
fn score(
    instances: &[Instance],
    lengths: &[usize],
    documents: usize,
    from: usize,
    size: usize,
) -> (i64, usize) {
    let mut seen = vec![false; lengths.len()];
    let mut total = 0i64;
    let mut first: Option<usize> = None;
    let mut last = 0usize;
    for instance in instances {
        if instance.at >= from && instance.at < from + size {
            total += if seen[instance.phrase] { 1 } else { 1000 };
            seen[instance.phrase] = true;
            first.get_or_insert(instance.at);
            last = instance.at + lengths[instance.phrase];
        }
    }
    let first = first.unwrap_or(0) as i64;
    let (size, documents) = (size as i64, documents as i64);
    let mut adjusted = first - (size - (last as i64 - first)) / 2;
    if adjusted + size > documents {
        adjusted = documents - size;
    }
    (total, adjusted.max(0) as usize)
}

/// The first token of the best window, as `fts5SnippetFunction` picks it.
fn best_start(
    instances: &[Instance],
    lengths: &[usize],
    sentences: &[usize],
    documents: usize,
    size: usize,
) -> usize {
    let mut best = (0i64, 0usize);
    for instance in instances {
        let (total, adjusted) = score(instances, lengths, documents, instance.at, size);
        if total > best.0 {
            best = (total, adjusted);
        }
        if !sentences.is_empty() && documents > size {
            let mut j = 0;
            while j + 1 < sentences.len() && sentences[j + 1] <= instance.at {
                j += 1;
            }
            let sentence = sentences[j];
            if sentence < instance.at {
                let (total, _) = score(instances, lengths, documents, sentence, size);
                let total = total + if sentence == 0 { 120 } else { 100 };
                if total > best.0 {
                    best = (total, sentence);
                }
            }
        }
    }
    best.1
}

/// `fts5HighlightCb` over the window of `size` tokens from `start`: overlapping
/// instances are one bold run; '…' where the window cuts the text.
fn highlight(
    text: &str,
    tokens: &[Token],
    instances: &[Instance],
    lengths: &[usize],
    start: usize,
    size: usize,
) -> String {
    // Coalesced instances: (first token, last token).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for instance in instances {
        let end = instance.at + lengths[instance.phrase] - 1;
        match runs.last_mut() {
            Some(run) if instance.at <= run.1 => run.1 = run.1.max(end),
            _ => runs.push((instance.at, end)),
        }
    }
    let mut runs = runs.into_iter().skip_while(|run| run.0 < start).peekable();
    let range_end = start + size - 1;
    let mut out = String::with_capacity(size * 8);
    if start > 0 {
        out.push('…');
    }
    let mut copied = 0usize;
    let mut open = false;
    let window = tokens
        .get(start..tokens.len().min(range_end + 1))
        .unwrap_or(&[]);
    for (position, token) in (start..).zip(window) {
        if start > 0 && position == start {
            copied = token.start;
        }
        let run = runs.peek().copied();
        if open && run.is_none_or(|(first, _)| position <= first) && token.start > copied {
            out.push_str("**");
            open = false;
        }
        if run.is_some_and(|(first, _)| first == position) && !open {
            out.push_str(&text[copied..token.start]);
            out.push_str("**");
            copied = token.start;
            open = true;
        }
        if run.is_some_and(|(_, last)| last == position) {
            if !open {
                out.push_str("**");
                open = true;
            }
            out.push_str(&text[copied..token.end]);
            copied = token.end;
            runs.next();
        }
        if position == range_end {
            if open {
                if runs.peek().is_some_and(|(first, _)| position >= *first) {
                    out.push_str(&text[copied..token.end]);
                    copied = token.end;
                }
                out.push_str("**");
                open = false;
            }
            out.push_str(&text[copied..token.end]);
            copied = token.end;
        }
    }
    if open {
        out.push_str("**");
    }
    if range_end + 1 >= tokens.len() {
        out.push_str(&text[copied..]);
    } else {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::query::{fts_query, parse};

    /// Our snippets are FTS5's, byte for byte, on texts long and short, with words,
    /// phrases, repeated and overlapping matches, sentences and diacritics.
    #[test]
    fn snippets_are_those_of_fts5() {
        let connection = rusqlite::Connection::open_in_memory().expect("db");
        connection
            .execute_batch(
                "CREATE VIRTUAL TABLE t USING fts5(x, tokenize = 'porter unicode61 remove_diacritics 2');",
            )
            .expect("fts5");
        let long: String = (0..80)
            .map(|i| match i % 17 {
                3 => "The wombats dig. ".to_string(),
                9 => "A big wombat: burrows everywhere, ".to_string(),
                _ => format!("filler{} word{} ", i % 5, i % 7),
            })
            .collect();
        let texts = [
            "# A\n\nThe wombats were running through the big wombat burrow.\n",
            "Café déjà vu, a big wombat digs. Then more text follows here for a while.",
            long.as_str(),
            "wombat wombat big wombat big big wombat",
            "Nothing here. Or here: nothing. But then: the quick brown fox jumps over it.",
        ];
        let queries = [
            "wombat",
            "\"big wombat\"",
            "wombat dig",
            "\"big big\"",
            "cafe",
            "\"the quick brown\" fox",
            "filler3",
            "nothing",
            "wom*",
            "big OR cafe",
            "wombat NOT cafe",
            "\"big wom\" *",
            "^the",
            "NEAR(big wombat)",
            "NEAR(big wombat, 0)",
            "NEAR(wombat dig burrow, 3)",
            "NEAR(filler1 word4, 2) OR cafe",
        ];
        for (i, text) in texts.iter().enumerate() {
            connection
                .execute(
                    "INSERT INTO t(rowid, x) VALUES (?1, ?2)",
                    rusqlite::params![i as i64, text],
                )
                .expect("insert");
        }
        let mut compared = 0;
        for (text_id, text) in texts.iter().enumerate() {
            for query in queries {
                for size in [5, 24] {
                    let fts = fts_query(query).expect("query");
                    let expected: Option<String> = connection
                        .query_row(
                            "SELECT snippet(t, 0, '**', '**', '…', ?3) FROM t WHERE t MATCH ?1 AND rowid = ?2",
                            rusqlite::params![fts, text_id as i64, size as i64],
                            |row| row.get(0),
                        )
                        .ok();
                    let Some(expected) = expected else {
                        continue; // FTS5 does not match this text
                    };
                    let expr = parse(query).expect("query");
                    let ours = snippet(text, &expr.phrases(), size);
                    assert_eq!(
                        ours,
                        Some(expected),
                        "{query:?} in text {text_id} ({size} tokens)"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared >= 30, "only {compared} snippets compared");
    }
}
