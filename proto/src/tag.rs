//! Per-packet authentication (docs/PROTOCOL.md, "Per-packet
//! authentication" and "RESULT tokens"): the 16-byte tag after every DATA
//! and RESULT payload of an `auth = "mac"` job, the 16-byte token after
//! every RESULT of an `auth = "port"` job, and the tag of a JOIN_ACK.
//!
//! Owns: [`AuthMode`] (a job's declared mode), [`PacketKey`] (AES-128-GMAC
//! under a DATA or RESULT key, with its key derivations) and
//! [`join_ack_tag`]. The lengths ([`TAG_LEN`], [`Tag`], [`EPOCH_LEN`]) are
//! the wire format's ([`crate::wire`], below this module), re-exported here.
//!
//! Invariants:
//! * GMAC is a nonce-based MAC: one (key, nonce) pair must never tag two
//!   different inputs. The nonce is made of the header fields the tag covers
//!   (`ver_type`, flags without `RETX`, `window`, `seq`, `collective`) and the
//!   associated data is the payload, so one nonce always meets the same
//!   input as long as a key never sees one (`seq`, `collective`) with two
//!   payloads: a DATA key is fresh per accepted JOIN (a worker's resends are
//!   byte-identical), a RESULT key per activation of the job (a slot's result
//!   is computed once and resent as it is).
//! * What the tag does not cover is chosen: `rank` and `RETX` of a RESULT
//!   differ per destination (one tag serves every member); `job`, `gen`
//!   (and a DATA's `rank`) are bound by the key; `count` by the payload's
//!   length.
//! * A RESULT token is the RESULT tag over an empty payload: it proves that
//!   its sender holds the job's RESULT key of this activation (so the
//!   secret), not that the values are the switch's. It is what keeps a host
//!   that cannot see a port job's RESULTs from forging them; one that can see
//!   them can replay a token with other values (`auth = "mac"` stops that).
//! * Tags are compared in constant time; keys never print.

use aes::cipher::BlockCipherEncrypt;
use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes128Gcm, KeyInit};
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::wire::{flags, HeaderRepr, HEADER_LEN, SECRET_LEN, VERSION};
pub use crate::wire::{Tag, EPOCH_LEN, TAG_LEN};

const DATA_KEY_LABEL: &[u8] = b"aggswitch v3 data key";
const RESULT_KEY_LABEL: &[u8] = b"aggswitch v3 result key";
const JOIN_ACK_LABEL: &[u8] = b"aggswitch v3 join ack";

/// How a job's DATA and RESULT are authenticated; the discriminant is the
/// JOIN_ACK's `auth` byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum AuthMode {
    /// DATA by the member's source and switch port only (no tag); every
    /// RESULT carries a 16-byte token after its payload.
    #[default]
    Port = 2,
    /// A 16-byte AES-GMAC tag after every DATA and RESULT payload.
    Mac = 1,
}

/// The JOIN_ACK `auth` byte of a switch from before RESULT tokens, whose
/// `auth = "port"` RESULTs anyone could forge: a worker refuses it.
pub const AUTH_PORT_UNTOKENED: u8 = 0;

/// An auth mode name that is not `port` or `mac`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown auth mode {0:?} (expected \"port\" or \"mac\")")]
pub struct UnknownAuthMode(pub String);

impl AuthMode {
    /// The mode a JOIN_ACK's `auth` byte names, if any.
    pub const fn from_u8(v: u8) -> Option<AuthMode> {
        match v {
            2 => Some(AuthMode::Port),
            1 => Some(AuthMode::Mac),
            _ => None,
        }
    }

    /// The name used in configs, CLIs and logs.
    pub const fn name(self) -> &'static str {
        match self {
            AuthMode::Port => "port",
            AuthMode::Mac => "mac",
        }
    }

    /// Bytes after a DATA payload in this mode.
    pub const fn data_tag_len(self) -> usize {
        match self {
            AuthMode::Port => 0,
            AuthMode::Mac => TAG_LEN,
        }
    }

    /// Bytes after a RESULT payload in this mode: a tag or a token, 16 in
    /// both.
    pub const fn result_tag_len(self) -> usize {
        TAG_LEN
    }
}

impl core::fmt::Display for AuthMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for AuthMode {
    type Err = UnknownAuthMode;
    fn from_str(s: &str) -> Result<AuthMode, UnknownAuthMode> {
        match s {
            "port" => Ok(AuthMode::Port),
            "mac" => Ok(AuthMode::Mac),
            _ => Err(UnknownAuthMode(s.to_string())),
        }
    }
}

fn hmac(key: &[u8]) -> Hmac<Sha256> {
    match <Hmac<Sha256> as hmac::Mac>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts every key length"),
    }
}

/// An AES-128-GMAC key for DATA or RESULT tags.
///
/// AES-GMAC rather than Poly1305: in the `data_path` bench it tags a full
/// frame in well under half Poly1305's time on a CPU with AES-NI and
/// carry-less multiply, which `aes` and `polyval` detect at run time; its
/// key schedule is done once per key rather than a one-time key per nonce;
/// and it is NIST's GCM with an empty plaintext, which every crypto library
/// offers to a peer (docs/BENCHMARKS.md, "Per-packet authentication").
#[derive(Clone)]
pub struct PacketKey {
    cipher: Aes128Gcm,
    /// A RESULT key's same key as a bare block cipher, for tokens (boxed:
    /// a DATA key, one per rank of a mac job, makes none and keeps 8 bytes
    /// for it).
    block: Option<Box<aes::Aes128>>,
}

impl core::fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PacketKey(<redacted>)")
    }
}

impl PacketKey {
    fn from_prk(prk: [u8; 32], tokens: bool) -> PacketKey {
        let mut key = [0u8; 16];
        key.copy_from_slice(&prk[..16]);
        PacketKey {
            cipher: Aes128Gcm::new(&key.into()),
            block: tokens.then(|| Box::new(aes::Aes128::new(&key.into()))),
        }
    }

    /// The key of a member's DATA: `HMAC-SHA256(session key, "aggswitch v3
    /// data key")`, first 16 bytes. Fresh per accepted JOIN.
    pub fn data(session_key: &[u8; 32]) -> PacketKey {
        let mut m = hmac(session_key);
        m.update(DATA_KEY_LABEL);
        PacketKey::from_prk(m.finalize().into_bytes().into(), false)
    }

    /// The key of a job's RESULTs during one activation:
    /// `HMAC-SHA256(secret, "aggswitch v3 result key" ‖ job u16 ‖ gen u32 ‖
    /// epoch)`, first 16 bytes.
    pub fn result(
        secret: &[u8; SECRET_LEN],
        job: u16,
        gen: u32,
        epoch: &[u8; EPOCH_LEN],
    ) -> PacketKey {
        let mut m = hmac(secret);
        m.update(RESULT_KEY_LABEL);
        m.update(&job.to_be_bytes());
        m.update(&gen.to_be_bytes());
        m.update(epoch);
        PacketKey::from_prk(m.finalize().into_bytes().into(), true)
    }

    /// The GCM nonce of a DATA or RESULT with header `hdr`: `ver_type`,
    /// flags without `RETX`, `window`, `seq`, `collective`.
    fn nonce(hdr: &HeaderRepr) -> aes_gcm::Nonce<aes_gcm::aead::consts::U12> {
        let mut n = [0u8; 12];
        n[0] = (VERSION << 4) | hdr.msg_type as u8;
        n[1] = hdr.flags & !flags::RETX;
        n[2..4].copy_from_slice(&hdr.window.to_be_bytes());
        n[4..8].copy_from_slice(&hdr.seq.to_be_bytes());
        n[8..12].copy_from_slice(&hdr.collective.to_be_bytes());
        n.into()
    }

    /// The tag of a DATA or RESULT with header `hdr` and elements `payload`.
    pub fn tag(&self, hdr: &HeaderRepr, payload: &[u8]) -> Tag {
        match self
            .cipher
            .encrypt_inout_detached(&Self::nonce(hdr), payload, (&mut [][..]).into())
        {
            Ok(t) => t.into(),
            // Only a plaintext over 2^36 bytes fails; ours is empty.
            Err(_) => unreachable!("GCM accepts an empty plaintext"),
        }
    }

    /// The token of an `auth = "port"` RESULT with header `hdr`: its tag
    /// over an empty payload (module docs). With nothing to hash, GCM's
    /// tag is E_K(nonce ‖ 0x00000001) XOR GHASH of an all-zero length
    /// block, which is zero: one AES block, computed here directly (a test
    /// checks it against [`PacketKey::tag`]).
    pub fn token(&self, hdr: &HeaderRepr) -> Tag {
        let Some(aes) = &self.block else {
            // Not a RESULT key: the same bytes the long way.
            return self.tag(hdr, &[]);
        };
        let mut block = [0u8; 16];
        block[..12].copy_from_slice(&Self::nonce(hdr));
        block[15] = 1;
        let mut b = block.into();
        aes.encrypt_block(&mut b);
        b.into()
    }

    /// [`PacketKey::token`], remembered in `cache` with the header fields
    /// it covers: the RESULTs of one fan-out (every member's, `rank` and
    /// `RETX` left out) share one, made once. The cache must be cleared
    /// whenever the key it serves changes.
    pub fn token_cached(&self, hdr: &HeaderRepr, cache: &TokenCache) -> Tag {
        let n: [u8; 12] = Self::nonce(hdr).into();
        match cache.0.get() {
            Some((m, t)) if m == n => t,
            _ => {
                let t = self.token(hdr);
                cache.0.set(Some((n, t)));
                t
            }
        }
    }

    /// Whether `token` is the token of a RESULT with header `hdr`
    /// (constant time).
    pub fn verify_token(&self, hdr: &HeaderRepr, token: &[u8]) -> bool {
        let want = self.token(hdr);
        token.len() == TAG_LEN && bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], token))
    }

    /// Whether `tag` is the tag of this header and payload (constant time).
    pub fn verify(&self, hdr: &HeaderRepr, payload: &[u8], tag: &[u8]) -> bool {
        let Ok(tag) = <[u8; TAG_LEN]>::try_from(tag) else {
            return false;
        };
        self.cipher
            .decrypt_inout_detached(
                &Self::nonce(hdr),
                payload,
                (&mut [][..]).into(),
                &tag.into(),
            )
            .is_ok()
    }
}

/// The last RESULT token one key made, with the nonce it covers
/// ([`PacketKey::token_cached`]): single-threaded, kept beside the key.
#[derive(Debug, Default)]
pub struct TokenCache(core::cell::Cell<Option<([u8; 12], Tag)>>);

impl TokenCache {
    /// Forgets the token (its key changed).
    pub fn clear(&self) {
        self.0.set(None);
    }
}

/// The tag of a JOIN_ACK to one member: `HMAC-SHA256(session key,
/// "aggswitch v3 join ack" ‖ header (22 B) ‖ payload before the tag)`, first
/// 16 bytes. HMAC, not GMAC: a JOIN_ACK may be sent again with another
/// window, and HMAC needs no nonce.
pub fn join_ack_tag(session_key: &[u8; 32], hdr: &HeaderRepr, body: &[u8]) -> Tag {
    let mut h = [0u8; HEADER_LEN];
    if hdr.emit_to(&mut h).is_err() {
        unreachable!("a header fits its length");
    }
    let mut m = hmac(session_key);
    m.update(JOIN_ACK_LABEL);
    m.update(&h);
    m.update(body);
    let full = m.finalize().into_bytes();
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&full[..TAG_LEN]);
    t
}

/// Checks a JOIN_ACK's tag in constant time.
pub fn verify_join_ack(session_key: &[u8; 32], hdr: &HeaderRepr, body: &[u8], tag: &[u8]) -> bool {
    let want = join_ack_tag(session_key, hdr, body);
    tag.len() == TAG_LEN && bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], tag))
}

/// The epoch of a job's activation: `HMAC-SHA256(key, "aggswitch v3 epoch"
/// ‖ counter u64)`, first 8 bytes, under the switch's private random key
/// and a counter that never repeats while the switch runs. Unpredictable to
/// anyone without the key, and never the same twice within a generation, so
/// a RESULT key never serves two activations.
pub fn epoch(key: &[u8; 32], counter: u64) -> [u8; EPOCH_LEN] {
    let mut m = hmac(key);
    m.update(b"aggswitch v3 epoch");
    m.update(&counter.to_be_bytes());
    let full = m.finalize().into_bytes();
    let mut e = [0u8; EPOCH_LEN];
    e.copy_from_slice(&full[..EPOCH_LEN]);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, MsgType};

    fn hr(f: &[u8]) -> HeaderRepr {
        HeaderRepr::parse(&Header::new_checked(f).unwrap()).unwrap()
    }

    fn frame(ty: MsgType, rank: u16, flags: u8) -> Vec<u8> {
        let mut h = HeaderRepr::new(ty, 7);
        h.rank = rank;
        h.flags = flags;
        h.count = 4;
        h.seq = 1000;
        h.collective = 3;
        h.window = 16;
        h.gen = 0xdead_beef;
        let mut b = vec![0u8; HEADER_LEN + 16];
        h.emit_to(&mut b).unwrap();
        for (i, x) in b[HEADER_LEN..].iter_mut().enumerate() {
            *x = i as u8 * 3 + 1;
        }
        b
    }

    fn key() -> PacketKey {
        PacketKey::data(&[0x42; 32])
    }

    #[test]
    fn tag_binds_header_and_payload() {
        let k = key();
        let f = frame(MsgType::Data, 1, flags::LAST);
        let (h, p) = (hr(&f), &f[HEADER_LEN..]);
        let t = k.tag(&h, p);
        assert!(k.verify(&h, p, &t));
        // Every payload byte, and every covered header field.
        for i in 0..p.len() {
            let mut q = p.to_vec();
            q[i] ^= 0x01;
            assert!(!k.verify(&h, &q, &t), "payload byte {i}");
        }
        let changes: [fn(&mut HeaderRepr); 7] = [
            |h| h.msg_type = MsgType::Result,
            |h| h.flags ^= flags::LAST,
            |h| h.flags ^= flags::ECE,
            |h| h.seq += 1,
            |h| h.collective += 1,
            |h| h.window += 1,
            |h| h.seq ^= 1 << 31,
        ];
        for change in changes {
            let mut g = h;
            change(&mut g);
            assert!(!k.verify(&g, p, &t), "{g:?}");
        }
        // RETX is not covered: a resend is the same DATA.
        let mut g = h;
        g.flags |= flags::RETX;
        assert!(k.verify(&g, p, &t));
        // A shorter payload (another count) fails too.
        assert!(!k.verify(&h, &p[..12], &t));
        let mut bad = t;
        bad[15] ^= 0x80;
        assert!(!k.verify(&h, p, &bad));
    }

    /// A token is the GMAC tag of an empty input, computed as one AES
    /// block: the same 16 bytes for every header, and it binds what the tag
    /// binds (every covered field, not `rank` or `RETX`).
    #[test]
    fn a_token_is_the_tag_of_an_empty_input_and_binds_the_header() {
        let k = PacketKey::result(&[1; 32], 7, 9, &[5; EPOCH_LEN]);
        for (ty, flags) in [
            (MsgType::Result, 0),
            (MsgType::Result, flags::ECE | flags::LAST),
            (MsgType::Result, flags::NOVAL | 0x10),
            (MsgType::Data, flags::RETX),
        ] {
            let f = frame(ty, 3, flags);
            let h = hr(&f);
            assert_eq!(k.token(&h), k.tag(&h, &[]), "{h:?}");
            assert!(k.verify_token(&h, &k.tag(&h, &[])));
        }
        let h = hr(&frame(MsgType::Result, 0, 0));
        let t = k.token(&h);
        let changes: [fn(&mut HeaderRepr); 6] = [
            |h| h.flags ^= flags::ECE,
            |h| h.flags ^= flags::NOVAL,
            |h| h.seq += 1,
            |h| h.collective += 1,
            |h| h.window += 1,
            |h| h.msg_type = MsgType::Data,
        ];
        for change in changes {
            let mut g = h;
            change(&mut g);
            assert!(!k.verify_token(&g, &t), "{g:?}");
        }
        let (mut g, mut r) = (h, h);
        g.rank = 2;
        r.flags |= flags::RETX;
        assert!(k.verify_token(&g, &t) && k.verify_token(&r, &t));
        assert!(!k.verify_token(&h, &[0; TAG_LEN]));
        assert!(!k.verify_token(&h, &t[..15]));
        let other = PacketKey::result(&[1; 32], 7, 9, &[6; EPOCH_LEN]);
        assert!(!other.verify_token(&h, &t), "another activation");
    }

    /// A cached token is the token of the header asked for: one per
    /// fan-out (any rank, resends too), a new one when a covered field
    /// changes, and none left over from another key once cleared.
    #[test]
    fn a_cached_token_is_always_the_headers_own() {
        let k = PacketKey::result(&[1; 32], 7, 9, &[5; EPOCH_LEN]);
        let cache = TokenCache::default();
        let mut h = hr(&frame(MsgType::Result, 0, 0));
        for rank in 0..4 {
            h.rank = rank;
            assert_eq!(k.token_cached(&h, &cache), k.token(&h));
        }
        h.flags |= flags::RETX;
        assert_eq!(k.token_cached(&h, &cache), k.token(&h));
        let changes: [fn(&mut HeaderRepr); 3] = [
            |h| h.window += 1,
            |h| h.seq += 1,
            |h| h.flags ^= flags::NOVAL,
        ];
        for change in changes {
            change(&mut h);
            assert_eq!(k.token_cached(&h, &cache), k.token(&h), "{h:?}");
        }
        let other = PacketKey::result(&[1; 32], 7, 9, &[6; EPOCH_LEN]);
        cache.clear();
        assert_eq!(other.token_cached(&h, &cache), other.token(&h));
        assert_ne!(other.token(&h), k.token(&h));
    }

    #[test]
    fn wrong_key_fails() {
        let f = frame(MsgType::Data, 1, 0);
        let (h, p) = (&hr(&f), &f[HEADER_LEN..]);
        let t = key().tag(h, p);
        assert!(!PacketKey::data(&[0x43; 32]).verify(h, p, &t));
        let r = PacketKey::result(&[1; 32], 7, 9, &[5; EPOCH_LEN]);
        let r2 = PacketKey::result(&[1; 32], 7, 9, &[6; EPOCH_LEN]);
        let t = r.tag(h, p);
        assert!(r.verify(h, p, &t));
        assert!(!r2.verify(h, p, &t), "another epoch");
        assert!(!PacketKey::result(&[1; 32], 8, 9, &[5; EPOCH_LEN]).verify(h, p, &t));
        assert!(!PacketKey::result(&[1; 32], 7, 10, &[5; EPOCH_LEN]).verify(h, p, &t));
        assert!(!PacketKey::result(&[2; 32], 7, 9, &[5; EPOCH_LEN]).verify(h, p, &t));
    }

    #[test]
    fn result_tag_ignores_rank_and_retx_only() {
        let k = PacketKey::result(&[1; 32], 7, 9, &[5; EPOCH_LEN]);
        let a = frame(MsgType::Result, 0, flags::ECE);
        let b = frame(MsgType::Result, 3, flags::ECE | flags::RETX);
        let ta = k.tag(&hr(&a), &a[HEADER_LEN..]);
        assert_eq!(ta, k.tag(&hr(&b), &b[HEADER_LEN..]));
        let c = frame(MsgType::Result, 0, 0);
        assert!(!k.verify(&hr(&c), &c[HEADER_LEN..], &ta), "ECE is covered");
        // A DATA tag never verifies as a RESULT's.
        let d = frame(MsgType::Data, 0, flags::ECE);
        assert!(!k.verify(&hr(&d), &d[HEADER_LEN..], &ta));
    }

    #[test]
    fn matches_gcm_with_an_empty_plaintext() {
        // A peer computes the same with any AES-GCM: key, 12-byte nonce,
        // AAD = payload, no plaintext.
        let prk = {
            let mut m = hmac(&[0x42; 32]);
            m.update(DATA_KEY_LABEL);
            let b: [u8; 32] = m.finalize().into_bytes().into();
            b
        };
        let mut k = [0u8; 16];
        k.copy_from_slice(&prk[..16]);
        let c = Aes128Gcm::new(&k.into());
        let f = frame(MsgType::Data, 1, flags::RETX | flags::LAST);
        let mut nonce = [0u8; 12];
        nonce[0] = f[0];
        nonce[1] = flags::LAST;
        nonce[2..4].copy_from_slice(&16u16.to_be_bytes());
        nonce[4..8].copy_from_slice(&1000u32.to_be_bytes());
        nonce[8..12].copy_from_slice(&3u32.to_be_bytes());
        let t = c
            .encrypt_inout_detached(&nonce.into(), &f[HEADER_LEN..], (&mut [][..]).into())
            .unwrap();
        let t: Tag = t.into();
        assert_eq!(t, key().tag(&hr(&f), &f[HEADER_LEN..]));
    }

    #[test]
    fn join_ack_tag_binds_header_body_and_key() {
        let mut h = HeaderRepr::new(MsgType::JoinAck, 7);
        h.rank = 2;
        h.window = 16;
        let body = [3u8; 16];
        let t = join_ack_tag(&[1; 32], &h, &body);
        assert!(verify_join_ack(&[1; 32], &h, &body, &t));
        assert!(!verify_join_ack(&[2; 32], &h, &body, &t));
        let mut b = body;
        b[3] ^= 1;
        assert!(!verify_join_ack(&[1; 32], &h, &b, &t));
        let mut g = h;
        g.window = 1;
        assert!(!verify_join_ack(&[1; 32], &g, &body, &t));
    }

    #[test]
    fn epochs_differ_per_counter_and_key() {
        assert_ne!(epoch(&[1; 32], 1), epoch(&[1; 32], 2));
        assert_ne!(epoch(&[1; 32], 1), epoch(&[2; 32], 1));
    }

    #[test]
    fn auth_modes_parse_and_name_the_choices() {
        assert_eq!("mac".parse::<AuthMode>(), Ok(AuthMode::Mac));
        assert_eq!("port".parse::<AuthMode>(), Ok(AuthMode::Port));
        let e = "hmac".parse::<AuthMode>().unwrap_err().to_string();
        assert!(e.contains("\"port\" or \"mac\""), "{e}");
        // The JOIN_ACK byte: 2 port (with RESULT tokens), 1 mac; 0 (a
        // switch from before tokens) and anything else name no mode.
        assert_eq!(AuthMode::from_u8(2), Some(AuthMode::Port));
        assert_eq!(AuthMode::from_u8(1), Some(AuthMode::Mac));
        assert_eq!(AuthMode::from_u8(AUTH_PORT_UNTOKENED), None);
        assert_eq!(AuthMode::from_u8(3), None);
    }
}
