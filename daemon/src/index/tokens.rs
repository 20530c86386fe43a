//! Words as FTS5's `porter unicode61 remove_diacritics 2` tokenizer sees them, for the
//! tantivy index (`engine.rs`): the same text must give the same terms in both, so a
//! word found by one is found by the other and FTS5 can still write the snippet.
//!
//! unicode61: a token is a run of letters, digits and private-use characters (`L* N*
//! Co`), folded to lower case with diacritics removed. porter: SQLite's port of the
//! original Porter stemmer (`fts5_tokenize.c`), applied to tokens of 3 to 64 bytes.

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// The longest token (in bytes) the porter step stems; longer ones pass through.
const PORTER_MAX_TOKEN: usize = 64;

/// The terms of `text`, in order.
pub fn terms(text: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut stream = Terms::new(text);
    while stream.advance().is_some() {
        terms.push(stream.term().to_string());
    }
    terms
}

/// The terms of a text one at a time, with where each word is in the text, reusing
/// two buffers (no allocation per word): for the index's tokenizer and for snippets.
pub struct Terms<'a> {
    text: &'a str,
    chars: std::str::CharIndices<'a>,
    word: String,
    stem: Vec<u8>,
    term: String,
}

impl<'a> Terms<'a> {
    pub fn new(text: &'a str) -> Terms<'a> {
        Terms {
            text,
            chars: text.char_indices(),
            word: String::new(),
            stem: Vec::new(),
            term: String::new(),
        }
    }

    /// Move to the next term; the byte range of its word in the text.
    pub fn advance(&mut self) -> Option<std::ops::Range<usize>> {
        self.word.clear();
        let mut start = None;
        let mut end = self.text.len();
        for (at, c) in self.chars.by_ref() {
            if c.is_ascii() {
                if c.is_ascii_alphanumeric() {
                    start.get_or_insert(at);
                    self.word.push(c.to_ascii_lowercase());
                    continue;
                }
            } else if is_token_char(c) {
                start.get_or_insert(at);
                fold_into(c, &mut self.word);
                continue;
            }
            if start.is_some() && !self.word.is_empty() {
                end = at;
                break;
            }
            // A word made only of marks folds to nothing: not a token.
            start = None;
        }
        let start = start?;
        if self.word.is_empty() {
            return None;
        }
        porter_into(&self.word, &mut self.stem);
        self.term.clear();
        match std::str::from_utf8(&self.stem) {
            Ok(stem) => self.term.push_str(stem),
            Err(_) => self.term.push_str(&String::from_utf8_lossy(&self.stem)),
        }
        Some(start..end)
    }

    /// The current term.
    pub fn term(&self) -> &str {
        &self.term
    }
}

/// The word pairs of a list of terms ("a b", "b c"): what makes a phrase a few term
/// look-ups instead of a position check in every page holding its words.
pub fn pairs(terms: &[String]) -> Vec<String> {
    terms.windows(2).map(|w| pair(&w[0], &w[1])).collect()
}

pub fn pair(first: &str, second: &str) -> String {
    format!("{first} {second}")
}

/// Whether the terms of `text` hold `phrase` (a list of terms) as neighbours, in order.
pub fn contains_phrase(text: &str, phrase: &[String]) -> bool {
    if phrase.is_empty() {
        return true;
    }
    // The last terms seen, as many as the phrase has, in a ring.
    let mut window: Vec<String> = vec![String::new(); phrase.len()];
    let mut seen = 0usize;
    let mut terms = Terms::new(text);
    while terms.advance().is_some() {
        let slot = &mut window[seen % phrase.len()];
        slot.clear();
        slot.push_str(terms.term());
        seen += 1;
        if seen >= phrase.len()
            && phrase
                .iter()
                .enumerate()
                .all(|(i, term)| window[(seen + i) % phrase.len()] == *term)
        {
            return true;
        }
    }
    false
}

fn is_token_char(c: char) -> bool {
    c.is_alphanumeric()
        || is_combining_mark(c)
        || matches!(c as u32, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD)
}

/// Lower-case `c` and drop its diacritics (remove_diacritics 2: all of them).
fn fold_into(c: char, out: &mut String) {
    if is_combining_mark(c) {
        return;
    }
    for lower in c.to_lowercase() {
        for part in std::iter::once(lower).nfd() {
            if !is_combining_mark(part) {
                out.push(part);
            }
        }
    }
}

fn is_vowel(c: u8, y_is_vowel: bool) -> bool {
    matches!(c, b'a' | b'e' | b'i' | b'o' | b'u') || (y_is_vowel && c == b'y')
}

fn gobble_vc(stem: &[u8], previous_consonant: bool) -> usize {
    let mut consonant = previous_consonant;
    let mut i = 0;
    while i < stem.len() {
        consonant = !is_vowel(stem[i], consonant);
        if !consonant {
            break;
        }
        i += 1;
    }
    i += 1;
    while i < stem.len() {
        consonant = !is_vowel(stem[i], consonant);
        if consonant {
            return i + 1;
        }
        i += 1;
    }
    0
}

fn m_gt0(stem: &[u8]) -> bool {
    gobble_vc(stem, false) != 0
}

fn m_gt1(stem: &[u8]) -> bool {
    let n = gobble_vc(stem, false);
    n != 0 && gobble_vc(&stem[n..], true) != 0
}

fn m_eq1(stem: &[u8]) -> bool {
    let n = gobble_vc(stem, false);
    n != 0 && gobble_vc(&stem[n..], true) == 0
}

fn o_star(stem: &[u8]) -> bool {
    let Some(&last) = stem.last() else {
        return false;
    };
    if matches!(last, b'w' | b'x' | b'y') {
        return false;
    }
    let mut mask = 0u32;
    let mut consonant = false;
    for &c in stem {
        consonant = !is_vowel(c, consonant);
        mask = (mask << 1) + u32::from(consonant);
    }
    mask & 0x7 == 0x5
}

fn has_vowel(stem: &[u8]) -> bool {
    stem.iter().enumerate().any(|(i, &c)| is_vowel(c, i > 0))
}

/// Condition of a rule on the stem left once the suffix is removed.
#[derive(Clone, Copy)]
enum Cond {
    MGt0,
    MGt1,
    MGt1ST,
}

impl Cond {
    fn holds(self, stem: &[u8]) -> bool {
        match self {
            Cond::MGt0 => m_gt0(stem),
            Cond::MGt1 => m_gt1(stem),
            Cond::MGt1ST => matches!(stem.last(), Some(b's' | b't')) && m_gt1(stem),
        }
    }
}

/// Apply the first rule whose suffix ends `word` (and is shorter than it); the
/// suffix is replaced only when the condition holds. As SQLite does, only rules for
/// the word's second-to-last letter are tried, in the listed order.
fn apply(word: &mut Vec<u8>, rules: &[(&str, &str, Cond)]) {
    let n = word.len();
    if n < 2 {
        return;
    }
    let key = word[n - 2];
    for (suffix, replacement, cond) in rules {
        let s = suffix.as_bytes();
        if s[s.len() - 2] != key {
            continue;
        }
        if n > s.len() && word.ends_with(s) {
            if cond.holds(&word[..n - s.len()]) {
                word.truncate(n - s.len());
                word.extend_from_slice(replacement.as_bytes());
            }
            return;
        }
    }
}

const STEP2: &[(&str, &str, Cond)] = &[
    ("ational", "ate", Cond::MGt0),
    ("tional", "tion", Cond::MGt0),
    ("enci", "ence", Cond::MGt0),
    ("anci", "ance", Cond::MGt0),
    ("izer", "ize", Cond::MGt0),
    ("logi", "log", Cond::MGt0),
    ("bli", "ble", Cond::MGt0),
    ("alli", "al", Cond::MGt0),
    ("entli", "ent", Cond::MGt0),
    ("eli", "e", Cond::MGt0),
    ("ousli", "ous", Cond::MGt0),
    ("ization", "ize", Cond::MGt0),
    ("ation", "ate", Cond::MGt0),
    ("ator", "ate", Cond::MGt0),
    ("alism", "al", Cond::MGt0),
    ("iveness", "ive", Cond::MGt0),
    ("fulness", "ful", Cond::MGt0),
    ("ousness", "ous", Cond::MGt0),
    ("aliti", "al", Cond::MGt0),
    ("iviti", "ive", Cond::MGt0),
    ("biliti", "ble", Cond::MGt0),
];

const STEP3: &[(&str, &str, Cond)] = &[
    ("ical", "ic", Cond::MGt0),
    ("ness", "", Cond::MGt0),
    ("icate", "ic", Cond::MGt0),
    ("iciti", "ic", Cond::MGt0),
    ("ful", "", Cond::MGt0),
    ("ative", "", Cond::MGt0),
    ("alize", "al", Cond::MGt0),
];

const STEP4: &[(&str, &str, Cond)] = &[
    ("al", "", Cond::MGt1),
    ("ance", "", Cond::MGt1),
    ("ence", "", Cond::MGt1),
    ("er", "", Cond::MGt1),
    ("ic", "", Cond::MGt1),
    ("able", "", Cond::MGt1),
    ("ible", "", Cond::MGt1),
    ("ant", "", Cond::MGt1),
    ("ement", "", Cond::MGt1),
    ("ment", "", Cond::MGt1),
    ("ent", "", Cond::MGt1),
    ("ion", "", Cond::MGt1ST),
    ("ou", "", Cond::MGt1),
    ("ism", "", Cond::MGt1),
    ("ate", "", Cond::MGt1),
    ("iti", "", Cond::MGt1),
    ("ous", "", Cond::MGt1),
    ("ive", "", Cond::MGt1),
    ("ize", "", Cond::MGt1),
];

fn step1a(word: &mut Vec<u8>) {
    let n = word.len();
    if word[n - 1] != b's' {
        return;
    }
    if word[n - 2] == b'e' {
        if (n > 4 && word[n - 4] == b's' && word[n - 3] == b's') || (n > 3 && word[n - 3] == b'i') {
            word.truncate(n - 2);
        } else {
            word.truncate(n - 1);
        }
    } else if word[n - 2] != b's' {
        word.truncate(n - 1);
    }
}

/// Step 1b; true when "ed" or "ing" was removed.
fn step1b(word: &mut Vec<u8>) -> bool {
    let n = word.len();
    match word[n - 2] {
        b'e' => {
            if n > 3 && word.ends_with(b"eed") {
                if m_gt0(&word[..n - 3]) {
                    word.truncate(n - 1);
                }
                false
            } else if n > 2 && word.ends_with(b"ed") && has_vowel(&word[..n - 2]) {
                word.truncate(n - 2);
                true
            } else {
                false
            }
        }
        b'n' if n > 3 && word.ends_with(b"ing") && has_vowel(&word[..n - 3]) => {
            word.truncate(n - 3);
            true
        }
        _ => false,
    }
}

fn step1b2(word: &mut Vec<u8>) -> bool {
    let n = word.len();
    if n < 2 {
        return false;
    }
    for (suffix, replacement) in [("at", "ate"), ("bl", "ble"), ("iz", "ize")] {
        if n > 2 && word.ends_with(suffix.as_bytes()) {
            word.truncate(n - 2);
            word.extend_from_slice(replacement.as_bytes());
            return true;
        }
    }
    false
}

/// SQLite's porter stemmer (`fts5PorterCb`): the stem of `token` into `word`.
fn porter_into(token: &str, word: &mut Vec<u8>) {
    let bytes = token.as_bytes();
    word.clear();
    word.extend_from_slice(bytes);
    if bytes.len() > PORTER_MAX_TOKEN || bytes.len() < 3 {
        return;
    }
    step1a(word);
    if step1b(word) && !step1b2(word) {
        let n = word.len();
        let c = word[n - 1];
        if n >= 2 && !is_vowel(c, false) && !matches!(c, b'l' | b's' | b'z') && c == word[n - 2] {
            word.truncate(n - 1);
        } else if m_eq1(word) && o_star(word) {
            word.push(b'e');
        }
    }
    let n = word.len();
    if word[n - 1] == b'y' && has_vowel(&word[..n - 1]) {
        word[n - 1] = b'i';
    }
    apply(word, STEP2);
    apply(word, STEP3);
    apply(word, STEP4);
    let n = word.len();
    if word[n - 1] == b'e'
        && (m_gt1(&word[..n - 1]) || (m_eq1(&word[..n - 1]) && !o_star(&word[..n - 1])))
    {
        word.truncate(n - 1);
    }
    let n = word.len();
    if n > 1 && word[n - 1] == b'l' && word[n - 2] == b'l' && m_gt1(&word[..n - 1]) {
        word.truncate(n - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_phrase_wants_the_terms_in_order_and_together() {
        let phrase = terms("big brown wombats");
        assert!(contains_phrase("A big, brown wombat digs.", &phrase));
        assert!(contains_phrase("big brown wombat", &phrase));
        assert!(!contains_phrase("big brown, and a brown wombat", &phrase));
        assert!(!contains_phrase("wombat brown big", &phrase));
        assert!(!contains_phrase("big brown", &phrase));
        assert!(contains_phrase("a a a b", &terms("a a b")));
        assert!(contains_phrase("anything", &[]));
    }

    #[test]
    fn terms_fold_and_stem_as_fts5_does() {
        assert_eq!(terms("Wombats, running!"), vec!["wombat", "run"]);
        assert_eq!(terms("Café déjà-vu"), vec!["cafe", "deja", "vu"]);
        assert_eq!(
            terms("don't c++ snake_case"),
            ["don", "t", "c", "snake", "case"]
        );
        assert_eq!(pairs(&terms("a b c")), vec!["a b", "b c"]);
    }

    /// Stems checked against SQLite's own porter tokenizer (see the test below).
    #[test]
    fn porter_matches_sqlite() {
        let connection = rusqlite::Connection::open_in_memory().expect("db");
        connection
            .execute_batch(
                "CREATE VIRTUAL TABLE t USING fts5(x, tokenize = 'porter unicode61 remove_diacritics 2');
                 CREATE VIRTUAL TABLE v USING fts5vocab(t, row);",
            )
            .expect("fts5");
        let words = "caresses ponies ties caress cats feed agreed plastered bled motoring sing \
            conflated troubled sized hopping tanned falling hissing fizzed failing filing happy sky \
            relational conditional rational valenci hesitanci digitizer conformabli radicalli \
            differentli vileli analogousli vietnamization predication operator feudalism \
            decisiveness hopefulness callousness formaliti sensitiviti sensibiliti triplicate \
            formative formalize electriciti electrical hopeful goodness revival allowance \
            inference airliner gyroscopic adjustable defensible irritant replacement adjustment \
            dependent adoption homologou communism activate angulariti homologous effective \
            bowdlerize probate rate cease controll roll generalizations oscillators running \
            wombats Zebras quixotic sesquipedalian agreement meetings universities";
        connection
            .execute("INSERT INTO t(x) VALUES (?1)", [words])
            .expect("insert");
        let mut expected: Vec<String> = connection
            .prepare("SELECT term FROM v")
            .expect("vocab")
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        expected.sort();
        let mut ours = terms(words);
        ours.sort();
        ours.dedup();
        assert_eq!(ours, expected);
    }
}
