//! What a leased job's provider reads besides its params: the files an
//! action sends, and what a notification says now.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;
use uuid::Uuid;

use super::{get, query_for, query_one_for};
use crate::error::Error;

/// One file an action sends, as `keyturn.attachments` lists it.
#[derive(Clone, Debug)]
pub struct ListedFile {
    /// The params key whose list names it (the tool's `attachments_param`).
    pub param: String,
    /// The staged file.
    pub file_id: Uuid,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    /// The name it is sent under.
    pub filename: String,
    /// `type/subtype`.
    pub content_type: String,
    /// Length in bytes.
    pub size: i64,
}

/// `keyturn.attachments(action_id, lease_id)`: the files an action sends,
/// from its approved params, in their order; none when its tool takes no
/// attachments. `55000` unless it is leased or executing under this lease.
pub async fn attachments(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
) -> Result<Vec<ListedFile>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let rows = query_for(
        client,
        tenant,
        "SELECT param, file_id, sha256, filename, content_type, size \
                   FROM keyturn.attachments($1, $2) ORDER BY ord",
        "SELECT param, file_id, sha256, filename, content_type, size \
                   FROM keyturn.attachments_for($3, $1, $2) ORDER BY ord",
        &params,
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ListedFile {
                param: get(r, "param")?,
                file_id: get(r, "file_id")?,
                sha256: get(r, "sha256")?,
                filename: get(r, "filename")?,
                content_type: get(r, "content_type")?,
                size: get(r, "size")?,
            })
        })
        .collect()
}

/// `keyturn.file_content(action_id, lease_id, file_id)`: the bytes of one
/// attachment of an action `executing` under this lease (else `55000`).
/// Never log or store what it returns.
pub async fn file_content(
    client: &Client,
    tenant: Option<&str>,
    action_id: Uuid,
    lease_id: Uuid,
    file_id: Uuid,
) -> Result<Vec<u8>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&action_id, Type::UUID),
        (&lease_id, Type::UUID),
        (&file_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let row = query_one_for(
        client,
        tenant,
        "SELECT keyturn.file_content($1, $2, $3) AS content",
        "SELECT keyturn.file_content_for($4, $1, $2, $3) AS content",
        &params,
    )
    .await?;
    get(&row, "content")
}

/// `keyturn.notification_message(notification_id, lease_id)`, or
/// `keyturn.notification_message_for(tenant, …)`: what the notification
/// `executing` under this lease says now, with a fresh link code (else
/// `55000`). Never log what it returns.
pub async fn notification_message(
    client: &Client,
    tenant: Option<&str>,
    id: Uuid,
    lease_id: Uuid,
) -> Result<crate::providers::notify::Message, Error> {
    const COLUMNS: &str = "send, reason, channel, target, secret, kind, title, body, actions, \
                           link_action_ids, code, code_expires_at, waiting";
    let params: [(&(dyn ToSql + Sync), Type); 3] = [
        (&id, Type::UUID),
        (&lease_id, Type::UUID),
        (&tenant, Type::TEXT),
    ];
    let row = query_one_for(
        client,
        tenant,
        &format!("SELECT {COLUMNS} FROM keyturn.notification_message($1, $2)"),
        &format!("SELECT {COLUMNS} FROM keyturn.notification_message_for($3, $1, $2)"),
        &params,
    )
    .await?;
    let text = |col: &str| -> Result<String, Error> {
        Ok(get::<Option<String>>(&row, col)?.unwrap_or_default())
    };
    let secret = |col: &str| -> Result<Option<crate::config::Secret>, Error> {
        Ok(get::<Option<String>>(&row, col)?.map(crate::config::Secret::from))
    };
    let actions: Option<serde_json::Value> = get(&row, "actions")?;
    Ok(crate::providers::notify::Message {
        send: get(&row, "send")?,
        reason: get(&row, "reason")?,
        channel: text("channel")?,
        target: secret("target")?,
        secret: secret("secret")?,
        kind: text("kind")?,
        title: text("title")?,
        body: text("body")?,
        actions: match actions {
            Some(a) => serde_json::from_value(a)
                .map_err(|e| Error::internal("reading a notification's actions", e))?,
            None => Vec::new(),
        },
        link_action_ids: get::<Option<Vec<Uuid>>>(&row, "link_action_ids")?.unwrap_or_default(),
        code: secret("code")?,
        code_expires_at: get(&row, "code_expires_at")?,
        waiting: get(&row, "waiting")?,
    })
}

/// Whether `e` is `file_content` saying the file is not stored for this
/// action (as opposed to the lease or the action's status): both are
/// `55000`, and only the message tells them apart.
pub fn is_missing_file(e: &Error) -> bool {
    match e {
        Error::Db(db) if e.is_object_not_in_state() => db
            .as_db_error()
            .is_some_and(|d| d.message().contains("is not an attachment of action")),
        _ => false,
    }
}
