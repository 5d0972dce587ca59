//! Verifying the people's JWTs for `/rpc`, with `jsonwebtoken`.
//!
//! keyturnd authenticates a request only to choose the database role it
//! runs as and the claims the database reads its identity from
//! (`request.jwt.claims`, as PostgREST sets it); every rule about what that
//! identity may do stays in the database.
//!
//! Accepted: HS256 with `KEYTURN_JWT_SECRET`, or RS256 / ES256 with a key of
//! the `KEYTURN_JWT_JWKS` file (chosen by `kid`, else by algorithm). `exp`
//! and `nbf` are checked when present, with 60 s of leeway (a token without
//! `exp` is its issuer's choice, as PostgREST takes it); `aud` is required
//! and checked when `KEYTURN_JWT_AUD` is set. `alg: none` and any algorithm other than
//! the configured ones are refused, so a JWKS public key can never be used
//! as an HMAC secret. A JWKS key that could not or should not verify
//! anything (a type that does not match its `alg`, an RSA modulus under
//! 2048 bits) stops keyturnd at start, naming its `kid`.

use std::collections::HashSet;
use std::path::Path;

use jsonwebtoken::jwk::{JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config::Config;
use crate::error::Error;

/// The clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY_SECONDS: u64 = 60;

/// The smallest RSA modulus accepted (RFC 7518 3.3: "A key of size 2048
/// bits or larger MUST be used").
pub const MIN_RSA_BITS: usize = 2048;

/// The algorithm a JWKS signing key verifies, from its type and its `alg`
/// together: a key whose type does not fit its label (an `oct` secret
/// labelled RS256), a curve other than P-256, or an RSA modulus under
/// [`MIN_RSA_BITS`] is an error, so keyturnd refuses it at start instead of
/// refusing every token it signs.
fn key_algorithm(jwk: &jsonwebtoken::jwk::Jwk) -> Result<Algorithm, String> {
    use jsonwebtoken::jwk::{AlgorithmParameters as P, EllipticCurve};
    let label = jwk.common.key_algorithm;
    match (&jwk.algorithm, label) {
        (P::RSA(rsa), None | Some(KeyAlgorithm::RS256)) => {
            let bits = rsa_bits(&rsa.n).ok_or("its RSA modulus `n` is not base64url")?;
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "an RSA key of {bits} bits; keyturnd accepts {MIN_RSA_BITS} bits or more"
                ));
            }
            Ok(Algorithm::RS256)
        }
        (P::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
            if ec.curve == EllipticCurve::P256 =>
        {
            Ok(Algorithm::ES256)
        }
        (params, Some(label @ (KeyAlgorithm::RS256 | KeyAlgorithm::ES256))) => Err(format!(
            "a {} key labelled {label:?}; RS256 needs an RSA key, ES256 a P-256 key",
            key_type(params)
        )),
        (params, label) => Err(format!(
            "only RS256 (RSA) and ES256 (P-256) keys are accepted, not a {} key{}",
            key_type(params),
            label
                .map(|l| format!(" labelled {l:?}"))
                .unwrap_or_default()
        )),
    }
}

/// A JWK's `kty` (and curve), for messages.
fn key_type(params: &jsonwebtoken::jwk::AlgorithmParameters) -> String {
    use jsonwebtoken::jwk::AlgorithmParameters as P;
    match params {
        P::RSA(_) => "RSA".into(),
        P::EllipticCurve(ec) => format!("EC {:?}", ec.curve),
        P::OctetKey(_) => "oct".into(),
        P::OctetKeyPair(okp) => format!("OKP {:?}", okp.curve),
        _ => "unknown".into(),
    }
}

/// The bit length of an RSA modulus given as base64url (RFC 7518 6.3.1.1).
fn rsa_bits(n: &str) -> Option<usize> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(n.trim_end_matches('='))
        .ok()?;
    let first = bytes.iter().position(|&b| b != 0)?;
    let top = bytes[first];
    Some((bytes.len() - first - 1) * 8 + (8 - top.leading_zeros() as usize))
}

/// A verified request: the role to `SET LOCAL ROLE` to, and the claims to
/// hand to the database.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The `role` claim, one of `KEYTURN_JWT_ROLES`.
    pub role: String,
    /// The verified claims, as JSON text.
    pub claims: String,
}

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// The configured keys and rules.
pub struct Verifier {
    keys: Vec<Key>,
    audience: Option<String>,
    roles: HashSet<String>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.len())
            .field("audience", &self.audience)
            .field("roles", &self.roles)
            .finish()
    }
}

impl Verifier {
    /// The verifier `config` describes; `None` when no JWT key is set
    /// (`/rpc` is off).
    pub fn from_config(config: &Config) -> Result<Option<Verifier>, Error> {
        let roles = config.jwt_roles.iter().map(|r| r.trim().to_owned());
        let audience = config.jwt_aud.clone();
        if let Some(secret) = &config.jwt_secret {
            return Ok(Some(Verifier::hs256(
                secret.expose().as_bytes(),
                audience,
                roles,
            )?));
        }
        match &config.jwt_jwks {
            Some(path) => Ok(Some(Verifier::jwks_file(path, audience, roles)?)),
            None => Ok(None),
        }
    }

    /// HS256 with `secret`.
    pub fn hs256(
        secret: &[u8],
        audience: Option<String>,
        roles: impl IntoIterator<Item = String>,
    ) -> Result<Verifier, Error> {
        let key = DecodingKey::from_secret(secret)
            .map_err(|e| Error::Config(format!("KEYTURN_JWT_SECRET: {e}")))?;
        Ok(Verifier {
            keys: vec![Key {
                kid: None,
                alg: Algorithm::HS256,
                key,
            }],
            audience,
            roles: roles.into_iter().collect(),
        })
    }

    /// The RS256 and ES256 signing keys of the JWKS file at `path`.
    pub fn jwks_file(
        path: &Path,
        audience: Option<String>,
        roles: impl IntoIterator<Item = String>,
    ) -> Result<Verifier, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "KEYTURN_JWT_JWKS: cannot read {}: {e}",
                path.display()
            ))
        })?;
        Verifier::jwks(&text, audience, roles)
            .map_err(|why| Error::Config(format!("KEYTURN_JWT_JWKS {}: {why}", path.display())))
    }

    /// The RS256 and ES256 signing keys of the JWKS document `text`.
    /// Encryption keys are skipped; a signing key of another algorithm, or
    /// a set with no usable key, is an error, so a misconfigured identity
    /// provider fails at start and not on the first request.
    pub fn jwks(
        text: &str,
        audience: Option<String>,
        roles: impl IntoIterator<Item = String>,
    ) -> Result<Verifier, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
                continue;
            }
            let name = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
            let alg = key_algorithm(jwk).map_err(|why| format!("key {name}: {why}"))?;
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {name}: {e}"))?;
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
            });
        }
        if keys.is_empty() {
            return Err("it holds no RS256 or ES256 signing key".into());
        }
        Ok(Verifier {
            keys,
            audience,
            roles: roles.into_iter().collect(),
        })
    }

    /// These keys and rules with another role allowlist (`/mcp`'s agents
    /// are verified with the people's keys, against `KEYTURN_MCP_ROLES`).
    pub fn for_roles(mut self, roles: impl IntoIterator<Item = String>) -> Verifier {
        self.roles = roles.into_iter().collect();
        self
    }

    /// The roles a JWT may select.
    pub fn roles(&self) -> impl Iterator<Item = &str> {
        self.roles.iter().map(String::as_str)
    }

    /// Whether `role` is one of `KEYTURN_JWT_ROLES`.
    pub fn allows(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }

    /// Verifies the `Authorization` header's bearer token: 401 for anything
    /// wrong with the token, 403 for a role outside the list.
    pub fn verify(&self, authorization: Option<&str>) -> Result<Verified, Error> {
        let token = bearer(authorization)?;
        let header =
            decode_header(token).map_err(|_| Error::Unauthorized("the JWT is malformed"))?;
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .filter(|k| k.alg == header.alg)
            .filter(|k| match (&header.kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(Error::Unauthorized(
                "the JWT's algorithm or key id is not one keyturnd accepts",
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        // `exp` and `nbf` are checked when present, as PostgREST checks
        // them: a token without `exp` is its issuer's choice (client code
        // written for PostgREST sends such tokens).
        match &self.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                // A configured audience is required, not only checked when present.
                validation.set_required_spec_claims(&["aud"]);
            }
            None => {
                validation.validate_aud = false;
                validation.set_required_spec_claims::<&str>(&[]);
            }
        }
        let mut last = Error::Unauthorized("the JWT's signature does not verify");
        for key in candidates {
            match decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => return self.accept(token, data.claims),
                Err(e) => {
                    last = unauthorized(e.kind());
                    // Only a bad signature may mean "another key of the
                    // set"; anything else is about the token itself.
                    if !matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    /// The database reads its identity from the claims with keyturn-core's
    /// strict reader, which refuses a repeated key and serde_json's reserved
    /// number key; the JSON library here takes the last of a repeated key.
    /// So the payload is read that way too, and the database gets it as it
    /// was signed, never a re-serialization that would hide either
    /// (docs/security.md, row 128).
    fn accept(&self, token: &str, claims: Map<String, Value>) -> Result<Verified, Error> {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let payload = token
            .split('.')
            .nth(1)
            .and_then(|p| URL_SAFE_NO_PAD.decode(p).ok())
            .and_then(|p| String::from_utf8(p).ok())
            .ok_or(Error::Unauthorized("the JWT is malformed"))?;
        if keyturn_core::canonical::parse_bounded(&payload).is_err() {
            return Err(Error::Unauthorized(
                "the JWT's claims repeat a key, or hold JSON keyturn does not read exactly",
            ));
        }
        let role = match claims.get("role") {
            Some(Value::String(role)) if self.roles.contains(role) => role.clone(),
            _ => return Err(Error::RoleNotAllowed),
        };
        Ok(Verified {
            role,
            claims: payload,
        })
    }
}

/// An HS256 JWT for `role`, `sub`, `tenant_id` and `session_id`, valid for
/// `ttl_seconds`, signed with `secret`: what `keyturnd jwt` prints so a
/// demo or a developer can open the card without an identity provider.
pub fn mint_hs256(
    secret: &[u8],
    role: &str,
    identity: [(&str, Option<&str>); 3],
    ttl_seconds: u64,
) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::internal("reading the clock", e))?
        .as_secs();
    let mut claims = Map::new();
    claims.insert("role".into(), Value::from(role));
    for (claim, value) in identity {
        if let Some(value) = value {
            claims.insert(claim.into(), Value::from(value));
        }
    }
    claims.insert("iat".into(), Value::from(now));
    claims.insert("exp".into(), Value::from(now + ttl_seconds));
    let key = jsonwebtoken::EncodingKey::from_secret(secret)
        .map_err(|e| Error::Config(format!("KEYTURN_JWT_SECRET: {e}")))?;
    jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key)
        .map_err(|e| Error::internal("signing a JWT", e))
}

pub fn bearer(authorization: Option<&str>) -> Result<&str, Error> {
    let value = authorization.ok_or(Error::Unauthorized(
        "no JWT: send Authorization: Bearer <token>",
    ))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(Error::Unauthorized(
            "the Authorization header is not `Bearer <token>`",
        )),
    }
}

fn unauthorized(kind: &jsonwebtoken::errors::ErrorKind) -> Error {
    use jsonwebtoken::errors::ErrorKind as K;
    Error::Unauthorized(match kind {
        K::ExpiredSignature => "the JWT has expired",
        K::ImmatureSignature => "the JWT is not valid yet (nbf)",
        K::InvalidAudience => "the JWT's audience (aud) is not accepted",
        K::InvalidSignature => "the JWT's signature does not verify",
        K::MissingRequiredClaim(_) => "the JWT lacks the audience (aud) keyturnd requires",
        K::InvalidAlgorithm => "the JWT's algorithm is not one keyturnd accepts",
        _ => "the JWT is malformed",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64
    }

    fn verifier(aud: Option<&str>) -> Verifier {
        Verifier::hs256(SECRET, aud.map(str::to_owned), ["web_human".to_owned()]).expect("key")
    }

    fn token(claims: Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).expect("key"),
        )
        .expect("encode")
    }

    fn bearer_of(t: &str) -> String {
        format!("Bearer {t}")
    }

    fn code(r: Result<Verified, Error>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(Error::Unauthorized(_)) => "401",
            Err(Error::RoleNotAllowed) => "403",
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn test_a_valid_token_yields_its_role_and_claims() {
        let t = token(json!({"role": "web_human", "sub": "alice", "exp": now() + 60}));
        let v = verifier(None).verify(Some(&bearer_of(&t))).expect("valid");
        assert_eq!(v.role, "web_human");
        let claims: Value = serde_json::from_str(&v.claims).expect("json");
        assert_eq!(claims["sub"], "alice");
    }

    #[test]
    fn test_expiry_allows_60_seconds_of_leeway_and_no_more() {
        let v = verifier(None);
        let within = token(json!({"role": "web_human", "exp": now() - 30}));
        assert_eq!(code(v.verify(Some(&bearer_of(&within)))), "ok");
        let past = token(json!({"role": "web_human", "exp": now() - 120}));
        assert_eq!(code(v.verify(Some(&bearer_of(&past)))), "401");
        let early = token(json!({"role": "web_human", "exp": now() + 600, "nbf": now() + 120}));
        assert_eq!(code(v.verify(Some(&bearer_of(&early)))), "401");
        // No exp: accepted, as PostgREST accepts it; an exp that is not a
        // number is malformed.
        let no_exp = token(json!({"role": "web_human"}));
        assert_eq!(code(v.verify(Some(&bearer_of(&no_exp)))), "ok");
        let bad_exp = token(json!({"role": "web_human", "exp": "tomorrow"}));
        assert_eq!(code(v.verify(Some(&bearer_of(&bad_exp)))), "401");
    }

    #[test]
    fn test_audience_is_checked_only_when_configured() {
        let t = token(json!({"role": "web_human", "aud": "other", "exp": now() + 60}));
        assert_eq!(code(verifier(None).verify(Some(&bearer_of(&t)))), "ok");
        assert_eq!(
            code(verifier(Some("keyturn")).verify(Some(&bearer_of(&t)))),
            "401"
        );
        let good = token(json!({"role": "web_human", "aud": "keyturn", "exp": now() + 60}));
        assert_eq!(
            code(verifier(Some("keyturn")).verify(Some(&bearer_of(&good)))),
            "ok"
        );
    }

    #[test]
    fn test_missing_malformed_unsigned_and_foreign_tokens_are_401() {
        let v = verifier(None);
        assert_eq!(code(v.verify(None)), "401");
        assert_eq!(code(v.verify(Some("Basic abc"))), "401");
        assert_eq!(code(v.verify(Some("Bearer not.a.jwt"))), "401");
        // alg none: the header parses as no algorithm jsonwebtoken knows.
        let none = format!(
            "{}.{}.",
            base64_url(r#"{"alg":"none","typ":"JWT"}"#),
            base64_url(&json!({"role": "web_human", "exp": now() + 60}).to_string())
        );
        assert_eq!(code(v.verify(Some(&bearer_of(&none)))), "401");
        let other = encode(
            &Header::new(Algorithm::HS256),
            &json!({"role": "web_human", "exp": now() + 60}),
            &EncodingKey::from_secret(b"another secret, just as long as ours").expect("key"),
        )
        .expect("encode");
        assert_eq!(code(v.verify(Some(&bearer_of(&other)))), "401");
    }

    #[test]
    fn test_a_minted_jwt_verifies() {
        let t = mint_hs256(
            SECRET,
            "web_human",
            [
                ("sub", Some("alice")),
                ("tenant_id", Some("acme")),
                ("session_id", None),
            ],
            60,
        )
        .expect("mint");
        let v = verifier(None).verify(Some(&bearer_of(&t))).expect("valid");
        let claims: Value = serde_json::from_str(&v.claims).expect("json");
        assert_eq!(
            (claims["sub"].as_str(), claims.get("session_id")),
            (Some("alice"), None)
        );
    }

    #[test]
    fn test_roles_outside_the_list_are_403() {
        let v = verifier(None);
        let agent = token(json!({"role": "app_agent", "exp": now() + 60}));
        assert_eq!(code(v.verify(Some(&bearer_of(&agent)))), "403");
        let none = token(json!({"exp": now() + 60}));
        assert_eq!(code(v.verify(Some(&bearer_of(&none)))), "403");
    }

    /// A payload keyturnd read one way and the database's strict reader
    /// another (the last of two `tenant_id`s won here; a reserved key read
    /// as a number) is refused, and what the database gets is the payload
    /// as it was signed (twenty-first red-team pass, docs/security.md row
    /// 128).
    #[test]
    fn test_a_payload_the_database_reads_otherwise_is_401() {
        let v = verifier(None);
        let exp = now() + 60;
        for payload in [
            format!(
                r#"{{"role":"web_human","tenant_id":"globex","tenant_id":"acme","exp":{exp}}}"#
            ),
            format!(r#"{{"role":"web_human","role":"web_human","exp":{exp}}}"#),
            format!(
                r#"{{"role":"web_human","n":{{"$serde_json::private::Number":"7"}},"exp":{exp}}}"#
            ),
        ] {
            assert_eq!(
                code(v.verify(Some(&bearer_of(&signed(&payload))))),
                "401",
                "{payload}"
            );
        }
        let payload = format!(r#"{{"exp": {exp}, "role": "web_human", "sub": "alice"}}"#);
        let verified = v
            .verify(Some(&bearer_of(&signed(&payload))))
            .expect("valid");
        assert_eq!(verified.claims, payload);
    }

    /// An HS256 JWT of exactly `payload`.
    fn signed(payload: &str) -> String {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        use hmac::{Hmac, Mac};
        let head = format!(
            "{}.{}",
            base64_url(r#"{"alg":"HS256","typ":"JWT"}"#),
            base64_url(payload)
        );
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET).expect("key");
        mac.update(head.as_bytes());
        format!(
            "{head}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    fn base64_url(s: &str) -> String {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        URL_SAFE_NO_PAD.encode(s)
    }
}
