//! The signing keys keyturnd is configured with: the Standard Webhooks key
//! of effects and notifications, and the Web Push VAPID key. No error
//! message here ever quotes a key.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use std::fmt;

use super::Secret;
use crate::error::Error;

/// The prefix of a Standard Webhooks secret.
pub const STANDARD_SECRET_PREFIX: &str = "whsec_";

/// Standard Webhooks libraries decode secrets with or without padding.
pub(super) const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The Standard Webhooks signing key of `KEYTURN_WEBHOOK_SECRET`: the
/// decoded rest of `whsec_<base64>`, otherwise the secret's UTF-8 bytes.
pub fn webhook_key(secret: &str) -> Result<Vec<u8>, Error> {
    let Some(encoded) = secret.strip_prefix(STANDARD_SECRET_PREFIX) else {
        return Ok(secret.as_bytes().to_vec());
    };
    match SECRET_BASE64.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        // The error text could quote the secret; say only what is wrong.
        _ => Err(Error::Config(
            "KEYTURN_WEBHOOK_SECRET starts with whsec_ but the rest is not a non-empty base64 \
             key (the Standard Webhooks secret format); fix it, or use a secret without the prefix"
                .into(),
        )),
    }
}

/// A Web Push VAPID key (RFC 8292): the base64url of a raw 32-byte P-256
/// private key, as `keyturnd vapid-keys` prints it, parsed by the `web-push`
/// crate that signs with it.
#[derive(Clone)]
pub struct VapidKey {
    builder: web_push::PartialVapidSignatureBuilder,
    public: String,
}

impl VapidKey {
    /// Parses `KEYTURN_VAPID_PRIVATE_KEY`; the error never quotes it.
    pub fn parse(private_key: &str) -> Result<Self, Error> {
        let builder = web_push::VapidSignatureBuilder::from_base64_no_sub(private_key.trim())
            .map_err(|_| {
                Error::Config(
                    "KEYTURN_VAPID_PRIVATE_KEY is not the base64url of a raw 32-byte P-256 private key                      (keyturnd vapid-keys makes one)"
                        .into(),
                )
            })?;
        let public = URL_SAFE_NO_PAD.encode(builder.get_public_key());
        Ok(VapidKey { builder, public })
    }

    /// A new key pair: (private key, public key), both base64url, the
    /// public key uncompressed (65 bytes), as browsers take it
    /// (`applicationServerKey`).
    pub fn generate() -> (Secret, String) {
        let private =
            URL_SAFE_NO_PAD.encode(jwt_simple::algorithms::ES256KeyPair::generate().to_bytes());
        // Read back by web-push, as KEYTURN_VAPID_PRIVATE_KEY will be.
        let public = match VapidKey::parse(&private) {
            Ok(key) => key.public,
            Err(_) => unreachable!("a key jwt-simple made is a P-256 private key"),
        };
        (Secret::from(private), public)
    }

    /// The public key, base64url: what a browser subscribes with.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    /// A signature builder for one subscription.
    pub fn builder(&self) -> web_push::PartialVapidSignatureBuilder {
        self.builder.clone()
    }
}

impl fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VapidKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}
