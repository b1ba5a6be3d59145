//! Content checksums: CRC-64/NVME, written as 16 lowercase hex digits.
//!
//! Checkpoint files are named and verified by this checksum, and so are operator builds
//! recorded before versions were named by SHA-256 ([`version_of`]). It guards against
//! corruption and mix-ups, not against an adversary (anyone can make bytes match a given
//! CRC), which is why new versions are not named by it; the speed (SIMD, many GB/s) is
//! what lets every restored byte be checked.
//!
//! [`version_of`]: crate::operator::version_of

use anyhow::{Context, Result};
use crc_fast::{CrcAlgorithm, Digest};
use std::io::Read;
use std::path::Path;

/// A running checksum over bytes fed in pieces.
pub struct Checksum {
    digest: Digest,
    len: u64,
}

impl Checksum {
    /// An empty checksum.
    pub fn new() -> Self {
        Checksum { digest: Digest::new(CrcAlgorithm::Crc64Nvme), len: 0 }
    }

    /// Adds `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.digest.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// The number of bytes added so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The checksum as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.digest.finalize())
    }
}

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

/// The checksum of `bytes`.
pub fn of_bytes(bytes: &[u8]) -> String {
    let mut checksum = Checksum::new();
    checksum.update(bytes);
    checksum.hex()
}

/// The size and checksum of the file at `path`.
pub fn of_file(path: &Path) -> Result<(u64, String)> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut checksum = Checksum::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        let n = file.read(&mut buffer).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok((checksum.len(), checksum.hex()));
        }
        checksum.update(&buffer[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_and_whole_agree_and_differ_from_other_bytes() {
        let mut pieces = Checksum::new();
        pieces.update(b"hello ");
        pieces.update(b"world");
        assert_eq!(pieces.hex(), of_bytes(b"hello world"));
        assert_ne!(of_bytes(b"hello world"), of_bytes(b"hello worle"));
        assert_eq!(of_bytes(b"").len(), 16);
    }
}
