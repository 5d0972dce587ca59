//! Detecting credential material, so it is never stored.
//!
//! Proposals, audit rows and receipts are kept for a long time and read by many
//! people; a password or API key pasted into params would leak through all of
//! them. `propose` therefore refuses params holding anything credential-shaped
//! ([`find_credential`]), receipts are stored [`redact`]ed, and fenced
//! connected-app data has credential-shaped strings redacted
//! ([`crate::fence`]).
//!
//! This is defence in depth, not a guarantee: a secret that is not in a known
//! shape and not under a telling name (a bare random password in a `note`) is
//! not found, and cannot be. It is deliberately biased toward false positives
//! (a refused proposal is cheap, a stored secret is not), so some prose and
//! some harmless keys are flagged too. What it catches:
//!
//! * **keys** whose name mentions a secret (`api_key`, `X-Auth-Token`,
//!   `client.secret`, `AccountKey`, `Pwd`), whatever their value, and keys that
//!   are themselves shaped like a secret (below);
//! * **authorization schemes**: `Bearer`/`Basic` and a token after any
//!   whitespace, as the whole string (`Bearer abc.def-ghi`) or inside it
//!   (`Authorization: Bearer …`, `-H 'Bearer …'`), where the token must look
//!   generated (a digit, a symbol or an inner capital) so that prose such as
//!   "a basic understanding" passes;
//! * **assignments** inside strings: a secret-named key, then `=` or `:`, then
//!   a value (`password=hunter2`, `?access_token=…`, `Pwd=…;`, `"secret": "x"`,
//!   `api_key: xyz…`). After `:` an unquoted value needs 6 characters, so
//!   "Reset your password: click here" passes;
//! * **URL userinfo** with a password: `postgres://u:pass@host`,
//!   `https://user:token@github.com`, `redis://:pw@host`;
//! * **PEM private keys**, **JWTs**, and these **key formats**, each a
//!   prefix and the least that must follow it, so that short words such as
//!   `sk-learn` or `hf_hub` do not match:
//!   - AWS `AKIA`/`ASIA` and exactly 16 of `[A-Z0-9]`;
//!   - GitHub `ghp_` `gho_` `ghs_` `ghu_` `ghr_` `github_pat_`, GitLab
//!     `glpat-`, OpenAI and Anthropic `sk-`, Stripe `whsec_`, Google OAuth
//!     `ya29.`: 20 or more;
//!   - Slack `xoxa-` `xoxb-` `xoxp-` `xoxr-` `xoxs-` `xapp-` and Stripe
//!     `sk_live_` `rk_live_` `sk_test_` `rk_test_`: 8 or more;
//!   - Google API `AIza`, npm `npm_`, Hugging Face `hf_`: 30 or more;
//!     PyPI `pypi-`: 32 or more;
//!   - hex after the prefix: Twilio `SK` (exactly 32), Shopify `shpat_`
//!     `shpss_` `shpca_` `shppa_`, DigitalOcean `dop_v1_` `doo_v1_` `dor_v1_`
//!     and Mailgun `key-` (32 or more);
//!   - SendGrid `SG.` and two dot-separated parts of 16 or more.
//!
//! Every string and key is normalized first ([`crate::text::for_matching`]):
//! NFKC, so fullwidth `ｐａｓｓｗｏｒｄ` reads `password`, then without
//! invisible characters, so `Bear\u{200B}er` and `ghp_\u{200B}…` are not split.
//! Key names (object keys, the names in assignments, the scheme words) are
//! also folded to their confusable skeleton
//! ([`crate::text::fold_confusables`]), so Cyrillic `раssword` and `t0ken`
//! read as what they look like.
//!
//! Matching is hand-written: the shapes are simple, and a regex engine would add
//! a dependency and its own worst cases to a hot path.

use std::sync::OnceLock;

use serde_json::{Map, Value};

use crate::text::{fold_confusables, for_matching};

/// What replaces credential material in redacted output.
pub const REDACTED: &str = "[redacted]";

/// Substrings of a folded key that mark it as holding a secret.
const KEY_FRAGMENTS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "authorization",
    "privatekey",
    "credential",
    "accesskey",
    "accountkey",
    "sessionkey",
    "cookie",
    "clientsecret",
    "passcode",
    "pincode",
    "seedphrase",
    "mnemonic",
    "securitycode",
    "verificationcode",
    "recoverycode",
    "backupcode",
    "otpcode",
    "mfacode",
];

/// Folded keys that mark a secret only when they are the whole key
/// (`auth` is a secret; `author` and `oauth_provider` are not).
const WHOLE_KEYS: &[&str] = &["auth", "pwd"];

/// Words that mark a secret when they are a whole word of the key
/// (`pin`, `card_pin`, `cardPin`, `otp_code`; never `spinner`, `shipping`,
/// `opinion`, `footprint`): too short to match as fragments.
const KEY_WORDS: &[&str] = &[
    "pin", "otp", "totp", "hotp", "cvv", "cvc", "cvv2", "mfa", "2fa",
];

/// JSON-pointer path (RFC 6901) of the first credential in `v`, depth first with
/// object members in key order, or `None` if there is none.
pub fn find_credential(v: &Value) -> Option<String> {
    let mut path = String::new();
    find_in(v, &mut path).then_some(path)
}

/// A copy of `v` with the value of every credential-named key, and every
/// credential-shaped string, replaced by `"[redacted]"`. A key that is itself
/// shaped like a secret is renamed `"[redacted]"` (`"[redacted] 2"`, … when
/// several in one object are).
pub fn redact(v: &Value) -> Value {
    match v {
        Value::String(s) if is_credential_value(s) => Value::String(REDACTED.to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let v = if is_credential_key(k) {
                    Value::String(REDACTED.to_owned())
                } else {
                    redact(v)
                };
                let k = if is_credential_value(k) {
                    free_redacted_key(&out, map)
                } else {
                    k.clone()
                };
                out.insert(k, v);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `[redacted]`, or the first `[redacted] N` taken neither in the output nor
/// by a key of the input that will be copied there.
fn free_redacted_key(out: &Map<String, Value>, input: &Map<String, Value>) -> String {
    let taken = |k: &str| out.contains_key(k) || input.contains_key(k);
    if !taken(REDACTED) {
        return REDACTED.to_owned();
    }
    (2..)
        .map(|n| format!("{REDACTED} {n}"))
        .find(|k| !taken(k))
        .unwrap_or_default()
}

/// True when a key's name says it holds a secret (see the module docs).
pub fn is_credential_key(key: &str) -> bool {
    let folded: String = fold_confusables(key)
        .chars()
        .filter(|c| c.is_alphanumeric())
        .collect();
    WHOLE_KEYS.contains(&folded.as_str())
        || folded_fragments()
            .iter()
            .any(|f| folded.contains(f.as_str()))
        || key_words(key).any(|w| folded_words().contains(&w))
}

/// The words of a key, folded as keys are: split at anything that is not a
/// letter or digit and at a lower-to-upper case change (`cardPin`).
fn key_words(key: &str) -> impl Iterator<Item = String> {
    let normalized = for_matching(key);
    let mut words = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in normalized.chars() {
        if (!c.is_alphanumeric() || (prev_lower && c.is_uppercase())) && !word.is_empty() {
            words.push(fold_confusables(&std::mem::take(&mut word)));
        }
        if c.is_alphanumeric() {
            word.push(c);
        }
        prev_lower = c.is_lowercase();
    }
    if !word.is_empty() {
        words.push(fold_confusables(&word));
    }
    words.into_iter()
}

fn folded_words() -> &'static [String] {
    static FOLDED: OnceLock<Vec<String>> = OnceLock::new();
    FOLDED.get_or_init(|| KEY_WORDS.iter().map(|w| fold_confusables(w)).collect())
}

/// The key fragments folded the way keys are, so that whatever the skeleton
/// does to a letter it does on both sides.
fn folded_fragments() -> &'static [String] {
    static FOLDED: OnceLock<Vec<String>> = OnceLock::new();
    FOLDED.get_or_init(|| KEY_FRAGMENTS.iter().map(|f| fold_confusables(f)).collect())
}

/// True when a string is shaped like credential material (see the module
/// docs), wherever in it the material stands.
pub fn is_credential_value(s: &str) -> bool {
    let normalized = for_matching(s);
    let s = normalized.trim();
    has_private_key(s)
        || has_auth_scheme(s)
        || has_secret_assignment(s)
        || has_url_password(s)
        || words(s).any(|w| is_jwt(w) || is_api_key(w))
}

/// Walks `v`, keeping `path` pointing at the current node; on a find, returns
/// true with `path` left at the credential.
fn find_in(v: &Value, path: &mut String) -> bool {
    match v {
        Value::String(s) => is_credential_value(s),
        Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
            let len = path.len();
            path.push('/');
            path.push_str(&i.to_string());
            let found = find_in(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        Value::Object(map) => map.iter().any(|(k, item)| {
            let len = path.len();
            push_pointer_segment(path, k);
            let found = is_credential_key(k) || is_credential_value(k) || find_in(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// RFC 6901: `~` → `~0`, `/` → `~1`.
fn push_pointer_segment(path: &mut String, key: &str) {
    path.push('/');
    for c in key.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

/// PEM armour is upper case by RFC 7468; `PRIVATE KEY` without the dashes
/// also covers OpenPGP's `PRIVATE KEY BLOCK`.
fn has_private_key(s: &str) -> bool {
    s.find("-----BEGIN")
        .is_some_and(|at| s[at..].contains("PRIVATE KEY"))
}

/// `Bearer`/`Basic`, whitespace, then a token: the whole string (a token of
/// at least 8 characters), or anywhere in it (a token that looks generated).
fn has_auth_scheme(s: &str) -> bool {
    alnum_runs(s).any(|(start, end)| {
        if !is_scheme_word(&s[start..end]) {
            return false;
        }
        let after = &s[end..];
        let rest = after.trim_start();
        if rest.len() == after.len() {
            return false;
        }
        let token = rest.split(char::is_whitespace).next().unwrap_or_default();
        let whole = start == 0 && token.len() == rest.len();
        (whole && token.chars().count() >= 8) || looks_generated(token)
    })
}

fn is_scheme_word(w: &str) -> bool {
    if w.is_ascii() {
        w.eq_ignore_ascii_case("bearer") || w.eq_ignore_ascii_case("basic")
    } else {
        // Folding allocates; a long text in another script has many words, and
        // only short ones can look like these two.
        (3..=12).contains(&w.chars().count())
            && matches!(fold_confusables(w).as_str(), "bearer" | "basic")
    }
}

/// A token of RFC 6750 `b64token` characters, at least 8 long, that prose
/// would not produce: it has a digit, a symbol, or a capital after the first
/// letter. The quotes of a header written inside a command are not part of it.
fn looks_generated(token: &str) -> bool {
    let token = token.trim_matches(|c| matches!(c, '\'' | '"' | ',' | ';' | ')'));
    token.len() >= 8
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
        && token.bytes().enumerate().any(|(i, b)| {
            b.is_ascii_digit() || !b.is_ascii_alphanumeric() || (i > 0 && b.is_ascii_uppercase())
        })
}

/// Byte ranges of the maximal runs of alphanumeric characters.
fn alnum_runs(s: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut chars = s.char_indices().peekable();
    std::iter::from_fn(move || {
        let (start, _) = chars.by_ref().find(|(_, c)| c.is_alphanumeric())?;
        let mut end = s.len();
        while let Some(&(i, c)) = chars.peek() {
            if !c.is_alphanumeric() {
                end = i;
                break;
            }
            chars.next();
        }
        Some((start, end))
    })
}

/// `<secret-named key> = value` or `<key>: value`, the key and value perhaps
/// quoted (JSON or a header written inside a string).
fn has_secret_assignment(s: &str) -> bool {
    s.match_indices(['=', ':']).any(|(at, sep)| {
        let before = s[..at].trim_end();
        let before = before.strip_suffix(['"', '\'']).unwrap_or(before);
        let key_start = before
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_key_char(c))
            .last()
            .map_or(before.len(), |(i, _)| i);
        let key = &before[key_start..];
        // No secret name is shorter than `pwd`; skipping shorter keys before
        // folding keeps a string of many `a=` from costing a fold each.
        if key.chars().count() < 3 {
            return false;
        }
        let after = s[at + sep.len()..].trim_start();
        let (quoted, after) = match after.strip_prefix(['"', '\'']) {
            Some(rest) => (true, rest),
            None => (false, after),
        };
        // Six is the most any rule below asks for; counting further would make
        // a string of many separators ("a=a=a=...") quadratic.
        let value_chars = after
            .chars()
            .take_while(|&c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '&' | ';' | ','))
            .take(6)
            .count();
        let enough = match sep {
            "=" => value_chars >= 1,
            _ => value_chars >= 6 || (quoted && value_chars >= 1),
        };
        // A URL's "://" is a scheme, not an assignment.
        enough && !after.starts_with("//") && is_credential_key(key)
    })
}

fn is_key_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// `scheme://user:password@host`, with a non-empty password.
fn has_url_password(s: &str) -> bool {
    s.match_indices("://").any(|(at, _)| {
        let rest = &s[at + 3..];
        let authority = rest
            .split(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .next()
            .unwrap_or_default();
        authority.rsplit_once('@').is_some_and(|(userinfo, _)| {
            userinfo
                .split_once(':')
                .is_some_and(|(_, password)| !password.is_empty())
        })
    })
}

/// Candidate tokens inside a string: runs of characters that secrets are made of,
/// with sentence-ending dots trimmed. Emails split at `@` into harmless parts.
fn words(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        .map(|w| w.trim_matches('.'))
        .filter(|w| !w.is_empty())
}

fn is_base64url(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `header.payload.signature`, each base64url and at least 4 long, the header
/// starting `eyJ` (base64 of `{"`).
fn is_jwt(w: &str) -> bool {
    let mut parts = w.split('.');
    let (Some(h), Some(p), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    h.starts_with("eyJ")
        && [h, p, sig]
            .iter()
            .all(|seg| seg.len() >= 4 && is_base64url(seg))
}

/// What may follow a key prefix.
#[derive(Clone, Copy)]
enum Tail {
    /// `[A-Za-z0-9_-]`
    Key,
    /// `[A-Za-z0-9_.-]`
    KeyOrDot,
    /// `[0-9a-fA-F]`
    Hex,
    /// `[A-Z0-9]`
    UpperOrDigit,
}

impl Tail {
    fn allows(self, b: u8) -> bool {
        match self {
            Tail::Key => b.is_ascii_alphanumeric() || b == b'-' || b == b'_',
            Tail::KeyOrDot => b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'),
            Tail::Hex => b.is_ascii_hexdigit(),
            Tail::UpperOrDigit => b.is_ascii_uppercase() || b.is_ascii_digit(),
        }
    }
}

/// Key formats as (prefixes, least and most characters after the prefix,
/// which characters). The module docs list them by vendor.
const KEY_FORMATS: &[(&[&str], usize, usize, Tail)] = &[
    (&["AKIA", "ASIA"], 16, 16, Tail::UpperOrDigit),
    (
        &["ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"],
        20,
        usize::MAX,
        Tail::Key,
    ),
    (&["glpat-"], 20, usize::MAX, Tail::Key),
    (
        &["xoxa-", "xoxb-", "xoxp-", "xoxr-", "xoxs-", "xapp-"],
        8,
        usize::MAX,
        Tail::Key,
    ),
    (&["sk-"], 20, usize::MAX, Tail::Key),
    (
        &["sk_live_", "rk_live_", "sk_test_", "rk_test_"],
        8,
        usize::MAX,
        Tail::Key,
    ),
    (&["whsec_"], 20, usize::MAX, Tail::Key),
    (&["AIza"], 30, usize::MAX, Tail::Key),
    (&["ya29."], 20, usize::MAX, Tail::KeyOrDot),
    (&["npm_"], 30, usize::MAX, Tail::Key),
    (&["pypi-"], 32, usize::MAX, Tail::Key),
    (&["SK"], 32, 32, Tail::Hex),
    (
        &["shpat_", "shpss_", "shpca_", "shppa_"],
        32,
        usize::MAX,
        Tail::Hex,
    ),
    (
        &["dop_v1_", "doo_v1_", "dor_v1_"],
        32,
        usize::MAX,
        Tail::Hex,
    ),
    (&["hf_"], 30, usize::MAX, Tail::Key),
    (&["key-"], 32, usize::MAX, Tail::Hex),
];

/// Well-known API key formats ([`KEY_FORMATS`], and SendGrid's two-part one).
fn is_api_key(w: &str) -> bool {
    KEY_FORMATS.iter().any(|&(prefixes, min, max, tail)| {
        prefixes.iter().any(|p| {
            w.strip_prefix(p).is_some_and(|t| {
                (min..=max).contains(&t.len()) && t.bytes().all(|b| tail.allows(b))
            })
        })
    }) || is_sendgrid_key(w)
}

/// `SG.<id>.<secret>`, each part at least 16 key characters.
fn is_sendgrid_key(w: &str) -> bool {
    w.strip_prefix("SG.")
        .and_then(|t| t.split_once('.'))
        .is_some_and(|(id, secret)| {
            [id, secret]
                .iter()
                .all(|p| p.len() >= 16 && p.bytes().all(|b| Tail::Key.allows(b)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `name: params => expected path` for find_credential.
    macro_rules! finds {
        ($($name:ident: $v:expr => $want:expr,)*) => {$(
            #[test]
            fn $name() {
                let want: Option<&str> = $want;
                assert_eq!(find_credential(&$v).as_deref(), want);
            }
        )*};
    }

    finds! {
        test_password_key: json!({"user": "ann", "password": "x"}) => Some("/password"),
        test_authorization_header: json!({"headers": {"Authorization": "x"}}) => Some("/headers/Authorization"),
        test_api_key_snake: json!({"api_key": 1}) => Some("/api_key"),
        test_api_key_header_style: json!({"X-Api-Key": "k"}) => Some("/X-Api-Key"),
        test_dotted_client_secret: json!({"client.Secret": "k"}) => Some("/client.Secret"),
        test_access_key_with_space: json!({"Access Key": "k"}) => Some("/Access Key"),
        test_session_token_key: json!({"sessionToken": null}) => Some("/sessionToken"),
        test_cookie_key: json!({"Set-Cookie": "a=b"}) => Some("/Set-Cookie"),
        test_passphrase_key: json!({"ssh_passphrase": "p"}) => Some("/ssh_passphrase"),
        test_private_key_key: json!({"private_key": "p"}) => Some("/private_key"),
        test_credentials_key: json!({"credentials": {}}) => Some("/credentials"),
        test_passcode_key: json!({"passcode": "4721"}) => Some("/passcode"),
        test_pin_key: json!({"pin": "4721"}) => Some("/pin"),
        test_card_pin_camel_key: json!({"cardPin": "4721"}) => Some("/cardPin"),
        test_pin_code_key: json!({"pin_code": "4721"}) => Some("/pin_code"),
        test_otp_key: json!({"otp": "123456"}) => Some("/otp"),
        test_totp_key: json!({"user": {"totp": "123456"}}) => Some("/user/totp"),
        test_seed_phrase_key: json!({"seed_phrase": "x"}) => Some("/seed_phrase"),
        test_cvv_key: json!({"cvv": "123"}) => Some("/cvv"),
        test_words_that_hold_pin_are_not_secrets: json!({"spinner": 1, "shipping": 2, "opinion": 3, "pinned_at": 4, "footprint": 5, "option": 6}) => None,
        test_session_key_key: json!({"session-key": "x"}) => Some("/session-key"),
        test_passwd_key: json!({"PASSWD": "x"}) => Some("/PASSWD"),
        test_auth_whole_key: json!({"Auth": "x"}) => Some("/Auth"),
        test_key_in_array: json!({"items": [{"ok": 1}, {"token": "t"}]}) => Some("/items/1/token"),
        test_pointer_escaping: json!({"a/b": {"~secret": 1}}) => Some("/a~1b/~0secret"),
        test_bearer_value: json!({"h": "Bearer abcdefgh12345"}) => Some("/h"),
        test_bearer_lowercase_padded: json!({"h": "  bearer   abc.def-ghi  "}) => Some("/h"),
        test_basic_value: json!({"h": "Basic dXNlcjpwYXNzd29yZA=="}) => Some("/h"),
        test_jwt_value: json!(["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"]) => Some("/0"),
        test_jwt_inside_text: json!({"note": "use eyJhbGciOi.eyJzdWIi.abcd1234 please"}) => Some("/note"),
        test_pem_private_key: json!({"k": "-----BEGIN RSA PRIVATE KEY-----\nMII...\n-----END RSA PRIVATE KEY-----"}) => Some("/k"),
        test_aws_access_key_id: json!({"note": "key AKIAIOSFODNN7EXAMPLE."}) => Some("/note"),
        test_aws_temporary_key_id: json!({"x": "ASIAIOSFODNN7EXAMPLE"}) => Some("/x"),
        test_github_pat: json!({"x": "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"}) => Some("/x"),
        test_github_fine_grained: json!({"x": "github_pat_11ABCDEFG0123456789_abcdef"}) => Some("/x"),
        test_slack_bot_token: json!({"x": "xoxb-123456789-abcdefgh"}) => Some("/x"),
        test_openai_key: json!({"x": "sk-proj-abcdefghijklmnopqrstuv"}) => Some("/x"),
        test_stripe_live_key: json!({"x": "sk_live_51Habcdefgh"}) => Some("/x"),
        test_stripe_restricted_key: json!({"x": "rk_live_51Habcdefgh"}) => Some("/x"),
        test_root_string: json!("Bearer abcdefgh12345") => Some(""),
        test_first_found_wins: json!({"a": ["Bearer abcdefgh12345"], "b": {"secret": 1}}) => Some("/a/0"),

        // Reported bypasses: each was missed by the previous detector.
        test_attack_scheme_after_prefix: json!({"h": "Authorization: Bearer abcdefgh12345"}) => Some("/h"),
        test_attack_scheme_after_header_name_only: json!({"h": "curl -H 'Bearer abcdefgh12345'"}) => Some("/h"),
        test_attack_tab_after_bearer: json!({"h": "Bearer\tabcdefgh12345"}) => Some("/h"),
        test_attack_newline_after_basic: json!({"h": "Basic\ndXNlcjpwYXNzd29yZA=="}) => Some("/h"),
        test_attack_url_userinfo_postgres: json!({"dsn": "postgres://u:pass@host/db"}) => Some("/dsn"),
        test_attack_url_userinfo_https: json!({"remote": "git clone https://user:token@github.com/x/y"}) => Some("/remote"),
        test_attack_url_userinfo_empty_user: json!({"u": "redis://:hunter2@cache:6379"}) => Some("/u"),
        test_attack_password_assignment: json!({"note": "password=hunter2"}) => Some("/note"),
        test_attack_api_key_colon: json!({"note": "api_key: xyz123abc"}) => Some("/note"),
        test_attack_quoted_json_in_string: json!({"note": "{\"password\": \"x\"}"}) => Some("/note"),
        test_attack_token_assignment: json!({"note": "use token=abc then"}) => Some("/note"),
        test_attack_client_secret_assignment: json!({"env": "CLIENT_SECRET=s3cr3t"}) => Some("/env"),
        test_attack_query_string_token: json!({"url": "https://api.example.com/v1?x=1&access_token=abc123"}) => Some("/url"),
        test_attack_odbc_pwd: json!({"cs": "Server=db;Uid=app;Pwd=hunter2;"}) => Some("/cs"),
        test_attack_azure_account_key: json!({"cs": "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=bXlrZXk=;EndpointSuffix=core.windows.net"}) => Some("/cs"),
        test_attack_google_api_key: json!({"x": "AIzaSyA1234567890abcdefghijklmnopqrstu"}) => Some("/x"),
        test_attack_google_oauth_token: json!({"x": "ya29.a0AfH6SMBxyzABCDEFGHIJKLMNOP"}) => Some("/x"),
        test_attack_gitlab_pat: json!({"x": "glpat-abcdefghij0123456789"}) => Some("/x"),
        test_attack_npm_token: json!({"x": "npm_abcdefghijklmnopqrstuvwxyz0123456789"}) => Some("/x"),
        test_attack_pypi_token: json!({"x": "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcA"}) => Some("/x"),
        test_attack_anthropic_key: json!({"x": "key sk-ant-api03-abcdefghijklmnopqrstuvwxyz"}) => Some("/x"),
        test_attack_sendgrid_key: json!({"x": "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"}) => Some("/x"),
        test_attack_twilio_api_key: json!({"x": "SK0123456789abcdef0123456789abcdef"}) => Some("/x"),
        test_attack_slack_legacy_tokens: json!(["xoxa-2-abcdefgh", "xoxr-12345678", "xoxs-12345678"]) => Some("/0"),
        test_attack_shopify_token: json!({"x": "shpat_0123456789abcdef0123456789abcdef"}) => Some("/x"),
        test_attack_shopify_shared_secret: json!({"x": "shpss_0123456789abcdef0123456789abcdef"}) => Some("/x"),
        test_attack_digitalocean_token: json!({"x": "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}) => Some("/x"),
        test_attack_hugging_face_token: json!({"x": "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"}) => Some("/x"),
        test_attack_mailgun_key: json!({"x": "key-0123456789abcdef0123456789abcdef"}) => Some("/x"),
        test_attack_stripe_webhook_secret: json!({"x": "whsec_abcdefghijklmnopqrstuvwxyz012345"}) => Some("/x"),
        test_attack_fullwidth_key: json!({"ｐａｓｓｗｏｒｄ": "x"}) => Some("/ｐａｓｓｗｏｒｄ"),
        test_attack_cyrillic_key: json!({"\u{0440}\u{0430}ssword": "x"}) => Some("/\u{0440}\u{0430}ssword"),
        test_attack_digit_look_alike_key: json!({"t0ken": "x"}) => Some("/t0ken"),
        test_attack_zero_width_in_key: json!({"pass\u{200B}word": "x"}) => Some("/pass\u{200B}word"),
        test_attack_fullwidth_assignment: json!({"n": "ｐａｓｓｗｏｒｄ＝hunter2"}) => Some("/n"),
        test_attack_cyrillic_assignment: json!({"n": "\u{0440}\u{0430}ssword=hunter2"}) => Some("/n"),
        test_attack_zero_width_in_bearer: json!({"h": "Bear\u{200B}er abcdefgh12345"}) => Some("/h"),
        test_attack_zero_width_in_prefix: json!({"x": "ghp_\u{200B}aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"}) => Some("/x"),
        test_attack_soft_hyphens_in_key: json!({"x": "AKIA\u{AD}IOSFODNN7\u{AD}EXAMPLE"}) => Some("/x"),
        test_attack_fullwidth_token: json!({"x": "ｇｈｐ＿aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"}) => Some("/x"),
        test_attack_nbsp_after_bearer: json!({"h": "Bearer\u{A0}abcdefgh12345"}) => Some("/h"),
        test_attack_secret_as_object_key: json!({"m": {"ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345": 1}}) => Some("/m/ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"),

        test_plain_params: json!({"to": "ann@example.com", "subject": "Q3 numbers", "n": 3}) => None,
        test_basic_in_prose: json!({"text": "We need a basic understanding of it"}) => None,
        test_bearer_in_prose: json!({"text": "The bearer instrument is payable"}) => None,
        test_password_colon_prose: json!({"text": "Reset your password: click the link below"}) => None,
        test_token_word_prose: json!({"text": "The token count is 5, see the secret garden"}) => None,
        test_url_with_query: json!({"url": "https://example.com/path?page=2&sort=asc"}) => None,
        test_url_with_user_only: json!({"url": "ssh://git@github.com/x/y and mailto:ann@example.com"}) => None,
        test_url_port_not_password: json!({"url": "https://example.com:8443/x@y"}) => None,
        test_author_assignment: json!({"q": "author=Ann&year=2024"}) => None,
        test_time_colons: json!({"text": "Meeting time: 10:30, room: B-12"}) => None,
        test_prefix_words_are_not_keys: json!({"text": "the key-value store, hf_hub, SKU SKATEBOARD, npm_install, AIza"}) => None,
        test_sendgrid_short: json!({"x": "SG.abc.def"}) => None,
        test_twilio_not_hex: json!({"x": "SK0123456789abcdef0123456789abcdeg"}) => None,
        test_email_with_token_word: json!({"to": "token.holder@example.com"}) => None,
        test_tokenize_in_value: json!({"text": "We tokenize the input and authorize the password reset flow"}) => None,
        test_bearer_prose: json!({"text": "Bearer of bad news"}) => None,
        test_basic_prose: json!({"text": "basic plan"}) => None,
        test_bearer_short: json!({"text": "Bearer abc"}) => None,
        test_author_key: json!({"author": "ann", "oauth_provider": "google", "authors": []}) => None,
        test_sk_short: json!({"lib": "sk-learn"}) => None,
        test_akia_wrong_length: json!({"x": "AKIAIOSFODNN7EXAMPL"}) => None,
        test_akia_lowercase: json!({"x": "AKIAiosfodnn7example"}) => None,
        test_two_dots_not_jwt: json!({"v": "eyJ.ab.cd", "ver": "1.2.3", "host": "eyJfoo.example.com"}) => None,
        test_public_key_pem: json!({"k": "-----BEGIN PUBLIC KEY-----\nMII..."}) => None,
        test_numbers_and_bools: json!([1, true, null, 2.5]) => None,
        test_empty: json!({}) => None,
    }

    #[test]
    fn test_redact_replaces_keys_and_values_and_keeps_the_rest() {
        let v = json!({
            "headers": {"Authorization": {"nested": "whatever"}, "Accept": "text/plain"},
            "list": ["fine", "Bearer abcdefgh12345", 3],
            "api_key": 42,
            "ok": {"password_hint": "x"}
        });
        assert_eq!(
            redact(&v),
            json!({
                "headers": {"Authorization": "[redacted]", "Accept": "text/plain"},
                "list": ["fine", "[redacted]", 3],
                "api_key": "[redacted]",
                "ok": {"password_hint": "[redacted]"}
            })
        );
    }

    #[test]
    fn test_redacted_output_has_no_credential_values() {
        let v = json!({"a": ["eyJhbGciOi.eyJzdWIi.abcd1234"], "b": {"c": "sk_live_51Habcdefgh"}});
        let r = redact(&v);
        assert_eq!(r, json!({"a": ["[redacted]"], "b": {"c": "[redacted]"}}));
        assert_eq!(find_credential(&r), None);
    }

    #[test]
    fn test_many_separators_and_schemes_stay_linear() {
        // Each would take hours if a rule rescanned the rest of the string at
        // every separator or scheme word. The scan runs on a thread of its
        // own so that a quadratic rule fails this test (the bound is minutes
        // of slack over milliseconds of work) instead of hanging the suite;
        // each answer is checked too, so a rule that gave up early on long
        // input would fail as well.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (unit, want) in [
                ("a=", false),
                ("a: ", false),
                ("x://", false),
                ("Bearer ", false),
                ("://a:", false),
                ("=\"", false),
                ("basic b", false),
                ("password=", true),
            ] {
                let s = unit.repeat(50_000);
                let _ = tx.send((unit, is_credential_value(&s), want));
            }
        });
        for _ in 0..8 {
            let (unit, got, want) = rx
                .recv_timeout(std::time::Duration::from_secs(120))
                .expect("each long input is judged in linear time, not hours");
            assert_eq!(got, want, "{unit:?} × 50,000");
        }
    }

    #[test]
    fn test_redact_leaves_clean_values_untouched() {
        let v = json!({"to": "ann@example.com", "n": [1, 2, {"x": null}]});
        assert_eq!(redact(&v), v);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// Strings each rule above detects.
        const SECRETS: &[&str] = &[
            "Bearer abcdefgh12345",
            "Authorization: Bearer abcdefgh12345",
            "Basic dXNlcjpwYXNzd29yZA==",
            "password=hunter2",
            "api_key: xyz123abc",
            "https://user:token@github.com/x",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "AKIAIOSFODNN7EXAMPLE",
            "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
            "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
            "xoxb-123456789-abcdefgh",
            "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH",
            "-----BEGIN RSA PRIVATE KEY-----\nMII",
        ];

        /// Characters that draw nothing.
        const INVISIBLE: &[char] = &[
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{00AD}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{115F}',
            '\u{E0041}',
            '\u{FE0F}',
            '\u{202E}',
            '\u{2066}',
            '\u{180E}',
        ];

        fn with_invisible(s: &str, at: &[(usize, usize)]) -> String {
            let mut out: Vec<char> = s.chars().collect();
            let mut inserts: Vec<(usize, char)> = at
                .iter()
                .map(|&(pos, which)| (pos % (out.len() + 1), INVISIBLE[which % INVISIBLE.len()]))
                .collect();
            inserts.sort_unstable();
            for (pos, c) in inserts.into_iter().rev() {
                out.insert(pos, c);
            }
            out.into_iter().collect()
        }

        /// Fullwidth forms of ASCII letters and digits, which NFKC maps back.
        fn fullwidth(s: &str, mask: u64) -> String {
            s.chars()
                .enumerate()
                .map(|(i, c)| {
                    if c.is_ascii_alphanumeric() && mask >> (i % 64) & 1 == 1 {
                        char::from_u32(u32::from(c) - 0x21 + 0xFF01).unwrap_or(c)
                    } else {
                        c
                    }
                })
                .collect()
        }

        /// Every string and key of `v` is clean, except a credential-named
        /// key whose value was replaced.
        fn assert_clean(v: &Value) -> Result<(), TestCaseError> {
            match v {
                Value::String(s) => prop_assert!(!is_credential_value(s), "{s:?}"),
                Value::Array(items) => items.iter().try_for_each(assert_clean)?,
                Value::Object(map) => {
                    for (k, v) in map {
                        prop_assert!(!is_credential_value(k), "{k:?}");
                        if is_credential_key(k) {
                            prop_assert_eq!(v, &json!(REDACTED));
                        } else {
                            assert_clean(v)?;
                        }
                    }
                }
                _ => {}
            }
            Ok(())
        }

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::sample::select(SECRETS).prop_map(str::to_owned),
                "[a-zA-Z0-9 _.:=@/-]{0,40}",
                any::<String>(),
                Just("[redacted]".to_owned()),
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("password".to_owned()),
                Just("X-Api-Key".to_owned()),
                Just("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345".to_owned()),
                Just("[redacted]".to_owned()),
                "[a-z]{1,8}",
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                text().prop_map(Value::String),
                any::<i64>().prop_map(|n| json!(n)),
                Just(Value::Null),
            ];
            leaf.prop_recursive(3, 32, 5, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    proptest::collection::btree_map(key(), inner, 0..5)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn prop_invisible_characters_never_hide_a_secret(
                secret in proptest::sample::select(SECRETS),
                at in proptest::collection::vec((any::<usize>(), any::<usize>()), 0..8),
            ) {
                let hidden = with_invisible(secret, &at);
                prop_assert!(is_credential_value(&hidden), "{hidden:?}");
                let in_prose = format!("please use {hidden} for it");
                prop_assert!(is_credential_value(&in_prose), "{in_prose:?}");
            }

            #[test]
            fn prop_fullwidth_letters_never_hide_a_secret(
                secret in proptest::sample::select(SECRETS), mask in any::<u64>()
            ) {
                let wide = fullwidth(secret, mask);
                prop_assert!(is_credential_value(&wide), "{wide:?}");
            }

            #[test]
            fn prop_disguised_key_names_are_still_found(
                name in proptest::sample::select(&["password", "api_key", "client_secret", "access_token"][..]),
                at in proptest::collection::vec((any::<usize>(), any::<usize>()), 0..4),
                mask in any::<u64>(),
            ) {
                let key = with_invisible(&fullwidth(name, mask), &at);
                prop_assert!(is_credential_key(&key), "{key:?}");
                let v = json!({ "k": { key.clone(): 1 } });
                prop_assert!(find_credential(&v).is_some(), "{key:?}");
            }

            #[test]
            fn prop_redact_leaves_nothing_detectable(v in value()) {
                assert_clean(&redact(&v))?;
            }

            #[test]
            fn prop_find_and_redact_agree(v in value()) {
                match find_credential(&v) {
                    Some(path) => prop_assert!(v.pointer(&path).is_some(), "{path}"),
                    // Nothing found, so nothing to redact.
                    None => prop_assert_eq!(redact(&v), v),
                }
            }
        }
    }
}
