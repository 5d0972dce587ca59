//! The upstream MCP servers of the TOML file (`[[mcp_upstream]]`).

use std::path::Path;

use axum::http::HeaderValue;

use super::Secret;
use crate::error::Error;

/// One `[[mcp_upstream]]` of the TOML file, its header values resolved.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Its name: the prefix of its tools in keyturn (`<name>.<tool>`).
    pub name: String,
    /// Its Streamable HTTP endpoint.
    pub url: url::Url,
    /// HTTP headers sent to it (credentials: configuration only, never
    /// logged, never a param, never in a receipt).
    pub headers: Vec<(String, Secret)>,
    /// Whether its `readOnlyHint: true` makes a tool a read tool.
    pub trust_annotations: bool,
}

/// An `[[mcp_upstream]]` as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamToml {
    name: String,
    url: String,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    trust_annotations: bool,
}

/// The TOML file's key for the upstream MCP servers.
pub(super) const UPSTREAM_KEY: &str = "mcp_upstream";

/// The `[[mcp_upstream]]` tables of the TOML file at `path`; a header value
/// `env:NAME` is read from the environment (unset: an error naming the
/// variable, never its value).
pub fn read_upstreams(path: &Path) -> Result<Vec<Upstream>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| Error::Config(format!("{} is not valid TOML: {e}", path.display())))?;
    let Some(raw) = table.remove(UPSTREAM_KEY) else {
        return Ok(Vec::new());
    };
    let raw: Vec<UpstreamToml> = raw.try_into().map_err(|e| {
        Error::Config(format!(
            "{}: [[{UPSTREAM_KEY}]] takes name, url, headers and trust_annotations: {e}",
            path.display()
        ))
    })?;
    let mut out = Vec::with_capacity(raw.len());
    for u in raw {
        let bad = |why: String| Error::Config(format!("[[{UPSTREAM_KEY}]] {:?}: {why}", u.name));
        // The database's rule for an upstream's name (keyturn._name_ok, one
        // part), said here too so that a bad file fails at start rather than
        // at every discovery.
        if !u.name.starts_with(|c: char| c.is_ascii_alphabetic())
            || !u
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || u.name.len() > 30
        {
            return Err(bad(
                "name must be 1 to 30 ASCII letters, digits, underscores and hyphens, starting with a letter".into(),
            ));
        }
        // Apart in case only, their tools would be a case apart (which the
        // database refuses).
        if out
            .iter()
            .any(|o: &Upstream| o.name.eq_ignore_ascii_case(&u.name))
        {
            return Err(bad("two upstreams have this name (in some case)".into()));
        }
        let url = url::Url::parse(&u.url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| bad("url must be an http:// or https:// URL".into()))?;
        let mut headers = Vec::with_capacity(u.headers.len());
        for (name, value) in &u.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(bad(format!(
                    "header name {name:?} is not an HTTP header name"
                )));
            }
            let value = match value.strip_prefix("env:") {
                Some(var) => std::env::var(var)
                    .map_err(|_| bad(format!("header {name} names env:{var}, which is not set")))?,
                None => value.clone(),
            };
            if HeaderValue::from_str(&value).is_err() {
                // Never the value: it is a credential.
                return Err(bad(format!(
                    "header {name}'s value is not a valid HTTP header value"
                )));
            }
            headers.push((name.clone(), Secret::from(value)));
        }
        out.push(Upstream {
            name: u.name,
            url,
            headers,
            trust_annotations: u.trust_annotations,
        });
    }
    Ok(out)
}
