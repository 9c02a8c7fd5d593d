//! The readdir anchor handed to clients: a DFS iteration position, authenticated.
//!
//! A `daos_anchor_t` is DAOS-internal state (hash-key positions per shard). Handing its
//! bytes back to libdfs unchecked would let a host steer DFS's iterator with values DFS
//! never produced, so the token carries an HMAC-SHA256 (truncated to 128 bits) under a
//! key drawn once per backend, over the container, the directory's path and the anchor
//! bytes. A token is accepted only if this backend issued it for that directory; one from
//! another directory, another container, an earlier run of the agent, or altered in any
//! byte is refused before DFS sees it.
//!
//! Format: `dfs1.` + 240 hex digits (the 120 anchor bytes) + `.` + 32 hex digits (tag).
#![forbid(unsafe_code)]

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::sys::{DAOS_ANCHOR_BYTES, daos_anchor_t};

const PREFIX: &str = "dfs1.";
const TAG_BYTES: usize = 16;
const DOMAIN: &[u8] = b"dpuio-daos readdir anchor v1\0";

/// The key anchors are authenticated with (random per backend instance).
pub struct AnchorKey([u8; 32]);

impl AnchorKey {
    pub fn random() -> AnchorKey {
        AnchorKey(rand::random())
    }

    fn tag(&self, container: &str, dir: &str, anchor: &[u8; DAOS_ANCHOR_BYTES]) -> [u8; 32] {
        let mut mac = self.mac();
        for part in [container.as_bytes(), b"\0", dir.as_bytes(), b"\0", anchor] {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    fn mac(&self) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(DOMAIN);
        mac
    }

    /// The token for `anchor`, the position after a batch of directory `dir`.
    pub fn encode(&self, container: &str, dir: &str, anchor: &daos_anchor_t) -> String {
        let bytes = anchor.to_bytes();
        let tag = self.tag(container, dir, &bytes);
        format!("{PREFIX}{}.{}", hex(&bytes), hex(&tag[..TAG_BYTES]))
    }

    /// The anchor in `token`, if this key issued it for `dir` of `container`; else why not.
    pub fn decode(&self, container: &str, dir: &str, token: &str) -> Result<daos_anchor_t, &'static str> {
        let rest = token.strip_prefix(PREFIX).ok_or("it is not an anchor of the daos backend")?;
        let (body, tag) = rest.split_once('.').ok_or("it is malformed")?;
        let bytes: [u8; DAOS_ANCHOR_BYTES] =
            unhex(body).and_then(|b| b.try_into().ok()).ok_or("its position is malformed")?;
        let tag = unhex(tag).filter(|t| t.len() == TAG_BYTES).ok_or("its tag is malformed")?;
        let mut mac = self.mac();
        for part in [container.as_bytes(), b"\0", dir.as_bytes(), b"\0", &bytes] {
            mac.update(part);
        }
        mac.verify_truncated_left(&tag).map_err(|_| {
            "it was not issued by this agent for this directory (altered, from another directory or container, \
             or from before the agent restarted)"
        })?;
        Ok(daos_anchor_t::from_bytes(&bytes))
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes().chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> daos_anchor_t {
        let mut a = daos_anchor_t::ZERO;
        a.da_type = 1;
        a.da_shard = 7;
        a.da_flags = 0x55;
        a.da_sub_anchors = 0x0102030405060708;
        a.da_buf[0] = 0xAB;
        a.da_buf[103] = 0xCD;
        a
    }

    #[test]
    fn round_trips_and_binds_to_the_directory() {
        let key = AnchorKey::random();
        let token = key.encode("c", "/d", &sample());
        let back = key.decode("c", "/d", &token).unwrap();
        assert_eq!(back.to_bytes(), sample().to_bytes());
        assert!(key.decode("c", "/e", &token).unwrap_err().contains("not issued"));
        assert!(key.decode("other", "/d", &token).unwrap_err().contains("not issued"));
        assert!(AnchorKey::random().decode("c", "/d", &token).unwrap_err().contains("not issued"));
    }

    #[test]
    fn refuses_every_altered_or_malformed_token() {
        let key = AnchorKey::random();
        let token = key.encode("c", "/d", &sample());
        // Flip each hex digit of position and tag in turn.
        for i in PREFIX.len()..token.len() {
            if token.as_bytes()[i] == b'.' {
                continue;
            }
            let mut t = token.clone().into_bytes();
            t[i] = if t[i] == b'0' { b'1' } else { b'0' };
            let t = String::from_utf8(t).unwrap();
            assert!(key.decode("c", "/d", &t).is_err(), "byte {i} altered was accepted");
        }
        for bad in ["", "f01", "dfs1.", "dfs1.00.00", &token[..token.len() - 2], &format!("{token}00"), "dfs1.zz.zz"] {
            assert!(key.decode("c", "/d", bad).is_err(), "{bad:?} was accepted");
        }
    }
}
