//! Helpers for the crate's unit tests.

/// A small deterministic generator (xorshift): the same cases on every run, without a
/// dependency.
pub struct Xorshift(pub u64);

impl Xorshift {
    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
