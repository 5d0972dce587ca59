//! The one-time approval token and the two things stored in its place.
//!
//! The token is shown once, to the agent, which hands it to the human's approval
//! surface; the database never keeps it. It keeps:
//!
//! * a digest ([`token_digest`]) to find the proposal a presented token belongs to,
//!   and
//! * a binding ([`token_binding`]): an HMAC keyed by the token over the proposal's
//!   action id, params hash and expiry. Someone who can write the table but does
//!   not hold the token can change params and params_hash together, or push the
//!   expiry out, but cannot recompute the binding, so approve detects the
//!   tampering (`rejected_tampered`).
//!
//! 32 bytes from the OS CSPRNG give 256 bits, far past guessing; SHA-256 of such
//! a token needs no salt or slow hash, since there is no dictionary to attack.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Random bytes in a token.
pub const TOKEN_BYTES: usize = 32;

/// Domain tag so this HMAC can never be confused with another use of the token.
const BINDING_TAG: &[u8] = b"keyturn/v1/binding";

/// Mints a token: [`TOKEN_BYTES`] from the OS CSPRNG as URL-safe base64 without
/// padding (43 characters).
///
/// # Panics
/// If the operating system cannot supply randomness. There is no safe fallback
/// for an approval secret, so failing the statement is the only correct outcome.
pub fn new_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    if let Err(e) = getrandom::fill(&mut bytes) {
        panic!("the operating system's random number generator failed: {e}");
    }
    URL_SAFE_NO_PAD.encode(bytes)
}

/// SHA-256 of the token's UTF-8 bytes: the lookup key for a presented token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// HMAC-SHA256 keyed by the token over
/// `tag ‖ action_id (16) ‖ len(params_hash) as u64 BE ‖ params_hash ‖ expires_at as i64 BE`.
///
/// Every field is fixed-width or length-prefixed, so no two different tuples
/// encode to the same message.
pub fn token_binding(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
) -> [u8; 32] {
    binding_mac(token, action_id, params_hash, expires_at_micros)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `stored` is the binding of this token to these values, in constant time.
pub fn verify_binding(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
    stored: &[u8],
) -> bool {
    binding_mac(token, action_id, params_hash, expires_at_micros)
        .verify_slice(stored)
        .is_ok()
}

/// Constant-time equality; unequal lengths are simply unequal (length is not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

fn binding_mac(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
) -> Hmac<Sha256> {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
        // HMAC hashes over-long keys and pads short ones: every length is valid.
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    mac.update(BINDING_TAG);
    mac.update(action_id);
    // usize → u64 is lossless on every supported target.
    mac.update(&(params_hash.len() as u64).to_be_bytes());
    mac.update(params_hash.as_bytes());
    mac.update(&expires_at_micros.to_be_bytes());
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const ID: [u8; 16] = [7; 16];
    const HASH: &str = "a4ef7e703f6022c8e6b746a9d20bce01e98e95696101afa915dc00f859887010";
    const EXP: i64 = 1_750_000_000_000_000;

    #[test]
    fn test_tokens_are_43_url_safe_chars() {
        for _ in 0..100 {
            let t = new_token();
            assert_eq!(t.len(), 43, "{t}");
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t}"
            );
            assert_eq!(URL_SAFE_NO_PAD.decode(&t).unwrap().len(), TOKEN_BYTES);
        }
    }

    #[test]
    fn test_tokens_are_distinct() {
        let tokens: HashSet<String> = (0..1000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 1000);
    }

    #[test]
    fn test_digest_is_sha256_of_token_text() {
        // sha256("abc"), FIPS 180-2 appendix B.1
        assert_eq!(
            hex::encode(token_digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn test_binding_changes_with_every_input() {
        let t = "token-one";
        let base = token_binding(t, &ID, HASH, EXP);
        let mut other_id = ID;
        other_id[15] ^= 1;
        let variants = [
            token_binding("token-two", &ID, HASH, EXP),
            token_binding(t, &other_id, HASH, EXP),
            token_binding(t, &ID, &HASH.replace('a', "b"), EXP),
            token_binding(t, &ID, HASH, EXP + 1),
            token_binding(t, &ID, HASH, -EXP),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i}");
        }
        assert_eq!(token_binding(t, &ID, HASH, EXP), base, "deterministic");
    }

    #[test]
    fn test_binding_is_hmac_of_documented_encoding() {
        let mut msg = Vec::new();
        msg.extend_from_slice(b"keyturn/v1/binding");
        msg.extend_from_slice(&ID);
        msg.extend_from_slice(&64u64.to_be_bytes());
        msg.extend_from_slice(HASH.as_bytes());
        msg.extend_from_slice(&EXP.to_be_bytes());
        let mut mac = Hmac::<Sha256>::new_from_slice(b"k").unwrap();
        mac.update(&msg);
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(token_binding("k", &ID, HASH, EXP), want);
    }

    #[test]
    fn test_verify_accepts_right_and_rejects_each_tampered_input() {
        let t = new_token();
        let stored = token_binding(&t, &ID, HASH, EXP);
        assert!(verify_binding(&t, &ID, HASH, EXP, &stored));

        let mut other_id = ID;
        other_id[0] ^= 0x80;
        let mut flipped = stored;
        flipped[31] ^= 1;
        assert!(!verify_binding(&new_token(), &ID, HASH, EXP, &stored));
        assert!(!verify_binding(&t, &other_id, HASH, EXP, &stored));
        assert!(!verify_binding(&t, &ID, &HASH[1..], EXP, &stored));
        assert!(!verify_binding(&t, &ID, HASH, EXP + 60_000_000, &stored));
        assert!(!verify_binding(&t, &ID, HASH, EXP, &flipped));
        assert!(!verify_binding(&t, &ID, HASH, EXP, &stored[..31]));
        assert!(!verify_binding(&t, &ID, HASH, EXP, &[]));
    }

    #[test]
    fn test_ct_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"ab", b"abc"));
    }
}
