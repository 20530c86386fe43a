//! The deterministic benchmark corpus: wiki pages with a Zipf-like vocabulary, rare
//! marker words planted in a known number of pages, a planted phrase, wiki links and
//! raw citations; plus a few raw PDFs and text sources. The same seed and size give
//! the same bytes on every machine.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use crate::pdf::make_pdf;

/// Pages per directory under `wiki/`, so no directory holds 100k entries.
pub const PAGES_PER_DIR: usize = 100;
/// Synthetic vocabulary size.
const VOCABULARY: usize = 20_000;
/// Zipf exponent of the word distribution.
const ZIPF_S: f64 = 1.0;
/// Pages of each raw PDF, and how many PDFs and text sources there are.
pub const PDF_PAGES: u32 = 8;
const PDF_COUNT: usize = 4;
const TEXT_COUNT: usize = 4;

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: usize, high: usize) -> usize {
        low + (self.next_u64() % (high - low + 1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Words drawn with probability proportional to `1 / rank^s`.
pub struct Vocabulary {
    words: Vec<String>,
    cumulative: Vec<f64>,
}

const SYLLABLES: [&str; 40] = [
    "ba", "be", "bi", "bo", "da", "de", "di", "do", "fa", "fe", "fi", "fo", "ga", "ge", "gi", "go",
    "ka", "ke", "ki", "ko", "la", "le", "li", "lo", "ma", "me", "mi", "mo", "na", "ne", "ni", "no",
    "pa", "pe", "pi", "po", "ra", "re", "ri", "ro",
];

impl Vocabulary {
    pub fn new() -> Vocabulary {
        let words: Vec<String> = (0..VOCABULARY).map(word_for).collect();
        let mut cumulative = Vec::with_capacity(VOCABULARY);
        let mut total = 0.0;
        for rank in 1..=VOCABULARY {
            total += 1.0 / (rank as f64).powf(ZIPF_S);
            cumulative.push(total);
        }
        for value in &mut cumulative {
            *value /= total;
        }
        Vocabulary { words, cumulative }
    }

    /// The word of a rank (0 is the most frequent).
    pub fn word(&self, rank: usize) -> &str {
        &self.words[rank]
    }

    pub fn sample(&self, rng: &mut Rng) -> &str {
        let u = rng.unit();
        let rank = self.cumulative.partition_point(|c| *c < u);
        &self.words[rank.min(VOCABULARY - 1)]
    }
}

impl Default for Vocabulary {
    fn default() -> Self {
        Vocabulary::new()
    }
}

/// Index → a unique word of at least two syllables (base-40 digits of `index + 40`).
fn word_for(index: usize) -> String {
    let mut n = index + SYLLABLES.len();
    let mut parts = Vec::new();
    while n > 0 {
        parts.push(SYLLABLES[n % SYLLABLES.len()]);
        n /= SYLLABLES.len();
    }
    parts.reverse();
    parts.concat()
}

/// A marker word planted in exactly `pages` pages, once each.
#[derive(Debug, Clone)]
pub struct Marker {
    pub word: String,
    pub pages: usize,
}

/// What was generated, for the queries and the checks.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub pages: usize,
    pub bytes: u64,
    pub words: u64,
    /// A word found in almost every page.
    pub common_word: String,
    /// Pages containing `common_word` (counted while generating).
    pub common_pages: usize,
    pub markers: Vec<Marker>,
    /// Three-word phrase planted in `phrase_pages` pages.
    pub phrase: String,
    pub phrase_pages: usize,
    /// Workspace-relative paths of every page, in order.
    pub page_paths: Vec<String>,
    /// Workspace-relative paths of the raw PDFs (`PDF_PAGES` pages each).
    pub pdfs: Vec<String>,
    /// Workspace-relative paths of the raw text sources.
    pub texts: Vec<String>,
}

impl Corpus {
    /// The marker planted in `pages` pages.
    pub fn marker(&self, pages: usize) -> Option<&Marker> {
        self.markers.iter().find(|m| m.pages == pages)
    }
}

/// Workspace-relative path of page `index`.
pub fn page_path(index: usize) -> String {
    format!("wiki/s{:04}/p{index:06}.md", index / PAGES_PER_DIR)
}

/// The marker word for a hit count: letters only, not in the vocabulary (which uses
/// only consonant-vowel syllables, never "zq").
pub fn marker_word(pages: usize) -> String {
    let mut word = String::from("zqmark");
    let mut n = pages;
    loop {
        word.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    word
}

/// Write the raw sources into `workspace_dir/raw/` and `pages` wiki pages under
/// `workspace_dir/wiki/`, directly (the daemon should be stopped). Deterministic in
/// `seed` and `pages`.
pub fn generate(seed: u64, pages: usize, workspace_dir: &Path) -> Result<Corpus> {
    let vocabulary = Vocabulary::new();
    let mut rng = Rng::new(seed);
    let raw = workspace_dir.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("cannot create {}", raw.display()))?;

    // Raw sources: PDFs and text notes, cited by some pages.
    let mut pdfs = Vec::new();
    for k in 1..=PDF_COUNT {
        let texts: Vec<String> = (0..PDF_PAGES)
            .map(|_| lines_of(&prose(&vocabulary, &mut rng, 150), 12))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let name = format!("survey-{k:02}.pdf");
        let path = raw.join(&name);
        std::fs::write(&path, make_pdf(&refs))
            .with_context(|| format!("cannot write {}", path.display()))?;
        pdfs.push(format!("raw/{name}"));
    }
    let mut texts = Vec::new();
    for k in 1..=TEXT_COUNT {
        let name = if k % 2 == 0 {
            format!("interview-{k:02}.txt")
        } else {
            format!("notes-{k:02}.md")
        };
        let path = raw.join(&name);
        let body = format!(
            "# Source {k}\n\n{}\n",
            lines_of(&prose(&vocabulary, &mut rng, 1500), 14)
        );
        std::fs::write(&path, body).with_context(|| format!("cannot write {}", path.display()))?;
        texts.push(format!("raw/{name}"));
    }

    // Which pages get which marker, and the phrase.
    let mut markers = Vec::new();
    let mut planted: Vec<Vec<String>> = vec![Vec::new(); pages];
    for count in [1usize, 10, 100, 1000] {
        if count > pages / 2 {
            break;
        }
        let word = marker_word(count);
        for page in distinct(&mut rng, pages, count) {
            planted[page].push(word.clone());
        }
        markers.push(Marker { word, pages: count });
    }
    let phrase = format!(
        "{} {} {}",
        vocabulary.word(20),
        vocabulary.word(35),
        vocabulary.word(50)
    );
    let phrase_pages = (pages / 100).max(3);
    for page in distinct(&mut rng, pages, phrase_pages) {
        planted[page].push(phrase.clone());
    }
    let common_word = vocabulary.word(4).to_string();

    let mut corpus = Corpus {
        pages,
        bytes: 0,
        words: 0,
        common_word,
        common_pages: 0,
        markers,
        phrase,
        phrase_pages,
        page_paths: Vec::with_capacity(pages),
        pdfs,
        texts,
    };
    let wiki = workspace_dir.join("wiki");
    for (index, plants) in planted.iter().enumerate() {
        let relative = page_path(index);
        let (text, words) = page(&vocabulary, &mut rng, index, pages, plants, &corpus);
        if text
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w == corpus.common_word)
        {
            corpus.common_pages += 1;
        }
        let absolute = workspace_dir.join(&relative);
        if index % PAGES_PER_DIR == 0 {
            let dir = absolute.parent().unwrap_or(&wiki);
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&absolute, &text)
            .with_context(|| format!("cannot write {}", absolute.display()))?;
        corpus.bytes += text.len() as u64;
        corpus.words += words as u64;
        corpus.page_paths.push(relative);
    }
    Ok(corpus)
}

/// `count` distinct indices below `total`, in order.
fn distinct(rng: &mut Rng, total: usize, count: usize) -> BTreeSet<usize> {
    let mut chosen = BTreeSet::new();
    // Bounded: count <= total / 2, so each draw succeeds with probability >= 1/2.
    for _ in 0..count * 64 {
        if chosen.len() == count {
            break;
        }
        chosen.insert(rng.range(0, total - 1));
    }
    chosen
}

/// `words` words of sentences: capitalized, 8–20 words, ending with a period.
fn prose(vocabulary: &Vocabulary, rng: &mut Rng, words: usize) -> String {
    let mut text = String::new();
    let mut left_in_sentence = 0;
    for i in 0..words {
        let word = vocabulary.sample(rng);
        if left_in_sentence == 0 {
            left_in_sentence = rng.range(8, 20);
            if i > 0 {
                text.push_str(". ");
            }
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                text.extend(first.to_uppercase());
                text.push_str(chars.as_str());
            }
        } else {
            text.push(' ');
            text.push_str(word);
        }
        left_in_sentence -= 1;
    }
    text.push('.');
    text
}

/// Break text into lines of `per_line` words.
fn lines_of(text: &str, per_line: usize) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .chunks(per_line)
        .map(|line| line.join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn title_case(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// One page: title, 2–4 sections of paragraphs, wiki links, planted words, and a
/// citation footnote on every fourth page. Returns the text and its prose word count.
fn page(
    vocabulary: &Vocabulary,
    rng: &mut Rng,
    index: usize,
    total: usize,
    plants: &[String],
    corpus: &Corpus,
) -> (String, usize) {
    let words = rng.range(300, 800);
    let sections = rng.range(2, 4);
    let title = format!(
        "{} {} {index}",
        title_case(vocabulary.sample(rng)),
        vocabulary.sample(rng)
    );
    let mut text = format!("# {title}\n\n");
    let mut paragraphs: Vec<String> = Vec::new();
    let mut left = words;
    while left > 0 {
        let take = rng.range(40, 120).min(left);
        paragraphs.push(prose(vocabulary, rng, take));
        left -= take;
    }
    for plant in plants {
        let at = rng.range(0, paragraphs.len() - 1);
        paragraphs[at].push_str(&format!(" See {plant}."));
    }
    let links = rng.range(2, 5);
    for _ in 0..links {
        let target = rng.range(0, total - 1);
        let at = rng.range(0, paragraphs.len() - 1);
        let label = title_case(vocabulary.sample(rng));
        paragraphs[at].push_str(&format!(" Related: [{label}]({}).", page_path(target)));
    }
    let cites = index.is_multiple_of(4);
    if cites {
        let at = rng.range(0, paragraphs.len() - 1);
        paragraphs[at].push_str(" As the source reports.[^1]");
    }
    let per_section = paragraphs.len().div_ceil(sections);
    for (i, chunk) in paragraphs.chunks(per_section.max(1)).enumerate() {
        if i > 0 || chunk.len() > 1 {
            let _ = write!(
                text,
                "## {} {}\n\n",
                title_case(vocabulary.sample(rng)),
                vocabulary.sample(rng)
            );
        }
        for paragraph in chunk {
            text.push_str(paragraph);
            text.push_str("\n\n");
        }
    }
    if cites {
        let source = index / 4;
        if source.is_multiple_of(2) {
            let pdf = &corpus.pdfs[source / 2 % corpus.pdfs.len()];
            let page = source as u32 % PDF_PAGES + 1;
            let _ = writeln!(text, "[^1]: {pdf}, p.{page}");
        } else {
            let texts = &corpus.texts;
            let _ = writeln!(text, "[^1]: {}", texts[source / 2 % texts.len()]);
        }
    }
    (text, words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_unique_and_zipfian() {
        let vocabulary = Vocabulary::new();
        let unique: BTreeSet<&str> = vocabulary.words.iter().map(String::as_str).collect();
        assert_eq!(unique.len(), VOCABULARY);
        let mut rng = Rng::new(7);
        let draws = 100_000;
        let top = (0..draws)
            .filter(|_| vocabulary.sample(&mut rng) == vocabulary.word(0))
            .count();
        // 1 / H(20000) ≈ 9.4 %
        assert!((8_000..11_000).contains(&top), "{top}");
    }

    #[test]
    fn markers_are_outside_the_vocabulary() {
        for count in [1, 10, 100, 1000] {
            let word = marker_word(count);
            assert!(word.starts_with("zq"), "{word}");
            assert!(word.chars().all(|c| c.is_ascii_lowercase()));
        }
        assert_ne!(marker_word(1), marker_word(10));
    }

    #[test]
    fn generation_is_deterministic_with_known_counts() {
        let run = || {
            let dir = tempfile::tempdir().expect("tempdir");
            let corpus = generate(42, 200, dir.path()).expect("gen");
            let mut all = Vec::new();
            let mut marker_pages = vec![0usize; corpus.markers.len()];
            for path in &corpus.page_paths {
                let text = std::fs::read_to_string(dir.path().join(path)).expect("read");
                for (i, marker) in corpus.markers.iter().enumerate() {
                    if text.contains(&marker.word) {
                        marker_pages[i] += 1;
                    }
                }
                let words = text.split_whitespace().count();
                assert!((300..1000).contains(&words), "{path}: {words} words");
                all.push(text);
            }
            for (marker, found) in corpus.markers.iter().zip(marker_pages) {
                assert_eq!(marker.pages, found, "{}", marker.word);
            }
            assert!(corpus.common_pages > 190, "{}", corpus.common_pages);
            assert_eq!(corpus.pdfs.len(), PDF_COUNT);
            assert_eq!(corpus.texts.len(), TEXT_COUNT);
            all
        };
        assert_eq!(run(), run());
    }
}
