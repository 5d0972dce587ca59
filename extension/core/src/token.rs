//! The one-time approval token and the two things stored in its place.
//!
//! The token is shown once, to the agent, which hands it to the human's approval
//! surface; the database never keeps it. It keeps:
//!
//! * a digest ([`token_digest`]) to find the proposal a presented token belongs to,
//!   and
//! * a binding ([`token_binding`]): an HMAC keyed by the token over the proposal's
//!   action id, params hash, expiry and origin. Someone who can write the table
//!   but does not hold the token can change params and params_hash together,
//!   push the expiry out, or move the proposal to another conversation or other
//!   evidence, but cannot recompute the binding, so approve detects the
//!   tampering (`rejected_tampered`). A binding made before the origin was bound
//!   (0.2.0: 32 bytes, the first form) still verifies, over what it covers.
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

/// Domain tags so this HMAC can never be confused with another use of the
/// token: the first form (action id, params hash, expiry) and the second (and
/// the origin).
const BINDING_TAG_V1: &[u8] = b"keyturn/v1/binding";
const BINDING_TAG_V2: &[u8] = b"keyturn/v2/binding";

/// The first byte of a binding of the second form, which is 33 bytes long
/// (a first-form binding is the bare 32-byte MAC).
const V2: u8 = 2;

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

/// The binding of a new proposal: [`V2`] followed by HMAC-SHA256 keyed by the
/// token over
/// `tag ‖ action_id (16) ‖ len(params_hash) as u64 BE ‖ params_hash ‖
/// expires_at as i64 BE ‖ len(origin) as u64 BE ‖ origin`, where `origin` is
/// the RFC 8785 text of the stored origin.
///
/// Every field is fixed-width or length-prefixed, so no two different tuples
/// encode to the same message.
pub fn token_binding(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
    origin: &str,
) -> Vec<u8> {
    let mut mac = binding_mac(
        BINDING_TAG_V2,
        token,
        action_id,
        params_hash,
        expires_at_micros,
    );
    // usize → u64 is lossless on every supported target.
    mac.update(&(origin.len() as u64).to_be_bytes());
    mac.update(origin.as_bytes());
    let mut out = Vec::with_capacity(33);
    out.push(V2);
    out.extend_from_slice(&mac.finalize().into_bytes());
    out
}

/// The binding of the first form (0.2.0's, which does not cover the origin):
/// HMAC-SHA256 keyed by the token over
/// `tag ‖ action_id (16) ‖ len(params_hash) as u64 BE ‖ params_hash ‖ expires_at as i64 BE`.
/// Still verified for proposals made before the second; made only by a
/// 0.2.0 database running this code before its upgrade.
pub fn first_form_binding(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
) -> [u8; 32] {
    binding_mac(
        BINDING_TAG_V1,
        token,
        action_id,
        params_hash,
        expires_at_micros,
    )
    .finalize()
    .into_bytes()
    .into()
}

/// Whether `stored` is the binding of this token to these values, in constant
/// time: of the second form, or of the first (32 bytes), which does not cover
/// the origin (a proposal made before 0.3.0). Neither can be made without the
/// token.
pub fn verify_binding(
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
    origin: &str,
    stored: &[u8],
) -> bool {
    if stored.len() == 32 {
        let first = first_form_binding(token, action_id, params_hash, expires_at_micros);
        return ct_eq(stored, &first);
    }
    let second = token_binding(token, action_id, params_hash, expires_at_micros, origin);
    ct_eq(stored, &second)
}

/// Constant-time equality; unequal lengths are simply unequal (length is not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

fn binding_mac(
    tag: &[u8],
    token: &str,
    action_id: &[u8; 16],
    params_hash: &str,
    expires_at_micros: i64,
) -> Hmac<Sha256> {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
        // HMAC hashes over-long keys and pads short ones: every length is valid.
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    mac.update(tag);
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

    const ORIGIN: &str = r#"{"conversation_id":"c1"}"#;

    #[test]
    fn test_binding_changes_with_every_input() {
        let t = "token-one";
        let base = token_binding(t, &ID, HASH, EXP, ORIGIN);
        let mut other_id = ID;
        other_id[15] ^= 1;
        let variants = [
            token_binding("token-two", &ID, HASH, EXP, ORIGIN),
            token_binding(t, &other_id, HASH, EXP, ORIGIN),
            token_binding(t, &ID, &HASH.replace('a', "b"), EXP, ORIGIN),
            token_binding(t, &ID, HASH, EXP + 1, ORIGIN),
            token_binding(t, &ID, HASH, -EXP, ORIGIN),
            token_binding(t, &ID, HASH, EXP, r#"{"conversation_id":"c2"}"#),
            token_binding(t, &ID, HASH, EXP, "{}"),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i}");
        }
        assert_eq!(
            token_binding(t, &ID, HASH, EXP, ORIGIN),
            base,
            "deterministic"
        );
    }

    #[test]
    fn test_binding_is_hmac_of_documented_encoding() {
        let mut msg = Vec::new();
        msg.extend_from_slice(b"keyturn/v2/binding");
        msg.extend_from_slice(&ID);
        msg.extend_from_slice(&64u64.to_be_bytes());
        msg.extend_from_slice(HASH.as_bytes());
        msg.extend_from_slice(&EXP.to_be_bytes());
        msg.extend_from_slice(&(ORIGIN.len() as u64).to_be_bytes());
        msg.extend_from_slice(ORIGIN.as_bytes());
        let mut mac = Hmac::<Sha256>::new_from_slice(b"k").unwrap();
        mac.update(&msg);
        let mut want = vec![2u8];
        want.extend_from_slice(&mac.finalize().into_bytes());
        assert_eq!(token_binding("k", &ID, HASH, EXP, ORIGIN), want);
    }

    #[test]
    fn test_verify_accepts_right_and_rejects_each_tampered_input() {
        let t = new_token();
        let stored = token_binding(&t, &ID, HASH, EXP, ORIGIN);
        assert!(verify_binding(&t, &ID, HASH, EXP, ORIGIN, &stored));

        let mut other_id = ID;
        other_id[0] ^= 0x80;
        let mut flipped = stored.clone();
        flipped[32] ^= 1;
        assert!(!verify_binding(
            &new_token(),
            &ID,
            HASH,
            EXP,
            ORIGIN,
            &stored
        ));
        assert!(!verify_binding(&t, &other_id, HASH, EXP, ORIGIN, &stored));
        assert!(!verify_binding(&t, &ID, &HASH[1..], EXP, ORIGIN, &stored));
        assert!(!verify_binding(
            &t,
            &ID,
            HASH,
            EXP + 60_000_000,
            ORIGIN,
            &stored
        ));
        assert!(!verify_binding(&t, &ID, HASH, EXP, "{}", &stored));
        assert!(!verify_binding(&t, &ID, HASH, EXP, ORIGIN, &flipped));
        // Cut to a first-form length, it is no first-form binding either.
        assert!(!verify_binding(&t, &ID, HASH, EXP, ORIGIN, &stored[1..]));
        assert!(!verify_binding(&t, &ID, HASH, EXP, ORIGIN, &stored[..32]));
        assert!(!verify_binding(&t, &ID, HASH, EXP, ORIGIN, &[]));
    }

    /// A binding made by 0.2.0 (the first form: no origin, 32 bytes) still
    /// verifies, whatever the origin, and each of its own inputs still counts.
    #[test]
    fn test_a_first_form_binding_verifies_over_what_it_covers() {
        let t = new_token();
        let mut mac = Hmac::<Sha256>::new_from_slice(t.as_bytes()).unwrap();
        mac.update(b"keyturn/v1/binding");
        mac.update(&ID);
        mac.update(&64u64.to_be_bytes());
        mac.update(HASH.as_bytes());
        mac.update(&EXP.to_be_bytes());
        let old: Vec<u8> = mac.finalize().into_bytes().to_vec();
        assert_eq!(first_form_binding(&t, &ID, HASH, EXP).to_vec(), old);
        assert!(verify_binding(&t, &ID, HASH, EXP, ORIGIN, &old));
        assert!(verify_binding(&t, &ID, HASH, EXP, "{}", &old));
        assert!(!verify_binding(&t, &ID, HASH, EXP + 1, ORIGIN, &old));
        assert!(!verify_binding(&new_token(), &ID, HASH, EXP, ORIGIN, &old));
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
