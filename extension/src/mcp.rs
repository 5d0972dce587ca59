//! Tools discovered on an upstream MCP server, as keyturn registers them:
//! keyturn-core `upstream` decides read or write (fail closed), the params
//! schema and the definition's hash; `keyturn.register_discovered_tool`
//! (sql/063_mcp.sql) registers what this returns.

use keyturn_core::upstream;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::error::{KeyturnError, OrRaise};
use crate::jsonb_text::JsonbText;

/// What keyturn makes of one tool of an upstream's `tools/list`:
/// `{"tool": <its name upstream>, "kind", "sha256", "params_schema",
/// "description"}`. 22023 for a definition without a string `name`, or whose
/// `inputSchema` keyturn cannot check.
#[pg_extern(name = "_upstream_tool", immutable, strict, parallel_safe)]
fn upstream_tool(definition: JsonbText, trust_annotations: bool) -> JsonB {
    let definition = keyturn_core::canonical::parse_bounded(&definition.0).or_raise();
    let Some(name) = definition.get("name").and_then(|n| n.as_str()) else {
        KeyturnError::InvalidArgument {
            message: "an upstream tool definition must be a JSON object with a string name".into(),
            hint: "Pass the JSON object of one tool as the upstream's tools/list gave it.",
        }
        .raise()
    };
    let sha256 = upstream::definition_sha256(&definition).or_raise();
    let input = definition
        .get("inputSchema")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let params_schema = upstream::params_schema(&input).or_raise();
    let description = definition
        .get("description")
        .and_then(|d| d.as_str())
        .map(|d| d.chars().take(2000).collect::<String>());
    JsonB(json!({
        "tool": name,
        "kind": upstream::classify(&definition, trust_annotations).word(),
        "sha256": sha256,
        "params_schema": params_schema,
        "description": description,
    }))
}
