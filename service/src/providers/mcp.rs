//! The `mcp` provider: an approved call of a tool discovered on an upstream
//! MCP server (`<upstream>.<tool>`), sent as exactly one `tools/call` with
//! the approved arguments, byte-identical on every attempt, and
//! `_meta: {"idempotency_key": <the action's key>}`.
//!
//! Right before it, the worker asks this provider for the upstream's live
//! definition of the tool ([`Provider::live_definition`]) and the database
//! whether it is the approved one (`keyturn.check_upstream_tool`); if not,
//! nothing is sent and the action is `invalidated`.
//!
//! | what happened | outcome |
//! |---|---|
//! | no session could be opened, the connection was refused, the live definition could not be read | `retry` (nothing sent) |
//! | a result with `isError: true` | `failed` |
//! | a result | `succeeded` |
//! | a JSON-RPC error, a timeout, a reset, anything else once the request may have left | `unknown` → `uncertain` |
//!
//! The receipt keeps whether the result was an error, how many content
//! blocks it had and whether it had structured content: never a body, an
//! argument or a header.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::attachments::Attachment;
use super::{lapsed, not_sent, BoxFuture, CallResult, Provider};
use crate::classify::Outcome;
use crate::db::LeasedJob;
use crate::mcp::upstream::{CallError, Upstreams};

/// Delay asked for when the tool's upstream is not configured here.
const NO_UPSTREAM_DELAY: Duration = Duration::from_secs(60);

/// The `mcp` provider.
pub struct McpProvider {
    upstreams: Arc<Upstreams>,
}

impl McpProvider {
    /// The provider over these upstreams.
    pub fn new(upstreams: Arc<Upstreams>) -> Self {
        McpProvider { upstreams }
    }
}

/// `<upstream>.<tool>` → (upstream, tool): keyturn names a discovered tool
/// so, and upstream names hold no dot.
fn split(tool: &str) -> Option<(&str, &str)> {
    tool.split_once('.')
}

impl Provider for McpProvider {
    fn name(&self) -> &'static str {
        "mcp"
    }

    fn takes_attachments(&self) -> bool {
        false
    }

    fn live_definition<'a>(
        &'a self,
        job: &'a LeasedJob,
        by: Instant,
    ) -> BoxFuture<'a, Result<Option<Value>, CallResult>> {
        Box::pin(async move {
            let Some((upstream, tool)) = split(&job.tool) else {
                return Ok(Some(Value::Null));
            };
            let Some(u) = self.upstreams.get(upstream) else {
                tracing::warn!(
                    upstream,
                    "the tool's upstream is not configured in this keyturnd; handing the job back"
                );
                return Err(not_sent(
                    Outcome::Retry {
                        after: Some(NO_UPSTREAM_DELAY),
                    },
                    "the tool's upstream is not configured in this keyturnd; nothing sent",
                ));
            };
            match u.definition(tool, by).await {
                // A tool the upstream no longer lists is a changed one.
                Ok(def) => Ok(Some(def.unwrap_or(Value::Null))),
                Err(e) => {
                    tracing::warn!(upstream, error = %e, "could not read the upstream's live definition; nothing sent, recording retry");
                    Err(not_sent(
                        Outcome::Retry { after: None },
                        "the upstream's live tool definition could not be read; nothing sent",
                    ))
                }
            }
        })
    }

    fn call<'a>(
        &'a self,
        job: &'a LeasedJob,
        _attachments: &'a [Attachment],
        by: Instant,
    ) -> BoxFuture<'a, CallResult> {
        Box::pin(async move {
            let (Some((upstream, tool)), Value::Object(arguments)) =
                (split(&job.tool), job.params.clone())
            else {
                return not_sent(Outcome::Failed, "not an upstream MCP tool call");
            };
            let Some(u) = self.upstreams.get(upstream) else {
                return not_sent(
                    Outcome::Retry {
                        after: Some(NO_UPSTREAM_DELAY),
                    },
                    "the tool's upstream is not configured in this keyturnd; nothing sent",
                );
            };
            if Instant::now() >= by {
                return lapsed();
            }
            let mut meta = Map::new();
            meta.insert("idempotency_key".into(), json!(job.idempotency_key));
            match u.call(tool, arguments, Some(meta), by).await {
                Ok(result) => {
                    let is_error = result.is_error == Some(true);
                    CallResult {
                        outcome: if is_error {
                            Outcome::Failed
                        } else {
                            Outcome::Succeeded
                        },
                        receipt: json!({
                            "is_error": is_error,
                            "content_blocks": result.content.len(),
                            "structured": result.structured_content.is_some(),
                        }),
                    }
                }
                Err(CallError::NotSent(why)) => {
                    tracing::warn!(upstream, reason = %why, "upstream call not sent; recording retry");
                    not_sent(
                        Outcome::Retry { after: None },
                        "the upstream could not be reached; nothing sent",
                    )
                }
                Err(CallError::Rpc(e)) => {
                    tracing::warn!(
                        upstream,
                        code = e.code.0,
                        "upstream answered the call with a JSON-RPC error; recording unknown"
                    );
                    CallResult {
                        outcome: Outcome::Unknown,
                        receipt: json!({"error": "a JSON-RPC error after the request left", "code": e.code.0}),
                    }
                }
                Err(CallError::AfterSend(why)) => {
                    tracing::error!(upstream, reason = %why, "upstream call failed after it may have been sent; recording unknown");
                    CallResult {
                        outcome: Outcome::Unknown,
                        receipt: json!({"error": "the call failed after the request may have left"}),
                    }
                }
            }
        })
    }
}
