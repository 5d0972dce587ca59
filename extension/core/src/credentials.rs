//! Detecting credential material, so it is never stored.
//!
//! Proposals, audit rows and receipts are kept for a long time and read by many
//! people; a password or API key pasted into params would leak through all of
//! them. `propose` therefore refuses params holding anything credential-shaped
//! ([`find_credential`]), and receipts are stored [`redact`]ed.
//!
//! Two signals, deliberately biased toward false positives (a refused proposal
//! is cheap, a stored secret is not):
//!
//! * keys whose normalized name mentions a secret (`api_key`, `X-Auth-Token`,
//!   `client.secret`) — whatever their value;
//! * string values shaped like a secret (`Bearer …`, JWTs, PEM private keys and
//!   well-known API-key formats), wherever they occur.
//!
//! Matching is hand-written: the shapes are simple, and a regex engine would add
//! a dependency and its own worst cases to a hot path.

use serde_json::{Map, Value};

/// What replaces credential material in redacted output.
pub const REDACTED: &str = "[redacted]";

/// Substrings of a normalized key that mark it as holding a secret.
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
    "sessionkey",
    "cookie",
    "clientsecret",
];

/// Normalized keys that mark a secret only when they are the whole key
/// (`auth` is a secret; `author` and `oauth_provider` are not).
const WHOLE_KEYS: &[&str] = &["auth"];

/// JSON-pointer path (RFC 6901) of the first credential in `v`, depth first with
/// object members in key order, or `None` if there is none.
pub fn find_credential(v: &Value) -> Option<String> {
    let mut path = String::new();
    find_in(v, &mut path).then_some(path)
}

/// A copy of `v` with the value of every credential-shaped key, and every
/// credential-shaped string, replaced by `"[redacted]"`.
pub fn redact(v: &Value) -> Value {
    match v {
        Value::String(s) if is_credential_value(s) => Value::String(REDACTED.to_owned()),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_credential_key(k) {
                        Value::String(REDACTED.to_owned())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
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
            let found = is_credential_key(k) || find_in(item, path);
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

/// Lowercase, without `-`, `_`, `.` and spaces, so `X-Api-Key`, `api_key` and
/// `API.Key` all read `xapikey`/`apikey`.
fn is_credential_key(key: &str) -> bool {
    let normalized: String = key
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    WHOLE_KEYS.contains(&normalized.as_str())
        || KEY_FRAGMENTS.iter().any(|f| normalized.contains(f))
}

fn is_credential_value(s: &str) -> bool {
    let trimmed = s.trim();
    has_auth_scheme(trimmed)
        || (trimmed.contains("-----BEGIN") && trimmed.contains("PRIVATE KEY-----"))
        || words(trimmed).any(|w| is_jwt(w) || is_api_key(w))
}

/// `Bearer <token>` / `Basic <token>`: the scheme, then one unbroken run of at
/// least 8 characters. Prose such as "Bearer of bad news" has spaces and is not.
fn has_auth_scheme(s: &str) -> bool {
    ["bearer ", "basic "].iter().any(|scheme| {
        strip_prefix_ignore_case(s, scheme).is_some_and(|rest| {
            let rest = rest.trim_start();
            rest.chars().count() >= 8 && !rest.contains(char::is_whitespace)
        })
    })
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
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

/// Well-known API key formats.
fn is_api_key(w: &str) -> bool {
    let tail = |prefix: &str| w.strip_prefix(prefix);
    let key_chars = |s: &str, min: usize| {
        s.len() >= min
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    // AWS access key ids: AKIA (long-term) / ASIA (temporary) + 16 [A-Z0-9].
    let aws = ["AKIA", "ASIA"].iter().any(|p| {
        tail(p).is_some_and(|t| {
            t.len() == 16
                && t.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
    });
    // GitHub tokens (personal, OAuth, server, user-to-server, refresh, fine-grained).
    let github = ["ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"]
        .iter()
        .any(|p| tail(p).is_some_and(|t| key_chars(t, 20)));
    // Slack bot/user/app tokens.
    let slack = ["xoxb-", "xoxp-", "xapp-"]
        .iter()
        .any(|p| tail(p).is_some_and(|t| key_chars(t, 8)));
    // OpenAI-style `sk-…`; Stripe secret and restricted keys (live and test).
    let sk = tail("sk-").is_some_and(|t| key_chars(t, 20));
    let stripe = ["sk_live_", "rk_live_", "sk_test_", "rk_test_"]
        .iter()
        .any(|p| tail(p).is_some_and(|t| key_chars(t, 8)));
    aws || github || slack || sk || stripe
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

        test_plain_params: json!({"to": "ann@example.com", "subject": "Q3 numbers", "n": 3}) => None,
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
    fn test_redact_leaves_clean_values_untouched() {
        let v = json!({"to": "ann@example.com", "n": [1, 2, {"x": null}]});
        assert_eq!(redact(&v), v);
    }
}
