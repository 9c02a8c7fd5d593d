//! Throughput of a provider through the real block path, for `dpuio bench crypto`.
//!
//! This is the one place in the crate that reads a clock: it exists to measure.

use std::time::{Duration, Instant};

use crate::cipher::{FileCipher, FileContext};
use crate::error::{Error, Result};
use crate::keys::Kek;
use crate::layout::BLOCK_OVERHEAD_BYTES;
use crate::provider::CryptoProvider;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// [`FileCipher::seal_block`]: nonce from the provider's generator, AAD, AES-GCM
    /// encryption out of place, tag.
    Seal,
    /// [`FileCipher::open_block`]: AES-GCM tag check and decryption out of place.
    Open,
    /// `Open` into a scratch block, then a copy into the destination: what a read does
    /// so that no plaintext reaches the caller's buffer before its tag checked.
    OpenCopy,
}

/// Result of [`measure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// The provider measured.
    pub provider: &'static str,
    /// The operation.
    pub op: Op,
    /// Plaintext bytes per block.
    pub block_bytes: u32,
    /// Plaintext bytes processed in the timed part.
    pub bytes: u64,
    /// Wall-clock time of the timed part.
    pub elapsed: Duration,
}

impl Throughput {
    /// Plaintext GiB (2^30 bytes) per second.
    pub fn gib_per_s(&self) -> f64 {
        self.bytes as f64 / (1u64 << 30) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Seal or open `total_bytes` of plaintext in blocks of `block_bytes` (a valid block
/// size) with `provider`, on one thread, and time it by the wall clock after a
/// warm-up of a tenth of the work (at least one block).
///
/// One block buffer is reused, so the data stays in cache: like `openssl speed`, this
/// measures the cipher, not memory bandwidth. Unlike plain `openssl speed -evp`,
/// every block pays for its nonce, AAD and tag, as on the agent's data path.
pub fn measure(
    provider: &'static dyn CryptoProvider,
    op: Op,
    block_bytes: u32,
    total_bytes: u64,
) -> Result<Throughput> {
    let ctx = FileContext::new("bench", "bench")?;
    let kek = Kek::generate(provider, "bench", 1)?;
    let (cipher, _header) = FileCipher::create(provider, &ctx, &kek, block_bytes)?;
    let block = block_bytes as usize;
    let blocks = total_bytes.div_ceil(block_bytes.into()).max(1);
    let mut plaintext = vec![0u8; block];
    provider.fill_random(&mut plaintext)?;
    let mut stored = vec![0u8; block + BLOCK_OVERHEAD_BYTES];
    let mut scratch = vec![0u8; block];
    cipher.seal_block(0, &plaintext, &mut stored)?;
    let mut run = |count: u64| -> Result<()> {
        for i in 0..count {
            match op {
                Op::Seal => {
                    cipher.seal_block(i, &plaintext, &mut stored)?;
                }
                Op::Open => {
                    cipher.open_block(0, &stored, &mut plaintext)?;
                }
                Op::OpenCopy => {
                    cipher.open_block(0, &stored, &mut scratch)?;
                    plaintext.copy_from_slice(&scratch);
                }
            }
        }
        Ok(())
    };
    run((blocks / 10).max(1))?;
    let start = Instant::now();
    run(blocks)?;
    let elapsed = start.elapsed();
    if op != Op::Seal && plaintext.iter().all(|&b| b == 0) {
        // A random 64 KiB block is never all zero; this is an open that lied.
        return Err(Error::Integrity { block_index: 0 });
    }
    Ok(Throughput { provider: provider.name(), op, block_bytes, bytes: blocks * u64::from(block_bytes), elapsed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{AWS_LC_RS, RUST_CRYPTO};

    #[test]
    fn measures_both_ops() {
        for (provider, total) in [(&AWS_LC_RS as &'static dyn CryptoProvider, 1 << 20), (&RUST_CRYPTO, 64 << 10)] {
            for op in [Op::Seal, Op::Open] {
                let t = measure(provider, op, 4096, total).unwrap();
                assert_eq!((t.op, t.bytes, t.provider), (op, total, provider.name()));
                assert!(t.gib_per_s() > 0.0);
            }
        }
        assert!(matches!(measure(&AWS_LC_RS, Op::Seal, 1000, 1 << 20), Err(Error::InvalidBlockSize { .. })));
    }
}
